//! Turns a pack's TOML text into a [`Pack`]: every value is checked against the format in
//! `filters/README.md`, and every problem is collected with its file, line and dotted path, so
//! `check-config` can list them all at once.

use super::pointer::Pointer;
use super::toml_tree::{self, Kind, Node};
use super::{
    AnnotationStyle, CollectionRef, CompiledRoute, Layout, Method, Pack, PackError, ReadbackSpec,
    RouteKind, Segment, Shape, Variant,
};
use std::collections::HashMap;
use std::ops::Range;

/// The specification's `TargetSubstrate` values.
pub const SUBSTRATES: &[&str] = &[
    "agent_memory",
    "rag_store",
    "policy_corpus",
    "document",
    "knowledge_base",
    "workflow_state",
    "review_room",
    "paper_section",
    "execution_boundary",
    "coordination_field",
    "code_substrate",
];

/// The specification's `ProposedMutation` values.
pub const MUTATIONS: &[&str] = &[
    "create_trace",
    "update_trace",
    "promote_trace",
    "canonicalize_trace",
    "write_memory",
    "update_policy",
    "update_embedding",
    "lock_document_section",
    "change_workflow_state",
    "release_action",
    "execute_tool",
    "submit_review",
    "finalize_section",
    "deploy_code",
];

const TOP_FIELDS: &[&str] = &["pack", "route"];
const PACK_FIELDS: &[&str] = &[
    "name",
    "description",
    "substrate",
    "annotation",
    "annotation_key",
    "uuid_ids",
    "uuid_collections",
    "capitalized_collections",
    "max_records",
];
const SHAPE_FIELDS: &[&str] = &[
    "layout", "records", "id", "id_alias", "text", "metadata", "parallel", "exclude", "scan",
];
const ROUTE_ONLY_FIELDS: &[&str] = &[
    "name",
    "description",
    "method",
    "path",
    "kind",
    "mutation",
    "substrate",
    "fail_open",
    "annotate",
    "merges",
    "keeps_existing",
    "annotation",
    "annotation_key",
    "collection",
    "id_param",
    "conditions",
    "metadata_path",
    "readback",
    "readback_body",
    "readback_query",
    "max_records",
    "variant",
];
const VARIANT_ONLY_FIELDS: &[&str] = &["when"];

const DEFAULT_ANNOTATION_KEY: &str = "_integrity";

struct Ctx<'t> {
    file: &'t str,
    text: &'t str,
    errors: Vec<PackError>,
}

impl<'t> Ctx<'t> {
    fn line(&self, span: &Range<usize>) -> usize {
        self.text
            .get(..span.start)
            .map(|s| s.matches('\n').count() + 1)
            .unwrap_or(1)
    }

    fn err(&mut self, span: &Range<usize>, path: impl Into<String>, message: impl Into<String>) {
        let line = self.line(span);
        self.errors.push(PackError {
            file: self.file.to_string(),
            line: Some(line),
            path: path.into(),
            message: message.into(),
        });
    }

    /// The entries of a table, with keys outside `allowed` reported as unknown fields.
    fn table<'n>(
        &mut self,
        node: &'n Node,
        path: &str,
        allowed: &[&[&str]],
    ) -> Option<&'n [(String, Node)]> {
        let Kind::Table(entries) = &node.kind else {
            self.err(
                &node.span,
                path,
                format!("expected a table, found {}", node.kind.describe()),
            );
            return None;
        };
        for (k, v) in entries {
            if !allowed.iter().any(|set| set.contains(&k.as_str())) {
                let expected: Vec<&str> = allowed.iter().flat_map(|s| s.iter().copied()).collect();
                self.err(
                    &v.span,
                    join(path, k),
                    format!(
                        "unknown field `{k}` (expected one of: {})",
                        expected.join(", ")
                    ),
                );
            }
        }
        Some(entries)
    }

    fn opt_str<'n>(
        &mut self,
        t: &'n [(String, Node)],
        path: &str,
        key: &str,
    ) -> Option<(&'n str, &'n Node)> {
        let n = get(t, key)?;
        match &n.kind {
            Kind::Str(s) => Some((s.as_str(), n)),
            k => {
                self.err(
                    &n.span,
                    join(path, key),
                    format!("expected a string, found {}", k.describe()),
                );
                None
            }
        }
    }

    fn req_str<'n>(
        &mut self,
        t: &'n [(String, Node)],
        table_span: &Range<usize>,
        path: &str,
        key: &str,
    ) -> Option<(&'n str, &'n Node)> {
        if get(t, key).is_none() {
            self.err(table_span, path, format!("missing required field `{key}`"));
            return None;
        }
        self.opt_str(t, path, key)
    }

    fn opt_bool(&mut self, t: &[(String, Node)], path: &str, key: &str) -> Option<bool> {
        let n = get(t, key)?;
        match &n.kind {
            Kind::Bool(b) => Some(*b),
            k => {
                self.err(
                    &n.span,
                    join(path, key),
                    format!("expected true or false, found {}", k.describe()),
                );
                None
            }
        }
    }

    /// A count of at least 1 (`max_records`).
    fn opt_count(&mut self, t: &[(String, Node)], path: &str, key: &str) -> Option<usize> {
        let n = get(t, key)?;
        match &n.kind {
            Kind::Int(v) if *v >= 1 => usize::try_from(*v).ok(),
            Kind::Int(v) => {
                self.err(
                    &n.span,
                    join(path, key),
                    format!("must be at least 1, found {v}"),
                );
                None
            }
            k => {
                self.err(
                    &n.span,
                    join(path, key),
                    format!("expected an integer, found {}", k.describe()),
                );
                None
            }
        }
    }

    fn opt_pointer(&mut self, t: &[(String, Node)], path: &str, key: &str) -> Option<Pointer> {
        let (s, n) = self.opt_str(t, path, key)?;
        self.pointer(s, &n.span, &join(path, key))
    }

    fn pointer(&mut self, s: &str, span: &Range<usize>, path: &str) -> Option<Pointer> {
        match Pointer::parse(s) {
            Ok(p) => Some(p),
            Err(msg) => {
                self.err(span, path, msg);
                None
            }
        }
    }

    fn opt_pointer_list(
        &mut self,
        t: &[(String, Node)],
        path: &str,
        key: &str,
    ) -> Option<Vec<Pointer>> {
        let n = get(t, key)?;
        let Kind::Array(items) = &n.kind else {
            self.err(
                &n.span,
                join(path, key),
                format!(
                    "expected an array of JSON pointers, found {}",
                    n.kind.describe()
                ),
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let p = format!("{}[{i}]", join(path, key));
            match &item.kind {
                Kind::Str(s) => {
                    if let Some(ptr) = self.pointer(s, &item.span, &p) {
                        out.push(ptr);
                    }
                }
                k => self.err(
                    &item.span,
                    p,
                    format!("expected a JSON pointer string, found {}", k.describe()),
                ),
            }
        }
        Some(out)
    }

    fn enum_value(
        &mut self,
        value: (&str, &Node),
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Option<String> {
        if allowed.contains(&value.0) {
            Some(value.0.to_string())
        } else {
            self.err(
                &value.1.span,
                path,
                format!(
                    "unknown {what} `{}` (expected one of: {})",
                    value.0,
                    allowed.join(", ")
                ),
            );
            None
        }
    }
}

fn get<'n>(t: &'n [(String, Node)], key: &str) -> Option<&'n Node> {
    t.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits a path template into segments; the error is the message for the pack author.
