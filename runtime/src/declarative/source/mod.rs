//! The YAML format of a declarative workflow: parsed with the position of every value, and
//! validated into the canonical [`Definition`] — or refused with one error naming the file,
//! line and column.

use std::path::Path;

use indexmap::IndexMap;
use marked_yaml::{Node, Span, Spanned};
use serde::Deserialize;
use serde_json::{Value, json};
use uncaged_workflow_declarative::{Definition, Role, Routing};

use crate::error::{Error, Result};

mod references;
mod routing;
mod yaml;

use self::routing::default_dag_rounds;
use self::yaml::{child, key_marker, load, second_document, to_json};

/// The most bytes a workflow file may hold.
pub const MAX_SOURCE_BYTES: usize = 1024 * 1024;
/// Rounds a graph may take when the file does not say.
const GRAPH_MAX_ROUNDS: u32 = 10;
/// The longest role name or step id.
const MAX_NAME: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// A DAG-protocol plan's name: the workflow is named by `add`, so this is a note.
    #[allow(dead_code)]
    name: Option<Spanned<String>>,
    /// A DAG-protocol plan's format version: `1.0`, the one this reads.
    schema_version: Option<Spanned<String>>,
    description: Spanned<String>,
    #[serde(default)]
    roles: IndexMap<Spanned<String>, RoleSpec>,
    max_rounds: Option<Spanned<u32>>,
    graph: Option<Spanned<Vec<NodeSpec>>>,
    steps: Option<Spanned<Vec<StepSpec>>>,
    failure_policy: Option<Spanned<PolicySpec>>,
    /// The most bytes of a step's output a reference hands on.
    reference_limit: Option<Spanned<u32>>,
    /// JSON Schema of the data a thread starts with: read from the node tree, where scalars
    /// keep their YAML types.
    #[allow(dead_code)]
    inputs: Option<serde::de::IgnoredAny>,
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
    secret_env: Option<Spanned<String>>,
    /// A webhook's data, field by field: a JSON Pointer into the delivery's body for each.
    map: Option<Spanned<std::collections::BTreeMap<String, String>>>,
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
    /// A signed request to `serve`'s `POST /hooks/<workflow>`, signed with the secret in the
    /// environment variable `secret_env`.
    Webhook { secret_env: String, map: std::collections::BTreeMap<String, String>, prompt: String },
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
    when: Option<Spanned<String>>,
    retry: Option<Spanned<RetrySpec>>,
    on_failure: Option<Spanned<String>>,
    for_each: Option<Spanned<String>>,
    max_parallel: Option<Spanned<u32>>,
    timeout: Option<Spanned<String>>,
    workflow: Option<Spanned<String>>,
    /// A DAG-protocol plan's agent (`claude`): agents are bound by the host, per step id, so
    /// this is a note.
    #[allow(dead_code)]
    agent: Option<Spanned<String>>,
    /// A DAG-protocol plan's layout position: the graph is laid out when shown.
    #[allow(dead_code)]
    position: Option<serde::de::IgnoredAny>,
    /// Read from the node tree, where scalars keep their YAML types.
    #[allow(dead_code)]
    inputs: Option<serde::de::IgnoredAny>,
    #[allow(dead_code)]
    schema: Option<serde::de::IgnoredAny>,
}

/// A step's `retry:`, durations as written (`500ms`, `2s`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrySpec {
    max: u32,
    delay: Option<Spanned<String>>,
    backoff: Option<Spanned<f64>>,
    max_delay: Option<Spanned<String>>,
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
        if let Some(version) = file.schema_version.as_ref().filter(|v| v.as_str() != "1.0") {
            return Err(self.at(
                version.span(),
                format!("`schema_version` `{}` is not one this reads (1.0)", version.as_str()),
            ));
        }
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
                if let Some(limit) = &file.reference_limit {
                    return Err(self.at(
                        limit.span(),
                        "`reference_limit` applies to `steps`, not to a `graph`",
                    ));
                }
                let nodes = self.graph(&root, graph, &roles)?;
                let roles = roles.into_values().map(|(role, _)| role).collect();
                (roles, max_rounds.unwrap_or(GRAPH_MAX_ROUNDS), Routing::Graph(nodes))
            }
            (None, Some(steps)) => {
                let failure_policy = self.policy(file.failure_policy.as_ref())?;
                let (steps, step_roles) = self.steps(&root, steps, &roles, &failure_policy)?;
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
        if let Some(limit) = file.reference_limit.as_ref().filter(|l| ***l == 0) {
            return Err(self.at(limit.span(), "`reference_limit` must be at least 1 byte"));
        }
        let inputs = self.schema(child(&root, &["inputs"])).map_err(|e| prefix(e, "`inputs`: "))?;
        let definition = Definition {
            description: file.description.to_string(),
            roles,
            max_rounds,
            routing,
            reference_limit: file.reference_limit.as_ref().map(|l| **l),
            inputs,
        };
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
                ("secret_env", fields.secret_env.as_ref().map(|v| v.span())),
                ("map", fields.map.as_ref().map(|v| v.span())),
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
            "webhook" => {
                only(&["secret_env", "map"])?;
                let secret_env = required(fields.secret_env.as_ref(), "secret_env")?;
                if let Err(message) = crate::env_name::check(&secret_env) {
                    let span = fields.secret_env.as_ref().expect("required above").span();
                    return Err(self.at(span, message));
                }
                let map = fields.map.as_ref().map(|m| (**m).clone()).unwrap_or_default();
                if let Err(message) = crate::data_map::check(&map) {
                    let span = fields.map.as_ref().expect("not empty").span();
                    return Err(self.at(span, message));
                }
                Ok(Some(TriggerSpec::Webhook { secret_env, map, prompt }))
            }
            other => Err(self.at(
                fields.kind.span(),
                format!(
                    "a trigger's `type` is `cron`, `poll`, `webhook` or `manual`, not `{other}`"
                ),
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

    /// A role's, a step's or the inputs' schema, which must be a valid JSON Schema.
    fn schema(&self, node: Option<&Node>) -> Result<Option<Value>> {
        let Some(node) = node else { return Ok(None) };
        let schema = to_json(node);
        crate::schema::compile(&schema.to_string())
            .map_err(|e| self.at(node.span(), format!("not a valid JSON Schema: {e}")))?;
        Ok(Some(schema))
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use uncaged_workflow_declarative::expr;

    use super::*;

    const SCHEMA: &str = include_str!("../../../../docs/workflow.schema.json");
    const EXAMPLES: &[(&str, &str)] = &[
        ("solve-issue.yaml", include_str!("../../../../bundles/solve-issue.yaml")),
        ("plan-develop-review.yaml", include_str!("../../../../bundles/plan-develop-review.yaml")),
        ("triage.yaml", include_str!("../../../../bundles/triage.yaml")),
        ("review-each-file.yaml", include_str!("../../../../bundles/review-each-file.yaml")),
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
        let reference = include_str!("../../../../docs/declarative.md");
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
