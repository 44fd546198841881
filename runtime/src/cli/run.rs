//! `run <name> -p <prompt>`.

use clap::Parser;

use super::follow::follow;
use super::options::{FollowArgs, GlobalOptions, PromptArgs, RunArgs, TriggerArgs};
use crate::run::actions;
use crate::run::lifecycle::StartRequest;

const AFTER_HELP: &str = "\
Agents (--agent, --agent-for ROLE=AGENT, or config.yaml):
  scripted                 built-in, offline: answers from each role's schema examples
  scripted:FILE            built-in, offline: answers per role from a YAML file
  command:PROGRAM [ARGS]   an external program (context as JSON on stdin, answer on stdout)
  human                    a person: asked on this terminal, or later with `answer`
  NAME                     a binding under `agents:` in config.yaml, of kind scripted,
                           command, openai (any OpenAI-compatible endpoint) or human

The thread runs in the bundle's worker process (started on demand, shared by all threads of
the bundle, gone a second after its last thread ends). Ctrl-C pauses the thread after its
current step.

Examples:
  uncaged-workflow run solve-issue -p \"Fix the crash on empty input\"
  uncaged-workflow run solve-issue -p \"...\" --agent scripted:answers.yaml --max-rounds 6
  uncaged-workflow run solve-issue -p \"...\" --detach
  git diff | uncaged-workflow run review -p -
  uncaged-workflow run solve-issue --prompt-file issue.md";

/// Start a thread of a workflow and print its steps as they happen.
///
/// Exits with the workflow's return code (0 when it succeeded), or 75 if the thread was
/// paused before it ended.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct RunCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: String,
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub trigger: TriggerArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl RunCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let start = StartRequest {
            name: self.name,
            prompt: self.prompt.text()?,
            trigger_data: self.trigger.value()?,
            request: self.run.request()?,
            origin: Default::default(),
        };
        let how = self.follow.how();
        let handed = actions::start(&store, start, how.hand()).await?;
        Ok(follow(&store, handed, how).await?)
    }
}
