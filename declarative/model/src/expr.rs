//! JSONata conditions: checked when a workflow is added, evaluated inside the sandbox.
//!
//! Evaluation is `jsonata-rs`. What it supports is listed in [`FUNCTIONS`]; the functions
//! whose result changes from run to run ([`NONDETERMINISTIC`]) are refused, because a resumed
//! thread replays its routing and must route as it did.

use std::collections::HashMap;

use bumpalo::Bump;
use jsonata_rs::JsonAta;
use serde_json::Value;

/// The JSONata functions a condition may call.
pub const FUNCTIONS: &[&str] = &[
    "abs",
    "append",
    "assert",
    "base64decode",
    "base64encode",
    "boolean",
    "ceil",
    "contains",
    "count",
    "distinct",
    "each",
    "error",
    "exists",
    "filter",
    "floor",
    "join",
    "keys",
    "length",
    "lookup",
    "lowercase",
    "map",
    "match",
    "max",
    "merge",
    "min",
    "not",
    "number",
    "pad",
    "power",
    "reduce",
    "replace",
    "reverse",
    "round",
    "single",
    "sort",
    "split",
    "sqrt",
    "string",
    "substring",
    "substringAfter",
    "substringBefore",
    "sum",
    "trim",
    "uppercase",
    "zip",
    "fromMillis",
    "toMillis",
];

/// Functions the evaluator has but conditions may not call: their result is not a function of
/// the thread, so a replayed thread could route differently.
pub const NONDETERMINISTIC: &[&str] = &["now", "millis", "random", "uuid"];

/// Why an expression is refused, and where (a byte offset into it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExprError {
    pub message: String,
    pub offset: usize,
}

/// Checks that `expr` parses and calls only supported functions.
///
/// `jsonata-rs` panics on some syntax it does not implement (the parent operator `%`): the
/// host catches that here, quietly, and refuses the expression, so that such a condition never
/// reaches a bundle (where the panic would end the thread).
pub fn check(expr: &str) -> Result<(), ExprError> {
    let parsed = {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let parsed = std::panic::catch_unwind(|| {
            let arena = Bump::new();
            JsonAta::new(expr, &arena).map(|_| ()).map_err(|e| e.to_string())
        });
        std::panic::set_hook(quiet);
        parsed
    };
    let parsed = parsed.map_err(|_| ExprError {
        message: "uses JSONata syntax the evaluator does not implement (such as the parent \
                  operator `%`)"
            .into(),
        offset: 0,
    })?;
    if let Err(message) = parsed {
        // jsonata-rs writes `CODE @ OFFSET: message`.
        let offset = message
            .split_once(" @ ")
            .and_then(|(_, rest)| rest.split_once(':'))
            .and_then(|(n, _)| n.trim().parse().ok())
            .unwrap_or(0);
        let text = message.split_once(": ").map_or(message.as_str(), |(_, m)| m);
        let message = format!("does not parse: {text}");
        return Err(ExprError { message, offset: offset.min(expr.len()) });
    }
    let bound = assigned_names(expr);
    for (name, offset) in called_functions(expr) {
        if bound.contains(&name) || FUNCTIONS.contains(&name) {
            continue;
        }
        let message = if NONDETERMINISTIC.contains(&name) {
            format!(
                "`${name}` is not allowed in a condition: its result changes from run to run, \
                 and a resumed thread must route as it did"
            )
        } else {
            format!(
                "unsupported JSONata function `${name}` (see the reference for the supported list)"
            )
        };
        return Err(ExprError { message, offset });
    }
    Ok(())
}

/// Evaluates `expr` over `input`; its truthiness (JSONata's boolean cast) is the result.
pub fn evaluate(expr: &str, input: &Value) -> Result<bool, String> {
    evaluate_bound(expr, input, None)
}

/// As [`evaluate`], with each top-level key of `input` also bound as a variable: a DAG step's
/// `when` reads `$steps`, `$trigger_data` and `$prompt`.
pub fn evaluate_with_variables(expr: &str, input: &Value) -> Result<bool, String> {
    evaluate_bound(expr, input, Some(&variables(input)))
}

/// `input`'s top-level keys as JSONata variables.
fn variables(input: &Value) -> HashMap<&str, &Value> {
    input
        .as_object()
        .map(|fields| fields.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default()
}

/// The value of `expr` over `input` (its top-level keys bound as variables, as in
/// [`evaluate_with_variables`]): a fan-out's items. Nothing selected is null.
pub fn value_with_variables(expr: &str, input: &Value) -> Result<Value, String> {
    let arena = Bump::new();
    let jsonata = JsonAta::new(expr, &arena).map_err(|e| e.to_string())?;
    let value = jsonata
        .evaluate(Some(&input.to_string()), Some(&variables(input)))
        .map_err(|e| e.to_string())?;
    if value.is_undefined() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&value.serialize(false)).map_err(|e| e.to_string())
}

