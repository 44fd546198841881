//! The routing of a declarative workflow, checked: a `graph` of nodes and transitions, or
//! `steps` forming a DAG (their order, inputs and failure policy).

use std::collections::{BTreeSet, HashMap, VecDeque};

use marked_yaml::{Node, Span, Spanned};
use serde_json::{Value, json};
use uncaged_workflow_declarative::{
    DagStep, END, FailurePolicy, Node as GraphNode, OnStepFailure, Retry, Role, START, Transition,
    expr,
};

use super::yaml::{child, is_null};
use super::{Checker, NodeSpec, PolicySpec, RetrySpec, StepSpec, prefix};
use crate::error::{Error, Result};
use indexmap::IndexMap;

impl Checker<'_> {
    pub(super) fn graph(
        &self,
        root: &Node,
        graph: &Spanned<Vec<NodeSpec>>,
        roles: &IndexMap<String, (Role, Span)>,
    ) -> Result<Vec<GraphNode>> {
        let known = |name: &str| roles.contains_key(name);
        let mut nodes: Vec<GraphNode> = Vec::new();
        let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
        for (n, node) in graph.iter().enumerate() {
            if node.from.as_str() != START && !known(&node.from) {
                return Err(self.undeclared(&node.from, roles, "`from`"));
            }
            if nodes.iter().any(|n| n.from == *node.from) {
                return Err(self.at(
                    node.from.span(),
                    format!(
                        "`{}` has two `from` entries; list all its transitions in one",
                        *node.from
                    ),
                ));
            }
            let mut transitions = Vec::new();
            for (t, transition) in node.transitions.iter().enumerate() {
                if transition.to.as_str() != END && !known(&transition.to) {
                    return Err(self.undeclared(&transition.to, roles, "a transition to"));
                }
                // `condition: null` (or `~`, or nothing) is the unconditional fallback of the
                // format's source documents, as if the key were absent; `"null"` quoted is
                // an expression.
                let path = ["graph", &n.to_string(), "transitions", &t.to_string(), "condition"];
                let condition =
                    transition.condition.as_ref().filter(|_| !is_null(child(root, &path)));
                if let Some(condition) = condition {
                    expr::check(condition).map_err(|e| {
                        let message = format!("condition `{}`: {}", **condition, e.message);
                        self.within(condition.span(), e.offset, message)
                    })?;
                }
                edges.entry(node.from.as_str()).or_default().push(transition.to.as_str());
                transitions.push(Transition {
                    to: transition.to.to_string(),
                    condition: condition.map(|c| c.to_string()),
                });
            }
            if transitions.is_empty() {
                return Err(
                    self.at(node.from.span(), format!("`{}` has no transitions", *node.from))
                );
            }
            nodes.push(GraphNode { from: node.from.to_string(), transitions });
        }
        if !nodes.iter().any(|n| n.from == START) {
            return Err(self.at(graph.span(), "the graph has no `from: $START` entry"));
        }
        let reached = reachable(&edges, START);
        for (name, (_, span)) in roles {
            if !reached.contains(name.as_str()) {
                return Err(self.at(span, format!("role `{name}` is not reached from $START")));
            }
            if !edges.contains_key(name.as_str()) {
                return Err(self.at(
                    span,
                    format!("role `{name}` has no transitions (add `- from: {name}` to the graph)"),
                ));
            }
        }
        if !reached.contains(END) {
            return Err(self.at(graph.span(), "the graph has no path from $START to $END"));
        }
        for node in graph.iter().filter(|n| n.from.as_str() != START) {
            if !reachable(&edges, &node.from).contains(END) {
                return Err(self.at(
                    node.from.span(),
                    format!("there is no path from `{}` to $END", *node.from),
                ));
            }
        }
        Ok(nodes)
    }

    fn undeclared(
        &self,
        name: &Spanned<String>,
        roles: &IndexMap<String, (Role, Span)>,
        what: &str,
    ) -> Error {
        let names: Vec<&str> = roles.keys().map(String::as_str).collect();
        let hint = crate::error::closest(name, &names)
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        self.at(name.span(), format!("{what} undeclared role `{}`{hint}", name.as_str()))
    }

    /// The steps in topological order, and one role per step.
    pub(super) fn steps(
        &self,
        root: &Node,
        steps: &Spanned<Vec<StepSpec>>,
        roles: &IndexMap<String, (Role, Span)>,
        policy: &FailurePolicy,
    ) -> Result<(Vec<DagStep>, Vec<Role>)> {
        if steps.is_empty() {
            return Err(self.at(steps.span(), "`steps` is empty"));
        }
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, step) in steps.iter().enumerate() {
            self.name(&step.id, "step id")?;
            if index.insert(step.id.as_str(), i).is_some() {
                return Err(
                    self.at(step.id.span(), format!("two steps have the id `{}`", *step.id))
                );
            }
        }
        for step in steps.iter() {
            for dep in &step.depends_on {
                if !index.contains_key(dep.as_str()) {
                    let ids: Vec<&str> = index.keys().copied().collect();
                    let hint = crate::error::closest(dep, &ids)
                        .map(|c| format!(" (did you mean `{c}`?)"))
                        .unwrap_or_default();
                    return Err(self.at(
                        dep.span(),
                        format!("`depends_on`: no step `{}`{hint}", dep.as_str()),
                    ));
                }
            }
        }
        let order = self.topological(steps, &index)?;
        let used: BTreeSet<&str> =
            steps.iter().filter_map(|s| s.role.as_ref().map(|r| r.as_str())).collect();
        for (name, (_, span)) in roles {
            if !used.contains(name.as_str()) {
                return Err(self.at(span, format!("role `{name}` is not used by any step")));
            }
        }
        let mut dag = Vec::new();
        let mut step_roles = Vec::new();
        for i in order {
            let step = &steps[i];
            let id = step.id.as_str();
            let base = match &step.role {
                Some(role) => Some(
                    &roles
                        .get(role.as_str())
                        .ok_or_else(|| self.undeclared(role, roles, "`role`:"))?
                        .0,
                ),
                None => None,
            };
            if base.is_none() && step.description.is_none() {
                return Err(self
                    .at(step.id.span(), format!("step `{id}` needs a `role` or a `description`")));
            }
            let schema = self
                .schema(child(root, &["steps", &i.to_string(), "schema"]))
                .map_err(|e| prefix(e, &format!("step `{id}`: ")))?;
            let instructions = self.instruction(root, i, "description", step, &index)?;
            let expected_output = self.instruction(root, i, "expected_output", step, &index)?;
            let templated = (instructions.is_some(), expected_output.is_some());
            step_roles.push(step_role(step, base, schema, templated));
            let inputs = self.inputs(root, i, step, &index)?;
            let when = self.when(step, &index)?;
            let on_failure = match &step.on_failure {
                Some(word) => Some(self.on_failure(word, "on_failure", true)?),
                None => None,
            };
            dag.push(DagStep {
                id: id.to_string(),
                depends_on: step.depends_on.iter().map(|d| d.to_string()).collect(),
                inputs,
                when,
                retry: step.retry.as_ref().map(|r| self.retry(r, policy)).transpose()?,
                on_failure,
                for_each: self.fan_out(step, &index)?,
                timeout_ms: step.timeout.as_ref().map(|t| self.timeout(t)).transpose()?,
                workflow: step
                    .workflow
                    .as_ref()
                    .map(|w| self.child_workflow(step, w))
                    .transpose()?,
                instructions,
                expected_output,
            });
        }
        Ok((dag, step_roles))
    }

    /// Kahn's algorithm, taking ready steps in file order; a cycle is an error at one of its
    /// steps.
    fn topological(&self, steps: &[StepSpec], index: &HashMap<&str, usize>) -> Result<Vec<usize>> {
        let mut waiting: Vec<usize> = steps.iter().map(|s| s.depends_on.len()).collect();
        let mut ready: VecDeque<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
        let mut order = Vec::new();
        while let Some(i) = ready.pop_front() {
            order.push(i);
            for (j, step) in steps.iter().enumerate() {
                let edges = step.depends_on.iter().filter(|d| index[d.as_str()] == i).count();
                if edges > 0 {
                    waiting[j] -= edges;
                    if waiting[j] == 0 {
                        ready.push_back(j);
                    }
                }
            }
        }
        if let Some(stuck) = (0..steps.len()).find(|i| !order.contains(i)) {
            // Follow dependencies among the stuck steps until one repeats: that is the cycle.
            let mut path = vec![stuck];
            let dep = loop {
                let step = &steps[*path.last().expect("not empty")];
                let next = step
                    .depends_on
                    .iter()
                    .find(|d| !order.contains(&index[d.as_str()]))
                    .expect("a stuck step waits on a stuck step");
                let j = index[next.as_str()];
                if let Some(at) = path.iter().position(|&p| p == j) {
                    path.drain(..at);
                    break next;
                }
                path.push(j);
            };
            let mut names: Vec<&str> = path.iter().map(|&p| steps[p].id.as_str()).collect();
            names.push(names[0]);
            return Err(self.at(
                dep.span(),
                format!("the steps form a dependency cycle: {}", names.join(" → ")),
            ));
        }
        Ok(order)
    }

    pub(super) fn policy(&self, policy: Option<&Spanned<PolicySpec>>) -> Result<FailurePolicy> {
        let Some(policy) = policy else { return Ok(FailurePolicy::default()) };
        let on_step_failure = self.on_failure(&policy.on_step_failure, "on_step_failure", false)?;
        let defaults = FailurePolicy::default();
        Ok(FailurePolicy {
            on_step_failure,
            max_retries: policy.max_retries.unwrap_or(defaults.max_retries),
            retry_delay_ms: policy.retry_delay_ms.unwrap_or(defaults.retry_delay_ms),
        })
    }
}