pub(super) fn compile_template(t: &str) -> Result<Vec<Segment>, String> {
    if !t.starts_with('/') {
        return Err("a path template must start with '/'".into());
    }
    if t.contains('?') || t.contains('#') {
        return Err("a path template has no query string or fragment".into());
    }
    if t == "/" {
        return Ok(vec![Segment::Literal(String::new())]);
    }
    if t.ends_with('/') {
        return Err(
            "a path template must not end with '/' (a trailing slash in a request matches anyway)"
                .into(),
        );
    }
    let mut segments = Vec::new();
    for seg in t[1..].split('/') {
        if seg.is_empty() {
            return Err("empty segment ('//') in path template".into());
        }
        let opens = seg.matches('{').count();
        let closes = seg.matches('}').count();
        if opens == 0 && closes == 0 {
            segments.push(Segment::Literal(seg.to_string()));
            continue;
        }
        let balanced = opens == closes && {
            // every '}' must close an open '{', with no nesting
            let mut depth = 0i32;
            seg.chars().all(|c| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                (0..=1).contains(&depth)
            })
        };
        if !balanced {
            return Err(format!("unbalanced braces in path segment `{seg}`"));
        }
        if opens != 1 || !seg.starts_with('{') || !seg.ends_with('}') {
            return Err(format!(
                "a path parameter must be a whole segment, like `{{name}}` (found `{seg}`)"
            ));
        }
        let name = &seg[1..seg.len() - 1];
        if !is_ident(name) {
            return Err(format!(
                "path parameter name `{name}` must be letters, digits and '_', not starting with a digit"
            ));
        }
        if segments
            .iter()
            .any(|s| matches!(s, Segment::Param(p) if p == name))
        {
            return Err(format!("path parameter `{name}` appears twice"));
        }
        segments.push(Segment::Param(name.to_string()));
    }
    Ok(segments)
}

/// The part of a template that decides which requests it matches: literals, and "some
/// parameter" in the parameters' places (their names do not change what matches).
pub(super) fn template_key(method: Method, segments: &[Segment]) -> (Method, Vec<Option<&str>>) {
    (
        method,
        segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => Some(l.as_str()),
                Segment::Param(_) => None,
            })
            .collect(),
    )
}

struct PackDefaults {
    name: String,
    substrate: String,
    annotation: AnnotationStyle,
    annotation_key: String,
    uuid_ids: bool,
    uuid_collections: bool,
    capitalized_collections: bool,
    max_records: Option<usize>,
}

/// What is known of a route for the pack-wide checks, even when the route itself failed.
struct RouteIdent {
    index: usize,
    line: usize,
    name: Option<String>,
    name_span: Range<usize>,
    key: Option<(Method, Vec<Segment>, String)>,
    path_span: Range<usize>,
    readback_span: Range<usize>,
}

/// Compiles one pack. `file_name` is only used in messages, so inline packs from a config can
/// pass something like `config.toml:packs[0]`.
pub fn compile_pack(file_name: &str, toml_text: &str) -> Result<Pack, Vec<PackError>> {
    let mut ctx = Ctx {
        file: file_name,
        text: toml_text,
        errors: Vec::new(),
    };
    let root = match toml_tree::parse(toml_text) {
        Ok(root) => root,
        Err((message, span)) => {
            let line = span.map(|s| ctx.line(&s));
            return Err(vec![PackError {
                file: file_name.to_string(),
                line,
                path: String::new(),
                message,
            }]);
        }
    };
    let Some(top) = ctx.table(&root, "", &[TOP_FIELDS]) else {
        return Err(ctx.errors);
    };

    let defaults = match get(top, "pack") {
        None => {
            ctx.err(&(0..0), "pack", "missing [pack] table");
            None
        }
        Some(node) => compile_header(&mut ctx, node),
    };

    let mut routes = Vec::new();
    let mut idents = Vec::new();
    match get(top, "route") {
        None => ctx.err(
            &(toml_text.len()..toml_text.len()),
            "route",
            "a pack needs at least one [[route]]",
        ),
        Some(node) => match &node.kind {
            Kind::Array(items) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    let (route, ident) = compile_route(&mut ctx, item, i, defaults.as_ref());
                    idents.push(ident);
                    if let Some(r) = route {
                        routes.push((i, r));
                    }
                }
            }
            Kind::Array(_) => ctx.err(&node.span, "route", "a pack needs at least one [[route]]"),
            k => ctx.err(
                &node.span,
                "route",
                format!("expected [[route]] tables, found {}", k.describe()),
            ),
        },
    }

    check_duplicates(&mut ctx, &idents);
    check_readbacks(&mut ctx, &routes, &idents);

    match defaults {
        Some(d) if ctx.errors.is_empty() => Ok(Pack {
            name: d.name,
            description: pack_description(top),
            file: file_name.to_string(),
            substrate: d.substrate,
            routes: routes.into_iter().map(|(_, r)| r).collect(),
        }),
        _ => Err(ctx.errors),
    }
}

