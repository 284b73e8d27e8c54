//! A small validator for the subset of OpenAPI 3.0 schemas `docs/openapi.json` uses (`$ref`,
//! `allOf`, `type`, `format` (`uint32`, `uint64`), `nullable`, `enum`, `required`, `properties`,
//! `additionalProperties`, `items`, `minimum`, `maximum`, `minLength`, `maxLength`, and `pattern`
//! for anchored sequences of literals and character classes with `+ * ? {n} {n,m}`), so tests
//! can check real responses against the document a client would generate code from. A keyword,
//! format or pattern outside that subset panics rather than being skipped.

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

/// The schema keywords [`check`] evaluates, or that carry no constraint.
const KNOWN_KEYWORDS: &[&str] = &[
    "$ref",
    "allOf",
    "type",
    "format",
    "nullable",
    "enum",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "description",
    "default",
    "example",
    "title",
];

fn check(doc: &Value, schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if let Some(keywords) = schema.as_object() {
        for keyword in keywords.keys() {
            assert!(
                KNOWN_KEYWORDS.contains(&keyword.as_str()),
                "schema keyword {keyword} not evaluated by this validator"
            );
        }
    }
    for part in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        check(doc, part, value, path, errors);
    }
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) && schema.get("allOf").is_none() {
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
    if let Some(format) = schema.get("format").and_then(Value::as_str) {
        let max = match format {
            "uint32" => u64::from(u32::MAX),
            "uint64" => u64::MAX,
            other => panic!("format {other} not supported by this validator"),
        };
        if value.is_number() && value.as_u64().is_none_or(|n| n > max) {
            errors.push(format!("{path}: {value} is not a {format}"));
        }
    }
    if value.is_number() {
        if let Some(max) = schema.get("maximum") {
            if compare(value, max) == Some(std::cmp::Ordering::Greater) {
                errors.push(format!("{path}: {value} above the maximum {max}"));
            }
        }
        if let Some(min) = schema.get("minimum") {
            if compare(value, min) == Some(std::cmp::Ordering::Less) {
                errors.push(format!("{path}: {value} below the minimum {min}"));
            }
        }
    }
    if let Some(text) = value.as_str() {
        let length = text.chars().count() as u64;
        if schema.get("minLength").and_then(Value::as_u64).is_some_and(|min| length < min) {
            errors.push(format!("{path}: {value} shorter than minLength"));
        }
        if schema.get("maxLength").and_then(Value::as_u64).is_some_and(|max| length > max) {
            errors.push(format!("{path}: {value} longer than maxLength"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            if !pattern_matches(pattern, text) {
                errors.push(format!("{path}: {value} does not match {pattern}"));
            }
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

/// `value` against `bound`, exactly for integers (u64 ids exceed f64's exact range).
fn compare(value: &Value, bound: &Value) -> Option<std::cmp::Ordering> {
    match (
        value.as_i64().map(i128::from).or(value.as_u64().map(i128::from)),
        bound.as_i64().map(i128::from).or(bound.as_u64().map(i128::from)),
    ) {
        (Some(v), Some(b)) => Some(v.cmp(&b)),
        _ => value.as_f64()?.partial_cmp(&bound.as_f64()?),
    }
}

/// One element of a pattern: the characters it accepts, and how many times in a row.
struct Atom {
    accepts: Vec<(char, char)>,
    min: usize,
    max: usize,
}

/// Parses the pattern subset the document uses: `^`, then literals (`\\` escapes one) and
/// character classes (`[a-z0-9._-]`, no negation), each with an optional `+ * ? {n} {n,m}`,
/// then `$`. Panics on anything else.
fn parse_pattern(pattern: &str) -> Vec<Atom> {
    let unsupported = || -> ! { panic!("pattern {pattern} outside the subset this validator evaluates") };
    let body = pattern.strip_prefix('^').and_then(|p| p.strip_suffix('$')).unwrap_or_else(|| unsupported());
    let chars: Vec<char> = body.chars().collect();
    let mut atoms = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let accepts = match chars[i] {
            '\\' => {
                let c = *chars.get(i + 1).unwrap_or_else(|| unsupported());
                if c.is_ascii_alphanumeric() {
                    unsupported(); // \d, \w, \s...: classes this parser does not know
                }
                i += 2;
                vec![(c, c)]
            }
            '[' => {
                let close = chars[i + 1..].iter().position(|&c| c == ']').unwrap_or_else(|| unsupported()) + i + 1;
                let class = &chars[i + 1..close];
                if class.first() == Some(&'^') || class.contains(&'\\') || class.contains(&'[') {
                    unsupported();
                }
                let mut ranges = Vec::new();
                let mut j = 0;
                while j < class.len() {
                    if j + 2 < class.len() && class[j + 1] == '-' {
                        ranges.push((class[j], class[j + 2]));
                        j += 3;
                    } else {
                        ranges.push((class[j], class[j]));
                        j += 1;
                    }
                }
                i = close + 1;
                ranges
            }
            '(' | ')' | '|' | '.' | '^' | '$' | '*' | '+' | '?' | '{' | '}' | ']' => unsupported(),
            c => {
                i += 1;
                vec![(c, c)]
            }
        };
        let (min, max) = match chars.get(i) {
            Some('+') => (1, usize::MAX),
            Some('*') => (0, usize::MAX),
            Some('?') => (0, 1),
            Some('{') => {
                let close = chars[i..].iter().position(|&c| c == '}').unwrap_or_else(|| unsupported()) + i;
                let inner: String = chars[i + 1..close].iter().collect();
                let bound = |s: &str| s.parse::<usize>().unwrap_or_else(|_| unsupported());
                let range = match inner.split_once(',') {
                    Some((min, max)) => (bound(min), bound(max)),
                    None => (bound(&inner), bound(&inner)),
                };
                i = close;
                range
            }
            _ => {
                atoms.push(Atom { accepts, min: 1, max: 1 });
                continue;
            }
        };
        i += 1; // past the quantifier (or its closing brace)
        atoms.push(Atom { accepts, min, max });
    }
    atoms
}

/// Whether all of `text` matches the anchored `pattern` (see [`parse_pattern`]).
fn pattern_matches(pattern: &str, text: &str) -> bool {
    fn matches(atoms: &[Atom], text: &[char]) -> bool {
        let Some((atom, rest)) = atoms.split_first() else { return text.is_empty() };
        let run = text.iter().take_while(|&&c| atom.accepts.iter().any(|&(lo, hi)| lo <= c && c <= hi)).count();
        (atom.min..=run.min(atom.max)).rev().any(|n| matches(rest, &text[n..]))
    }
    let text: Vec<char> = text.chars().collect();
    matches(&parse_pattern(pattern), &text)
}

#[test]
fn the_validator_can_fail() {
    let doc = serde_json::json!({"components": {"schemas": {
        "Proof": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "X": {"type": "object", "required": ["a"],
        "properties": {
            "a": {"type": "integer", "minimum": 1, "maximum": 3},
            "b": {"type": "string", "enum": ["x"]},
            "id": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[A-Za-z0-9._:-]+$"},
            "proof": {"allOf": [{"$ref": "#/components/schemas/Proof"}], "description": "d"},
            "token": {"type": "string", "pattern": "^[0-9]{1,20}\\.[0-9a-f]{16}$"},
            "n": {"type": "integer", "format": "uint32"}},
        "additionalProperties": false}}}});
    let schema = serde_json::json!({"$ref": "#/components/schemas/X"});
    let proof = "0123456789abcdef0123456789abcdef";
    let good = serde_json::json!({"a": 1, "b": "x", "id": "g:1", "proof": proof, "token": "12.0123456789abcdef",
        "n": 4_294_967_295u64});
    assert_eq!(validate(&doc, &schema, &good, "$"), Vec::<String>::new());
    for bad in [
        serde_json::json!({"b": "x"}),
        serde_json::json!({"a": 4}),
        serde_json::json!({"a": 0}),
        serde_json::json!({"a": -1}),
        serde_json::json!({"a": "1"}),
        serde_json::json!({"a": 1, "b": "y"}),
        serde_json::json!({"a": 1, "c": 0}),
        serde_json::json!({"a": null}),
        serde_json::json!({"a": 1, "id": "g"}),
        serde_json::json!({"a": 1, "id": "group"}),
        serde_json::json!({"a": 1, "id": "g/1"}),
        serde_json::json!({"a": 1, "proof": 7}),
        serde_json::json!({"a": 1, "proof": null}),
        serde_json::json!({"a": 1, "proof": format!("{proof}{proof}")}),
        serde_json::json!({"a": 1, "proof": proof.to_uppercase()}),
        serde_json::json!({"a": 1, "proof": &proof[1..]}),
        serde_json::json!({"a": 1, "token": "12x0123456789abcdef"}),
        serde_json::json!({"a": 1, "token": ".0123456789abcdef"}),
        serde_json::json!({"a": 1, "token": "12.0123456789abcde"}),
        serde_json::json!({"a": 1, "n": 4_294_967_296u64}),
        serde_json::json!({"a": 1, "n": -1}),
    ] {
        assert!(!validate(&doc, &schema, &bad, "$").is_empty(), "{bad} must be refused");
    }
    // Every pattern of the document parses, and a keyword or pattern outside the subset is loud.
    let document: Value =
        serde_json::from_str(include_str!("../../docs/openapi.json")).expect("docs/openapi.json parses");
    fn patterns<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                out.extend(map.get("pattern").and_then(Value::as_str));
                map.values().for_each(|v| patterns(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| patterns(v, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    patterns(&document, &mut found);
    assert!(found.len() >= 5, "{found:?}");
    for pattern in found {
        parse_pattern(pattern);
    }
    for (unsupported, value) in [
        (serde_json::json!({"type": "string", "oneOf": []}), serde_json::json!("1")),
        (serde_json::json!({"type": "string", "pattern": "^(a|b)$"}), serde_json::json!("a")),
        (serde_json::json!({"type": "string", "pattern": "^\\d+$"}), serde_json::json!("1")),
        (serde_json::json!({"type": "string", "pattern": "[a-z]+"}), serde_json::json!("a")),
        (serde_json::json!({"type": "integer", "format": "int8"}), serde_json::json!(1)),
    ] {
        let outcome = std::panic::catch_unwind(|| validate(&doc, &unsupported, &value, "$"));
        assert!(outcome.is_err(), "{unsupported} must panic, not pass");
    }
}
