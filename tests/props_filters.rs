//! Properties of filter packs and of what the proxy does with their routes:
//!
//! - `filters::compile_pack` never panics, on arbitrary text or on damaged copies of the shipped
//!   packs, and every error carries the file name it was given and a line within the text;
//! - JSON pointers resolve exactly as RFC 6901 (serde_json's `Value::pointer` as the reference);
//! - for every write, delete and read route of every shipped pack, on bodies built from the
//!   route's own shape: `extract_records` finds one record per id / row, in order;
//!   `rewrite_admitted` keeps exactly the admitted records with every parallel column filtered in
//!   lockstep and nothing else touched; all admitted without annotations is the identity;
//!   annotations land in the admitted records' metadata; retrieval treatment drops what it says;
//! - on arbitrary bodies every record operation answers or errs without panicking, and a failed
//!   in-place rewrite leaves the body as it was.

mod props_support;

use props_support::{cfg, json_value, nasty_string};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use substrate_gate::filters::{
    build_table, compile_pack, AnnotationStyle, CompiledRoute, ExtractError, Layout, Pack, Pointer,
    RouteKind, Shape, Treatment,
};

const PACKS: &[(&str, &str)] = &[
    (
        "filters/chroma.toml",
        include_str!("../filters/chroma.toml"),
    ),
    (
        "filters/qdrant.toml",
        include_str!("../filters/qdrant.toml"),
    ),
    (
        "filters/weaviate.toml",
        include_str!("../filters/weaviate.toml"),
    ),
    (
        "filters/pinecone.toml",
        include_str!("../filters/pinecone.toml"),
    ),
    (
        "filters/milvus.toml",
        include_str!("../filters/milvus.toml"),
    ),
    (
        "filters/generic.toml",
        include_str!("../filters/generic.toml"),
    ),
];

fn packs() -> &'static [Pack] {
    static P: std::sync::OnceLock<Vec<Pack>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        PACKS
            .iter()
            .map(|(f, t)| compile_pack(f, t).unwrap_or_else(|e| panic!("{f}: {e:?}")))
            .collect()
    })
}

/// Every route of every shipped pack, with the variant shapes as separate entries.
fn routes() -> Vec<(&'static CompiledRoute, Option<usize>)> {
    packs()
        .iter()
        .flat_map(|p| p.routes.iter())
        .flat_map(|r| {
            std::iter::once((r, None)).chain((0..r.variants.len()).map(move |i| (r, Some(i))))
        })
        .collect()
}

fn shape_of(r: &CompiledRoute, variant: Option<usize>) -> &Shape {
    match variant {
        Some(i) => &r.variants[i].shape,
        None => &r.shape,
    }
}

// ------------------------------------------------------------------------------- pack parsing

fn mutate(text: &str, edits: &[(usize, u8, String)]) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for (pos, op, chunk) in edits {
        if s.is_empty() {
            s.extend(chunk.chars());
            continue;
        }
        let i = pos % s.len();
        match op % 4 {
            0 => {
                let end = (i + chunk.len() % 9 + 1).min(s.len());
                s.drain(i..end);
            }
            1 => {
                s.splice(i..i, chunk.chars());
            }
            2 => {
                let end = (i + 60).min(s.len());
                let dup: Vec<char> = s[i..end].to_vec();
                s.splice(i..i, dup);
            }
            _ => {
                if let Some(c) = chunk.chars().next() {
                    s[i] = c;
                }
            }
        }
    }
    s.into_iter().collect()
}