fn evaluate_bound(
    expr: &str,
    input: &Value,
    bindings: Option<&HashMap<&str, &Value>>,
) -> Result<bool, String> {
    if let Some(result) = simple::evaluate(expr, input) {
        return Ok(result);
    }
    let arena = Bump::new();
    let jsonata = JsonAta::new(expr, &arena).map_err(|e| e.to_string())?;
    let text = input.to_string();
    let value = jsonata.evaluate(Some(&text), bindings).map_err(|e| e.to_string())?;
    Ok(value.is_truthy())
}

/// The commonest condition, `a.b.c = literal` (or `!=`), decided without the JSONata
/// evaluator, whose fixed cost (~20 µs natively per evaluation, more in the sandbox) would
/// otherwise dominate a routing step. Exactly JSONata's semantics, for the cases it takes: a
/// path through objects to a scalar; anything else (an array or object on the way or at the
/// end, any other syntax) is left to the evaluator. A property test holds the two equal.
mod simple {
    use serde_json::Value;

    pub fn evaluate(expr: &str, input: &Value) -> Option<bool> {
        let (path, equal, literal) = parse(expr)?;
        let mut value = input;
        for key in &path {
            value = match value {
                Value::Object(map) => match map.get(*key) {
                    Some(next) => next,
                    // Nothing selected: `=` and `!=` are both false.
                    None => return Some(false),
                },
                _ => return None,
            };
        }
        let same = match (value, &literal) {
            (Value::Array(_) | Value::Object(_), _) => return None,
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            (a, b) => a == b,
        };
        Some(same == equal)
    }

    /// `path (=|!=) literal`, the path dotted plain names, the literal JSON-like.
    fn parse(expr: &str) -> Option<(Vec<&str>, bool, Value)> {
        let (left, right, equal) = match expr.split_once("!=") {
            Some((l, r)) => (l, r, false),
            None => {
                let (l, r) = expr.split_once('=')?;
                (l, r, true)
            }
        };
        if left.ends_with(['<', '>', '!']) || right.contains('=') {
            return None;
        }
        let path: Vec<&str> = left.trim().split('.').collect();
        let plain = |name: &&str| {
            name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        if !path.iter().all(plain)
            || ["and", "or", "in", "true", "false", "null"].contains(&path[0])
        {
            return None;
        }
        let right = right.trim();
        let literal = match right {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            _ => {
                let quoted = right.len() >= 2
                    && ((right.starts_with('\'') && right.ends_with('\''))
                        || (right.starts_with('"') && right.ends_with('"')));
                if quoted {
                    let inner = &right[1..right.len() - 1];
                    if inner.contains(['\'', '"', '\\']) {
                        return None;
                    }
                    Value::String(inner.to_string())
                } else {
                    // A plain decimal number, as JSONata reads one.
                    let number = right.parse::<f64>().ok().filter(|n| n.is_finite())?;
                    if !right.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '-')) {
                        return None;
                    }
                    Value::Number(serde_json::Number::from_f64(number)?)
                }
            }
        };
        Some((path, equal, literal))
    }
}

/// `$name(` calls outside string literals and comments, with their offsets.
fn called_functions(expr: &str) -> Vec<(&str, usize)> {
    let mut calls = Vec::new();
    scan(expr, |name, offset, after| {
        if after.trim_start().starts_with('(') && !name.is_empty() {
            calls.push((name, offset));
        }
    });
    calls
}

/// Variables the expression binds itself (`$f := …`): calling them is the author's business.
fn assigned_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    scan(expr, |name, _, after| {
        if after.trim_start().starts_with(":=") {
            names.push(name);
        }
    });
    // Lambda parameters (`function($x)`) are bound too.
    let mut rest = expr;
    while let Some(i) = rest.find("function") {
        rest = &rest[i + "function".len()..];
        if let Some(params) = rest.trim_start().strip_prefix('(')
            && let Some(end) = params.find(')')
        {
            names.extend(params[..end].split(',').filter_map(|p| p.trim().strip_prefix('$')));
        }
    }
    names
}

