//! The route table: every compiled route of the loaded packs, indexed by method and segment
//! count so that matching a request is a short scan of pre-split templates with no allocation
//! unless a route matches.

use super::compile::template_key;
use super::records::{ExtractError, Record};
use super::{CollectionRef, CompiledRoute, Method, Pack, PackError, Segment};
use serde_json::Value;
use std::collections::HashMap;

/// All routes of the loaded packs. Immutable once built: a reload builds a new table and swaps
/// it in whole.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: Vec<CompiledRoute>,
    /// `index[method][segment count]`: route indexes, most specific template first.
    index: [Vec<Vec<u32>>; Method::COUNT],
}

/// A request matched to a route, with its path parameters (percent-decoded, as the stores'
/// routers decode them: `…/collections/a%62c` names collection `abc`).
#[derive(Debug, Clone)]
pub struct RouteMatch<'a> {
    pub route: &'a CompiledRoute,
    pub params: Vec<(&'a str, String)>,
    /// The value of the query parameter that names the collection (`collection = "?name"`).
    pub query_collection: Option<String>,
}

/// A request that reads one record back from the upstream (start-up reconciliation of writes
/// whose outcome is unknown). Send it, then look for the id in
/// `read_route.response_record_ids(&answer)`.
#[derive(Debug, Clone)]
pub struct ReadbackRequest<'a> {
    pub read_route: &'a CompiledRoute,
    pub method: &'static str,
    /// Path with the parameters filled in (percent-encoded), plus `?query` when the pack gives one.
    pub path_and_query: String,
    pub body: Option<Value>,
}

/// Indexes the routes of `packs`. Two routes (of any packs) with the same method and a template
/// that matches the same requests are a conflict, as are two packs with one name.
pub fn build_table(packs: Vec<Pack>) -> Result<RouteTable, Vec<PackError>> {
    let mut errors = Vec::new();
    let mut pack_names: HashMap<String, String> = HashMap::new();
    for p in &packs {
        if let Some(first) = pack_names.get(&p.name) {
            errors.push(PackError {
                file: p.file.clone(),
                line: None,
                path: "pack.name".into(),
                message: format!("pack name `{}` is already used by {first}", p.name),
            });
        } else {
            pack_names.insert(p.name.clone(), p.file.clone());
        }
    }

    let routes: Vec<CompiledRoute> = packs.into_iter().flat_map(|p| p.routes).collect();
    let mut seen: HashMap<(Method, Vec<Option<&str>>), &CompiledRoute> = HashMap::new();
    for r in &routes {
        let key = template_key(r.method_id, &r.segments);
        if let Some(first) = seen.get(&key) {
            errors.push(PackError {
                file: r.file.clone(),
                line: Some(r.line),
                path: format!("route[{}].path", r.index),
                message: format!(
                    "{} {} conflicts with route `{}` of pack `{}` ({}:{})",
                    r.method, r.template, first.name, first.pack, first.file, first.line
                ),
            });
        } else {
            seen.insert(key, r);
        }
    }
    drop(seen);
    if !errors.is_empty() {
        return Err(errors);
    }

    let mut index: [Vec<Vec<u32>>; Method::COUNT] = Default::default();
    for (i, r) in routes.iter().enumerate() {
        let by_count = &mut index[r.method_id as usize];
        let n = r.segments.len();
        if by_count.len() <= n {
            by_count.resize_with(n + 1, Vec::new);
        }
        by_count[n].push(i as u32);
    }
    // Where templates overlap (`/m/batch` and `/m/{id}`), the literal wins: at the first
    // segment where two templates differ, a literal sorts before a parameter.
    for by_count in index.iter_mut() {
        for bucket in by_count.iter_mut() {
            bucket.sort_by_key(|&i| {
                routes[i as usize]
                    .segments
                    .iter()
                    .map(|s| matches!(s, Segment::Param(_)))
                    .collect::<Vec<bool>>()
            });
        }
    }
    Ok(RouteTable { routes, index })
}

