//! A webhook's map: the data its threads start with, picked field by field out of each
//! delivery's body by JSON Pointers (`issue: /issue/number`), so that a tracker's payload
//! meets the workflow's declared input without the workflow parsing the tracker's format.

use std::collections::BTreeMap;

use serde_json::Value;

/// The most fields a map may name.
pub const MAX_FIELDS: usize = 64;

/// Refuses a map that could not be applied: too many fields, an empty field name, or a value
/// that is not a JSON Pointer (`""` or starting with `/`).
pub fn check(map: &BTreeMap<String, String>) -> Result<(), String> {
    if map.len() > MAX_FIELDS {
        return Err(format!(
            "a webhook's map names {} fields, over the {MAX_FIELDS} it may",
            map.len()
        ));
    }
    for (field, pointer) in map {
        if field.is_empty() {
            return Err("a webhook's map has an empty field name".into());
        }
        if !(pointer.is_empty() || pointer.starts_with('/')) {
            return Err(format!(
                "the webhook's map gives field `{}` `{}`, not a JSON Pointer into the body \
                 (`/issue/number`; `` for the whole body)",
                crate::terminal::line(field),
                crate::terminal::line(pointer)
            ));
        }
    }
    Ok(())
}

/// The data a delivery of `body` starts its thread with: the body itself when the map is
/// empty, else an object of each field whose pointer finds something in the body (a field it
/// finds nothing for is left out, for the workflow's input schema to require or not).
pub fn apply(map: &BTreeMap<String, String>, body: Value) -> Value {
    if map.is_empty() {
        return body;
    }
    let fields = map
        .iter()
        .filter_map(|(field, pointer)| Some((field.clone(), body.pointer(pointer)?.clone())))
        .collect();
    Value::Object(fields)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_are_picked_by_pointer_and_a_missing_one_left_out() {
        let map: BTreeMap<String, String> =
            [("issue", "/issue/number"), ("gone", "/nope"), ("all", "")]
                .map(|(f, p)| (f.to_string(), p.to_string()))
                .into();
        let body = json!({"issue": {"number": 7}});
        assert_eq!(apply(&map, body.clone()), json!({"issue": 7, "all": body}));
        assert_eq!(apply(&BTreeMap::new(), body.clone()), body);
        assert!(check(&map).is_ok());
        let bad: BTreeMap<String, String> =
            [("issue".to_string(), "issue.number".to_string())].into();
        assert!(check(&bad).unwrap_err().contains("not a JSON Pointer"));
    }
}
