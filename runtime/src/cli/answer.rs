//! `answer <id> <text | --file F | --approve | --deny WHY | --redo | --skip TEXT>`.

use std::path::PathBuf;

use clap::Parser;

use super::follow::follow;
use super::options::{FollowArgs, GlobalOptions};
use crate::error::Error;
use crate::run::actions;
use crate::run::answer::{self, Answer};
use crate::store::journal::Decision;
use crate::store::pauses::DecidedBy;

/// Answer for a `human` agent a thread is waiting on, or decide about the tool call a durable
/// agent waits on, and continue the thread.
///
/// The answer (or decision) is journaled with that agent call, then the thread resumes in its
/// bundle's worker and is followed like `run` (or not, with `--detach`). A tool call that
/// needs approval takes `--approve` or `--deny WHY`; one a crash cut in the middle takes
/// `--redo` or `--skip TEXT`.
#[derive(Debug, Parser)]
#[command(group = clap::ArgGroup::new("reply").required(true).args(
    ["text", "file", "approve", "deny", "redo", "skip"]
))]
pub struct AnswerCommand {
    /// The waiting thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
    /// The answer
    #[arg(value_parser = non_empty)]
    pub text: Option<String>,
    /// Read the answer from a file (`-` for standard input)
    #[arg(long, short, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Let the tool call the agent waits on be made
    #[arg(long)]
    pub approve: bool,
    /// Do not let the tool call be made; the model is told WHY
    #[arg(long, value_name = "WHY", value_parser = non_empty)]
    pub deny: Option<String>,
    /// Make again the tool call a crash cut in the middle
    #[arg(long)]
    pub redo: bool,
    /// Do not make again the tool call a crash cut; the model is given TEXT as its result
    #[arg(long, value_name = "TEXT", value_parser = non_empty)]
    pub skip: Option<String>,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl AnswerCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        // Checked before the answer is read: a thread not waiting is an error at once.
        answer::answerable(&store, id)?;
        let reply = match (self.text, self.file, self.deny, self.skip) {
            (Some(text), ..) => Answer::Text(text),
            (_, Some(path), ..) if path.as_os_str() == "-" => Answer::Text(
                std::io::read_to_string(std::io::stdin())
                    .map_err(Error::io("read the answer from", "standard input"))?,
            ),
            (_, Some(path), ..) => {
                Answer::Text(crate::durable::read_text(&path, "read the answer from")?.ok_or_else(
                    || Error::MissingFile { what: "answer file", path: path.clone() },
                )?)
            }
            (_, _, Some(reason), _) => Answer::Decision(Decision::Deny { reason }),
            (_, _, _, Some(text)) => Answer::Decision(Decision::Skip { text }),
            _ if self.approve => Answer::Decision(Decision::Approve),
            _ if self.redo => Answer::Decision(Decision::Redo),
            _ => unreachable!("clap requires one of the replies"),
        };
        let how = self.follow.how();
        let handed =
            actions::answer(&store, id, reply, &DecidedBy::local("cli"), how.hand()).await?;
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
