//! Properties of the API's request validation (`api::extract::parse_json` into the spec's request
//! types, then `engine::validate_ingest`): whatever the bytes, the answer is a value or a 400,
//! never a panic; every valid request passes; every unknown, duplicated, `null` or ill-typed
//! field is a 400 that names it; nesting is bounded; and the key's authority ceiling holds
//! whatever `sourceAuthorityLevel` says.

mod props_support;

use props_support::{cfg, json_object, json_value, nasty_string};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use substrate_gate::api::error::ApiError;
use substrate_gate::api::extract::{json_depth, parse_json};
use substrate_gate::kernel::types::*;
use substrate_gate::state::Principal;
use uuid::Uuid;

const DEPTH: usize = 64;

const INGEST_FIELDS: &[&str] = &[
    "tenantId",
    "productSurface",
    "sourceType",
    "sourceId",
    "sourceTrustLevel",
    "sourceAuthorityLevel",
    "targetSubstrate",
    "targetRegionId",
    "proposedMutation",
    "eventType",
    "payload",
    "payloadSummary",
    "rawPayloadRef",
    "authorityClaim",
    "evidenceRefs",
    "observedAt",
    "metadata",
];
const INGEST_OPTIONAL: &[&str] = &[
    "tenantId",
    "sourceTrustLevel",
    "sourceAuthorityLevel",
    "targetRegionId",
    "eventType",
    "payloadSummary",
    "rawPayloadRef",
    "authorityClaim",
    "evidenceRefs",
    "observedAt",
    "metadata",
];
const EVALUATE_FIELDS: &[&str] = &[
    "tenantId",
    "signalId",
    "evaluationProfile",
    "evaluationMode",
    "equationBundles",
];
const REPLAY_FIELDS: &[&str] = &["reexecute", "evaluationProfile", "coefficientVersionId"];

fn pick<T: Copy + std::fmt::Display + std::fmt::Debug + 'static>(
    all: &'static [T],
) -> impl Strategy<Value = String> {
    prop::sample::select(all).prop_map(|v| v.to_string())
}

fn uuid_s() -> impl Strategy<Value = String> {
    any::<u128>().prop_map(|n| Uuid::from_u128(n).to_string())
}

fn non_empty() -> impl Strategy<Value = String> {
    nasty_string().prop_filter("non-empty", |s| !s.is_empty())
}

fn rfc3339() -> impl Strategy<Value = String> {
    (
        0i64..4_102_444_800,
        0u32..1_000_000_000,
        -720i32..720,
        0usize..3,
    )
        .prop_map(|(secs, nanos, offset_min, style)| {
            let t = chrono::DateTime::from_timestamp(secs, nanos).expect("in range");
            let off = chrono::FixedOffset::east_opt(offset_min * 60).expect("offset");
            let t = t.with_timezone(&off);
            match style {
                0 => t.to_rfc3339(),
                1 => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                _ => t
                    .with_timezone(&chrono::Utc)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            }
        })
}

/// A valid ingest request: every required field, each optional one present or not.
fn valid_ingest() -> impl Strategy<Value = Map<String, Value>> {
    let required = (
        pick(ProductSurface::ALL),
        pick(SourceType::ALL),
        non_empty(),
        pick(TargetSubstrate::ALL),
        pick(ProposedMutation::ALL),
        non_empty(),
    );
    let optional = (
        prop::option::of(uuid_s()),
        prop::option::of(0.0f64..=1.0),
        prop::option::of(prop_oneof![0.0f64..=1.0, Just(0.0), Just(1.0)]),
        prop::option::of(uuid_s()),
        prop::option::of(pick(EventType::ALL)),
        prop::option::of(nasty_string()),
        prop::option::of(nasty_string()),
        prop::option::of(nasty_string()),
        prop::option::of(prop::collection::vec(nasty_string(), 0..5)),
        prop::option::of(rfc3339()),
        prop::option::of(json_object(3)),
    );
    (required, optional).prop_map(|(r, o)| {
        let mut m = Map::new();
        m.insert("productSurface".into(), json!(r.0));
        m.insert("sourceType".into(), json!(r.1));
        m.insert("sourceId".into(), json!(r.2));
        m.insert("targetSubstrate".into(), json!(r.3));
        m.insert("proposedMutation".into(), json!(r.4));
        m.insert("payload".into(), json!(r.5));
        let mut opt = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        opt("tenantId", o.0.map(Value::from));
        opt("sourceTrustLevel", o.1.map(Value::from));
        opt("sourceAuthorityLevel", o.2.map(Value::from));
        opt("targetRegionId", o.3.map(Value::from));
        opt("eventType", o.4.map(Value::from));
        opt("payloadSummary", o.5.map(Value::from));
        opt("rawPayloadRef", o.6.map(Value::from));
        opt("authorityClaim", o.7.map(Value::from));
        opt("evidenceRefs", o.8.map(|v| json!(v)));
        opt("observedAt", o.9.map(Value::from));
        opt("metadata", o.10.map(Value::Object));
        nul_free(m)
    })
}

