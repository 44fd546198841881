//! The YAML format of a declarative workflow: parsed with the position of every value, and
//! validated into the canonical [`Definition`] — or refused with one error naming the file,
//! line and column.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;

use indexmap::IndexMap;
use marked_yaml::{LoaderOptions, Node, Span, Spanned};
use serde::Deserialize;
use serde_json::{Value, json};
use uncaged_workflow_declarative::{
    DagStep, Definition, END, FailurePolicy, Node as GraphNode, OnStepFailure, Role, Routing,
    START, Transition, expr, reference,
};

use crate::error::{Error, Result};

/// The most bytes a workflow file may hold.
pub const MAX_SOURCE_BYTES: usize = 1024 * 1024;
/// Rounds a graph may take when the file does not say.
const GRAPH_MAX_ROUNDS: u32 = 10;
/// The longest role name or step id.
const MAX_NAME: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    description: Spanned<String>,
    #[serde(default)]
    roles: IndexMap<Spanned<String>, RoleSpec>,
    max_rounds: Option<Spanned<u32>>,
    graph: Option<Spanned<Vec<NodeSpec>>>,
    steps: Option<Spanned<Vec<StepSpec>>>,
    failure_policy: Option<Spanned<PolicySpec>>,
    trigger: Option<Spanned<TriggerFields>>,
}

/// `trigger:` as written: 004's `TriggerConfig`, one struct for every type, checked per type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerFields {
    #[serde(rename = "type")]
    kind: Spanned<String>,
    expression: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    interval_seconds: Option<Spanned<u64>>,
    check_script: Option<Spanned<String>>,
    diff_mode: Option<Spanned<String>>,
    prompt: Option<String>,
}