fn edit() -> impl Strategy<Value = (usize, u8, String)> {
    (
        any::<usize>(),
        any::<u8>(),
        prop_oneof![
            Just("\n".to_string()),
            Just("[[route]]\n".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("/".to_string()),
            Just("~".to_string()),
            Just("\"".to_string()),
            Just("layout = \"rows\"\n".to_string()),
            Just("kind = \"read\"\n".to_string()),
            Just("id = \"/a/~2\"\n".to_string()),
            Just("readback = \"nope\"\n".to_string()),
            Just("path = \"/x/{a}/{a}\"\n".to_string()),
            Just("parallel = [\"/x\", \"/x\"]\n".to_string()),
            "\\PC{0,6}",
        ],
    )
}

fn check_pack_errors(file: &str, text: &str) -> Result<(), TestCaseError> {
    let lines = text.matches('\n').count() + 1;
    match compile_pack(file, text) {
        Ok(pack) => {
            prop_assert_eq!(&pack.file, file);
            // A pack that compiles builds a table (duplicates across packs aside).
            let _ = build_table(vec![pack]);
        }
        Err(errors) => {
            prop_assert!(!errors.is_empty(), "an error without errors");
            for e in &errors {
                prop_assert_eq!(&e.file, file);
                prop_assert!(!e.message.is_empty(), "{:?}", e);
                match e.line {
                    Some(l) => {
                        prop_assert!((1..=lines).contains(&l), "line {} of {}: {:?}", l, lines, e)
                    }
                    None => prop_assert!(
                        e.path.is_empty() && errors.len() == 1,
                        "only a whole-file parse error may lack a line: {:?}",
                        e
                    ),
                }
                prop_assert!(e.to_string().starts_with(file), "{}", e);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cfg(256))]

    #[test]
    fn arbitrary_pack_text_never_panics(text in "\\PC{0,400}") {
        check_pack_errors("fuzz.toml", &text)?;
    }

    /// Damaged shipped packs: compiled, or errors with the file and a line in it.
    #[test]
    fn damaged_packs_report_file_and_line(
        which in 0..PACKS.len(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let (file, text) = PACKS[which];
        check_pack_errors(file, &mutate(text, &edits))?;
    }

    /// Matching arbitrary requests against the table of all shipped packs never panics, and a
    /// match binds every parameter of its template.
    #[test]
    fn route_matching_never_panics(
        method in prop::sample::select(&["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "get", ""][..]),
        segments in prop::collection::vec(prop_oneof![
            Just("api".to_string()), Just("v2".to_string()), Just("collections".to_string()),
            Just("points".to_string()), Just("memories".to_string()), Just("".to_string()),
            Just("..".to_string()), Just("%2F".to_string()), Just("search".to_string()),
            "[a-z0-9%._~-]{1,8}",
        ], 0..10),
    ) {
        static TABLE: std::sync::OnceLock<substrate_gate::filters::RouteTable> = std::sync::OnceLock::new();
        let table = TABLE.get_or_init(|| build_table(packs().to_vec()).expect("shipped packs build a table"));
        let path = format!("/{}", segments.join("/"));
        if let Some(m) = table.match_route(method, &path) {
            for name in m.route.param_names() {
                prop_assert!(m.param(name).is_some(), "{} unbound in {}", name, path);
            }
        }
    }

    /// Our RFC 6901 pointers agree with serde_json's reference walk.
    #[test]
    fn pointers_follow_rfc6901(
        doc in json_value(3),
        tokens in prop::collection::vec(prop_oneof![
            Just("0".to_string()), Just("1".to_string()), Just("01".to_string()),
            Just("-".to_string()), Just("".to_string()), Just("~0".to_string()),
            Just("~1".to_string()), Just("a~1b".to_string()), nasty_string(),
        ], 0..4),
    ) {
        let raw: String = tokens.iter().map(|t| format!("/{t}")).collect();
        match Pointer::parse(&raw) {
            Ok(p) => prop_assert_eq!(p.get(&doc), doc.pointer(&raw), "pointer {:?}", raw),
            Err(_) => prop_assert!(raw.contains('~'), "{:?} refused", raw),
        }
    }
}

// ------------------------------------------------------------------------ record operations

/// The material of a body: per record an id, a text, metadata, and one value per other column.
#[derive(Debug, Clone)]
struct Material {
    ids: Vec<Value>,
    texts: Vec<Option<String>>,
    metas: Vec<Option<Map<String, Value>>>,
    extras: Vec<Value>,
    /// Which non-id columns a columnar body leaves out.
    omit: Vec<bool>,
}

fn clean_meta() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        nasty_string().prop_filter("not an annotation", |k| !k.starts_with("_integrity")),
        json_value(2),
        0..4,
    )
    .prop_map(|m| m.into_iter().collect())
}

fn material() -> impl Strategy<Value = Material> {
    (0usize..6).prop_flat_map(|n| {
        (
            prop::collection::vec(
                prop_oneof![
                    "[a-z0-9-]{1,10}".prop_map(Value::from),
                    (0u64..1_000_000).prop_map(Value::from),
                ],
                n,
            ),
            prop::collection::vec(prop::option::of(nasty_string()), n),
            prop::collection::vec(prop::option::of(clean_meta()), n),
            prop::collection::vec(json_value(1), n),
            prop::collection::vec(any::<bool>(), 8),
        )
            .prop_map(|(ids, texts, metas, extras, omit)| Material {
                ids,
                texts,
                metas,
                extras,
                omit,
            })
    })
}

fn set(body: &mut Value, p: &Pointer, v: Value) {
    if p.is_root() {
        *body = v;
    } else if let Some(slot) = p.get_or_create(body) {
        *slot = v;
    }
}

/// One record as a row object of `shape`.
fn row(shape: &Shape, m: &Material, i: usize) -> Value {
    let mut r = json!({});
    if let (Some(mp), Some(meta)) = (&shape.metadata, &m.metas[i]) {
        set(&mut r, mp, Value::Object(meta.clone()));
    }
    if let Some(ip) = &shape.id {
        set(&mut r, ip, m.ids[i].clone());
    }
    if let (Some(tp), Some(t)) = (&shape.text, &m.texts[i]) {
        set(&mut r, tp, Value::String(t.clone()));
    }
    r
}

/// A body of the route's shape (or of its variant) holding the material, or None for a layout
/// without records. A variant's `when` member is added when the shape's own pointers do not
/// put it there (a variant chosen by a member the record does not otherwise use).
fn build_for(route: &CompiledRoute, variant: Option<usize>, m: &Material) -> Option<Value> {
    let mut body = build(shape_of(route, variant), m)?;
    if let Some(v) = variant.map(|i| &route.variants[i]) {
        if v.when.get(&body).is_none() {
            set(&mut body, &v.when, json!({"k": "v"}));
        }
    }
    Some(body)
}

/// A body of `shape` holding the material, or None for a layout without records.
fn build(shape: &Shape, m: &Material) -> Option<Value> {
    let n = m.ids.len();
    let mut body = json!({});
    match shape.layout {
        Layout::None => None,
        Layout::Columnar => {
            let id_ptr = shape.id.as_ref()?;
            for (c, p) in shape.lockstep.iter().enumerate() {
                let column: Vec<Value> = if p == id_ptr {
                    m.ids.clone()
                } else if Some(p) == shape.text.as_ref() {
                    m.texts
                        .iter()
                        .map(|t| t.clone().map(Value::from).unwrap_or(Value::Null))
                        .collect()
                } else if Some(p) == shape.metadata.as_ref() {
                    m.metas
                        .iter()
                        .map(|x| x.clone().map(Value::Object).unwrap_or(Value::Null))
                        .collect()
                } else {
                    m.extras.clone()
                };
                if p != id_ptr && m.omit[c % m.omit.len()] {
                    continue;
                }
                set(&mut body, p, Value::Array(column));
            }
            if id_ptr.get(&body).is_none() {
                set(&mut body, id_ptr, Value::Array(m.ids.clone()));
            }
            Some(body)
        }
        Layout::Rows | Layout::Ndjson => {
            let rows: Vec<Value> = (0..n).map(|i| row(shape, m, i)).collect();
            set(&mut body, &shape.records, Value::Array(rows));
            Some(body)
        }
        Layout::Single => {
            if n == 0 {
                return None;
            }
            set(&mut body, &shape.records, row(shape, m, 0));
            Some(body)
        }
    }
}

fn id_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What `rewrite_admitted` must produce without annotations: the body with each lockstep column
/// (or the rows) filtered to the kept indexes.
fn expected_rewrite(shape: &Shape, body: &Value, keep: &[usize]) -> Value {
    let mut out = body.clone();
    let filter = |v: &Value| -> Value {
        match v {
            Value::Array(a) => {
                Value::Array(keep.iter().filter_map(|&i| a.get(i).cloned()).collect())
            }
            other => other.clone(),
        }
    };
    match shape.layout {
        Layout::Columnar => {
            for p in &shape.lockstep {
                if let Some(v) = p.get(body) {
                    let f = filter(v);
                    set(&mut out, p, f);
                }
            }
        }
        Layout::Rows | Layout::Ndjson => {
            if let Some(v) = shape.records.get(body) {
                let f = filter(v);
                set(&mut out, &shape.records, f);
            }
        }
        _ => {}
    }
    out
}

fn note_for(i: usize) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "decision".into(),
        json!(if i.is_multiple_of(2) {
            "allow"
        } else {
            "allow_with_warning"
        }),
    );
    m.insert("receipt".into(), json!(format!("r-{i}")));
    m
}

proptest! {
    #![proptest_config(cfg(128))]

    /// Extraction finds every record in order; rewriting keeps exactly the admitted ones, in
    /// lockstep, and touches nothing else; all admitted is the identity.
    #[test]
    fn extract_and_rewrite_keep_columns_in_lockstep(
        route_pick in any::<prop::sample::Index>(),
        m in material(),
        keep_mask in prop::collection::vec(any::<bool>(), 6),
    ) {
        let all = routes();
        let (route, variant) = *route_pick.get(&all);
        let shape = shape_of(route, variant);
        let Some(body) = build_for(route, variant, &m) else { return Ok(()); };
        // The variant's `when` must pick this shape for the body (and the route's own shape must
        // not be shadowed by a variant).
        prop_assume!(std::ptr::eq(route.shape_for(&body), shape));
        let recs = route.extract_records(&body)
            .map_err(|e| TestCaseError::fail(format!("{}/{}: {e} for {body}", route.pack, route.name)))?;
        let n = if shape.layout == Layout::Single { 1 } else { m.ids.len() };
        prop_assert_eq!(recs.len(), n, "{}/{} body {}", route.pack, route.name, body);
        for (i, r) in recs.iter().enumerate() {
            prop_assert_eq!(r.index, i);
            if shape.id.is_some() {
                prop_assert_eq!(r.id.clone(), Some(id_str(&m.ids[i])), "{}/{}", route.pack, route.name);
            }
        }
        if route.kind == RouteKind::Read {
            return Ok(());
        }

        // All admitted, no notes: the identity.
        let all_in: Vec<(usize, Option<Map<String, Value>>)> = (0..n).map(|i| (i, None)).collect();
        let same = route.rewrite_admitted(&body, &all_in)
            .map_err(|e| TestCaseError::fail(format!("{}/{}: {e}", route.pack, route.name)))?;
        prop_assert_eq!(&same, &body, "{}/{}: all admitted changed the body", route.pack, route.name);

        // A subset: lockstep filtering, order kept, ids of the survivors.
        let keep: Vec<usize> = (0..n).filter(|&i| keep_mask[i % keep_mask.len()]).collect();
        let admitted: Vec<(usize, Option<Map<String, Value>>)> = keep.iter().rev().map(|&i| (i, None)).collect();
        match route.rewrite_admitted(&body, &admitted) {
            Ok(out) => {
                prop_assert!(shape.layout != Layout::Single || keep == vec![0]);
                prop_assert_eq!(&out, &expected_rewrite(shape, &body, &keep), "{}/{}", route.pack, route.name);
                // Read again, as the store will: only a rewrite that keeps a record is ever
                // forwarded (a body with none left can pick another shape: Milvus v1's `id: []`).
                if keep.is_empty() {
                    return Ok(());
                }
                let again = route.extract_records(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
                if shape.id.is_some() && shape.layout != Layout::Single {
                    let ids: Vec<Option<String>> = again.iter().map(|r| r.id.clone()).collect();
                    let want: Vec<Option<String>> = keep.iter().map(|&i| Some(id_str(&m.ids[i]))).collect();
                    prop_assert_eq!(ids, want);
                }
            }
            Err(ExtractError::NothingAdmitted) => prop_assert!(shape.layout == Layout::Single && keep.is_empty()),
            Err(e) => return Err(TestCaseError::fail(format!("{}/{}: {e}", route.pack, route.name))),
        }

        // With annotations: each admitted record carries its note, where the pack says.
        let noted: Vec<(usize, Option<Map<String, Value>>)> = keep.iter().map(|&i| (i, Some(note_for(i)))).collect();
        if keep.is_empty() || !route.annotate || shape.metadata.is_none() {
            return Ok(());
        }
        let out = route.rewrite_admitted(&body, &noted)
            .map_err(|e| TestCaseError::fail(format!("{}/{}: {e}", route.pack, route.name)))?;
        let again = route.extract_records(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again.len(), if shape.layout == Layout::Single { 1 } else { keep.len() });
        for (rec, &i) in again.iter().zip(&keep) {
            let meta = rec.metadata.as_ref().and_then(Value::as_object)
                .ok_or_else(|| TestCaseError::fail(format!("{}/{}: no metadata after annotation: {out}", route.pack, route.name)))?;
            let key = &route.annotation_key;
            match route.annotation {
                AnnotationStyle::Nested => prop_assert_eq!(meta.get(key), Some(&Value::Object(note_for(i)))),
                AnnotationStyle::Flat => {
                    for (k, v) in note_for(i) {
                        prop_assert_eq!(meta.get(&format!("{key}_{k}")), Some(&v));
                    }
                }
            }
        }
    }

    /// Retrieval treatment of read answers: including everything changes nothing; excluding
    /// everything leaves no record id, and the count says how many went.
    #[test]
    fn retrieval_treatment_drops_what_it_says(route_pick in any::<prop::sample::Index>(), m in material()) {
        let all: Vec<_> = routes().into_iter().filter(|(r, _)| r.kind == RouteKind::Read).collect();
        let (route, variant) = *route_pick.get(&all);
        let shape = shape_of(route, variant);
        let Some(body) = build_for(route, variant, &m) else { return Ok(()); };
        prop_assume!(std::ptr::eq(route.shape_for(&body), shape));
        let mut same = body.clone();
        prop_assert_eq!(route.filter_response(&mut same, &|_| Treatment::Include), 0);
        prop_assert_eq!(&same, &body);
        let before = route.response_record_ids(&body);
        let mut gone = body.clone();
        let dropped = route.filter_response(&mut gone, &|_| Treatment::Exclude);
        prop_assert_eq!(dropped, before.len(), "{}/{} {}", route.pack, route.name, body);
        prop_assert!(route.response_record_ids(&gone).is_empty(), "{}/{} {}", route.pack, route.name, gone);
    }

    /// Arbitrary bodies, arbitrary admitted sets, arbitrary treatments: every record operation of
    /// every route answers without panicking; a failed in-place rewrite leaves the body as it was.
    #[test]
    fn record_operations_never_panic_on_arbitrary_bodies(
        route_pick in any::<prop::sample::Index>(),
        body in json_value(4),
        picks in prop::collection::vec((0usize..8, any::<bool>()), 0..6),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let all = routes();
        let (route, _) = *route_pick.get(&all);
        let _ = route.parse_body(&bytes);
        let _ = route.parse_body(body.to_string().as_bytes());
        let _ = route.serialize_body(&body);
        let _ = route.response_record_ids(&body);
        let mut treated = body.clone();
        let _ = route.filter_response(&mut treated, &|id: &str| match id.len() % 3 {
            0 => Treatment::Include,
            1 => Treatment::Warn,
            _ => Treatment::Exclude,
        });
        let admitted: Vec<(usize, Option<Map<String, Value>>)> = picks
            .iter()
            .map(|&(i, noted)| (i, noted.then(|| note_for(i))))
            .collect();
        let _ = route.extract_records(&body);
        let mut in_place = body.clone();
        match route.rewrite_admitted_in_place(&mut in_place, &admitted) {
            Ok(()) => {}
            Err(_) => prop_assert_eq!(&in_place, &body, "a failed rewrite changed the body"),
        }
        if let Ok(recs) = route.extract_records(&body) {
            let beyond = vec![(recs.len(), None)];
            let r = route.rewrite_admitted(&body, &beyond);
            let out_of_range = matches!(r, Err(ExtractError::IndexOutOfRange { .. }));
            prop_assert!(out_of_range, "index {} of {} records: {:?}", recs.len(), recs.len(), r);
        }
    }
}

/// Every shipped route is covered by the generators above (a new layout would need one).
#[test]
fn every_route_has_a_generated_body() {
    let m = Material {
        ids: vec![json!("a"), json!(2)],
        texts: vec![Some("t".into()), None],
        metas: vec![Some(Map::new()), None],
        extras: vec![json!(1), json!(null)],
        omit: vec![false; 8],
    };
    for (route, variant) in routes() {
        let shape = shape_of(route, variant);
        if let Some(body) = build_for(route, variant, &m) {
            let recs = route.extract_records(&body);
            assert!(
                recs.is_ok(),
                "{}/{} variant {variant:?}: {recs:?} for {body}",
                route.pack,
                route.name
            );
        } else {
            assert!(
                shape.layout == Layout::None
                    || (shape.layout == Layout::Columnar && shape.id.is_none()),
                "{}/{}: no generator for {:?}",
                route.pack,
                route.name,
                shape.layout
            );
        }
    }
}

/// Inputs the properties found, kept as plain tests.
#[test]
fn found_by_properties() {
    // A value missing at the end of the file: toml reports it without a message, so the pack
    // error said `x.toml:3: ` and nothing else.
    let errs = compile_pack("x.toml", "[pack]\nname = \"x\"\nannotate =").unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].line, Some(3), "{errs:?}");
    assert!(!errs[0].message.is_empty(), "{errs:?}");
}
