//! `answer <id> <text | --file F>`.

use std::path::PathBuf;

use clap::Parser;

use super::follow::follow;
use super::options::{FollowArgs, GlobalOptions};
use crate::error::Error;
use crate::run::{actions, answer};

/// Answer for a `human` agent a thread is waiting on, and continue the thread.
///
/// The answer is journaled as that agent call's answer, then the thread resumes in its
/// bundle's worker and is followed like `run` (or not, with `--detach`).
#[derive(Debug, Parser)]
pub struct AnswerCommand {
    /// The waiting thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
    /// The answer
    #[arg(required_unless_present = "file", conflicts_with = "file", value_parser = non_empty)]
    pub text: Option<String>,
    /// Read the answer from a file (`-` for standard input)
    #[arg(long, short, value_name = "FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl AnswerCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        // Checked before the answer is read: a thread not waiting is an error at once.
        answer::answerable(&store, id)?;
        let text = match (&self.text, &self.file) {
            (Some(text), _) => text.clone(),
            (None, Some(path)) if path.as_os_str() == "-" => {
                std::io::read_to_string(std::io::stdin())
                    .map_err(Error::io("read the answer from", "standard input"))?
            }
            (None, Some(path)) => crate::durable::read_text(path, "read the answer from")?
                .ok_or_else(|| Error::MissingFile { what: "answer file", path: path.clone() })?,
            (None, None) => unreachable!("clap requires TEXT or --file"),
        };
        let how = self.follow.how();
        let handed = actions::answer(&store, id, text, how.hand()).await?;
        Ok(follow(&store, handed, how).await?)
    }
}

/// An answer must say something: an empty one would be journaled as the agent's reply.
fn non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("the answer is empty; give the text the thread waits for".into())
    } else {
        Ok(text.to_string())
    }
}