fn pack_description(top: &[(String, Node)]) -> String {
    match get(top, "pack").map(|n| &n.kind) {
        Some(Kind::Table(t)) => match get(t, "description").map(|n| &n.kind) {
            Some(Kind::Str(s)) => s.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

fn compile_header(ctx: &mut Ctx, node: &Node) -> Option<PackDefaults> {
    let t = ctx.table(node, "pack", &[PACK_FIELDS])?;
    let before = ctx.errors.len();
    let name = ctx
        .req_str(t, &node.span, "pack", "name")
        .and_then(|(s, n)| {
            let ok = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
            if !ok {
                ctx.err(
                    &n.span,
                    "pack.name",
                    "a pack name is lowercase letters, digits, '-' and '_'",
                );
            }
            ok.then(|| s.to_string())
        });
    ctx.opt_str(t, "pack", "description");
    let substrate = ctx
        .req_str(t, &node.span, "pack", "substrate")
        .and_then(|v| ctx.enum_value(v, "pack.substrate", "substrate", SUBSTRATES));
    let annotation = annotation_style(ctx, t, "pack").unwrap_or(AnnotationStyle::Nested);
    let annotation_key =
        annotation_key(ctx, t, "pack").unwrap_or_else(|| DEFAULT_ANNOTATION_KEY.to_string());
    let uuid_ids = ctx.opt_bool(t, "pack", "uuid_ids").unwrap_or(false);
    let uuid_collections = ctx.opt_bool(t, "pack", "uuid_collections").unwrap_or(false);
    let capitalized_collections = ctx
        .opt_bool(t, "pack", "capitalized_collections")
        .unwrap_or(false);
    let max_records = ctx.opt_count(t, "pack", "max_records");
    if ctx.errors.len() != before {
        return None;
    }
    Some(PackDefaults {
        name: name?,
        substrate: substrate?,
        annotation,
        annotation_key,
        uuid_ids,
        uuid_collections,
        capitalized_collections,
        max_records,
    })
}

fn annotation_style(ctx: &mut Ctx, t: &[(String, Node)], path: &str) -> Option<AnnotationStyle> {
    let (s, n) = ctx.opt_str(t, path, "annotation")?;
    match s {
        "nested" => Some(AnnotationStyle::Nested),
        "flat" => Some(AnnotationStyle::Flat),
        other => {
            ctx.err(
                &n.span,
                join(path, "annotation"),
                format!("unknown annotation style `{other}` (expected nested or flat)"),
            );
            None
        }
    }
}

fn annotation_key(ctx: &mut Ctx, t: &[(String, Node)], path: &str) -> Option<String> {
    let (s, n) = ctx.opt_str(t, path, "annotation_key")?;
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        ctx.err(
            &n.span,
            join(path, "annotation_key"),
            "an annotation key is letters, digits and '_'",
        );
        return None;
    }
    Some(s.to_string())
}

fn compile_route(
    ctx: &mut Ctx,
    node: &Node,
    index: usize,
    defaults: Option<&PackDefaults>,
) -> (Option<CompiledRoute>, RouteIdent) {
    let path = format!("route[{index}]");
    let mut ident = RouteIdent {
        index,
        line: ctx.line(&node.span),
        name: None,
        name_span: node.span.clone(),
        key: None,
        path_span: node.span.clone(),
        readback_span: node.span.clone(),
    };
    let before = ctx.errors.len();
    let Some(t) = ctx.table(node, &path, &[ROUTE_ONLY_FIELDS, SHAPE_FIELDS]) else {
        return (None, ident);
    };

    let name = ctx
        .req_str(t, &node.span, &path, "name")
        .and_then(|(s, n)| {
            ident.name_span = n.span.clone();
            let ok = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                ctx.err(
                    &n.span,
                    join(&path, "name"),
                    "a route name is letters, digits, '_', '-' and '.'",
                );
            }
            ok.then(|| s.to_string())
        });
    ident.name = name.clone();
    ctx.opt_str(t, &path, "description");

    let method = ctx
        .req_str(t, &node.span, &path, "method")
        .and_then(|(s, n)| {
            let m = Method::parse(s);
            if m.is_none() {
                ctx.err(
                    &n.span,
                    join(&path, "method"),
                    format!("unknown method `{s}` (expected GET, POST, PUT, PATCH or DELETE)"),
                );
            }
            m
        });
    let template = ctx
        .req_str(t, &node.span, &path, "path")
        .and_then(|(s, n)| {
            ident.path_span = n.span.clone();
            match compile_template(s) {
                Ok(segs) => Some((s.to_string(), segs)),
                Err(msg) => {
                    ctx.err(&n.span, join(&path, "path"), msg);
                    None
                }
            }
        });
    if let (Some(m), Some((raw, segs))) = (method, template.as_ref()) {
        ident.key = Some((m, segs.clone(), raw.clone()));
    }

    let kind = ctx
        .req_str(t, &node.span, &path, "kind")
        .and_then(|(s, n)| match s {
            "write" => Some(RouteKind::Write),
            "delete" => Some(RouteKind::Delete),
            "read" => Some(RouteKind::Read),
            "forward" => Some(RouteKind::Forward),
            other => {
                ctx.err(
                    &n.span,
                    join(&path, "kind"),
                    format!("unknown kind `{other}` (expected write, delete, read or forward)"),
                );
                None
            }
        });
    if kind == Some(RouteKind::Forward) {
        let (pack, substrate) = defaults
            .map(|d| (d.name.clone(), d.substrate.clone()))
            .unwrap_or_default();
        let names = (pack, substrate, name);
        return compile_forward(ctx, t, &path, names, method, template, ident, before);
    }

    let mutation = match (ctx.opt_str(t, &path, "mutation"), kind) {
        (Some((_, n)), Some(RouteKind::Read)) => {
            ctx.err(
                &n.span,
                join(&path, "mutation"),
                "a read route takes no mutation",
            );
            None
        }
        (Some(v), _) => ctx.enum_value(v, &join(&path, "mutation"), "mutation", MUTATIONS),
        (None, Some(RouteKind::Write | RouteKind::Delete)) => {
            if get(t, "mutation").is_none() {
                ctx.err(
                    &node.span,
                    &path,
                    "missing required field `mutation` (write and delete routes name the spec's ProposedMutation)",
                );
            }
            None
        }
        (None, _) => None,
    };

    let substrate = match ctx.opt_str(t, &path, "substrate") {
        Some(v) => ctx.enum_value(v, &join(&path, "substrate"), "substrate", SUBSTRATES),
        None => defaults.map(|d| d.substrate.clone()),
    };

    let fail_open = ctx.opt_bool(t, &path, "fail_open");
    if let (Some(_), Some(RouteKind::Read)) = (fail_open, kind) {
        if let Some(n) = get(t, "fail_open") {
            ctx.err(
                &n.span,
                join(&path, "fail_open"),
                "fail_open only applies to write and delete routes (reads never wait on the kernel)",
            );
        }
    }
    let annotate = ctx.opt_bool(t, &path, "annotate").unwrap_or(false);
    let max_records = ctx
        .opt_count(t, &path, "max_records")
        .or(defaults.and_then(|d| d.max_records));
    let annotation = annotation_style(ctx, t, &path)
        .or(defaults.map(|d| d.annotation))
        .unwrap_or(AnnotationStyle::Nested);
    let annotation_key = annotation_key(ctx, t, &path)
        .or_else(|| defaults.map(|d| d.annotation_key.clone()))
        .unwrap_or_else(|| DEFAULT_ANNOTATION_KEY.to_string());

    let params: Vec<&str> = template
        .as_ref()
        .map(|(_, segs)| {
            segs.iter()
                .filter_map(|s| match s {
                    Segment::Param(p) => Some(p.as_str()),
                    Segment::Literal(_) => None,
                })
                .collect()
        })
        .unwrap_or_default();

    let collection = ctx.opt_str(t, &path, "collection").and_then(|(s, n)| {
        let p = join(&path, "collection");
        if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            if template.is_some() && !params.contains(&inner) {
                ctx.err(
                    &n.span,
                    p,
                    format!("`{{{inner}}}` is not a parameter of this route's path"),
                );
                return None;
            }
            Some(CollectionRef::Param(inner.to_string()))
        } else if s.starts_with('/') {
            ctx.pointer(s, &n.span, &p).map(CollectionRef::Body)
        } else if let Some(q) = s.strip_prefix('?').filter(|q| !q.is_empty() && !q.contains(['&', '='])) {
            Some(CollectionRef::Query(q.to_string()))
        } else {
            ctx.err(
                &n.span,
                p,
                "collection is `{param}` (a path parameter), `?name` (a query parameter) or a JSON pointer into the body",
            );
            None
        }
    });

    let id_param = ctx.opt_str(t, &path, "id_param").and_then(|(s, n)| {
        if template.is_some() && !params.contains(&s) {
            ctx.err(
                &n.span,
                join(&path, "id_param"),
                format!("`{s}` is not a parameter of this route's path"),
            );
            return None;
        }
        Some(s.to_string())
    });

    let metadata_path = ctx.opt_pointer(t, &path, "metadata_path");
    let conditions = ctx.opt_pointer_list(t, &path, "conditions");
    if let (Some(_), Some(RouteKind::Write | RouteKind::Read)) = (&conditions, kind) {
        if let Some(n) = get(t, "conditions") {
            ctx.err(
                &n.span,
                join(&path, "conditions"),
                "conditions only apply to delete routes (a filter that narrows the named ids)",
            );
        }
    }

    let shape = compile_shape(ctx, t, &node.span, &path, kind, false);
    let merges = ctx.opt_bool(t, &path, "merges").unwrap_or(false);
    let keeps_existing = ctx.opt_bool(t, &path, "keeps_existing").unwrap_or(false);
    if keeps_existing && kind.is_some_and(|k| k != RouteKind::Write) {
        if let Some(n) = get(t, "keeps_existing") {
            ctx.err(
                &n.span,
                join(&path, "keeps_existing"),
                "keeps_existing only applies to write routes (an insert the store ignores for an id it holds)",
            );
        }
    }
    if merges && !annotate {
        if let Some(n) = get(t, "merges") {
            ctx.err(
                &n.span,
                join(&path, "merges"),
                "merges = true needs annotate = true (it says which records get annotations)",
            );
        }
    }
    if let Some(n) = get(t, "annotate") {
        if annotate {
            if let Some(s) = &shape {
                if s.metadata.is_none() {
                    ctx.err(
                        &n.span,
                        join(&path, "annotate"),
                        "annotate = true needs `metadata` (where the annotation goes)",
                    );
                }
            }
        }
    }

    let mut variants = Vec::new();
    if let Some(vn) = get(t, "variant") {
        match &vn.kind {
            Kind::Array(items) => {
                if matches!(&shape, Some(s) if s.layout == Layout::Ndjson) {
                    ctx.err(
                        &vn.span,
                        join(&path, "variant"),
                        "an ndjson route cannot have variants (they are chosen by looking into a JSON body)",
                    );
                }
                for (j, item) in items.iter().enumerate() {
                    let vpath = format!("{path}.variant[{j}]");
                    let Some(vt) = ctx.table(item, &vpath, &[VARIANT_ONLY_FIELDS, SHAPE_FIELDS])
                    else {
                        continue;
                    };
                    let when = ctx
                        .req_str(vt, &item.span, &vpath, "when")
                        .and_then(|(s, n)| {
                            let p = ctx.pointer(s, &n.span, &join(&vpath, "when"))?;
                            if p.is_root() {
                                ctx.err(
                                    &n.span,
                                    join(&vpath, "when"),
                                    "`when` names a member of the body, not the whole body",
                                );
                                return None;
                            }
                            Some(p)
                        });
                    let vshape = compile_shape(ctx, vt, &item.span, &vpath, kind, true);
                    if annotate {
                        if let Some(s) = &vshape {
                            if s.metadata.is_none() {
                                ctx.err(
                                    &item.span,
                                    &vpath,
                                    "the route has annotate = true, so each variant needs `metadata`",
                                );
                            }
                        }
                    }
                    if let (Some(when), Some(shape)) = (when, vshape) {
                        variants.push(Variant { when, shape });
                    }
                }
            }
            k => ctx.err(
                &vn.span,
                join(&path, "variant"),
                format!("expected [[route.variant]] tables, found {}", k.describe()),
            ),
        }
    }

    let readback = compile_readback(ctx, t, &path, kind, &mut ident);

    if ctx.errors.len() != before {
        return (None, ident);
    }
    let (
        Some(name),
        Some(method),
        Some((template, segments)),
        Some(kind),
        Some(substrate),
        Some(shape),
    ) = (name, method, template, kind, substrate, shape)
    else {
        return (None, ident);
    };
    let route = CompiledRoute {
        pack: defaults.map(|d| d.name.clone()).unwrap_or_default(),
        name,
        kind,
        mutation,
        substrate,
        fail_open: fail_open.unwrap_or(false),
        annotate,
        merges,
        keeps_existing,
        annotation,
        annotation_key,
        uuid_ids: defaults.is_some_and(|d| d.uuid_ids),
        uuid_collections: defaults.is_some_and(|d| d.uuid_collections),
        capitalized_collections: defaults.is_some_and(|d| d.capitalized_collections),
        max_records,
        collection,
        id_param,
        conditions: conditions.unwrap_or_default(),
        metadata_path,
        method: method.as_str(),
        template,
        shape,
        variants,
        file: ctx.file.to_string(),
        line: ident.line,
        index,
        method_id: method,
        segments,
        readback,
    };
    (Some(route), ident)
}

