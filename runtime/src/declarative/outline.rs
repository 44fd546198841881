//! A declarative workflow as a person reads it at a terminal before saying yes to it (`plan`):
//! what it does, what starts it, its failure policy, and its steps as a tree.
//!
//! Every name, description and expression comes from the workflow — which `plan` got from a
//! model — so each is shown through [`terminal::line`] and cut to a line's width.

use std::fmt::Write;

use uncaged_workflow_declarative::{Definition, END, OnStepFailure, Routing, START};

use super::source::TriggerSpec;
use crate::terminal;

/// The widest a description is shown before it is cut.
const DESCRIPTION_WIDTH: usize = 72;

/// The outline of `definition` (named `name`, started by `trigger`), lines ending in `\n`.
pub fn outline(
    name: Option<&str>,
    definition: &Definition,
    trigger: Option<&TriggerSpec>,
) -> String {
    let mut out = String::new();
    let name = name.map_or("(no name)".into(), terminal::line);
    let _ = writeln!(out, "{name}: {}", short(&definition.description));
    let _ = writeln!(out, "  trigger: {}", describe_trigger(trigger));
    match &definition.routing {
        Routing::Steps { steps, failure_policy } => {
            let _ = writeln!(
                out,
                "  on a failed step: {} (retries: {}, first after {} ms)",
                policy_name(failure_policy.on_step_failure),
                failure_policy.max_retries,
                failure_policy.retry_delay_ms
            );
            let _ = writeln!(out, "  steps:");
            let tree = Tree::of(steps);
            for (i, root) in tree.roots.iter().enumerate() {
                tree.write(&mut out, definition, *root, "    ", i + 1 == tree.roots.len());
            }
        }
        Routing::Graph(nodes) => {
            let _ = writeln!(out, "  roles, and where each goes next:");
            for node in nodes {
                let from =
                    if node.from == START { "start".into() } else { terminal::line(&node.from) };
                let _ = writeln!(out, "    {from}");
                for (i, t) in node.transitions.iter().enumerate() {
                    let branch = if i + 1 == node.transitions.len() { "└─" } else { "├─" };
                    let to = if t.to == END { "end".into() } else { terminal::line(&t.to) };
                    match &t.condition {
                        Some(c) => {
                            let _ = writeln!(out, "    {branch} {to}  when {}", short(c));
                        }
                        None => {
                            let _ = writeln!(out, "    {branch} {to}");
                        }
                    }
                }
            }
        }
    }
    out
}

/// What starts the workflow's threads, in words.
pub fn describe_trigger(trigger: Option<&TriggerSpec>) -> String {
    match trigger {
        None => "manual (each thread is started by `run`, the API or a webhook)".into(),
        Some(TriggerSpec::Cron { expression, timezone, .. }) => format!(
            "cron `{}` ({})",
            terminal::line(expression),
            terminal::line(timezone.as_deref().unwrap_or("UTC"))
        ),
        Some(TriggerSpec::Poll { command, interval_seconds, new_items, .. }) => format!(
            "poll `{}` every {interval_seconds} s, a thread per {}",
            terminal::line(
                &shlex::try_join(command.iter().map(String::as_str)).unwrap_or_default()
            ),
            if *new_items { "new item" } else { "change of its output" }
        ),
        Some(TriggerSpec::Webhook { secret_env, .. }) => {
            format!("webhook, signed with the secret in ${}", terminal::line(secret_env))
        }
    }
}

/// A DAG drawn as a tree: each step under the dependency that finishes last (the deepest),
/// its other dependencies named on its line.
struct Tree<'a> {
    steps: &'a [uncaged_workflow_declarative::DagStep],
    roots: Vec<usize>,
    children: Vec<Vec<usize>>,
    /// The step each is drawn under, if any.
    parents: Vec<Option<usize>>,
}