impl Checker<'_> {
    /// A failure policy's word: `stop`, `skip_dependents`, `ask_user`, and for a step's own
    /// (`allow_continue`) `continue`.
    fn on_failure(
        &self,
        word: &Spanned<String>,
        key: &str,
        allow_continue: bool,
    ) -> Result<OnStepFailure> {
        let options: &[&str] = if allow_continue {
            &["stop", "skip_dependents", "ask_user", "continue"]
        } else {
            &["stop", "skip_dependents", "ask_user"]
        };
        Ok(match word.as_str() {
            "stop" => OnStepFailure::Stop,
            "skip_dependents" => OnStepFailure::SkipDependents,
            "ask_user" => OnStepFailure::AskUser,
            "continue" if allow_continue => OnStepFailure::Continue,
            other => {
                let hint = match other {
                    "continue" => " (`continue` is a step's own `on_failure`)".to_string(),
                    _ => crate::error::closest(other, options)
                        .map(|c| format!(" (did you mean `{c}`?)"))
                        .unwrap_or_default(),
                };
                let listed: Vec<String> = options.iter().map(|o| format!("`{o}`")).collect();
                return Err(self.at(
                    word.span(),
                    format!("`{key}` is one of {}, not `{other}`{hint}", listed.join(", ")),
                ));
            }
        })
    }

    /// A step's `workflow:`: the name of a workflow to run as its child. Whether it is
    /// registered is known when the step runs (it may be added after this one); a timeout
    /// bounds an agent call, and a child is bounded by its own limits.
    fn child_workflow(&self, step: &StepSpec, name: &Spanned<String>) -> Result<String> {
        crate::ids::validate_name("workflow name", name)
            .map_err(|e| self.at(name.span(), format!("`workflow`: {e}")))?;
        if let Some(timeout) = &step.timeout {
            return Err(self.at(
                timeout.span(),
                "`timeout` bounds an agent call; a `workflow` step's child is bounded by its own \
                 limits",
            ));
        }
        Ok(name.to_string())
    }

    /// A step's `timeout:`, from a millisecond to a day.
    fn timeout(&self, timeout: &Spanned<String>) -> Result<u32> {
        let refused = || {
            self.at(
                timeout.span(),
                format!(
                    "`timeout`: `{}` is not a duration from 1ms to 24h (write `30s`, `10m`)",
                    **timeout
                ),
            )
        };
        let duration = humantime::parse_duration(timeout.trim()).map_err(|_| refused())?;
        u32::try_from(duration.as_millis())
            .ok()
            .filter(|&ms| (1..=86_400_000).contains(&ms))
            .ok_or_else(refused)
    }

    /// A step's `retry:`, its delays defaulting to the workflow's.
    fn retry(&self, retry: &Spanned<RetrySpec>, policy: &FailurePolicy) -> Result<Retry> {
        let millis = |value: &Spanned<String>, key: &str| -> Result<u32> {
            let duration = humantime::parse_duration(value.trim()).map_err(|_| {
                self.at(
                    value.span(),
                    format!(
                        "`retry.{key}`: `{}` is not a duration (write `500ms`, `2s`, `1m`)",
                        **value
                    ),
                )
            })?;
            u32::try_from(duration.as_millis())
                .ok()
                .filter(|&ms| ms <= Retry::LONGEST_DELAY_MS)
                .ok_or_else(|| self.at(value.span(), format!("`retry.{key}`: at most an hour")))
        };
        let backoff = match &retry.backoff {
            Some(b) if !(1.0..=100.0).contains(&**b) => {
                return Err(self.at(b.span(), "`retry.backoff` is a factor from 1 to 100"));
            }
            Some(b) => **b,
            None => 2.0,
        };
        Ok(Retry {
            max: retry.max,
            delay_ms: match &retry.delay {
                Some(d) => millis(d, "delay")?,
                None => policy.retry_delay_ms,
            },
            backoff,
            max_delay_ms: retry.max_delay.as_ref().map(|d| millis(d, "max_delay")).transpose()?,
        })
    }
}