impl RouteTable {
    pub fn routes(&self) -> &[CompiledRoute] {
        &self.routes
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// A route by pack and route name (for the journal, which stores both).
    pub fn route(&self, pack: &str, name: &str) -> Option<&CompiledRoute> {
        self.routes
            .iter()
            .find(|r| r.pack == pack && r.name == name)
    }

    /// The route for a request, if any pack describes it. `path` may carry a query string or a
    /// fragment (ignored) and one trailing slash (ignored). Methods are case-sensitive, as in
    /// HTTP. Allocates only when a route matches (the captured parameters).
    pub fn match_route<'a>(&'a self, method: &str, path: &str) -> Option<RouteMatch<'a>> {
        let by_count = &self.index[Method::parse(method)? as usize];
        let (path, query) = match path.find(['?', '#']) {
            Some(i) => (&path[..i], path[i..].strip_prefix('?')),
            None => (path, None),
        };
        let path = if path.len() > 1 {
            path.strip_suffix('/').unwrap_or(path)
        } else {
            path
        };
        let rest = path.strip_prefix('/')?;
        let count = rest.bytes().filter(|&b| b == b'/').count() + 1;
        for &i in by_count.get(count)? {
            let route = &self.routes[i as usize];
            // Back to front: routes of one store share long prefixes and differ at the end
            // (`.../add`, `.../query`), so a miss is found at the first comparison.
            let hit = route
                .segments
                .iter()
                .rev()
                .zip(rest.rsplit('/'))
                .all(|(s, v)| match s {
                    Segment::Literal(l) => l == v,
                    Segment::Param(_) => !v.is_empty(),
                });
            if hit {
                let params: Vec<(&str, String)> = route
                    .segments
                    .iter()
                    .zip(rest.split('/'))
                    .filter_map(|(s, v)| match s {
                        Segment::Param(name) => Some((
                            name.as_str(),
                            percent_encoding::percent_decode_str(v)
                                .decode_utf8_lossy()
                                .into_owned(),
                        )),
                        Segment::Literal(_) => None,
                    })
                    .collect();
                let mut query_collection = None;
                if let (Some(CollectionRef::Query(name)), Some(q)) = (&route.collection, query) {
                    let q = q.split('#').next().unwrap_or("");
                    query_collection = url::form_urlencoded::parse(q.as_bytes())
                        .find(|(k, _)| k == name.as_str())
                        .map(|(_, v)| v.into_owned());
                }
                return Some(RouteMatch {
                    route,
                    params,
                    query_collection,
                });
            }
        }
        None
    }

    /// How to read back record `record_id` written through route `route` of `pack`, given the
    /// path parameters and collection journaled with the write. `None` when the pack gives no
    /// readback for that route or a placeholder cannot be filled.
    pub fn readback(
        &self,
        pack: &str,
        route: &str,
        params: &[(String, String)],
        collection: Option<&str>,
        record_id: &str,
    ) -> Option<ReadbackRequest<'_>> {
        let write = self.route(pack, route)?;
        let spec = write.readback.as_ref()?;
        let read = self.route(pack, &spec.route)?;
        let lookup = |name: &str| -> Option<&str> {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .or(match name {
                    "id" => Some(record_id),
                    "collection" => collection,
                    _ => None,
                })
        };
        let mut path_and_query = String::new();
        for seg in &read.segments {
            path_and_query.push('/');
            match seg {
                Segment::Literal(l) => path_and_query.push_str(l),
                Segment::Param(p) => path_and_query.push_str(&percent_encode(lookup(p)?)),
            }
        }
        if let Some(q) = &spec.query {
            path_and_query.push('?');
            path_and_query.push_str(&fill(q, &lookup, true)?);
        }
        let body = match &spec.body {
            Some(b) => Some(fill_json(b, &lookup)?),
            None => None,
        };
        Some(ReadbackRequest {
            read_route: read,
            method: read.method,
            path_and_query,
            body,
        })
    }
}

impl<'a> RouteMatch<'a> {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The collection the request writes to or reads from, as the pack says where to find it.
    pub fn collection(&self, body: &Value) -> Option<String> {
        let named = self.named_collection(body)?;
        if self.route.uuid_collections {
            if let Ok(u) = uuid::Uuid::try_parse(&named) {
                return Some(u.hyphenated().to_string());
            }
        }
        if self.route.capitalized_collections {
            let mut chars = named.chars();
            if let Some(first) = chars.next().filter(|c| c.is_lowercase()) {
                return Some(first.to_uppercase().chain(chars).collect());
            }
        }
        Some(named)
    }

    /// The collection as the request spells it.
    fn named_collection(&self, body: &Value) -> Option<String> {
        match self.route.collection.as_ref()? {
            CollectionRef::Param(p) => self.param(p).map(str::to_string),
            CollectionRef::Query(_) => self.query_collection.clone(),
            CollectionRef::Body(ptr) => match ptr.get(body)? {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            },
        }
    }

    /// [`CompiledRoute::extract_records`], plus the record id from the path when the route has
    /// an `id_param` and the body does not name the record.
    pub fn extract_records(&self, body: &Value) -> Result<Vec<Record>, ExtractError> {
        let mut records = self.route.extract_records(body)?;
        if let (Some(p), [only]) = (&self.route.id_param, records.as_mut_slice()) {
            if only.id.is_none() {
                only.id = self.param(p).map(str::to_string);
            }
        }
        Ok(records)
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Replaces `{name}` placeholders; text in braces that is not an identifier stays as written.
fn fill<'l>(s: &str, lookup: &dyn Fn(&str) -> Option<&'l str>, encode: bool) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close)
                if !after[..close].is_empty()
                    && after[..close]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                let v = lookup(&after[..close])?;
                if encode {
                    out.push_str(&percent_encode(v));
                } else {
                    out.push_str(v);
                }
                rest = &after[close + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Some(out)
}

