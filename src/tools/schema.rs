//! A small JSON-schema check, enough for tool input schemas: `type` (one or a list), `enum`,
//! `properties`, `required`, `additionalProperties`, `items`, `minimum`/`maximum`,
//! `minLength`/`maxLength` and `minItems`/`maxItems`. Other keywords are accepted and not
//! checked, so a richer schema (from an MCP server) is checked as far as these go.
//!
//! [`check_schema`] checks a schema itself, as the JSON Schema meta-schema would: every
//! standard keyword it uses has a value of the right shape (a schema where a schema goes, a
//! type name where a type goes, a count where a count goes), so a schema a client declares
//! is refused when it is made, not when the model's first call meets it.

use serde_json::{Map, Value};

/// Where an input breaks its schema and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    /// `input`, `input.path`, `input.items[2]`, …
    pub path: String,
    pub message: String,
}

/// Checks `value` against `schema`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    check(schema, value, "input")
}

/// The type names of JSON Schema.
const TYPE_NAMES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Checks that `schema` is a JSON Schema: an object or a boolean whose standard keywords
/// have values of the shapes the meta-schema (draft 2020-12, and the older drafts' forms of
/// `items`, `exclusiveMinimum` and `exclusiveMaximum`) gives them. Unknown keywords are
/// allowed, as JSON Schema allows them.
pub fn check_schema(schema: &Value) -> Result<(), SchemaError> {
    meta_check(schema, "input_schema")
}

fn meta_check(schema: &Value, path: &str) -> Result<(), SchemaError> {
    let map = match schema {
        Value::Object(map) => map,
        Value::Bool(_) => return Ok(()),
        other => {
            return fail(
                path,
                format!("a schema is an object or a boolean, not {}", type_of(other)),
            )
        }
    };
    for (key, value) in map {
        let at = format!("{path}.{key}");
        match key.as_str() {
            "type" => check_type_keyword(value, &at)?,
            "enum" | "examples" => expect(value.is_array(), &at, "must be an array")?,
            "required" => check_names(value, &at)?,
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                let Some(children) = value.as_object() else {
                    return fail(&at, "must be an object of schemas");
                };
                for (name, child) in children {
                    meta_check(child, &format!("{at}.{name}"))?;
                }
            }
            "dependentRequired" => {
                let Some(children) = value.as_object() else {
                    return fail(&at, "must be an object of arrays of property names");
                };
                for (name, child) in children {
                    check_names(child, &format!("{at}.{name}"))?;
                }
            }
            "additionalProperties"
            | "additionalItems"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "contains"
            | "propertyNames"
            | "not"
            | "if"
            | "then"
            | "else" => meta_check(value, &at)?,
            // A schema, or (before draft 2020-12) an array of schemas.
            "items" => match value {
                Value::Array(schemas) => check_schemas(schemas, &at)?,
                other => meta_check(other, &at)?,
            },
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => match value {
                Value::Array(schemas) if !schemas.is_empty() => check_schemas(schemas, &at)?,
                _ => return fail(&at, "must be a non-empty array of schemas"),
            },
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties" | "minContains" | "maxContains" => expect(
                value.as_f64().is_some_and(|n| n >= 0.0 && n.fract() == 0.0),
                &at,
                "must be a non-negative integer",
            )?,
            "minimum" | "maximum" => expect(value.is_number(), &at, "must be a number")?,
            // A number, or (draft 4) a boolean.
            "exclusiveMinimum" | "exclusiveMaximum" => expect(
                value.is_number() || value.is_boolean(),
                &at,
                "must be a number",
            )?,
            "multipleOf" => expect(
                value.as_f64().is_some_and(|n| n > 0.0),
                &at,
                "must be a number greater than 0",
            )?,
            "uniqueItems" => expect(value.is_boolean(), &at, "must be a boolean")?,
            "pattern" | "format" | "title" | "description" | "$id" | "$schema" | "$ref"
            | "$anchor" | "$comment" => expect(value.is_string(), &at, "must be a string")?,
            _ => {}
        }
    }
    Ok(())
}

fn check_type_keyword(value: &Value, path: &str) -> Result<(), SchemaError> {
    let known = |v: &Value| v.as_str().is_some_and(|t| TYPE_NAMES.contains(&t));
    let ok = match value {
        Value::String(_) => known(value),
        Value::Array(types) => {
            !types.is_empty()
                && types.iter().all(known)
                && types
                    .iter()
                    .enumerate()
                    .all(|(i, t)| !types[..i].contains(t))
        }
        _ => false,
    };
    expect(
        ok,
        path,
        format!(
            "must be a type name ({}) or a non-empty array of distinct ones, not {value}",
            TYPE_NAMES.join(", ")
        ),
    )
}

