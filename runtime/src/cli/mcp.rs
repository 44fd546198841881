//! `mcp`.

use clap::Parser;

use super::options::GlobalOptions;

const AFTER_HELP: &str = "\
Speaks the Model Context Protocol on stdin and stdout, for an AI assistant that starts it
(Claude Desktop, Claude Code, Cursor, VS Code): every registered workflow is a tool (or those
`mcp.workflows` in config.yaml names), and list_threads, get_thread, answer_thread and
kill_thread act on threads. A call starts a thread, once per call, and answers with its result;
the thread runs on if the assistant goes away. It uses the store of its environment (the home,
or the database `--store` or config.yaml names); no `serve` is needed. Over HTTP, `serve`
answers the same at /mcp. See docs/mcp.md.

Examples:
  uncaged-workflow mcp
  claude mcp add workflows -- uncaged-workflow mcp
  uncaged-workflow --home ~/team-workflows mcp";

/// Serve MCP over stdio: workflows as tools for AI assistants
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct McpCommand {}

impl McpCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        // A mistake in config.yaml is said now, in one line, not as every call's error.
        store.config()?;
        crate::serve::mcp::serve_stdio(store).await?;
        Ok(0)
    }
}