fn fill_json<'l>(v: &Value, lookup: &dyn Fn(&str) -> Option<&'l str>) -> Option<Value> {
    Some(match v {
        Value::String(s) => Value::String(fill(s, lookup, false)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| fill_json(x, lookup))
                .collect::<Option<Vec<_>>>()?,
        ),
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m {
                out.insert(k.clone(), fill_json(x, lookup)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::{compile_pack, RouteKind};
    use super::*;
    use serde_json::json;

    const A: &str = r#"
[pack]
name = "a"
substrate = "agent_memory"

[[route]]
name = "by_id"
method = "GET"
path = "/m/{id}"
kind = "read"
layout = "single"
id = "/id"

[[route]]
name = "batch"
method = "GET"
path = "/m/batch"
kind = "read"
layout = "none"

[[route]]
name = "add"
method = "POST"
path = "/t/{tenant}/c/{collection}/add"
kind = "write"
mutation = "write_memory"
layout = "single"
id = "/id"
collection = "{collection}"
id_param = "tenant"
readback = "by_id"
readback_query = "c={collection}&x={tenant}"
readback_body = '{"ids": ["{id}"], "literal": "{not a placeholder}", "n": 1}'

[[route]]
name = "root"
method = "GET"
path = "/"
kind = "read"
layout = "none"
"#;

    fn table() -> RouteTable {
        build_table(vec![compile_pack("a.toml", A).unwrap()]).unwrap()
    }

    #[test]
    fn matches_with_params_query_and_trailing_slash() {
        let t = table();
        let m = t.match_route("POST", "/t/acme/c/docs/add?x=1").unwrap();
        assert_eq!(m.route.name, "add");
        assert_eq!(
            m.params,
            vec![("tenant", "acme".into()), ("collection", "docs".into())]
        );
        assert_eq!(m.param("collection"), Some("docs"));
        assert_eq!(m.collection(&json!({})), Some("docs".into()));
        let m2 = t.match_route("POST", "/t/acme/c/docs/add/").unwrap();
        assert_eq!(m2.params, m.params);
        assert_eq!(t.match_route("GET", "/").unwrap().route.name, "root");
        assert_eq!(t.match_route("GET", "/?q").unwrap().route.name, "root");
        assert_eq!(
            t.match_route("GET", "/m/42").unwrap().route.kind,
            RouteKind::Read
        );
    }

    #[test]
    fn non_matching_requests() {
        let t = table();
        assert!(t.match_route("GET", "/t/acme/c/docs/add").is_none());
        assert!(t.match_route("post", "/t/acme/c/docs/add").is_none());
        assert!(t.match_route("HEAD", "/m/1").is_none());
        assert!(t.match_route("POST", "/t/acme/c/docs/add/more").is_none());
        assert!(t.match_route("POST", "/t/acme/c//add").is_none());
        assert!(t.match_route("POST", "/t/acme/c/docs/ad").is_none());
        assert!(t.match_route("POST", "t/acme/c/docs/add").is_none());
        assert!(t.match_route("POST", "").is_none());
        assert!(t.match_route("GET", "/m//").is_none());
        assert!(t.match_route("GET", "/m/1/2").is_none());
    }

    #[test]
    fn literal_beats_parameter() {
        let t = table();
        assert_eq!(
            t.match_route("GET", "/m/batch").unwrap().route.name,
            "batch"
        );
        assert_eq!(
            t.match_route("GET", "/m/batches").unwrap().route.name,
            "by_id"
        );
    }

    #[test]
    fn id_from_path_param() {
        let t = table();
        let m = t.match_route("POST", "/t/acme/c/docs/add").unwrap();
        let r = m.extract_records(&json!({"text": "x"})).unwrap();
        assert_eq!(r[0].id.as_deref(), Some("acme"));
        let r = m.extract_records(&json!({"id": "own"})).unwrap();
        assert_eq!(r[0].id.as_deref(), Some("own"));
    }

    #[test]
    fn conflicts_across_packs() {
        let b = A.replace("name = \"a\"", "name = \"b\"");
        let errs = build_table(vec![
            compile_pack("a.toml", A).unwrap(),
            compile_pack("b.toml", &b).unwrap(),
        ])
        .unwrap_err();
        assert_eq!(errs.len(), 4);
        assert_eq!(
            errs[0].to_string(),
            "b.toml:6: route[0].path: GET /m/{id} conflicts with route `by_id` of pack `a` (a.toml:6)"
        );
        let errs = build_table(vec![
            compile_pack("a.toml", A).unwrap(),
            compile_pack("a2.toml", A).unwrap(),
        ])
        .unwrap_err();
        assert_eq!(errs[0].path, "pack.name");
        assert!(errs[0].message.contains("already used by a.toml"));
    }

    #[test]
    fn readback_fills_placeholders() {
        let t = table();
        let params = vec![
            ("tenant".to_string(), "a b".to_string()),
            ("collection".to_string(), "docs".to_string()),
        ];
        let rb = t
            .readback("a", "add", &params, Some("docs"), "id/1")
            .unwrap();
        assert_eq!(rb.read_route.name, "by_id");
        assert_eq!(rb.method, "GET");
        assert_eq!(rb.path_and_query, "/m/id%2F1?c=docs&x=a%20b");
        assert_eq!(
            rb.body,
            Some(json!({"ids": ["id/1"], "literal": "{not a placeholder}", "n": 1}))
        );
        assert!(t.readback("a", "by_id", &params, None, "x").is_none());
        assert!(t.readback("a", "add", &[], Some("docs"), "x").is_none());
    }
}