fn check_names(value: &Value, path: &str) -> Result<(), SchemaError> {
    let ok = value
        .as_array()
        .is_some_and(|names| names.iter().all(Value::is_string));
    expect(ok, path, "must be an array of property names (strings)")
}

fn check_schemas(schemas: &[Value], path: &str) -> Result<(), SchemaError> {
    for (i, schema) in schemas.iter().enumerate() {
        meta_check(schema, &format!("{path}[{i}]"))?;
    }
    Ok(())
}

fn expect(ok: bool, path: &str, message: impl Into<String>) -> Result<(), SchemaError> {
    if ok {
        Ok(())
    } else {
        fail(path, message)
    }
}

fn fail(path: &str, message: impl Into<String>) -> Result<(), SchemaError> {
    Err(SchemaError {
        path: path.to_owned(),
        message: message.into(),
    })
}

fn check(schema: &Value, value: &Value, path: &str) -> Result<(), SchemaError> {
    let Some(schema) = schema.as_object() else {
        // `true` or `{}`-like schemas accept anything; `false` nothing.
        return match schema {
            Value::Bool(false) => fail(path, "no value is allowed here"),
            _ => Ok(()),
        };
    };
    if let Some(types) = schema.get("type") {
        let names: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !names.is_empty() && !names.iter().any(|t| has_type(value, t)) {
            return fail(
                path,
                format!("expected {}, got {}", names.join(" or "), type_of(value)),
            );
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(value) {
            return fail(
                path,
                format!("must be one of {}", Value::Array(allowed.clone())),
            );
        }
    }
    match value {
        Value::Object(map) => check_object(schema, map, path),
        Value::Array(items) => check_array(schema, items, path),
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            bounds(
                schema,
                "minLength",
                "maxLength",
                chars as f64,
                path,
                "characters",
            )
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if n < min {
                    return fail(path, format!("must be at least {min}"));
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if n > max {
                    return fail(path, format!("must be at most {max}"));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_object(
    schema: &Map<String, Value>,
    map: &Map<String, Value>,
    path: &str,
) -> Result<(), SchemaError> {
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                return fail(path, format!("missing required property `{name}`"));
            }
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    for (name, value) in map {
        let child = format!("{path}.{name}");
        match properties.and_then(|p| p.get(name)) {
            Some(property) => check(property, value, &child)?,
            None => match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return fail(path, format!("unexpected property `{name}`"))
                }
                Some(extra @ Value::Object(_)) => check(extra, value, &child)?,
                _ => {}
            },
        }
    }
    Ok(())
}

fn check_array(
    schema: &Map<String, Value>,
    items: &[Value],
    path: &str,
) -> Result<(), SchemaError> {
    bounds(
        schema,
        "minItems",
        "maxItems",
        items.len() as f64,
        path,
        "items",
    )?;
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn bounds(
    schema: &Map<String, Value>,
    min_key: &str,
    max_key: &str,
    n: f64,
    path: &str,
    unit: &str,
) -> Result<(), SchemaError> {
    if let Some(min) = schema.get(min_key).and_then(Value::as_f64) {
        if n < min {
            return fail(path, format!("must have at least {min} {unit}"));
        }
    }
    if let Some(max) = schema.get(max_key).and_then(Value::as_f64) {
        if n > max {
            return fail(path, format!("must have at most {max} {unit}"));
        }
    }
    Ok(())
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        // An unknown type name is not this checker's to refuse.
        _ => true,
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "minLength": 1 },
                "depth": { "type": "integer", "minimum": 1, "maximum": 5 },
                "mode": { "enum": ["a", "b"] },
                "tags": { "type": "array", "items": { "type": "string" }, "maxItems": 2 },
                "deep": {
                    "type": "object",
                    "properties": { "x": { "type": ["number", "null"] } },
                    "additionalProperties": false
                }
            },
            "required": ["path"]
        })
    }

    fn error(value: Value) -> String {
        validate(&schema(), &value)
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn valid_inputs_pass() {
        for value in [
            json!({"path": "a"}),
            json!({"path": "a", "depth": 5, "mode": "b", "tags": ["x"], "extra": 1}),
            json!({"path": "a", "depth": 2.0, "deep": {"x": null}}),
            json!({"path": "a", "deep": {"x": 1.5}}),
        ] {
            assert_eq!(validate(&schema(), &value), Ok(()), "{value}");
        }
        assert_eq!(validate(&json!({}), &json!([1, "x"])), Ok(()));
        assert_eq!(validate(&json!(true), &json!(null)), Ok(()));
    }

    #[test]
    fn each_broken_rule_names_where_and_why() {
        assert_eq!(error(json!("a")), "input: expected object, got string");
        assert_eq!(error(json!({})), "input: missing required property `path`");
        assert_eq!(
            error(json!({"path": 1})),
            "input.path: expected string, got number"
        );
        assert_eq!(
            error(json!({"path": ""})),
            "input.path: must have at least 1 characters"
        );
        assert_eq!(
            error(json!({"path": "a", "depth": 0})),
            "input.depth: must be at least 1"
        );
        assert_eq!(
            error(json!({"path": "a", "depth": 6})),
            "input.depth: must be at most 5"
        );
        assert_eq!(
            error(json!({"path": "a", "depth": 1.5})),
            "input.depth: expected integer, got number"
        );
        assert!(error(json!({"path": "a", "mode": "c"})).starts_with("input.mode: must be one of"));
        assert_eq!(
            error(json!({"path": "a", "tags": ["x", 2]})),
            "input.tags[1]: expected string, got number"
        );
        assert_eq!(
            error(json!({"path": "a", "tags": ["x", "y", "z"]})),
            "input.tags: must have at most 2 items"
        );
        assert_eq!(
            error(json!({"path": "a", "deep": {"y": 1}})),
            "input.deep: unexpected property `y`"
        );
        assert_eq!(
            error(json!({"path": "a", "deep": {"x": "1"}})),
            "input.deep.x: expected number or null, got string"
        );
        assert!(validate(&json!(false), &json!(1)).is_err());
    }

    fn meta_error(schema: Value) -> String {
        check_schema(&schema).expect_err("not a schema").to_string()
    }

    #[test]
    fn schemas_of_every_shape_the_meta_schema_allows_pass() {
        for schema in [
            schema(),
            json!({}),
            json!(true),
            json!({"type": ["string", "null"], "x-vendor": 5, "format": "uri"}),
            json!({"items": [{"type": "string"}], "additionalItems": false}),
            json!({"anyOf": [{"type": "string"}, true], "$defs": {"a": {"type": "object"}}}),
            json!({"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5}),
            json!({"type": "number", "minimum": 0, "exclusiveMinimum": true}),
            json!({"type": "string", "minLength": 2.0, "pattern": "^a"}),
        ] {
            assert_eq!(check_schema(&schema), Ok(()), "{schema}");
        }
    }

    #[test]
    fn a_schema_that_breaks_the_meta_schema_is_named_where_and_why() {
        assert!(
            meta_error(json!({"type": 5})).starts_with("input_schema.type: must be a type name")
        );
        assert!(meta_error(json!({"type": "strin"})).starts_with("input_schema.type:"));
        assert!(meta_error(json!({"type": []})).starts_with("input_schema.type:"));
        assert!(meta_error(json!({"type": ["string", "string"]})).starts_with("input_schema.type:"));
        assert_eq!(
            meta_error(json!({"properties": {"a": {"type": "object"}, "b": {"type": 1}}})),
            "input_schema.properties.b.type: must be a type name (object, array, string, \
             number, integer, boolean, null) or a non-empty array of distinct ones, not 1"
        );
        assert_eq!(
            meta_error(json!({"properties": []})),
            "input_schema.properties: must be an object of schemas"
        );
        assert_eq!(
            meta_error(json!({"properties": {"a": 3}})),
            "input_schema.properties.a: a schema is an object or a boolean, not number"
        );
        assert_eq!(
            meta_error(json!({"required": "a"})),
            "input_schema.required: must be an array of property names (strings)"
        );
        assert_eq!(
            meta_error(json!({"items": {"minLength": -1}})),
            "input_schema.items.minLength: must be a non-negative integer"
        );
        assert_eq!(
            meta_error(json!({"anyOf": []})),
            "input_schema.anyOf: must be a non-empty array of schemas"
        );
        assert_eq!(
            meta_error(json!({"oneOf": [{}, {"enum": 1}]})),
            "input_schema.oneOf[1].enum: must be an array"
        );
        assert_eq!(
            meta_error(json!({"maximum": "5"})),
            "input_schema.maximum: must be a number"
        );
        assert_eq!(
            meta_error(json!({"multipleOf": 0})),
            "input_schema.multipleOf: must be a number greater than 0"
        );
        assert_eq!(
            meta_error(json!({"description": 1})),
            "input_schema.description: must be a string"
        );
    }
}
