//! What a DAG step refers to, checked: the references of its `inputs` — a whole value
//! (`$steps.<id>.output[.field…]`, `$prompt`, `$trigger_data`) or inside a string
//! (`"Review this: ${steps.plan.output}"`, `$${` for a literal `${`) — and its `when`
//! condition and `for_each` expression. A step may read only the steps it lists in
//! `depends_on` (the DAG protocol's rule): what it reads is then settled before it runs.

use std::collections::HashMap;

use marked_yaml::{Node, Span, Spanned};
use serde_json::Value;
use uncaged_workflow_declarative::reference::{self, Part, Reference};
use uncaged_workflow_declarative::{FanOut, MAX_PARALLEL, expr};

use super::yaml::{child, to_json};
use super::{Checker, StepSpec};
use crate::error::Result;

impl Checker<'_> {
    /// A step's `inputs`, each reference in them checked.
    pub(super) fn inputs(
        &self,
        root: &Node,
        i: usize,
        step: &StepSpec,
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
                let named: Vec<Reference<'_>> = match reference::template(text) {
                    Ok(Some(parts)) => referenced(parts),
                    Ok(None) => match reference::parse(text) {
                        Ok(r) => r.into_iter().collect(),
                        Err(e) => return Err(self.at(value.span(), e)),
                    },
                    Err(e) => return Err(self.at(value.span(), e)),
                };
                self.may_read(value.span(), text, named, step, index)?;
            }
            inputs.insert(key.as_str().to_string(), to_json(value));
        }
        Ok(inputs)
    }

    /// A step's `description` or `expected_output` (`key`), when it embeds `${…}`
    /// references: checked as an input's are, and kept to be resolved at each of the step's
    /// calls. `None` when it embeds none (its text is the role's prompt as it is).
    pub(super) fn instruction(
        &self,
        root: &Node,
        i: usize,
        key: &str,
        step: &StepSpec,
        index: &HashMap<&str, usize>,
    ) -> Result<Option<String>> {
        let Some(node) = child(root, &["steps", &i.to_string(), key]) else { return Ok(None) };
        let Some(text) = node.as_scalar().map(|s| s.as_str()) else { return Ok(None) };
        match reference::template(text) {
            Ok(Some(parts)) => {
                let named = referenced(parts);
                if named.is_empty() {
                    return Ok(None);
                }
                self.may_read(node.span(), &format!("{key}: {text}"), named, step, index)?;
                Ok(Some(text.to_string()))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.at(node.span(), format!("`{key}`: {e}"))),
        }
    }

    /// The references `named` of `text` (at `span`) are ones `step` may read: steps it
    /// depends on, and the item at hand only in a `for_each` step.
    fn may_read(
        &self,
        span: &Span,
        text: &str,
        named: Vec<Reference<'_>>,
        step: &StepSpec,
        index: &HashMap<&str, usize>,
    ) -> Result<()> {
        for reference in named {
            match reference {
                Reference::Step { id, .. } => self.reads(span, text, id, step, index)?,
                Reference::Item { .. } | Reference::Index if step.for_each.is_none() => {
                    return Err(self.at(
                        span,
                        format!(
                            "`{text}`: `$item` and `$index` are the item at hand of a \
                             `for_each` step, and `{}` has none",
                            *step.id
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A step's `when`, checked as a condition whose `$steps.<id>` are steps it depends on.
    pub(super) fn when(
        &self,
        step: &StepSpec,
        index: &HashMap<&str, usize>,
    ) -> Result<Option<String>> {
        let Some(when) = &step.when else { return Ok(None) };
        self.expression(step, when, "when", index)?;
        Ok(Some(when.to_string()))
    }

    /// A step's `for_each` and `max_parallel`.
    pub(super) fn fan_out(
        &self,
        step: &StepSpec,
        index: &HashMap<&str, usize>,
    ) -> Result<Option<FanOut>> {
        let Some(items) = &step.for_each else {
            if let Some(n) = &step.max_parallel {
                return Err(self.at(n.span(), "`max_parallel` applies to a `for_each` step"));
            }
            return Ok(None);
        };
        self.expression(step, items, "for_each", index)?;
        let max_parallel = match &step.max_parallel {
            Some(n) if **n == 0 || **n as usize > MAX_PARALLEL => {
                return Err(
                    self.at(n.span(), format!("`max_parallel` is from 1 to {MAX_PARALLEL}"))
                );
            }
            Some(n) => **n,
            None => FanOut::DEFAULT_PARALLEL,
        };
        Ok(Some(FanOut { items: items.to_string(), max_parallel }))
    }

    /// A JSONata expression of a step (`key`): it parses, calls only supported functions, and
    /// names as `$steps.<id>` only steps it depends on.
    fn expression(
        &self,
        step: &StepSpec,
        text: &Spanned<String>,
        key: &str,
        index: &HashMap<&str, usize>,
    ) -> Result<()> {
        expr::check(text).map_err(|e| {
            self.within(text.span(), e.offset, format!("`{key}: {}`: {}", **text, e.message))
        })?;
        for (offset, id) in step_names(text) {
            if !index.contains_key(id) || !step.depends_on.iter().any(|d| d.as_str() == id) {
                let why = if index.contains_key(id) {
                    format!(
                        "step `{id}` is not in the `depends_on` of `{}` (add it there)",
                        *step.id
                    )
                } else {
                    format!("there is no step `{id}`")
                };
                return Err(self.within(text.span(), offset, format!("`{key}`: {why}")));
            }
        }
        Ok(())
    }

    /// `text` (at `span`) reads step `id`: it must exist and be in `step`'s `depends_on`.
    fn reads(
        &self,
        span: &Span,
        text: &str,
        id: &str,
        step: &StepSpec,
        index: &HashMap<&str, usize>,
    ) -> Result<()> {
        if !index.contains_key(id) {
            return Err(self.at(span, format!("`{text}`: there is no step `{id}`")));
        }
        if !step.depends_on.iter().any(|d| d.as_str() == id) {
            return Err(self.at(
                span,
                format!(
                    "`{text}`: step `{id}` is not in the `depends_on` of `{}` (add it there)",
                    *step.id
                ),
            ));
        }
        Ok(())
    }

    /// An error at `offset` characters into the string at `span`.
    pub(super) fn within(
        &self,
        span: &Span,
        offset: usize,
        message: impl Into<String>,
    ) -> crate::Error {
        let mut span = *span;
        if let Some(start) = span.start_mut() {
            *start = marked_yaml::Marker::new(
                start.source(),
                start.character() + offset,
                start.line(),
                start.column() + offset,
            );
        }
        self.at(&span, message)
    }
}

/// The references among a template's parts.
fn referenced(parts: Vec<Part<'_>>) -> Vec<Reference<'_>> {
    parts
        .into_iter()
        .filter_map(|part| match part {
            Part::Ref(r) => Some(r),
            Part::Text(_) => None,
        })
        .collect()
}

/// The step ids a condition names as `$steps.<id>` (or `` $steps.`<id>` `` for an id JSONata
/// would read as arithmetic), with the offset of each.
fn step_names(condition: &Spanned<String>) -> Vec<(usize, &str)> {
    const PREFIX: &str = "$steps.";
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = condition[from..].find(PREFIX) {
        let start = from + at + PREFIX.len();
        let rest = &condition[start..];
        let name = match rest.strip_prefix('`') {
            Some(quoted) => quoted.split('`').next().unwrap_or_default(),
            None => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            }
        };
        if !name.is_empty() {
            names.push((start, name));
        }
        from = start;
    }
    names
}