/// Rounds a DAG may take when the file does not say: every step, a record for each, and room
/// for retries decided by a person.
pub(super) fn default_dag_rounds(steps: usize) -> u32 {
    u32::try_from(steps * 3 + 10).unwrap_or(u32::MAX)
}

/// The role a DAG step runs as: named by its id, from its `role` if it names one, with its own
/// `description` and `expected_output` added to the prompts. One that embeds `${…}`
/// references (`templated`: the description's, the expected output's) is resolved at each
/// call and given in the call's input: the prompt says where, never the unresolved text.
pub(super) fn step_role(
    step: &StepSpec,
    base: Option<&Role>,
    schema: Option<Value>,
    templated: (bool, bool),
) -> Role {
    let mut system_prompt = base.map(|r| r.system_prompt.clone()).unwrap_or_default();
    let mut add = |text: String| {
        if !system_prompt.is_empty() {
            system_prompt.push_str("\n\n");
        }
        system_prompt.push_str(&text);
    };
    if let Some(description) = &step.description {
        let description = match templated.0 {
            true => INSTRUCTIONS_IN_INPUT.to_string(),
            false => description.clone(),
        };
        add(if base.is_some() { format!("This step: {description}") } else { description });
    }
    if let Some(expected) = &step.expected_output {
        match templated.1 {
            true => add(EXPECTED_IN_INPUT.to_string()),
            false => add(format!("Expected output: {expected}")),
        }
    }
    let extract_prompt = match (base.map(|r| r.extract_prompt.as_str()), &step.expected_output) {
        (Some(prompt), _) if !prompt.is_empty() => prompt.to_string(),
        (_, Some(expected)) => expected.clone(),
        _ => String::new(),
    };
    Role {
        name: step.id.to_string(),
        description: step
            .description
            .clone()
            .or_else(|| base.map(|r| r.description.clone()))
            .unwrap_or_default(),
        system_prompt,
        extract_prompt,
        schema: schema
            .or_else(|| base.map(|r| r.schema.clone()))
            .unwrap_or_else(|| json!({ "type": "object" })),
    }
}

/// A step's prompt in place of a `description` resolved at each call.
const INSTRUCTIONS_IN_INPUT: &str =
    "Do what the `instructions` of this step's input say (they are written for this call).";

/// A step's prompt in place of an `expected_output` resolved at each call.
const EXPECTED_IN_INPUT: &str =
    "Expected output: as the `expected_output` of this step's input describes it.";

pub(super) fn reachable<'a>(
    edges: &HashMap<&'a str, Vec<&'a str>>,
    from: &'a str,
) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::from([from]);
    let mut stack = vec![from];
    while let Some(node) = stack.pop() {
        for &next in edges.get(node).into_iter().flatten() {
            if seen.insert(next) {
                stack.push(next);
            }
        }
    }
    seen
}