/// The fields a `forward` route takes: it is forwarded as it is, so nothing about records.
const FORWARD_FIELDS: &[&str] = &["name", "description", "method", "path", "kind"];

#[allow(clippy::too_many_arguments)]
fn compile_forward(
    ctx: &mut Ctx,
    t: &[(String, Node)],
    path: &str,
    (pack, substrate, name): (String, String, Option<String>),
    method: Option<Method>,
    template: Option<(String, Vec<Segment>)>,
    ident: RouteIdent,
    errors_before: usize,
) -> (Option<CompiledRoute>, RouteIdent) {
    for (key, n) in t {
        if !FORWARD_FIELDS.contains(&key.as_str()) {
            ctx.err(
                &n.span,
                join(path, key),
                format!("a forward route is forwarded as it is: `{key}` does not apply"),
            );
        }
    }
    if let (Some(Method::Get), Some(n)) = (method, get(t, "method")) {
        ctx.err(
            &n.span,
            join(path, "method"),
            "a GET is always forwarded: a forward route describes a POST, PUT, PATCH or DELETE",
        );
    }
    if ctx.errors.len() != errors_before {
        return (None, ident);
    }
    let (Some(name), Some(method), Some((template, segments)), Some(root)) =
        (name, method, template, Pointer::parse("").ok())
    else {
        return (None, ident);
    };
    let route = CompiledRoute {
        pack,
        name,
        kind: RouteKind::Forward,
        mutation: None,
        substrate,
        fail_open: false,
        annotate: false,
        merges: false,
        keeps_existing: false,
        annotation: AnnotationStyle::Nested,
        annotation_key: DEFAULT_ANNOTATION_KEY.to_string(),
        uuid_ids: false,
        uuid_collections: false,
        capitalized_collections: false,
        max_records: None,
        collection: None,
        id_param: None,
        conditions: Vec::new(),
        metadata_path: None,
        method: method.as_str(),
        template,
        shape: Shape {
            layout: Layout::None,
            records: root,
            id: None,
            id_alias: None,
            text: None,
            metadata: None,
            lockstep: Vec::new(),
            exclude: Vec::new(),
            scan: Vec::new(),
        },
        variants: Vec::new(),
        file: ctx.file.to_string(),
        line: ident.line,
        index: ident.index,
        method_id: method,
        segments,
        readback: None,
    };
    (Some(route), ident)
}

