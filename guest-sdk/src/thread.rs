//! The thread as a moderator sees it, and what a moderator decides.

use serde_json::Value;

/// One completed role execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The role that ran.
    pub role: String,
    /// The agent's raw answer.
    pub content: String,
    /// The structured output, valid against the role's schema.
    pub meta: Value,
    /// Milliseconds since the Unix epoch (host clock).
    pub timestamp: u64,
}

/// The thread so far: what the moderator decides from.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadContext {
    /// The thread's ULID.
    pub thread_id: String,
    /// The user's prompt.
    pub prompt: String,
    /// Steps recorded so far, oldest first.
    pub steps: Vec<Step>,
    /// The most steps this thread may hold.
    pub max_rounds: u32,
    /// What the trigger that started the thread passed (a poll's item), if one did.
    pub trigger_data: Option<Value>,
}

impl ThreadContext {
    /// The most recent step, if any.
    pub fn last(&self) -> Option<&Step> {
        self.steps.last()
    }

    /// The most recent step of `role`, if any.
    pub fn last_of(&self, role: &str) -> Option<&Step> {
        self.steps.iter().rev().find(|s| s.role == role)
    }

    /// How many times `role` has run.
    pub fn count(&self, role: &str) -> usize {
        self.steps.iter().filter(|s| s.role == role).count()
    }
}

/// How a thread ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// 0 for success; the host's CLI exits with it.
    pub return_code: i32,
    /// One line for humans.
    pub summary: String,
}

/// A moderator's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run this role next.
    Role(String),
    /// Run these roles at once: their agents answer concurrently, and their steps are
    /// recorded together, in this order.
    Parallel(Vec<String>),
    /// End the thread.
    End(Outcome),
}

impl Next {
    /// Run `name` next.
    pub fn role(name: impl Into<String>) -> Self {
        Next::Role(name.into())
    }

    /// Run every role of `names` at once (a parallel group), e.g. three reviewers.
    pub fn parallel<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Next::Parallel(names.into_iter().map(Into::into).collect())
    }

    /// End the thread successfully.
    pub fn done(summary: impl Into<String>) -> Self {
        Next::End(Outcome { return_code: crate::RETURN_OK, summary: summary.into() })
    }

    /// End the thread with a non-zero return code.
    pub fn fail(return_code: i32, summary: impl Into<String>) -> Self {
        Next::End(Outcome { return_code, summary: summary.into() })
    }
}
