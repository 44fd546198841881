//! Reading YAML with the position of every value: loading one document (and finding a
//! second one, which is refused), finding where a key is, and turning nodes into JSON.

use marked_yaml::{LoaderOptions, Node};
use serde_json::{Value, json};

/// Where a second YAML document starts in `text` (line, column; 1-based), if one does. The
/// loader reads the first document and ignores the rest: a workflow split over documents
/// would lose its second half without a word.
pub(super) fn second_document(text: &str) -> Option<(usize, usize)> {
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

/// The YAML node tree of `text`. Quoted scalars are marked so that [`to_json`] keeps them
/// strings.
pub(super) fn load(text: &str) -> std::result::Result<Node, marked_yaml::LoadError> {
    let options = LoaderOptions::default().error_on_duplicate_keys(true).prevent_coercion(true);
    marked_yaml::parse_yaml_with_options(0, text, options)
}

/// Where the key `field` is written in the mapping at `path` (serde's path: `roles.a`,
/// `graph[0].transitions[1]`), if it is.
pub(super) fn key_marker(root: &Node, path: &str, field: &str) -> Option<marked_yaml::Marker> {
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
pub(super) fn find_key(node: &Node, field: &str) -> Option<marked_yaml::Marker> {
    match node {
        Node::Mapping(map) => map.iter().find_map(|(k, v)| {
            if k.as_str() == field { k.span().start().copied() } else { find_key(v, field) }
        }),
        Node::Sequence(items) => items.iter().find_map(|item| find_key(item, field)),
        Node::Scalar(_) => None,
    }
}

/// The node at `path` (mapping keys, or sequence indices) under `root`.
pub(super) fn child<'a>(root: &'a Node, path: &[&str]) -> Option<&'a Node> {
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
pub(super) fn is_null(node: Option<&Node>) -> bool {
    matches!(node, Some(Node::Scalar(s)) if s.may_coerce()
        && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// A YAML node as JSON, plain scalars typed as YAML 1.2's core schema types them.
pub(super) fn to_json(node: &Node) -> Value {
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