fn compile_readback(
    ctx: &mut Ctx,
    t: &[(String, Node)],
    path: &str,
    kind: Option<RouteKind>,
    ident: &mut RouteIdent,
) -> Option<ReadbackSpec> {
    let route = ctx.opt_str(t, path, "readback");
    let body = ctx.opt_str(t, path, "readback_body");
    let query = ctx.opt_str(t, path, "readback_query");
    let Some((route, rn)) = route else {
        for (key, v) in [("readback_body", body), ("readback_query", query)] {
            if let Some((_, n)) = v {
                ctx.err(
                    &n.span,
                    join(path, key),
                    "only used together with `readback`",
                );
            }
        }
        return None;
    };
    ident.readback_span = rn.span.clone();
    if kind == Some(RouteKind::Read) {
        ctx.err(
            &rn.span,
            join(path, "readback"),
            "readback applies to write and delete routes",
        );
        return None;
    }
    let body = match body {
        None => None,
        Some((s, n)) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(v) => Some(v),
            Err(e) => {
                ctx.err(
                    &n.span,
                    join(path, "readback_body"),
                    format!("not JSON: {e}"),
                );
                return None;
            }
        },
    };
    Some(ReadbackSpec {
        route: route.to_string(),
        body,
        query: query.map(|(s, _)| s.to_string()),
    })
}