/// What starts a workflow's threads by itself, from its `trigger:`: registered as a schedule
/// when the workflow is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerSpec {
    /// At each instant of a cron expression, in a time zone (UTC if absent).
    Cron { expression: String, timezone: Option<String>, prompt: String },
    /// Runs a check command every `interval_seconds`; a new item, or any change of its output,
    /// starts a thread.
    Poll { command: Vec<String>, interval_seconds: u64, new_items: bool, prompt: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleSpec {
    description: Option<String>,
    system_prompt: Option<String>,
    extract_prompt: Option<String>,
    /// Read from the node tree, where scalars keep their YAML types.
    #[allow(dead_code)]
    schema: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    from: Spanned<String>,
    transitions: Vec<TransitionSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionSpec {
    to: Spanned<String>,
    condition: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    id: Spanned<String>,
    role: Option<Spanned<String>>,
    description: Option<String>,
    expected_output: Option<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
    /// Read from the node tree, where scalars keep their YAML types.
    #[allow(dead_code)]
    inputs: Option<serde::de::IgnoredAny>,
    #[allow(dead_code)]
    schema: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    on_step_failure: Spanned<String>,
    max_retries: Option<u32>,
    retry_delay_ms: Option<u32>,
}

/// Reads and validates the workflow file at `path`: its text, its definition and its trigger.
pub fn read(path: &Path) -> Result<(String, Definition, Option<TriggerSpec>)> {
    use std::io::Read;
    let io = |cause| Error::Io { action: "read the workflow file", path: path.into(), cause };
    let invalid =
        |message: String| Error::InvalidWorkflow { path: path.into(), line: 1, column: 1, message };
    // Bounded before reading: a file given by mistake (a disk image, say) is refused, not
    // read whole.
    // Looked at before it is opened: opening a FIFO waits for a writer, forever.
    let metadata = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::MissingFile { what: "workflow file", path: path.into() }
        }
        _ => io(e),
    })?;
    if !metadata.is_file() {
        let kind = if metadata.is_dir() { "a directory" } else { "not a regular file" };
        return Err(invalid(format!("{kind}: a workflow is a `.yaml` or `.yml` file")));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > MAX_SOURCE_BYTES as u64 {
        return Err(invalid(format!(
            "the file is {size} bytes, over the limit of {MAX_SOURCE_BYTES}"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_BYTES as u64).read_to_end(&mut bytes).map_err(io)?;
    let text = String::from_utf8(bytes).map_err(|_| invalid("the file is not UTF-8".into()))?;
    let (definition, trigger) = Checker { path }.check(&text)?;
    Ok((text, definition, trigger))
}

/// Validates `text` (the contents of `path`) into a definition.
pub fn parse(path: &Path, text: &str) -> Result<Definition> {
    Ok(Checker { path }.check(text)?.0)
}

/// Validates `text` (the contents of `path`) into a definition and its trigger.
pub fn parse_with_trigger(path: &Path, text: &str) -> Result<(Definition, Option<TriggerSpec>)> {
    Checker { path }.check(text)
}

struct Checker<'a> {
    path: &'a Path,
}

impl Checker<'_> {
    fn at(&self, span: &Span, message: impl Into<String>) -> Error {
        let (line, column) = span.start().map_or((1, 1), |m| (m.line(), m.column()));
        Error::InvalidWorkflow { path: self.path.into(), line, column, message: message.into() }
    }

    fn at_marker(&self, marker: Option<&marked_yaml::Marker>, message: impl Into<String>) -> Error {
        let (line, column) = marker.map_or((1, 1), |m| (m.line(), m.column()));
        Error::InvalidWorkflow { path: self.path.into(), line, column, message: message.into() }
    }

    fn check(&self, text: &str) -> Result<(Definition, Option<TriggerSpec>)> {
        let root = load(text).map_err(|e| self.load_error(e))?;
        if let Some((line, column)) = second_document(text) {
            return Err(Error::InvalidWorkflow {
                path: self.path.into(),
                line,
                column,
                message: "a second YAML document starts here: a workflow file holds one \
                          (remove the `---` line, or split the file)"
                    .into(),
            });
        }
        let file: File = marked_yaml::from_node(&root).map_err(|e| self.shape_error(&root, &e))?;
        let roles = self.roles(&root, &file)?;
        let max_rounds = file.max_rounds.as_ref().map(|m| **m);
        if let Some(rounds) = file.max_rounds.as_ref().filter(|m| ***m == 0) {
            return Err(self.at(rounds.span(), "`max_rounds` must be at least 1"));
        }
        let (roles, max_rounds, routing) = match (&file.graph, &file.steps) {
            (Some(graph), None) => {
                if let Some(policy) = &file.failure_policy {
                    return Err(self.at(
                        policy.span(),
                        "`failure_policy` applies to `steps`, not to a `graph`",
                    ));
                }
                let nodes = self.graph(&root, graph, &roles)?;
                let roles = roles.into_values().map(|(role, _)| role).collect();
                (roles, max_rounds.unwrap_or(GRAPH_MAX_ROUNDS), Routing::Graph(nodes))
            }
            (None, Some(steps)) => {
                let (steps, step_roles) = self.steps(&root, steps, &roles)?;
                let failure_policy = self.policy(file.failure_policy.as_ref())?;
                let rounds = max_rounds.unwrap_or_else(|| default_dag_rounds(steps.len()));
                (step_roles, rounds, Routing::Steps { steps, failure_policy })
            }
            (Some(_), Some(steps)) => {
                return Err(self.at(steps.span(), "a workflow has `graph` or `steps`, not both"));
            }
            (None, None) => {
                return Err(self.at(
                    file.description.span(),
                    "a workflow needs its routing: a `graph` of roles or a DAG of `steps`",
                ));
            }
        };
        let trigger = match &file.trigger {
            Some(fields) => self.trigger(fields, &file.description)?,
            None => None,
        };
        let definition =
            Definition { description: file.description.to_string(), roles, max_rounds, routing };
        Ok((definition, trigger))
    }

    /// `trigger:`, checked for its type; `manual` is no trigger at all.
    fn trigger(
        &self,
        fields: &Spanned<TriggerFields>,
        description: &str,
    ) -> Result<Option<TriggerSpec>> {
        let kind = fields.kind.as_str();
        let prompt = fields.prompt.clone().unwrap_or_else(|| description.to_string());
        let only = |allowed: &[&str]| -> Result<()> {
            let present = [
                ("expression", fields.expression.as_ref().map(|v| v.span())),
                ("timezone", fields.timezone.as_ref().map(|v| v.span())),
                ("interval_seconds", fields.interval_seconds.as_ref().map(|v| v.span())),
                ("check_script", fields.check_script.as_ref().map(|v| v.span())),
                ("diff_mode", fields.diff_mode.as_ref().map(|v| v.span())),
            ];
            for (key, span) in present {
                if let Some(span) = span
                    && !allowed.contains(&key)
                {
                    return Err(
                        self.at(span, format!("`{key}` does not apply to a `{kind}` trigger"))
                    );
                }
            }
            Ok(())
        };
        let required = |value: Option<&Spanned<String>>, key: &str| -> Result<String> {
            value
                .map(|v| v.to_string())
                .ok_or_else(|| self.at(fields.span(), format!("a `{kind}` trigger needs `{key}`")))
        };
        match kind {
            "manual" => {
                only(&[])?;
                Ok(None)
            }
            "cron" => {
                only(&["expression", "timezone"])?;
                let expression = required(fields.expression.as_ref(), "expression")?;
                let timezone = fields.timezone.as_ref().map(|t| t.to_string());
                if let Err(message) =
                    crate::cron::CronTrigger::parse(&expression, timezone.as_deref())
                {
                    let span = match (&fields.timezone, message.contains("time zone")) {
                        (Some(zone), true) => zone.span(),
                        _ => fields.expression.as_ref().expect("required above").span(),
                    };
                    return Err(self.at(span, message));
                }
                Ok(Some(TriggerSpec::Cron { expression, timezone, prompt }))
            }
            "poll" => {
                only(&["interval_seconds", "check_script", "diff_mode"])?;
                let script = required(fields.check_script.as_ref(), "check_script")?;
                let script_span = fields.check_script.as_ref().expect("required above").span();
                let command = shlex::split(&script).filter(|c| !c.is_empty()).ok_or_else(|| {
                    self.at(script_span, "`check_script` must be a program and its arguments, quoted as a shell would (it is never run by one)")
                })?;
                let interval = fields.interval_seconds.as_ref().ok_or_else(|| {
                    self.at(fields.span(), "a `poll` trigger needs `interval_seconds`")
                })?;
                if **interval == 0 {
                    return Err(self.at(interval.span(), "`interval_seconds` must be at least 1"));
                }
                let diff = required(fields.diff_mode.as_ref(), "diff_mode")?;
                let new_items = match diff.as_str() {
                    "new_items" => true,
                    "any_change" => false,
                    other => {
                        return Err(self.at(
                            fields.diff_mode.as_ref().expect("required above").span(),
                            format!("`diff_mode` is `new_items` or `any_change`, not `{other}`"),
                        ));
                    }
                };
                Ok(Some(TriggerSpec::Poll {
                    command,
                    interval_seconds: **interval,
                    new_items,
                    prompt,
                }))
            }
            other => Err(self.at(
                fields.kind.span(),
                format!("a trigger's `type` is `cron`, `poll` or `manual`, not `{other}`"),
            )),
        }
    }

    fn load_error(&self, error: marked_yaml::LoadError) -> Error {
        use marked_yaml::LoadError::*;
        let (marker, message) = match &error {
            TopLevelMustBeMapping(m) => (Some(*m), "the file must be a YAML mapping".to_string()),
            TopLevelMustBeSequence(m) => (Some(*m), "the file must be a YAML mapping".to_string()),
            UnexpectedAnchor(m) => (Some(*m), "YAML anchors are not supported".to_string()),
            MappingKeyMustBeScalar(m) => (Some(*m), "mapping keys must be scalars".to_string()),
            UnexpectedTag(m) => (Some(*m), "YAML tags are not supported".to_string()),
            ScanError(m, e) => (Some(*m), format!("YAML syntax: {}", e.info())),
            DuplicateKey(inner) => (
                inner.key.span().start().copied(),
                format!("duplicate key `{}`", inner.key.as_str()),
            ),
        };
        self.at_marker(marker.as_ref(), message)
    }

    fn shape_error(&self, root: &Node, error: &marked_yaml::FromNodeError) -> Error {
        use marked_yaml::spanned_serde::Error as E;
        let mut marker = error.start_mark();
        let path = error.path().map(|p| p.to_string()).unwrap_or_default();
        let message = match &**error {
            E::UnknownFieldError(field, expected, _) => {
                // The error carries the mapping's place; the key's own is more use.
                if let Some(key) = key_marker(root, &path, field) {
                    marker = Some(key);
                }
                let hint = crate::error::closest(field, expected)
                    .map(|c| format!(" (did you mean `{c}`?)"))
                    .unwrap_or_else(|| format!(" (expected one of: {})", expected.join(", ")));
                format!("unknown key `{field}`{hint}")
            }
            E::IntegerParseFailure(..) => "expected a whole number".to_string(),
            other => {
                let text = other.to_string();
                // serde says "missing field"; the format says "key".
                text.replace("missing field", "missing key")
            }
        };
        let message = match error.path() {
            Some(path)
                if !path.is_empty()
                    && !path.contains('?')
                    && !matches!(&**error, E::UnknownFieldError(..)) =>
            {
                format!("{path}: {message}")
            }
            _ => message,
        };
        self.at_marker(marker.as_ref(), message)
    }

    /// The declared roles, by name, each with the span of its name.
    fn roles(&self, root: &Node, file: &File) -> Result<IndexMap<String, (Role, Span)>> {
        let mut roles = IndexMap::new();
        for (name, spec) in &file.roles {
            self.name(name, "role name")?;
            let schema = self
                .schema(child(root, &["roles", name.as_str(), "schema"]))
                .map_err(|e| prefix(e, &format!("role `{}`: ", name.as_str())))?;
            let role = Role {
                name: name.to_string(),
                description: spec.description.clone().unwrap_or_default(),
                system_prompt: spec.system_prompt.clone().unwrap_or_default(),
                extract_prompt: spec.extract_prompt.clone().unwrap_or_default(),
                schema: schema.unwrap_or_else(|| json!({ "type": "object" })),
            };
            roles.insert(name.to_string(), (role, *name.span()));
        }
        Ok(roles)
    }

    fn name(&self, name: &Spanned<String>, what: &str) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if ok {
            Ok(())
        } else {
            Err(self.at(
                name.span(),
                format!(
                    "{what} `{}` must be 1-{MAX_NAME} letters, digits, `_`, `-` or `.`, starting \
                     with a letter or digit",
                    name.chars().take(MAX_NAME).collect::<String>()
                ),
            ))
        }
    }

    /// A role's or step's schema, which must be a valid JSON Schema.
    fn schema(&self, node: Option<&Node>) -> Result<Option<Value>> {
        let Some(node) = node else { return Ok(None) };
        let schema = to_json(node);
        crate::schema::compile(&schema.to_string())
            .map_err(|e| self.at(node.span(), format!("not a valid JSON Schema: {e}")))?;
        Ok(Some(schema))
    }

    fn graph(
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
                        let mut span = *condition.span();
                        if let Some(start) = span.start_mut() {
                            *start = marked_yaml::Marker::new(
                                start.source(),
                                start.character() + e.offset,
                                start.line(),
                                start.column() + e.offset,
                            );
                        }
                        self.at(&span, format!("condition `{}`: {}", **condition, e.message))
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
    fn steps(
        &self,
        root: &Node,
        steps: &Spanned<Vec<StepSpec>>,
        roles: &IndexMap<String, (Role, Span)>,
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
        let upstream = upstream_sets(steps, &index);
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
            step_roles.push(step_role(step, base, schema));
            let inputs = self.inputs(root, i, step, &upstream[i], &index)?;
            dag.push(DagStep {
                id: id.to_string(),
                depends_on: step.depends_on.iter().map(|d| d.to_string()).collect(),
                inputs,
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

    fn inputs(
        &self,
        root: &Node,
        i: usize,
        step: &StepSpec,
        upstream: &BTreeSet<usize>,
        index: &HashMap<&str, usize>,
    ) -> Result<serde_json::Map<String, Value>> {
        let Some(node) = child(root, &["steps", &i.to_string(), "inputs"]) else {
            return Ok(Default::default());
        };
        let Some(mapping) = node.as_mapping() else {
            return Err(self.at(node.span(), "`inputs` must be a mapping of names to values"));
        };
        let mut inputs = serde_json::Map::new();
        for (key, value) in mapping.iter() {
            if let Some(text) = value.as_scalar().map(|s| s.as_str()) {
                match reference::parse(text) {
                    Ok(None)
                    | Ok(Some(reference::Reference::Prompt | reference::Reference::TriggerData)) => {
                    }
                    Ok(Some(reference::Reference::Step { id, .. })) => match index.get(id) {
                        None => {
                            return Err(
                                self.at(value.span(), format!("`{text}`: there is no step `{id}`"))
                            );
                        }
                        Some(j) if !upstream.contains(j) => {
                            return Err(self.at(
                                value.span(),
                                format!(
                                    "`{text}`: step `{id}` is not upstream of `{}` (add it to `depends_on`)",
                                    *step.id
                                ),
                            ));
                        }
                        Some(_) => {}
                    },
                    Err(e) => return Err(self.at(value.span(), e)),
                }
            }
            inputs.insert(key.as_str().to_string(), to_json(value));
        }
        Ok(inputs)
    }

    fn policy(&self, policy: Option<&Spanned<PolicySpec>>) -> Result<FailurePolicy> {
        let Some(policy) = policy else { return Ok(FailurePolicy::default()) };
        let on_step_failure = match policy.on_step_failure.as_str() {
            "stop" => OnStepFailure::Stop,
            "skip_dependents" => OnStepFailure::SkipDependents,
            "ask_user" => OnStepFailure::AskUser,
            other => {
                let options = ["stop", "skip_dependents", "ask_user"];
                let hint = crate::error::closest(other, &options)
                    .map(|c| format!(" (did you mean `{c}`?)"))
                    .unwrap_or_default();
                return Err(self.at(
                    policy.on_step_failure.span(),
                    format!("`on_step_failure` is `stop`, `skip_dependents` or `ask_user`, not `{other}`{hint}"),
                ));
            }
        };
        let defaults = FailurePolicy::default();
        Ok(FailurePolicy {
            on_step_failure,
            max_retries: policy.max_retries.unwrap_or(defaults.max_retries),
            retry_delay_ms: policy.retry_delay_ms.unwrap_or(defaults.retry_delay_ms),
        })
    }
}

/// The YAML node tree of `text`. Quoted scalars are marked so that [`to_json`] keeps them
/// strings.
/// Where a second YAML document starts in `text` (line, column; 1-based), if one does. The
/// loader reads the first document and ignores the rest: a workflow split over documents
/// would lose its second half without a word.
fn second_document(text: &str) -> Option<(usize, usize)> {
    use yaml_rust2::Event;
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut first_ended = false;
    loop {
        match parser.next_token() {
            Ok((Event::DocumentStart, mark)) if first_ended => {
                return Some((mark.line(), mark.col() + 1));
            }
            Ok((Event::DocumentEnd, _)) => first_ended = true,
            Ok((Event::StreamEnd, _)) => return None,
            Ok(_) => {}
            // The first document loaded, so what does not parse is after it.
            Err(e) if first_ended => return Some((e.marker().line(), e.marker().col() + 1)),
            Err(_) => return None,
        }
    }
}

fn load(text: &str) -> std::result::Result<Node, marked_yaml::LoadError> {
    let options = LoaderOptions::default().error_on_duplicate_keys(true).prevent_coercion(true);
    marked_yaml::parse_yaml_with_options(0, text, options)
}

/// `error` with its message prefixed.
fn prefix(error: Error, text: &str) -> Error {
    match error {
        Error::InvalidWorkflow { path, line, column, message } => {
            Error::InvalidWorkflow { path, line, column, message: format!("{text}{message}") }
        }
        other => other,
    }
}

/// Rounds a DAG may take when the file does not say: every step, a record for each, and room
/// for retries decided by a person.
fn default_dag_rounds(steps: usize) -> u32 {
    u32::try_from(steps * 3 + 10).unwrap_or(u32::MAX)
}

/// The role a DAG step runs as: named by its id, from its `role` if it names one, with its own
/// `description` and `expected_output` added to the prompts.
fn step_role(step: &StepSpec, base: Option<&Role>, schema: Option<Value>) -> Role {
    let mut system_prompt = base.map(|r| r.system_prompt.clone()).unwrap_or_default();
    let mut add = |text: String| {
        if !system_prompt.is_empty() {
            system_prompt.push_str("\n\n");
        }
        system_prompt.push_str(&text);
    };
    if let Some(description) = &step.description {
        add(if base.is_some() { format!("This step: {description}") } else { description.clone() });
    }
    if let Some(expected) = &step.expected_output {
        add(format!("Expected output: {expected}"));
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

/// For each step, the steps it depends on, transitively.
fn upstream_sets(steps: &[StepSpec], index: &HashMap<&str, usize>) -> Vec<BTreeSet<usize>> {
    (0..steps.len())
        .map(|i| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![i];
            while let Some(j) = stack.pop() {
                for dep in &steps[j].depends_on {
                    let k = index[dep.as_str()];
                    if seen.insert(k) {
                        stack.push(k);
                    }
                }
            }
            seen
        })
        .collect()
}

fn reachable<'a>(edges: &HashMap<&'a str, Vec<&'a str>>, from: &'a str) -> BTreeSet<&'a str> {
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

/// Where the key `field` is written in the mapping at `path` (serde's path: `roles.a`,
/// `graph[0].transitions[1]`), if it is.
fn key_marker(root: &Node, path: &str, field: &str) -> Option<marked_yaml::Marker> {
    let mut segments: Vec<String> = Vec::new();
    // Map keys serde cannot name are `?`: the search goes down to the first of them, then
    // looks for the key anywhere below.
    let known = path.split(".?").next().unwrap_or("");
    for part in known.split('.').filter(|p| !p.is_empty()) {
        // `name`, `name[0]`, `name[0][1]`. A key with brackets in it reads wrong, names no
        // node, and the error keeps the place it came with.
        let (name, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        segments.push(name.to_string());
        while let Some(inner) = rest.strip_prefix('[') {
            let Some(end) = inner.find(']') else { break };
            segments.push(inner[..end].to_string());
            rest = &inner[end + 1..];
        }
    }
    if segments.last().is_some_and(|s| s == field) {
        segments.pop();
    }
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    find_key(child(root, &segments)?, field)
}

/// The first key named `field` in `node` or below it.
fn find_key(node: &Node, field: &str) -> Option<marked_yaml::Marker> {
    match node {
        Node::Mapping(map) => map.iter().find_map(|(k, v)| {
            if k.as_str() == field { k.span().start().copied() } else { find_key(v, field) }
        }),
        Node::Sequence(items) => items.iter().find_map(|item| find_key(item, field)),
        Node::Scalar(_) => None,
    }
}

/// The node at `path` (mapping keys, or sequence indices) under `root`.
fn child<'a>(root: &'a Node, path: &[&str]) -> Option<&'a Node> {
    let mut node = root;
    for key in path {
        node = match node {
            Node::Mapping(m) => m.get_node(key)?,
            Node::Sequence(s) => s.get_node(key.parse().ok()?)?,
            Node::Scalar(_) => return None,
        };
    }
    Some(node)
}

/// Whether `node` is a YAML null: a plain (unquoted) `null`, `~`, or nothing.
fn is_null(node: Option<&Node>) -> bool {
    matches!(node, Some(Node::Scalar(s)) if s.may_coerce()
        && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// A YAML node as JSON, plain scalars typed as YAML 1.2's core schema types them.
fn to_json(node: &Node) -> Value {
    match node {
        Node::Scalar(s) if !s.may_coerce() => Value::String(s.as_str().to_string()),
        Node::Scalar(s) => {
            let text = s.as_str();
            match text {
                "" | "~" | "null" | "Null" | "NULL" => Value::Null,
                "true" | "True" | "TRUE" => Value::Bool(true),
                "false" | "False" | "FALSE" => Value::Bool(false),
                _ => {
                    if let Ok(n) = text.parse::<i64>() {
                        json!(n)
                    } else if let Some(n) = text
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite() && text.chars().any(|c| c.is_ascii_digit()))
                        .and_then(serde_json::Number::from_f64)
                    {
                        Value::Number(n)
                    } else {
                        Value::String(text.to_string())
                    }
                }
            }
        }
        Node::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        Node::Mapping(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.as_str().to_string(), to_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = include_str!("../../../docs/workflow.schema.json");
    const EXAMPLES: &[(&str, &str)] = &[
        ("solve-issue.yaml", include_str!("../../../bundles/solve-issue.yaml")),
        ("plan-develop-review.yaml", include_str!("../../../bundles/plan-develop-review.yaml")),
        ("triage.yaml", include_str!("../../../bundles/triage.yaml")),
    ];

    fn as_json(text: &str) -> Value {
        to_json(&load(text).expect("YAML"))
    }

    #[test]
    fn the_examples_validate_and_satisfy_the_published_schema() {
        let schema = crate::schema::compile(SCHEMA).expect("the format's schema is a JSON Schema");
        for (name, text) in EXAMPLES {
            parse(Path::new(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let errors: Vec<String> =
                schema.iter_errors(&as_json(text)).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{name}: {errors:?}");
        }
    }

    #[test]
    fn the_published_schema_refuses_what_add_refuses_by_shape() {
        let schema = crate::schema::compile(SCHEMA).unwrap();
        for bad in [
            "description: d\nrolse: {}\ngraph: [{from: $START, transitions: [{to: $END}]}]\n",
            "description: d\n",
            "description: d\ngraph: [{from: $START, transitions: [{to: $END}]}]\nsteps: [{id: a, description: A}]\n",
            "description: d\nsteps: [{id: a}]\n",
            "description: d\nsteps: [{id: a, description: A}]\nfailure_policy: {on_step_failure: retry}\n",
        ] {
            assert!(!schema.is_valid(&as_json(bad)), "{bad}");
            assert!(parse(Path::new("bad.yaml"), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_scalars_keep_their_yaml_types_and_quoted_ones_stay_strings() {
        let value = as_json("a: 1\nb: '1'\nc: true\nd: \"true\"\ne: 1.5\nf: ~\ng: text\n");
        assert_eq!(
            value,
            json!({"a": 1, "b": "1", "c": true, "d": "true", "e": 1.5, "f": null, "g": "text"})
        );
    }

    #[test]
    fn the_reference_lists_exactly_the_supported_functions() {
        let reference = include_str!("../../../docs/declarative.md");
        let listed: BTreeSet<&str> = reference
            .lines()
            .skip_while(|l| !l.starts_with("<!-- functions -->"))
            .skip(1)
            .take_while(|l| !l.starts_with("<!-- /functions -->"))
            .flat_map(|l| l.split('`').skip(1).step_by(2))
            .map(|f| f.trim_start_matches('$'))
            .collect();
        let supported: BTreeSet<&str> = expr::FUNCTIONS.iter().copied().collect();
        assert_eq!(listed, supported);
    }
}