fn valid_evaluate() -> impl Strategy<Value = Map<String, Value>> {
    (
        uuid_s(),
        prop::option::of(uuid_s()),
        prop::option::of(pick(EvaluationProfile::ALL)),
        prop::option::of(pick(EvaluationMode::ALL)),
        prop::option::of(prop::collection::vec(nasty_string(), 0..4)),
    )
        .prop_map(|(sig, tenant, profile, mode, bundles)| {
            let mut m = Map::new();
            m.insert("signalId".into(), json!(sig));
            for (k, v) in [
                ("tenantId", tenant.map(Value::from)),
                ("evaluationProfile", profile.map(Value::from)),
                ("evaluationMode", mode.map(Value::from)),
                ("equationBundles", bundles.map(|b| json!(b))),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            nul_free(m)
        })
}

fn valid_replay() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::option::of(any::<bool>()),
        prop::option::of(pick(EvaluationProfile::ALL)),
        prop::option::of(uuid_s()),
    )
        .prop_map(|(re, profile, version)| {
            let mut m = Map::new();
            for (k, v) in [
                ("reexecute", re.map(Value::from)),
                ("evaluationProfile", profile.map(Value::from)),
                ("coefficientVersionId", version.map(Value::from)),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            m
        })
}

/// `v` with every NUL character (in strings and member names) made U+0001: the gate refuses a
/// NUL anywhere in a request (PostgreSQL stores none), so valid requests carry none.
fn without_nul(v: Value) -> Value {
    let clean = |s: String| s.replace('\0', "\u{1}");
    match v {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nul).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (clean(k), without_nul(v)))
                .collect(),
        ),
        v => v,
    }
}

fn nul_free(m: Map<String, Value>) -> Map<String, Value> {
    match without_nul(Value::Object(m)) {
        Value::Object(m) => m,
        _ => unreachable!("an object stays an object"),
    }
}

fn bytes_of(m: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(m).expect("serializable")
}

/// A rejection is always a 400 with a code the contract lists.
fn assert_client_error(e: &ApiError) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.status.as_u16(), 400, "{:?}", e);
    prop_assert!(
        e.code == "invalid_json" || e.code == "validation_failed",
        "{:?}",
        e
    );
    if e.code == "validation_failed" {
        // A field's name may itself be empty (`{"": 1}`): then the error names "".
        prop_assert!(
            !e.errors.is_empty(),
            "validation error without a field: {:?}",
            e
        );
    }
    Ok(())
}

fn check_any<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<(), TestCaseError> {
    match parse_json::<T>(bytes, DEPTH) {
        Ok(_) => Ok(()),
        Err(e) => assert_client_error(&e),
    }
}

fn names_field(e: &ApiError, field: &str) -> bool {
    e.errors.iter().any(|f| {
        f.field == field
            || f.field.starts_with(&format!("{field}."))
            || f.field.starts_with(&format!("{field}["))
    })
}