fn compile_shape(
    ctx: &mut Ctx,
    t: &[(String, Node)],
    table_span: &Range<usize>,
    path: &str,
    kind: Option<RouteKind>,
    in_variant: bool,
) -> Option<Shape> {
    let before = ctx.errors.len();
    let layout = ctx
        .req_str(t, table_span, path, "layout")
        .and_then(|(s, n)| {
            let l = match s {
                "columnar" => Layout::Columnar,
                "rows" => Layout::Rows,
                "single" => Layout::Single,
                "ndjson" => Layout::Ndjson,
                "none" => Layout::None,
                other => {
                    ctx.err(
                        &n.span,
                        join(path, "layout"),
                        format!(
                            "unknown layout `{other}` (expected columnar, rows, single, ndjson or none)"
                        ),
                    );
                    return None;
                }
            };
            let problem = match (l, kind) {
                (Layout::None, Some(RouteKind::Write)) => Some(
                    "a write route carries records: layout \"none\" is for delete and read routes",
                ),
                (Layout::Ndjson, Some(RouteKind::Read)) => {
                    Some("layout \"ndjson\" is for request bodies, not read answers")
                }
                (Layout::Ndjson, _) if in_variant => Some(
                    "a variant cannot be ndjson (the body format must be known before parsing)",
                ),
                _ => None,
            };
            if let Some(msg) = problem {
                ctx.err(&n.span, join(path, "layout"), msg);
            }
            Some(l)
        });
    let records = ctx.opt_pointer(t, path, "records");
    let id = ctx.opt_pointer(t, path, "id");
    let id_alias = ctx.opt_pointer(t, path, "id_alias");
    let text = ctx.opt_pointer(t, path, "text");
    let metadata = ctx.opt_pointer(t, path, "metadata");
    let parallel = ctx.opt_pointer_list(t, path, "parallel");
    let exclude = ctx.opt_pointer_list(t, path, "exclude");
    let scan = ctx.opt_pointer_list(t, path, "scan");

    let layout = layout?;
    let unused: &[&str] = match layout {
        Layout::None => &[
            "records", "id", "id_alias", "text", "metadata", "parallel", "exclude", "scan",
        ],
        Layout::Columnar => &["records", "exclude", "id_alias"],
        Layout::Rows | Layout::Single => &["parallel"],
        Layout::Ndjson => &["records", "parallel"],
    };
    for key in unused {
        if let Some(n) = get(t, key) {
            ctx.err(
                &n.span,
                join(path, key),
                format!("`{key}` is not used by layout \"{}\"", layout.as_str()),
            );
        }
    }
    if layout == Layout::Columnar && get(t, "id").is_none() {
        ctx.err(
            table_span,
            path,
            "layout \"columnar\" needs `id`: the pointer to the ids array",
        );
    }
    if layout == Layout::Rows && get(t, "records").is_none() {
        ctx.err(
            table_span,
            path,
            "layout \"rows\" needs `records`: the pointer to the array of records",
        );
    }
    if ctx.errors.len() != before {
        return None;
    }

    let mut lockstep: Vec<Pointer> = Vec::new();
    if layout == Layout::Columnar {
        for p in [&id, &text, &metadata]
            .into_iter()
            .flatten()
            .chain(parallel.iter().flatten())
            .chain(scan.iter().flatten())
        {
            if !lockstep.contains(p) {
                lockstep.push(p.clone());
            }
        }
    }
    let root = Pointer::parse("").ok()?;
    Some(Shape {
        layout,
        records: records.unwrap_or(root),
        id,
        id_alias,
        text,
        metadata,
        lockstep,
        exclude: exclude.unwrap_or_default(),
        scan: scan.unwrap_or_default(),
    })
}

fn check_duplicates(ctx: &mut Ctx, idents: &[RouteIdent]) {
    let mut names: HashMap<&str, &RouteIdent> = HashMap::new();
    let mut keys: HashMap<(Method, Vec<Option<&str>>), &RouteIdent> = HashMap::new();
    for id in idents {
        if let Some(name) = &id.name {
            if let Some(first) = names.get(name.as_str()) {
                ctx.err(
                    &id.name_span,
                    format!("route[{}].name", id.index),
                    format!(
                        "duplicate route name `{name}` (first used by route[{}] on line {})",
                        first.index, first.line
                    ),
                );
            } else {
                names.insert(name, id);
            }
        }
        if let Some((m, segs, raw)) = &id.key {
            let key = template_key(*m, segs);
            if let Some(first) = keys.get(&key) {
                ctx.err(
                    &id.path_span,
                    format!("route[{}].path", id.index),
                    format!(
                        "duplicate route: {} {raw} already matched by route[{}] on line {}",
                        m.as_str(),
                        first.index,
                        first.line
                    ),
                );
            } else {
                keys.insert(key, id);
            }
        }
    }
}