/// Calls `visit(name, offset_of_dollar, text_after_name)` for every `$name` outside strings,
/// backquoted names and comments.
fn scan<'a>(expr: &'a str, mut visit: impl FnMut(&'a str, usize, &'a str)) {
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = expr[i + 2..].find("*/").map_or(bytes.len(), |end| i + 2 + end + 2);
            }
            b'$' => {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
                {
                    end += 1;
                }
                visit(&expr[start..end], i, &expr[end..]);
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_002_conditions_evaluate_as_written() {
        let c = "$not($exists(meta.needsClarification))";
        assert_eq!(check(c), Ok(()));
        assert!(evaluate(c, &json!({"role": "planner", "meta": {"steps": []}})).unwrap());
        assert!(!evaluate(c, &json!({"meta": {"needsClarification": "which file?"}})).unwrap());
        let c = "meta.approved = false";
        assert_eq!(check(c), Ok(()));
        assert!(evaluate(c, &json!({"meta": {"approved": false}})).unwrap());
        assert!(!evaluate(c, &json!({"meta": {"approved": true}})).unwrap());
        assert!(!evaluate(c, &json!({"meta": {}})).unwrap());
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 512, failure_persistence: None, ..Default::default() })]
        /// The shortcut decides exactly as jsonata-rs does, wherever it decides.
        #[test]
        fn the_shortcut_agrees_with_the_evaluator(
            path in proptest::sample::select(vec!["meta.approved", "meta.n", "meta.s", "meta.o.x", "meta.a", "meta.missing", "role", "depth"]),
            op in proptest::sample::select(vec!["=", "!=", " = ", " != "]),
            literal in proptest::sample::select(vec!["true", "false", "null", "0", "1", "1.5", "-2", "'yes'", "\"no\"", "''"]),
            approved in proptest::option::of(proptest::bool::ANY),
            n in proptest::sample::select(vec![json!(0), json!(1), json!(1.0), json!(1.5), json!(-2), json!("1"), json!(null), json!(true)]),
            s in proptest::sample::select(vec![json!("yes"), json!("no"), json!(""), json!(["yes"]), json!({"x": 1})]),
        ) {
            let mut meta = json!({"n": n, "s": s, "o": {"x": n}, "a": [1, 2]});
            if let Some(approved) = approved {
                meta["approved"] = json!(approved);
            }
            let input = json!({"role": "reviewer", "meta": meta, "depth": 1, "history": []});
            let expr = format!("{path}{op}{literal}");
            if let Some(fast) = simple::evaluate(&expr, &input) {
                let arena = Bump::new();
                let slow = JsonAta::new(&expr, &arena).unwrap().evaluate(Some(&input.to_string()), None).unwrap().is_truthy();
                proptest::prop_assert_eq!(fast, slow, "{} over {}", expr, input);
            }
        }
    }

    #[test]
    fn the_shortcut_takes_the_common_forms_and_leaves_the_rest() {
        let input = json!({"meta": {"approved": false, "list": [1]}});
        assert_eq!(simple::evaluate("meta.approved = false", &input), Some(true));
        assert_eq!(simple::evaluate("meta.approved != false", &input), Some(false));
        assert_eq!(simple::evaluate("meta.nothing = false", &input), Some(false));
        assert_eq!(simple::evaluate("meta.list = 1", &input), None);
        assert_eq!(simple::evaluate("meta.approved >= 1", &input), None);
        assert_eq!(simple::evaluate("$not(meta.approved) = true", &input), None);
    }

    #[test]
    fn history_and_depth_are_queryable() {
        let input = json!({"depth": 4, "history": [{"role": "developer"}, {"role": "developer"}]});
        assert!(evaluate("$count(history[role = 'developer']) >= 2", &input).unwrap());
        assert!(!evaluate("depth > 4", &input).unwrap());
    }

    #[test]
    fn unsupported_and_nondeterministic_functions_are_named() {
        let e = check("$frobnicate(meta.x)").unwrap_err();
        assert!(e.message.contains("`$frobnicate`"), "{e:?}");
        assert_eq!(e.offset, 0);
        let e = check("meta.x and $random() > 0.5").unwrap_err();
        assert!(e.message.contains("`$random`") && e.message.contains("run to run"), "{e:?}");
        assert_eq!(e.offset, 11);
    }

    #[test]
    fn own_bindings_strings_and_comments_are_not_calls() {
        assert_eq!(check("($f := function($x) { $x > 1 }; $f(meta.n))"), Ok(()));
        assert_eq!(check("meta.s = '$nope(1)' /* $nope() */"), Ok(()));
    }

    #[test]
    fn syntax_the_evaluator_does_not_implement_is_refused_not_a_panic() {
        let e = check("meta.%.x").unwrap_err();
        assert!(e.message.contains("does not implement"), "{e:?}");
    }

    #[test]
    fn a_parse_error_has_its_offset() {
        let e = check("meta.approved = ").unwrap_err();
        assert_eq!(e.offset, 16);
        assert!(e.message.starts_with("does not parse: "), "{e:?}");
        assert!(!e.message.contains("S0211 @"), "{e:?}");
    }
}
