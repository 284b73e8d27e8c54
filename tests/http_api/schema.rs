//! A small validator for the subset of OpenAPI 3.0 schemas `docs/openapi.json` uses (`$ref`,
//! `type`, `nullable`, `enum`, `required`, `properties`, `additionalProperties`, `items`,
//! `minimum`, `maximum`, `pattern` as a character-class check is not evaluated), so tests can
//! check real responses against the document a client would generate code from.

use serde_json::Value;

/// Errors of `value` against `schema` (empty: valid). `path` names the place in the value.
pub fn validate(doc: &Value, schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    check(doc, schema, value, path, &mut errors);
    errors
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.trim_start_matches('#');
            resolve(doc, doc.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {reference}")))
        }
        None => schema,
    }
}

fn check(doc: &Value, schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            errors.push(format!("{path}: null where the schema does not allow it"));
        }
        return;
    }
    let fits = match schema.get("type").and_then(Value::as_str) {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_u64() || value.is_i64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(other) => panic!("schema type {other} not supported by this validator"),
    };
    if !fits {
        errors.push(format!("{path}: {value} is not of type {}", schema["type"]));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            errors.push(format!("{path}: {value} is not one of {allowed:?}"));
        }
    }
    if let Some(n) = value.as_u64() {
        if schema.get("maximum").and_then(Value::as_u64).is_some_and(|max| n > max) {
            errors.push(format!("{path}: {n} above the maximum"));
        }
    }
    if let Some(object) = value.as_object() {
        let properties = schema.get("properties").and_then(Value::as_object);
        for required in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let name = required.as_str().expect("required names are strings");
            if !object.contains_key(name) {
                errors.push(format!("{path}: required field {name} missing"));
            }
        }
        for (name, field) in object {
            match properties.and_then(|p| p.get(name)) {
                Some(field_schema) => check(doc, field_schema, field, &format!("{path}.{name}"), errors),
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => errors.push(format!("{path}: undocumented field {name}")),
                    Some(extra) if extra.is_object() => check(doc, extra, field, &format!("{path}.{name}"), errors),
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            check(doc, items, item, &format!("{path}[{i}]"), errors);
        }
    }
}

#[test]
fn the_validator_can_fail() {
    let doc = serde_json::json!({"components": {"schemas": {"X": {"type": "object", "required": ["a"],
        "properties": {"a": {"type": "integer", "maximum": 3}, "b": {"type": "string", "enum": ["x"]}},
        "additionalProperties": false}}}});
    let schema = serde_json::json!({"$ref": "#/components/schemas/X"});
    assert!(validate(&doc, &schema, &serde_json::json!({"a": 1, "b": "x"}), "$").is_empty());
    for bad in [
        serde_json::json!({"b": "x"}),
        serde_json::json!({"a": 4}),
        serde_json::json!({"a": "1"}),
        serde_json::json!({"a": 1, "b": "y"}),
        serde_json::json!({"a": 1, "c": 0}),
        serde_json::json!({"a": null}),
    ] {
        assert!(!validate(&doc, &schema, &bad, "$").is_empty(), "{bad} must be refused");
    }
}