fn mutate_bytes(mut b: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(pos, op, byte) in edits {
        if b.is_empty() {
            b.push(byte);
            continue;
        }
        let i = pos % b.len();
        match op % 4 {
            0 => b[i] = byte,
            1 => b.insert(i, byte),
            2 => {
                b.remove(i);
            }
            _ => {
                let end = (i + (byte as usize % 16)).min(b.len());
                let chunk = b[i..end].to_vec();
                b.splice(i..i, chunk);
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(cfg(256))]

    /// Arbitrary bytes: a value or a 400, never a panic, for every request type.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_any::<IngestRequest>(&bytes)?;
        check_any::<EvaluateRequest>(&bytes)?;
        check_any::<ReplayRequest>(&bytes)?;
        let _ = json_depth(&bytes);
    }

    /// Arbitrary JSON documents: a value or a 400.
    #[test]
    fn arbitrary_json_never_panics(v in json_value(5)) {
        let bytes = serde_json::to_vec(&v).unwrap();
        check_any::<IngestRequest>(&bytes)?;
        check_any::<EvaluateRequest>(&bytes)?;
        check_any::<ReplayRequest>(&bytes)?;
    }

    /// Byte-level damage to a valid request (flips, insertions, deletions, repeats): a value
    /// or a 400.
    #[test]
    fn damaged_requests_never_panic(
        m in valid_ingest(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8),
    ) {
        let b = mutate_bytes(bytes_of(&m), &edits);
        check_any::<IngestRequest>(&b)?;
        if let Ok(req) = parse_json::<IngestRequest>(&b, DEPTH) {
            if let Err(e) = substrate_gate::engine::validate_ingest(&req) {
                assert_client_error(&e)?;
            }
        }
    }

    /// Every request built from the documented fields and values passes.
    #[test]
    fn valid_requests_pass(i in valid_ingest(), e in valid_evaluate(), r in valid_replay()) {
        let req = parse_json::<IngestRequest>(&bytes_of(&i), DEPTH)
            .map_err(|e| TestCaseError::fail(format!("valid ingest refused: {e:?}\n{i:?}")))?;
        if let Err(err) = substrate_gate::engine::validate_ingest(&req) {
            return Err(TestCaseError::fail(format!("valid ingest failed validation: {err:?}\n{i:?}")));
        }
        parse_json::<EvaluateRequest>(&bytes_of(&e), DEPTH)
            .map_err(|err| TestCaseError::fail(format!("valid evaluate refused: {err:?}")))?;
        parse_json::<ReplayRequest>(&bytes_of(&r), DEPTH)
            .map_err(|err| TestCaseError::fail(format!("valid replay refused: {err:?}")))?;
    }

    /// Any field that is not in the spec's table is a 400 naming it, wherever it sits among
    /// the valid ones and whatever its value.
    #[test]
    fn unknown_fields_are_named(
        i in valid_ingest(),
        e in valid_evaluate(),
        r in valid_replay(),
        name in nasty_string().prop_map(|s| s.replace('\0', "\u{1}")),
        value in json_value(2).prop_map(without_nul),
    ) {
        for (mut m, known) in [(i, INGEST_FIELDS), (e, EVALUATE_FIELDS), (r, REPLAY_FIELDS)] {
            if known.contains(&name.as_str()) {
                continue;
            }
            m.insert(name.clone(), value.clone());
            let err = match known {
                k if k == INGEST_FIELDS => parse_json::<IngestRequest>(&bytes_of(&m), DEPTH).err(),
                k if k == EVALUATE_FIELDS => parse_json::<EvaluateRequest>(&bytes_of(&m), DEPTH).err(),
                _ => parse_json::<ReplayRequest>(&bytes_of(&m), DEPTH).err(),
            };
            let err = err.ok_or_else(|| TestCaseError::fail(format!("unknown field {name:?} accepted")))?;
            assert_client_error(&err)?;
            prop_assert_eq!(err.code, "validation_failed");
            prop_assert_eq!(&err.errors[0].field, &name, "{:?}", err);
            prop_assert!(err.errors[0].message.starts_with("unknown field"), "{:?}", err);
        }
    }

    /// `null` for an optional field is a 400 naming the field (absent is the way to omit it).
    #[test]
    fn null_is_not_absent(i in valid_ingest(), which in prop::sample::select(INGEST_OPTIONAL)) {
        let mut m = i;
        m.insert(which.to_string(), Value::Null);
        let err = parse_json::<IngestRequest>(&bytes_of(&m), DEPTH)
            .err()
            .ok_or_else(|| TestCaseError::fail(format!("null {which} accepted")))?;
        assert_client_error(&err)?;
        prop_assert!(names_field(&err, which), "{:?}", err);
    }

    /// One field of a valid request replaced by an arbitrary JSON value: accepted (when the value
    /// happens to be valid) or a 400 naming exactly that field.
    #[test]
    fn a_bad_field_is_named(
        i in valid_ingest(),
        which in prop::sample::select(INGEST_FIELDS),
        value in json_value(2),
    ) {
        let mut m = i;
        m.insert(which.to_string(), value);
        match parse_json::<IngestRequest>(&bytes_of(&m), DEPTH) {
            Err(err) => {
                assert_client_error(&err)?;
                prop_assert!(names_field(&err, which), "{} not named: {:?}", which, err);
            }
            Ok(req) => {
                if let Err(err) = substrate_gate::engine::validate_ingest(&req) {
                    assert_client_error(&err)?;
                    prop_assert!(names_field(&err, which), "{} not named: {:?}", which, err);
                }
            }
        }
    }

    /// A field sent twice is a 400 naming it (no last-one-wins smuggling past a validator or
    /// a signature computed over the first occurrence).
    #[test]
    fn duplicate_fields_are_refused(i in valid_ingest(), idx in any::<prop::sample::Index>(), dup in json_value(1)) {
        let keys: Vec<String> = i.keys().cloned().collect();
        let key = idx.get(&keys).clone();
        let text = serde_json::to_string(&i).unwrap();
        let extra = format!(",{}:{}}}", serde_json::to_string(&key).unwrap(), dup);
        let text = format!("{}{}", &text[..text.len() - 1], extra);
        let err = parse_json::<IngestRequest>(text.as_bytes(), DEPTH)
            .err()
            .ok_or_else(|| TestCaseError::fail(format!("duplicate {key} accepted")))?;
        assert_client_error(&err)?;
        prop_assert!(names_field(&err, &key), "{:?}", err);
    }

    /// Nesting deeper than the limit is refused before parsing; up to it, metadata of any
    /// depth is accepted.
    #[test]
    fn nesting_is_bounded(i in valid_ingest(), depth in 1usize..200, arrays in any::<bool>()) {
        let (open, close) = if arrays { ("[", "]") } else { ("{\"a\":", "}") };
        let inner = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let mut m = i;
        m.insert("metadata".into(), json!({}));
        let text = serde_json::to_string(&m).unwrap().replacen("\"metadata\":{}", &format!("\"metadata\":{{\"x\":{inner}}}"), 1);
        let total = depth + 2;
        prop_assert_eq!(json_depth(text.as_bytes()), total);
        match parse_json::<IngestRequest>(text.as_bytes(), DEPTH) {
            Ok(_) => prop_assert!(total <= DEPTH),
            Err(e) => {
                prop_assert!(total > DEPTH, "depth {} refused: {:?}", total, e);
                prop_assert_eq!(e.code, "invalid_json");
            }
        }
    }

    /// A NUL character put into a typed string of a valid request (the sourceId, the payload)
    /// is refused with a 400 that names it; inside free-form metadata (kept as JSON text) it
    /// is accepted.
    #[test]
    fn a_nul_is_refused_naming_its_place(i in valid_ingest(), at in 0usize..3, pos in 0usize..16) {
        let mut m = i;
        let key = ["sourceId", "payload", "metadata"][at];
        let mut text = match key {
            "metadata" => "note".to_string(),
            k => m[k].as_str().unwrap().to_string(),
        };
        let pos = text.char_indices().map(|(i, _)| i).nth(pos).unwrap_or(text.len());
        text.insert(pos, '\0');
        if key == "metadata" {
            m.insert("metadata".into(), json!({"k": text}));
            prop_assert!(parse_json::<IngestRequest>(&bytes_of(&m), DEPTH).is_ok());
        } else {
            m.insert(key.into(), json!(text));
            let e = parse_json::<IngestRequest>(&bytes_of(&m), DEPTH).unwrap_err();
            assert_client_error(&e)?;
            prop_assert!(names_field(&e, key), "{:?}", e);
        }
    }

    /// The key's authority ceiling bounds the normalized authority, whatever was requested.
    #[test]
    fn authority_never_exceeds_the_ceiling(
        i in valid_ingest(),
        requested in prop::option::of(0.0f64..=1.0),
        ceiling in prop::option::of(0.0f64..=1.0),
    ) {
        let mut m = i;
        match requested {
            Some(a) => { m.insert("sourceAuthorityLevel".into(), json!(a)); }
            None => { m.remove("sourceAuthorityLevel"); }
        }
        let req = parse_json::<IngestRequest>(&bytes_of(&m), DEPTH).unwrap();
        let principal = Principal { tenant: Uuid::new_v4(), key_id: "k".into(), authority_ceiling: ceiling };
        let n = substrate_gate::engine::normalize(req, &principal, Uuid::new_v4());
        prop_assert!(n.source_authority_level <= ceiling.unwrap_or(1.0));
        prop_assert!(n.source_authority_level <= requested.unwrap_or(0.0));
        prop_assert_eq!(n.tenant_id, principal.tenant, "the tenant is the key's, never the body's");
        prop_assert_eq!(n.authority_ceiling_applied, requested.unwrap_or(0.0) > ceiling.unwrap_or(1.0));
    }
}

/// Numbers at the edges, fixed: each is a value or a 400, and out-of-range levels are named.
#[test]
fn edge_numbers() {
    let base = r#"{"productSurface":"generic","sourceType":"user_input","sourceId":"s","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"p","sourceTrustLevel":NUM}"#;
    for (num, ok) in [
        ("0", true),
        ("-0", true),
        ("1", true),
        ("1.0", true),
        ("1e0", true),
        ("0.5e0", true),
        ("1e-400", true),
        ("-1e-400", true),
        ("1e309", false),
        ("-1e309", false),
        ("NaN", false),
        ("Infinity", false),
        ("-Infinity", false),
        ("1.0000000000000002", false),
        ("-0.0000001", false),
        ("2", false),
        ("18446744073709551616", false),
        ("0x1", false),
        ("+1", false),
        (".5", false),
        ("1.", false),
        ("01", false),
    ] {
        let text = base.replace("NUM", num);
        let parsed = parse_json::<IngestRequest>(text.as_bytes(), DEPTH);
        let result = parsed.and_then(|r| substrate_gate::engine::validate_ingest(&r).map(|_| r));
        match result {
            Ok(r) => {
                assert!(ok, "{num} accepted as {:?}", r.source_trust_level);
                let v = r.source_trust_level.unwrap();
                assert!((0.0..=1.0).contains(&v) && v.is_finite(), "{num} -> {v}");
            }
            Err(e) => {
                assert!(!ok, "{num} refused: {e:?}");
                assert_eq!(e.status.as_u16(), 400, "{num}: {e:?}");
            }
        }
    }
}

/// Inputs the properties above found, kept as plain tests (the `.proptest-regressions` file
/// replays them too, but only while the strategies stay the same).
#[test]
fn found_by_properties() {
    let base = r#"{"productSurface":"generic","sourceType":"user_input","sourceId":"s","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"p"EXTRA}"#;
    let ingest =
        |extra: &str| parse_json::<IngestRequest>(base.replace("EXTRA", extra).as_bytes(), DEPTH);
    // An array or a null where an enumeration value goes was "not valid JSON: expected value",
    // naming no field.
    for (extra, field) in [
        (r#","eventType":null"#, "eventType"),
        (r#","eventType":[]"#, "eventType"),
        (r#","eventType":1"#, "eventType"),
    ] {
        let e = ingest(extra).unwrap_err();
        assert_eq!(e.code, "validation_failed", "{extra}: {e:?}");
        assert_eq!(e.errors[0].field, field, "{extra}: {e:?}");
    }
    let e = parse_json::<IngestRequest>(
        base.replace(r#""write_memory""#, "[]")
            .replace("EXTRA", "")
            .as_bytes(),
        DEPTH,
    )
    .unwrap_err();
    assert_eq!(e.errors[0].field, "proposedMutation", "{e:?}");
    // A key with a backtick was named "`." (the name was cut out of serde's message).
    for key in ["`", "a`b", "``", "", ".", "x.y", "ünï"] {
        let e = ingest(&format!(",{}:1", serde_json::to_string(key).unwrap())).unwrap_err();
        assert_eq!(e.errors[0].field, key, "{e:?}");
        assert!(e.errors[0].message.starts_with("unknown field"), "{e:?}");
    }
    // Structs were also read from arrays of their field values, in declaration order.
    let e = parse_json::<EvaluateRequest>(
        br#"["00000000-0000-4000-8000-000000000001","00000000-0000-4000-8000-000000000001","standard","shadow",[]]"#,
        DEPTH,
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.errors[0].field.as_str()),
        ("validation_failed", "body"),
        "{e:?}"
    );
    assert!(parse_json::<ReplayRequest>(b"[true]", DEPTH).is_err());
    assert!(parse_json::<ReplayRequest>(b" \n{}", DEPTH).is_ok());
    // Still `invalid_json` when the body is not JSON at all, with no position noise.
    let e = parse_json::<IngestRequest>(b"{\"payload\": tru}", DEPTH).unwrap_err();
    assert_eq!(e.code, "invalid_json", "{e:?}");
    assert!(!e.detail.contains(" at line "), "{e:?}");
}
