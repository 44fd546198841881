//! What a run of a thread is asked to do — who answers each role, where command agents run,
//! how many rounds it may take, its sandbox limits, what it may spend — as one serializable
//! value. It is parsed once where a request comes in (the command line, an HTTP request, a
//! schedule, a webhook, a child workflow's step) and carried unchanged from there: into the
//! thread's start record (as checked when the thread is created), into the work queue (the
//! overrides of a `resume`), and to the worker that runs the thread. A new run option is a
//! field here, the flag or field that sets it, and the code that uses it.
//!
//! Secrets never travel in it: the values of the variables that bindings name go beside it,
//! from the process that asked, and are never written down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agent_spec::AgentSpec;
use crate::limits::LimitOverrides;
use crate::spending::Budget;

/// What a run is asked to do. Every field is optional: an empty request asks nothing of its
/// own, and a request laid over another ([`RunRequest::over`]) changes only what it sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRequest {
    /// The agent of every role not bound more specifically (`--agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
    /// Role → agent (`--agent-for role=AGENT`).
    #[serde(
        default,
        alias = "agent_for",
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "role_bindings"
    )]
    pub agent_for: BTreeMap<String, AgentSpec>,
    /// Where command agents (and a schedule's poll command) run, and what relative paths in
    /// agent specs are relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The most steps the thread may take: the bundle's own when absent, never over
    /// `limits.max-rounds`. A thread's start record holds the number it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    /// Sandbox limits over the configured ones (`--limit key=value`).
    #[serde(default, skip_serializing_if = "LimitOverrides::is_empty")]
    pub limits: LimitOverrides,
    /// What the thread may spend on its agents (`--max-tokens`, `--max-cost`, …).
    #[serde(default, skip_serializing_if = "Budget::is_empty")]
    pub budget: Budget,
    /// Tools of durable agents a person says yes to before each call, in this thread, beside
    /// those the bindings' `approve:` names (`--approve server.tool`, or `server.*` for every
    /// tool of a server).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approve: Vec<String>,
}

impl RunRequest {
    /// Whether it asks nothing of its own.
    pub fn is_empty(&self) -> bool {
        *self == RunRequest::default()
    }

    /// Relative paths in `scripted:FILE` and `command:./PROGRAM` specs made absolute against
    /// `cwd`, which becomes the request's directory: the specs mean the same in a worker
    /// started elsewhere.
    pub fn absolutize(mut self, cwd: &Path) -> Self {
        self.agent = self.agent.map(|spec| spec.absolutize(cwd));
        self.agent_for =
            self.agent_for.into_iter().map(|(role, spec)| (role, spec.absolutize(cwd))).collect();
        self.cwd = Some(cwd.to_path_buf());
        self
    }

    /// `self` laid over `base`: each of its fields that is set wins, a role bound in both
    /// takes this binding, and the other roles keep theirs. What a resumed or forked thread
    /// runs with: its recorded request, under the one it was resumed with.
    pub fn over(&self, base: &RunRequest) -> RunRequest {
        let mut agent_for = base.agent_for.clone();
        agent_for.extend(self.agent_for.iter().map(|(r, a)| (r.clone(), a.clone())));
        let mut limits = base.limits.clone();
        for (key, value) in self.limits.iter() {
            // Both were checked where they were given; a pair that no longer parses was
            // refused there.
            let _ = limits.set(key, value);
        }
        RunRequest {
            agent: self.agent.clone().or_else(|| base.agent.clone()),
            agent_for,
            cwd: self.cwd.clone().or_else(|| base.cwd.clone()),
            max_rounds: self.max_rounds.or(base.max_rounds),
            limits,
            budget: base.budget.raised(&self.budget),
            // Approvals only add up: a resume never lifts one the thread was started with.
            approve: base.approve.iter().chain(&self.approve).fold(Vec::new(), |mut all, tool| {
                if !all.contains(tool) {
                    all.push(tool.clone());
                }
                all
            }),
        }
    }
}

/// Role bindings as a map, or as the list of pairs the work queue kept before the request was
/// one type (a thread queued by an older binary and taken by this one).
fn role_bindings<'de, D>(deserializer: D) -> Result<BTreeMap<String, AgentSpec>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Bindings {
        Map(BTreeMap<String, AgentSpec>),
        Pairs(Vec<(String, AgentSpec)>),
    }
    Ok(match Bindings::deserialize(deserializer)? {
        Bindings::Map(map) => map,
        Bindings::Pairs(pairs) => pairs.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> AgentSpec {
        text.parse().unwrap()
    }

    #[test]
    fn a_request_reads_back_as_a_start_record_and_a_queue_wrote_it() {
        let request = RunRequest {
            agent: Some(spec("scripted:a.yaml")),
            agent_for: BTreeMap::from([("reviewer".into(), spec("human"))]),
            cwd: Some("/work".into()),
            max_rounds: Some(7),
            limits: LimitOverrides::from_pairs([("memory", "64MiB")]).unwrap(),
            budget: Budget { max_tokens: Some(100), ..Default::default() },
            approve: vec!["fs.write_file".into()],
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["agentFor"]["reviewer"], "human");
        assert_eq!(json["maxRounds"], 7);
        assert_eq!(serde_json::from_value::<RunRequest>(json).unwrap(), request);
        // As the queue kept it before: snake case, role bindings as pairs.
        let queued: RunRequest = serde_json::from_str(
            r#"{"agent": null, "agent_for": [["reviewer", "human"]], "cwd": "/w"}"#,
        )
        .unwrap();
        assert_eq!(queued.agent_for["reviewer"], spec("human"));
        assert_eq!(serde_json::to_string(&RunRequest::default()).unwrap(), "{}");
    }

    #[test]
    fn a_request_over_another_changes_only_what_it_sets() {
        let base = RunRequest {
            agent: Some(spec("scripted")),
            agent_for: BTreeMap::from([
                ("a".into(), spec("human")),
                ("b".into(), spec("scripted")),
            ]),
            cwd: Some("/base".into()),
            max_rounds: Some(5),
            ..Default::default()
        };
        let over = RunRequest {
            agent_for: BTreeMap::from([("b".into(), spec("human"))]),
            ..Default::default()
        };
        let merged = over.over(&base);
        assert_eq!(merged.agent, base.agent);
        assert_eq!(merged.agent_for["a"], spec("human"));
        assert_eq!(merged.agent_for["b"], spec("human"));
        assert_eq!((merged.cwd, merged.max_rounds), (base.cwd.clone(), Some(5)));
        assert_eq!(RunRequest::default().over(&base), base);
    }
}
