//! Handing a thread to its bundle's worker and following it: shared by `run`, `resume` and
//! `fork`, with the agent flags they all take.

use clap::Args;
use serde_json::json;

use super::output::one_line;
use crate::agent::{AgentFlags, parse_role_binding};
use crate::error::{Error, Result, exit};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::ipc::{self, Reply, Request};

/// Agent choices for a thread.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Agent for every role not bound more specifically (see `run --help`)
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// Agent for one role (repeatable)
    #[arg(long, value_name = "ROLE=AGENT", value_parser = parse_role_binding)]
    pub agent_for: Vec<(String, String)>,
}

impl AgentArgs {
    /// The flags, with relative paths made absolute against the current directory.
    pub fn flags(&self) -> Result<AgentFlags> {
        let flags = AgentFlags {
            default: self.agent.clone(),
            for_roles: self.agent_for.clone(),
            cwd: None,
        };
        Ok(flags.absolutize(&crate::threads::current_dir()?))
    }
}

/// Sandbox limits for a new thread, recorded with it.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Override a sandbox limit for this thread (repeatable): cpu-per-step=5s, memory=256MiB,
    /// table-elements=N, string=4MiB, output=1MiB, max-rounds=N
    #[arg(long = "limit", value_name = "KEY=VALUE", value_parser = crate::limits::parse_limit_flag)]
    pub limits: Vec<(String, String)>,
}

impl LimitArgs {
    /// The overrides, later ones winning.
    pub fn overrides(&self) -> std::collections::BTreeMap<String, String> {
        self.limits.iter().cloned().collect()
    }
}

/// How to follow.
#[derive(Debug, Clone, Copy)]
pub struct Follow {
    /// Print the thread id and return at once.
    pub detach: bool,
    /// One JSON object per event instead of lines for humans.
    pub json: bool,
}

/// Hands thread `id` of bundle `hash` to its worker (starting one if none is live) and, unless
/// detached, prints its steps until it ends. Returns the exit code: the thread's return code,
/// 75 if it was paused, 130 if this command was interrupted (the thread then pauses).
pub async fn hand_over(
    home: &Home,
    hash: BundleHash,
    id: ThreadId,
    flags: &AgentFlags,
    how: Follow,
) -> Result<i32> {
    let mut connection = ipc::connect_or_spawn(home, hash).await?;
    let request = Request::Run {
        thread: id.to_string(),
        follow: !how.detach,
        agent: flags.default.clone(),
        agent_for: flags.for_roles.clone(),
        cwd: flags.cwd.clone(),
    };
    let lost = |e: std::io::Error| Error::Host(format!("lost the worker of bundle {hash}: {e}"));
    connection.send(&request).await.map_err(lost)?;
    match connection.receive::<Reply>().await.map_err(lost)? {
        Some(Reply::Accepted { pid, cache_hit, steps, .. }) => {
            if how.detach {
                println!("{id}");
                return Ok(0);
            }
            if how.json {
                println!(
                    "{}",
                    json!({"thread": id.to_string(), "pid": pid, "resumedAfter": steps})
                );
            } else {
                let cache = if cache_hit { "precompiled" } else { "compiled now" };
                let resumed = if steps > 0 {
                    format!(", continuing after step {steps}")
                } else {
                    String::new()
                };
                println!("thread {id}: bundle {hash} in worker {pid} ({cache}{resumed})");
            }
        }
        Some(Reply::Error { message, code }) => return Err(Error::Remote { message, code }),
        other => {
            return Err(Error::Host(format!(
                "unexpected answer from the worker of {hash}: {other:?}"
            )));
        }
    }
    loop {
        let reply = tokio::select! {
            reply = connection.receive::<Reply>() => reply.map_err(lost)?,
            _ = tokio::signal::ctrl_c() => {
                // Interrupting the command must not lose the thread: it pauses after the step
                // in progress and can be resumed.
                if let Ok(Some(mut control)) = ipc::connect(home, hash).await {
                    let _ = control.send(&Request::Pause { thread: id.to_string() }).await;
                    let _ = control.receive::<Reply>().await;
                }
                eprintln!("uncaged-workflow: interrupted; thread {id} pauses after its current step (`uncaged-workflow resume {id}` continues it)");
                return Ok(130);
            }
        };
        match reply {
            Some(Reply::Step { index, step, agent, elapsed_ms }) => {
                if how.json {
                    println!(
                        "{}",
                        json!({"thread": id.to_string(), "index": index, "role": step.role,
                        "content": step.content, "meta": step.meta, "timestamp": step.timestamp,
                        "agent": agent, "durationMs": elapsed_ms})
                    );
                } else {
                    let meta = one_line(&step.meta.to_string(), 100);
                    println!("[{index}] {:<10} {agent}, {elapsed_ms} ms  {meta}", step.role);
                }
            }
            Some(Reply::Ended { end }) => {
                if how.json {
                    println!("{}", json!({"thread": id.to_string(), "end": end.end}));
                } else {
                    println!(
                        "{} ({}): {}",
                        end.end.status.as_str(),
                        end.end.return_code,
                        end.end.summary
                    );
                }
                return Ok(end.end.return_code);
            }
            Some(Reply::Paused { steps }) => {
                if how.json {
                    println!("{}", json!({"thread": id.to_string(), "paused": {"steps": steps}}));
                } else {
                    println!(
                        "paused after step {steps}; `uncaged-workflow resume {id}` continues it"
                    );
                }
                return Ok(exit::STATE);
            }
            Some(Reply::Error { message, code }) => return Err(Error::Remote { message, code }),
            Some(other) => {
                return Err(Error::Host(format!(
                    "unexpected answer from the worker of {hash}: {other:?}"
                )));
            }
            None => {
                return Err(Error::Host(format!(
                    "the worker running thread {id} exited before the thread ended; `uncaged-workflow resume {id}` continues it"
                )));
            }
        }
    }
}
