//! A declarative workflow's routing as a Mermaid flowchart (`show --graph`).

use std::fmt::Write;

use uncaged_workflow_declarative::{Definition, END, Routing, START};

/// The flowchart: a graph's roles and conditional transitions, or a DAG's steps and
/// dependencies. Names and conditions come from the bundle, so every label is quoted and
/// escaped, and node ids are generated.
pub fn flowchart(definition: &Definition) -> String {
    let mut out = String::new();
    let mut known: Vec<String> = Vec::new();
    match &definition.routing {
        Routing::Graph(nodes) => {
            out.push_str("flowchart TD\n");
            for from in nodes {
                let a = node(&from.from, &mut out, &mut known);
                for t in &from.transitions {
                    let b = node(&t.to, &mut out, &mut known);
                    match &t.condition {
                        Some(c) => {
                            let _ = writeln!(out, "    {a} -->|\"{}\"| {b}", label(c));
                        }
                        None => {
                            let _ = writeln!(out, "    {a} --> {b}");
                        }
                    }
                }
            }
        }
        Routing::Steps { steps, .. } => {
            out.push_str("flowchart LR\n");
            for step in steps {
                let b = node(&step.id, &mut out, &mut known);
                // A step's condition and fan-out on the edges into it, as a graph's
                // transitions carry their conditions.
                let mut says = Vec::new();
                if let Some(when) = &step.when {
                    says.push(format!("when {when}"));
                }
                if let Some(fan_out) = &step.for_each {
                    says.push(format!("for each of {}", fan_out.items));
                }
                if let Some(workflow) = &step.workflow {
                    says.push(format!("runs workflow {workflow}"));
                }
                for dep in &step.depends_on {
                    let a = node(dep, &mut out, &mut known);
                    match says.is_empty() {
                        true => {
                            let _ = writeln!(out, "    {a} --> {b}");
                        }
                        false => {
                            let _ =
                                writeln!(out, "    {a} -->|\"{}\"| {b}", label(&says.join("; ")));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The generated id of `name`, declaring its node (and shape) the first time.
fn node(name: &str, out: &mut String, names: &mut Vec<String>) -> String {
    if let Some(i) = names.iter().position(|n| n == name) {
        return format!("n{i}");
    }
    names.push(name.to_string());
    let i = names.len() - 1;
    let shape = if name == START || name == END {
        format!("n{i}([\"{}\"])", label(name))
    } else {
        format!("n{i}[\"{}\"]", label(name))
    };
    let _ = writeln!(out, "    {shape}");
    format!("n{i}")
}

/// Text safe inside a quoted Mermaid label: quotes, angle brackets and ampersands as entity
/// codes, line breaks as spaces.
fn label(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '&' => out.push_str("#amp;"),
            '#' => out.push_str("#35;"),
            '|' => out.push_str("#124;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}