fn check_readbacks(ctx: &mut Ctx, routes: &[(usize, CompiledRoute)], idents: &[RouteIdent]) {
    for (i, r) in routes {
        let Some(spec) = &r.readback else { continue };
        let span = idents
            .iter()
            .find(|id| id.index == *i)
            .map(|id| id.readback_span.clone())
            .unwrap_or(0..0);
        let path = format!("route[{i}].readback");
        let Some((_, target)) = routes.iter().find(|(_, t)| t.name == spec.route) else {
            // The target may exist but have failed to compile; its own error is reported.
            if !idents
                .iter()
                .any(|id| id.name.as_deref() == Some(spec.route.as_str()))
            {
                ctx.err(
                    &span,
                    path,
                    format!("no route named `{}` in this pack", spec.route),
                );
            }
            continue;
        };
        if target.kind != RouteKind::Read {
            ctx.err(
                &span,
                path,
                format!("route `{}` is not a read route", spec.route),
            );
            continue;
        }
        let own: Vec<&str> = r.param_names().collect();
        for p in target.param_names() {
            let ok = own.contains(&p) || p == "id" || (p == "collection" && r.collection.is_some());
            if !ok {
                ctx.err(
                    &span,
                    path.clone(),
                    format!(
                        "route `{}` needs path parameter `{p}`, which this route cannot supply (it has {:?}, `id` and `collection`)",
                        spec.route, own
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[pack]
name = "mini"
substrate = "rag_store"

[[route]]
name = "add"
method = "POST"
path = "/c/{collection}/add"
kind = "write"
mutation = "update_embedding"
layout = "columnar"
id = "/ids"
"#;

    fn errors(text: &str) -> Vec<PackError> {
        match compile_pack("filters/t.toml", text) {
            Ok(_) => panic!("expected errors"),
            Err(e) => e,
        }
    }

    /// Replaces the first occurrence of `from` in the minimal pack.
    fn minimal_with(from: &str, to: &str) -> String {
        assert!(MINIMAL.contains(from), "{from}");
        MINIMAL.replacen(from, to, 1)
    }

    fn only(errs: &[PackError]) -> &PackError {
        assert_eq!(errs.len(), 1, "{errs:#?}");
        &errs[0]
    }

    #[test]
    fn minimal_compiles() {
        let p = compile_pack("filters/t.toml", MINIMAL).unwrap();
        assert_eq!(p.name, "mini");
        assert_eq!(p.routes.len(), 1);
        let r = &p.routes[0];
        assert_eq!(r.pack, "mini");
        assert_eq!(r.kind, RouteKind::Write);
        assert_eq!(r.mutation.as_deref(), Some("update_embedding"));
        assert_eq!(r.substrate, "rag_store");
        assert!(!r.fail_open && !r.annotate);
        assert_eq!(r.line, 6);
        assert_eq!(r.annotation_key, "_integrity");
    }

    #[test]
    fn forward_routes_take_a_method_and_a_path_only() {
        let forward = |extra: &str, method: &str| {
            format!(
                "{MINIMAL}\n[[route]]\nname = \"create_db\"\nmethod = \"{method}\"\npath = \"/db/{{name}}\"\nkind = \"forward\"\n{extra}"
            )
        };
        let p = compile_pack("filters/t.toml", &forward("", "POST")).unwrap();
        let r = &p.routes[1];
        assert_eq!((r.kind, r.pack.as_str()), (RouteKind::Forward, "mini"));
        assert!(r.mutation.is_none() && !r.treats_response());
        let t = crate::filters::build_table(vec![p]).unwrap();
        assert_eq!(
            t.match_route("POST", "/db/x").unwrap().route.kind,
            RouteKind::Forward
        );

        let errs = errors(&forward(
            "layout = \"columnar\"\nmutation = \"write_memory\"",
            "POST",
        ));
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert!(errs
            .iter()
            .all(|e| e.message.contains("a forward route is forwarded as it is")));
        let e = only_owned(errors(&forward("", "GET")));
        assert_eq!(e.path, "route[1].method");
        assert!(e.message.contains("a GET is always forwarded"), "{e:?}");
    }

    fn only_owned(errs: Vec<PackError>) -> PackError {
        assert_eq!(errs.len(), 1, "{errs:#?}");
        errs.into_iter().next().unwrap()
    }

    #[test]
    fn max_records_from_the_route_else_the_pack() {
        let p = compile_pack("filters/t.toml", MINIMAL).unwrap();
        assert_eq!(p.routes[0].max_records, None);
        let text = minimal_with(
            "substrate = \"rag_store\"",
            "substrate = \"rag_store\"\nmax_records = 100",
        );
        let p = compile_pack("filters/t.toml", &text).unwrap();
        assert_eq!(p.routes[0].max_records, Some(100));
        let text = format!("{text}max_records = 7\n");
        let p = compile_pack("filters/t.toml", &text).unwrap();
        assert_eq!(p.routes[0].max_records, Some(7));
        for (bad, message) in [
            ("0", "must be at least 1, found 0"),
            ("-5", "must be at least 1, found -5"),
            ("\"many\"", "expected an integer, found a string"),
            ("1.5", "expected an integer, found a float"),
        ] {
            let errs = errors(&format!("{MINIMAL}max_records = {bad}\n"));
            let e = only(&errs);
            assert_eq!(e.path, "route[0].max_records", "{bad}");
            assert_eq!(e.message, message, "{bad}");
        }
    }

    #[test]
    fn bad_pointer() {
        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\ntext = \"documents\"",
        ));
        let e = only(&errs);
        assert_eq!(e.line, Some(14));
        assert_eq!(e.path, "route[0].text");
        assert_eq!(
            e.to_string(),
            "filters/t.toml:14: route[0].text: not a JSON pointer (must start with '/')"
        );
        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nparallel = [\"/a\", \"/b~2\"]",
        ));
        assert_eq!(only(&errs).path, "route[0].parallel[1]");
        assert_eq!(only(&errs).line, Some(14));
    }

    #[test]
    fn bad_method_kind_layout() {
        let errs = errors(&minimal_with("\"POST\"", "\"FETCH\""));
        let e = only(&errs);
        assert_eq!((e.line, e.path.as_str()), (Some(8), "route[0].method"));
        assert!(e.message.contains("unknown method `FETCH`"));

        let errs = errors(&minimal_with("\"write\"", "\"mutate\""));
        let e = &errs[0];
        assert_eq!((e.line, e.path.as_str()), (Some(10), "route[0].kind"));
        assert!(e
            .message
            .contains("expected write, delete, read or forward"));

        let errs = errors(&minimal_with("\"columnar\"", "\"columns\""));
        let e = only(&errs);
        assert_eq!((e.line, e.path.as_str()), (Some(12), "route[0].layout"));
    }

    #[test]
    fn unknown_fields_everywhere_are_all_reported() {
        let text = minimal_with(
            "substrate = \"rag_store\"",
            "substrate = \"rag_store\"\ncolour = 1",
        )
        .replacen("id = \"/ids\"", "id = \"/ids\"\nidz = \"/x\"", 1)
            + "\n[extra]\nx = 1\n";
        let errs = errors(&text);
        let got: Vec<(Option<usize>, &str)> =
            errs.iter().map(|e| (e.line, e.path.as_str())).collect();
        assert!(got.contains(&(Some(5), "pack.colour")), "{errs:#?}");
        assert!(got.contains(&(Some(15), "route[0].idz")), "{errs:#?}");
        assert!(got.contains(&(Some(17), "extra")), "{errs:#?}");
        assert_eq!(errs.len(), 3);
        assert!(
            errs[0].message.starts_with("unknown field `extra`")
                || errs
                    .iter()
                    .any(|e| e.message.starts_with("unknown field `colour`"))
        );
    }

    #[test]
    fn duplicate_routes_and_names() {
        let text = format!(
            "{MINIMAL}\n[[route]]\nname = \"add\"\nmethod = \"POST\"\npath = \"/c/{{other}}/add\"\nkind = \"write\"\nmutation = \"update_embedding\"\nlayout = \"columnar\"\nid = \"/ids\"\n"
        );
        let errs = errors(&text);
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert_eq!(errs[0].path, "route[1].name");
        assert_eq!(errs[0].line, Some(16));
        assert!(errs[0].message.contains("duplicate route name `add`"));
        assert_eq!(errs[1].path, "route[1].path");
        assert_eq!(errs[1].line, Some(18));
        assert!(errs[1]
            .message
            .contains("already matched by route[0] on line 6"));
    }

    #[test]
    fn template_problems() {
        for (tpl, needle) in [
            ("/c/{collection/add", "unbalanced braces"),
            ("/c/collection}/add", "unbalanced braces"),
            ("/c/}{x/add", "unbalanced braces"),
            ("/c/x{collection}/add", "whole segment"),
            ("/c/{}/add", "parameter name ``"),
            ("/c/{a-b}/add", "parameter name `a-b`"),
            ("/c/{a}/{a}", "appears twice"),
            ("c/{a}", "must start with '/'"),
            ("/c/{a}/", "must not end with '/'"),
            ("/c//{a}", "empty segment"),
            ("/c/{a}?x=1", "no query string"),
        ] {
            let errs = errors(&minimal_with("/c/{collection}/add", tpl));
            let e = &errs[0];
            assert_eq!(
                (e.line, e.path.as_str()),
                (Some(9), "route[0].path"),
                "{tpl}"
            );
            assert!(e.message.contains(needle), "{tpl}: {}", e.message);
        }
    }

    #[test]
    fn unknown_substrate_and_mutation() {
        let errs = errors(&minimal_with("\"rag_store\"", "\"vector_db\""));
        let e = only(&errs);
        assert_eq!((e.line, e.path.as_str()), (Some(4), "pack.substrate"));
        assert!(e.message.contains("unknown substrate `vector_db`"));
        assert!(e.message.contains("agent_memory"));

        let errs = errors(&minimal_with("\"update_embedding\"", "\"insert\""));
        let e = only(&errs);
        assert_eq!((e.line, e.path.as_str()), (Some(11), "route[0].mutation"));
        assert!(e.message.contains("unknown mutation `insert`"));

        let errs = errors(&minimal_with(
            "kind = \"write\"",
            "kind = \"write\"\nsubstrate = \"cache\"",
        ));
        assert_eq!(only(&errs).path, "route[0].substrate");
    }

    #[test]
    fn missing_fields_point_at_the_table() {
        let errs = errors(&minimal_with("mutation = \"update_embedding\"\n", ""));
        let e = only(&errs);
        assert_eq!((e.line, e.path.as_str()), (Some(6), "route[0]"));
        assert!(e.message.contains("missing required field `mutation`"));

        let errs = errors(&minimal_with("id = \"/ids\"\n", ""));
        assert!(only(&errs).message.contains("needs `id`"));

        let errs = errors("[pack]\nname = \"x\"\n");
        assert!(errs
            .iter()
            .any(|e| e.path == "pack" && e.message.contains("`substrate`") && e.line == Some(1)));
        assert!(errs
            .iter()
            .any(|e| e.path == "route" && e.message.contains("at least one")));
    }

    #[test]
    fn type_and_layout_rules() {
        let errs = errors(&minimal_with("id = \"/ids\"", "id = 3"));
        assert!(
            errs.iter()
                .any(|e| e.path == "route[0].id"
                    && e.message == "expected a string, found an integer")
        );

        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nrecords = \"/x\"",
        ));
        let e = only(&errs);
        assert_eq!(e.path, "route[0].records");
        assert_eq!(e.message, "`records` is not used by layout \"columnar\"");

        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nannotate = true",
        ));
        assert!(only(&errs).message.contains("needs `metadata`"));

        let errs = errors(&minimal_with("\"columnar\"\nid = \"/ids\"", "\"none\""));
        assert!(only(&errs)
            .message
            .contains("a write route carries records"));

        let errs = errors(&minimal_with(
            "kind = \"write\"\nmutation = \"update_embedding\"",
            "kind = \"read\"\nmutation = \"update_embedding\"\nfail_open = true",
        ));
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["route[0].mutation", "route[0].fail_open"]);

        // `merges` says which records get annotations: it needs `annotate`.
        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nmerges = true",
        ));
        assert_eq!(only(&errs).path, "route[0].merges");

        // `conditions` narrow the ids of a delete; a write has none, and each is a pointer.
        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nconditions = [\"/where\"]",
        ));
        assert_eq!(only(&errs).path, "route[0].conditions");
        let errs = errors(&minimal_with(
            "kind = \"write\"",
            "kind = \"delete\"\nconditions = [\"where\"]",
        ));
        assert!(
            errs.iter()
                .any(|e| e.path.starts_with("route[0].conditions")),
            "{errs:#?}"
        );
    }

    #[test]
    fn collection_id_param_and_readback_checks() {
        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\ncollection = \"{coll}\"\nid_param = \"x\"",
        ));
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["route[0].collection", "route[0].id_param"]);

        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nreadback = \"get\"",
        ));
        assert!(only(&errs).message.contains("no route named `get`"));
        assert_eq!(only(&errs).line, Some(14));

        let errs = errors(&minimal_with(
            "id = \"/ids\"",
            "id = \"/ids\"\nreadback_body = \"{}\"",
        ));
        assert!(only(&errs)
            .message
            .contains("only used together with `readback`"));

        let text = minimal_with("id = \"/ids\"", "id = \"/ids\"\nreadback = \"get\"\nreadback_body = '{\"ids\": [\"{id}\"]}'")
            + "\n[[route]]\nname = \"get\"\nmethod = \"GET\"\npath = \"/d/{database}/get\"\nkind = \"read\"\nlayout = \"none\"\n";
        let errs = errors(&text);
        assert!(only(&errs)
            .message
            .contains("needs path parameter `database`"));
    }

    #[test]
    fn syntax_errors_and_dates() {
        let errs = errors("[pack]\nname = \"x\nsubstrate = 1\n");
        let e = only(&errs);
        assert_eq!(e.line, Some(2));
        assert_eq!(e.path, "");
        let errs = errors(&minimal_with("kind = \"write\"", "kind = 1979-05-27"));
        assert!(errs
            .iter()
            .any(|e| e.line == Some(10) && e.message.contains("dates and times")));
    }
}