impl<'a> Tree<'a> {
    fn of(steps: &'a [uncaged_workflow_declarative::DagStep]) -> Self {
        let index = |id: &str| steps.iter().position(|s| s.id == id);
        // Depth by longest path from a root; the validator has refused cycles, and the bound
        // on passes keeps a malformed input from looping.
        let mut depth = vec![0usize; steps.len()];
        for _ in 0..steps.len() {
            let mut changed = false;
            for (i, step) in steps.iter().enumerate() {
                let d = step.depends_on.iter().filter_map(|d| index(d)).map(|j| depth[j] + 1).max();
                if let Some(d) = d.filter(|d| *d > depth[i]) {
                    depth[i] = d;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let mut roots = Vec::new();
        let mut children = vec![Vec::new(); steps.len()];
        let mut parents = Vec::with_capacity(steps.len());
        for (i, step) in steps.iter().enumerate() {
            let parent = step.depends_on.iter().filter_map(|d| index(d)).max_by_key(|j| depth[*j]);
            match parent {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
            parents.push(parent);
        }
        Tree { steps, roots, children, parents }
    }

    fn write(
        &self,
        out: &mut String,
        definition: &Definition,
        at: usize,
        indent: &str,
        last: bool,
    ) {
        let step = &self.steps[at];
        let description = definition
            .roles
            .iter()
            .find(|r| r.name == step.id)
            .map(|r| short(&r.description))
            .unwrap_or_default();
        let mut notes = Vec::new();
        let parent = self.parents[at];
        let others: Vec<_> = step
            .depends_on
            .iter()
            .filter(|d| parent.is_none_or(|p| self.steps[p].id != **d))
            .map(|d| terminal::line(d).into_owned())
            .collect();
        if !others.is_empty() {
            notes.push(format!("also after {}", others.join(", ")));
        }
        if let Some(when) = &step.when {
            notes.push(format!("when {}", short(when)));
        }
        if let Some(fan_out) = &step.for_each {
            notes.push(format!(
                "for each of {}, {} at a time",
                short(&fan_out.items),
                fan_out.max_parallel
            ));
        }
        if let Some(workflow) = &step.workflow {
            notes.push(format!("runs workflow {}", terminal::line(workflow)));
        }
        if let Some(retry) = &step.retry {
            notes.push(format!("retries: {}", retry.max));
        }
        if let Some(on_failure) = step.on_failure {
            notes.push(format!("on failure: {}", policy_name(on_failure)));
        }
        if let Some(ms) = step.timeout_ms {
            notes.push(format!("timeout {ms} ms"));
        }
        let branch = if last { "└─" } else { "├─" };
        let notes =
            if notes.is_empty() { String::new() } else { format!("  [{}]", notes.join("; ")) };
        let _ =
            writeln!(out, "{indent}{branch} {}: {description}{notes}", terminal::line(&step.id));
        let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
        let children = &self.children[at];
        for (i, child) in children.iter().enumerate() {
            self.write(out, definition, *child, &deeper, i + 1 == children.len());
        }
    }
}

/// A failure policy as the YAML writes it.
fn policy_name(policy: OnStepFailure) -> &'static str {
    match policy {
        OnStepFailure::Stop => "stop",
        OnStepFailure::SkipDependents => "skip_dependents",
        OnStepFailure::AskUser => "ask_user",
        OnStepFailure::Continue => "continue",
    }
}

/// `text`'s first line, escaped for a terminal and cut to [`DESCRIPTION_WIDTH`] characters.
fn short(text: &str) -> String {
    let first = text.trim().lines().next().unwrap_or_default();
    let escaped = terminal::line(first);
    let mut cut: String = escaped.chars().take(DESCRIPTION_WIDTH).collect();
    if cut.len() < escaped.len() || text.trim().lines().nth(1).is_some() {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_dag_is_a_tree_under_its_deepest_dependency() {
        let text = "name: ship\ndescription: Ship a change\ntrigger: {type: cron, expression: '0 9 * * 1'}\n\
            failure_policy: {on_step_failure: skip_dependents, max_retries: 1, retry_delay_ms: 100}\n\
            steps:\n\
            - {id: plan, description: Plan it, inputs: {}, depends_on: []}\n\
            - {id: lint, description: Lint, inputs: {}, depends_on: []}\n\
            - {id: build, description: \"Build\\u001b[31m\", inputs: {}, depends_on: [plan]}\n\
            - {id: review, description: Review, inputs: {}, depends_on: [lint, build], when: '$steps.build.output != null'}\n";
        let (definition, trigger) =
            crate::declarative::source::parse_with_trigger(Path::new("p.yaml"), text).unwrap();
        let shown = outline(Some("ship"), &definition, trigger.as_ref());
        assert_eq!(
            shown,
            "ship: Ship a change\n  trigger: cron `0 9 * * 1` (UTC)\n  \
             on a failed step: skip_dependents (retries: 1, first after 100 ms)\n  steps:\n    \
             ├─ plan: Plan it\n    │  └─ build: Build\\u{1b}[31m\n    │     \
             └─ review: Review  [also after lint; when $steps.build.output != null]\n    \
             └─ lint: Lint\n",
            "{shown}"
        );
    }
}
