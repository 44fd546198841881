//! JSONata conditions: checked when a workflow is added, evaluated inside the sandbox.
//!
//! Evaluation is `jsonata-rs`. What it supports is listed in [`FUNCTIONS`]; the functions
//! whose result changes from run to run ([`NONDETERMINISTIC`]) are refused, because a resumed
//! thread replays its routing and must route as it did.

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
    let arena = Bump::new();
    let jsonata = JsonAta::new(expr, &arena).map_err(|e| e.to_string())?;
    let text = input.to_string();
    let value = jsonata.evaluate(Some(&text), None).map_err(|e| e.to_string())?;
    Ok(value.is_truthy())
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
