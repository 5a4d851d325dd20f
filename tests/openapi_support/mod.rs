//! The served `/openapi.json` as a list of operations, and request bodies generated from their
//! schemas, so that the isolation and hardening tests cover every documented route, including
//! routes added after they were written.
#![allow(dead_code)]

use serde_json::{json, Map, Value};

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    /// `path`, `query` or `header`.
    pub location: String,
    pub required: bool,
    pub schema: Value,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub method: String,
    pub path: String,
    pub operation_id: String,
    pub params: Vec<Param>,
    /// The JSON request body schema (resolved one level), if the operation takes one.
    pub body: Option<Value>,
    pub body_required: bool,
    /// Needs the Bearer key.
    pub secured: bool,
    /// Documented response status codes.
    pub statuses: Vec<String>,
}

impl Op {
    pub fn label(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    pub fn path_params(&self) -> Vec<&Param> {
        self.params
            .iter()
            .filter(|p| p.location == "path")
            .collect()
    }

    pub fn query_params(&self) -> Vec<&Param> {
        self.params
            .iter()
            .filter(|p| p.location == "query")
            .collect()
    }

    /// The path with each `{param}` replaced by `values(name)`.
    pub fn fill(&self, values: &dyn Fn(&str) -> String) -> String {
        let mut out = String::new();
        let mut rest = self.path.as_str();
        while let Some(i) = rest.find('{') {
            out.push_str(&rest[..i]);
            let j = rest[i..].find('}').map(|j| i + j).unwrap_or(rest.len() - 1);
            out.push_str(&urlencode(&values(&rest[i + 1..j])));
            rest = &rest[j + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Properties of the request body with `format: uuid` (top level).
    pub fn body_uuid_fields(&self, doc: &Value) -> Vec<String> {
        let Some(schema) = &self.body else {
            return vec![];
        };
        let schema = resolve(doc, schema);
        schema["properties"]
            .as_object()
            .map(|props| {
                props
                    .iter()
                    .filter(|(_, s)| resolve(doc, s)["format"] == "uuid")
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Follows `$ref` (repeatedly) into `components`.
pub fn resolve<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..16 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => match r.strip_prefix('#') {
                Some(ptr) => match doc.pointer(ptr) {
                    Some(s) => schema = s,
                    None => return schema,
                },
                None => return schema,
            },
            None => return schema,
        }
    }
    schema
}

/// Every operation of the document.
pub fn operations(doc: &Value) -> Vec<Op> {
    let mut ops = Vec::new();
    let Some(paths) = doc["paths"].as_object() else {
        return ops;
    };
    for (path, item) in paths {
        let shared: Vec<Value> = item["parameters"].as_array().cloned().unwrap_or_default();
        for method in ["get", "post", "put", "patch", "delete"] {
            let Some(op) = item.get(method) else { continue };
            let params = shared
                .iter()
                .chain(op["parameters"].as_array().into_iter().flatten())
                .map(|p| resolve(doc, p))
                .map(|p| Param {
                    name: p["name"].as_str().unwrap_or_default().to_string(),
                    location: p["in"].as_str().unwrap_or_default().to_string(),
                    required: p["required"].as_bool().unwrap_or(false),
                    schema: p["schema"].clone(),
                })
                .collect();
            let body = op
                .pointer("/requestBody/content/application~1json/schema")
                .cloned();
            let secured = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
            ops.push(Op {
                method: method.to_uppercase(),
                path: path.clone(),
                operation_id: op["operationId"].as_str().unwrap_or_default().to_string(),
                params,
                body,
                body_required: op
                    .pointer("/requestBody/required")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                secured,
                statuses: op["responses"]
                    .as_object()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default(),
            });
        }
    }
    ops
}

/// A value valid for `schema` (required properties only, first enum value, minimums), with
/// `uuid` called for every UUID-formatted string so the caller decides which ids go in.
pub fn example(doc: &Value, schema: &Value, field: &str, uuid: &dyn Fn(&str) -> String) -> Value {
    let schema = resolve(doc, schema);
    if let Some(all) = schema["allOf"].as_array() {
        let mut out = Map::new();
        for s in all {
            if let Value::Object(m) = example(doc, s, field, uuid) {
                out.extend(m);
            }
        }
        return Value::Object(out);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(first) = schema[key].as_array().and_then(|a| {
            a.iter()
                .find(|s| resolve(doc, s)["type"] != "null")
                .or_else(|| a.first())
        }) {
            return example(doc, first, field, uuid);
        }
    }
    if let Some(e) = schema["enum"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(e) = schema.get("example").or_else(|| schema.get("default")) {
        if !e.is_null() {
            return e.clone();
        }
    }
    let ty = match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null")
            .to_string(),
        _ if schema.get("properties").is_some() => "object".into(),
        _ => "object".into(),
    };
    match ty.as_str() {
        "string" => match schema["format"].as_str() {
            Some("uuid") => json!(uuid(field)),
            Some("date-time") => json!("2026-01-01T00:00:00Z"),
            Some("uri") | Some("url") => json!("https://hooks.example.com/substrate"),
            Some("email") => json!("ops@example.com"),
            _ => {
                let min = schema["minLength"].as_u64().unwrap_or(1).max(1) as usize;
                json!("x".repeat(min))
            }
        },
        "integer" => json!(schema["minimum"].as_i64().unwrap_or(1).max(
            schema["exclusiveMinimum"]
                .as_i64()
                .map(|m| m + 1)
                .unwrap_or(i64::MIN)
        )),
        "number" => json!(schema["minimum"]
            .as_f64()
            .map(|m| m.max(0.5))
            .unwrap_or(0.5)
            .min(schema["maximum"].as_f64().unwrap_or(f64::MAX))),
        "boolean" => json!(true),
        "array" => {
            let n = schema["minItems"].as_u64().unwrap_or(0) as usize;
            let items = schema.get("items").cloned().unwrap_or(json!({}));
            Value::Array((0..n).map(|_| example(doc, &items, field, uuid)).collect())
        }
        "null" => Value::Null,
        _ => {
            let mut out = Map::new();
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(props) = schema["properties"].as_object() {
                for (k, s) in props {
                    if required.contains(&k.as_str()) {
                        out.insert(k.clone(), example(doc, s, k, uuid));
                    }
                }
            }
            Value::Object(out)
        }
    }
}

/// A body for `op`, or None if it takes none.
pub fn example_body(doc: &Value, op: &Op, uuid: &dyn Fn(&str) -> String) -> Option<Value> {
    op.body.as_ref().map(|s| example(doc, s, "", uuid))
}

/// Every UUID in a JSON value (strings that parse as one).
pub fn uuids_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if uuid::Uuid::parse_str(s).is_ok() && s.len() == 36 => {
            out.push(s.to_ascii_lowercase());
        }
        Value::Array(a) => a.iter().for_each(|x| uuids_in(x, out)),
        Value::Object(m) => m.values().for_each(|x| uuids_in(x, out)),
        _ => {}
    }
}

/// A problem body without its per-request field, for comparing two answers.
pub fn without_request_id(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("requestId");
    }
    v
}
