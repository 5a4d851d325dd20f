//! Receipts: hash-bound proof objects. A receipt's content is canonicalized
//! with RFC 8785 (JCS) and hashed with sha256 (`replay_hash`); each binds the
//! previous receipt's hash of the same tenant, forming a chain. This module is
//! pure: building content, hashing, naming which field changed, walking a chain.

pub mod replay;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Hash that the first receipt of a tenant binds as its predecessor.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// RFC 8785 canonical JSON of a value.
///
/// The common case is written by serde_json itself with [`JcsNumbers`] for the numbers: a
/// `Map` iterates its keys in byte order, which is JCS's UTF-16 order unless a key holds a
/// character at or above U+E000 (there the two orders part). Values with such keys go to
/// `serde_json_canonicalizer`, which sorts every object by UTF-16 code units; it is also the
/// oracle the fast path is tested against. The fast path exists because the crate buffers and
/// re-sorts every member of every object and boxes a writer per token: it was the largest cost
/// of a proxied write on the proxy thread.
pub fn canonical_json(v: &Value) -> Result<String, serde_json::Error> {
    if !keys_in_jcs_order(v) {
        return serde_json_canonicalizer::to_string(v);
    }
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, JcsNumbers);
    serde::Serialize::serialize(v, &mut ser)?;
    // serde_json writes only UTF-8.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// Whether every object key of `v` iterates in JCS order as stored: no key has a byte of a
/// character at or above U+E000 (UTF-8 lead bytes 0xEE and up).
fn keys_in_jcs_order(v: &Value) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .all(|(k, v)| k.bytes().all(|b| b < 0xEE) && keys_in_jcs_order(v)),
        Value::Array(a) => a.iter().all(keys_in_jcs_order),
        _ => true,
    }
}

/// Whether `v` holds a number that serde_json writes differently from JCS (any float, an
/// integer beyond 2^53): only then does a stored payload need its own serialization.
fn numbers_differ_from_jcs(v: &Value) -> bool {
    const EXACT: u64 = 1 << 53;
    match v {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u > EXACT,
            (None, Some(i)) => i.unsigned_abs() > EXACT,
            _ => true,
        },
        Value::Object(m) => m.values().any(numbers_differ_from_jcs),
        Value::Array(a) => a.iter().any(numbers_differ_from_jcs),
        _ => false,
    }
}

/// serde_json's compact output with numbers as RFC 8785 writes them: every number is an IEEE
/// double in ECMAScript's shortest form (`ryu-js`). Strings need nothing: serde_json escapes
/// exactly what JCS escapes (`"`, `\\`, control characters, `\b\f\n\r\t` in short form,
/// others as lowercase `\u00xx`).
struct JcsNumbers;

macro_rules! as_double {
    ($($f:ident: $t:ty),*) => {$(
        fn $f<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: $t) -> std::io::Result<()> {
            self.write_f64(w, v as f64)
        }
    )*};
}

impl serde_json::ser::Formatter for JcsNumbers {
    as_double!(write_i8: i8, write_i16: i16, write_i32: i32, write_i64: i64, write_i128: i128,
        write_u8: u8, write_u16: u16, write_u32: u32, write_u64: u64, write_u128: u128,
        write_f32: f32);

    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f64) -> std::io::Result<()> {
        if !v.is_finite() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "NaN and infinities are not JSON",
            ));
        }
        w.write_all(ryu_js::Buffer::new().format_finite(v).as_bytes())
    }

    fn write_number_str<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        v: &str,
    ) -> std::io::Result<()> {
        let n: f64 = v
            .parse()
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a number"))?;
        self.write_f64(w, n)
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut out = [0u8; 64];
    // `encode` collects a char iterator; the slice form is a table lookup per byte. A digest
    // is exactly half the buffer, so this cannot fail.
    let _ = hex::encode_to_slice(Sha256::digest(bytes), &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// sha256 of the canonical JSON of `v`.
pub fn hash_value(v: &Value) -> String {
    sha256_hex(canonical_json(v).unwrap_or_default().as_bytes())
}

/// Hex digits kept of each field's digest: 64 bits. The digests only name the field a replay
/// finds altered; what proves the content is `replay_hash`, a whole sha256 of it. (Stored as 64
/// hex digits by earlier versions; a recorded digest is compared as a prefix, so both read.)
pub const FIELD_DIGEST_HEX: usize = 16;

/// The digest of one field's value as recorded: the first [`FIELD_DIGEST_HEX`] hex digits of the
/// sha256 of its canonical JSON.
fn field_digest(canonical: &str) -> String {
    let mut d = sha256_hex(canonical.as_bytes());
    d.truncate(FIELD_DIGEST_HEX);
    d
}

/// Digest of each top-level field of the content, kept beside the receipt so
/// a replay can name the field that was altered, not just say that one was.
pub fn field_digests(content: &Map<String, Value>) -> Map<String, Value> {
    content
        .iter()
        .map(|(k, v)| {
            let d = field_digest(&canonical_json(v).unwrap_or_default());
            (k.clone(), Value::String(d))
        })
        .collect()
}

/// Fields whose digest differs between what was recorded and what is stored now.
pub fn changed_fields(content: &Map<String, Value>, recorded: &Map<String, Value>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in content {
        match recorded.get(k).and_then(Value::as_str) {
            Some(d) if d.len() >= FIELD_DIGEST_HEX && hash_value(v).starts_with(d) => {}
            _ => out.push(k.clone()),
        }
    }
    for k in recorded.keys() {
        if !content.contains_key(k) {
            out.push(k.clone());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A receipt's content canonicalized (RFC 8785) member by member before its place in the chain
/// is known. Sealing adds `sequence` and `previousHash` and joins the members: the result is
/// byte for byte `canonical_json` of the whole content, so the costly part (serializing and
/// hashing every field) runs where the receipt is built, in parallel, and the chain's serial
/// step is a splice and one sha256.
#[derive(Debug, Clone)]
pub struct CanonicalContent {
    /// One per field, in JCS order (UTF-16 code units of the key).
    members: Vec<Member>,
}

#[derive(Debug, Clone)]
struct Member {
    key: String,
    /// Bytes of the key as a JSON string at the start of `canonical` and `plain`.
    name_len: usize,
    /// `"key":value`, canonical (what the hash covers).
    canonical: String,
    /// `"key":value` as serde_json writes it (what is stored: it keeps what JCS folds, such as
    /// `-0.0` against `0`, so the stored material reads back as the same values).
    plain: String,
    /// The field's digest as recorded (see [`field_digest`]).
    digest: String,
}

/// A receipt content bound to its chain position.
#[derive(Debug, Clone)]
pub struct SealedContent {
    /// The whole content as JSON (stored as the receipt's payload); its canonical form is what
    /// `replay_hash` covers.
    pub payload: String,
    /// sha256 of the canonical JSON of the content.
    pub replay_hash: String,
    /// `{field: sha256 of its canonical value}` as JSON (see [`field_digests`]).
    pub field_digests: String,
}

fn canonical_or_plain(v: &Value) -> String {
    // Serializing a `Value` cannot fail (its numbers are finite, its keys strings); the fallback
    // only keeps this total.
    canonical_json(v).unwrap_or_else(|_| v.to_string())
}

fn jcs_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

impl CanonicalContent {
    pub fn new(content: Map<String, Value>) -> Self {
        let mut members: Vec<Member> = content
            .into_iter()
            .map(|(k, v)| Member::new(k, &v))
            .collect();
        members.sort_by(|a, b| jcs_order(&a.key, &b.key));
        CanonicalContent { members }
    }

    /// The content with `sequence` and `previousHash` bound, serialized and hashed.
    pub fn seal(&self, sequence: i64, previous_hash: &str) -> SealedContent {
        let chain = [
            Member::new("sequence".into(), &Value::from(sequence)),
            Member::new("previousHash".into(), &Value::String(previous_hash.into())),
        ];
        let mut all: Vec<&Member> = self
            .members
            .iter()
            .filter(|m| m.key != "sequence" && m.key != "previousHash")
            .chain(chain.iter())
            .collect();
        all.sort_by(|a, b| jcs_order(&a.key, &b.key));
        let join = |text: fn(&Member) -> &str| {
            let mut out =
                String::with_capacity(all.iter().map(|m| text(m).len() + 1).sum::<usize>() + 2);
            out.push('{');
            for (i, m) in all.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(text(m));
            }
            out.push('}');
            out
        };
        let canonical = join(|m| &m.canonical);
        // `{"key":"digest",...}`: each member's canonical key is the text before its first
        // `:` outside the key string, which is exactly `name.len()` bytes.
        let mut field_digests = String::with_capacity(all.len() * (FIELD_DIGEST_HEX + 24) + 2);
        field_digests.push('{');
        for (i, m) in all.iter().enumerate() {
            if i > 0 {
                field_digests.push(',');
            }
            field_digests.push_str(&m.canonical[..m.name_len]);
            field_digests.push_str(":\"");
            field_digests.push_str(&m.digest);
            field_digests.push('"');
        }
        field_digests.push('}');
        SealedContent {
            replay_hash: sha256_hex(canonical.as_bytes()),
            payload: join(|m| &m.plain),
            field_digests,
        }
    }
}

impl Member {
    fn new(key: String, v: &Value) -> Member {
        let value = canonical_or_plain(v);
        let digest = field_digest(&value);
        // A string serializes the same in both forms (serde_json escapes what JCS escapes).
        let name = serde_json::to_string(&key).unwrap_or_default();
        let mut canonical = String::with_capacity(name.len() + 1 + value.len());
        canonical.push_str(&name);
        canonical.push(':');
        canonical.push_str(&value);
        // The stored form differs from the canonical one only in how numbers are spelled.
        let plain = if numbers_differ_from_jcs(v) {
            let mut plain = Vec::with_capacity(canonical.len() + 16);
            plain.extend_from_slice(name.as_bytes());
            plain.push(b':');
            // Writing a `Value` to memory cannot fail.
            let _ = serde_json::to_writer(&mut plain, v);
            String::from_utf8(plain).unwrap_or_default()
        } else {
            canonical.clone()
        };
        Member {
            name_len: name.len(),
            key,
            canonical,
            plain,
            digest,
        }
    }
}

/// One receipt as the chain sees it.
#[derive(Debug, Clone)]
pub struct ChainLink {
    pub id: String,
    pub seq: i64,
    pub replay_hash: String,
    pub prev_hash: String,
    pub payload: String,
}

/// The first broken link of a chain, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLink {
    pub seq: i64,
    /// The sequence of the last receipt that verified before this one (0: none did).
    pub last_good: i64,
    pub receipt_id: String,
    pub reason: String,
}

impl std::fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "receipt {} (sequence {}): {}",
            self.receipt_id, self.seq, self.reason
        )
    }
}

/// Walks links in sequence order starting after (`prev_seq`, `prev_hash`).
/// Returns the new tip, or the first broken link.
pub fn verify_links(
    prev_seq: i64,
    prev_hash: &str,
    links: &[ChainLink],
) -> Result<(i64, String), BrokenLink> {
    let mut seq = prev_seq;
    let mut hash = prev_hash.to_string();
    for l in links {
        let broken = |reason: String| BrokenLink {
            seq: l.seq,
            last_good: seq,
            receipt_id: l.id.clone(),
            reason,
        };
        if l.seq != seq + 1 {
            return Err(broken(format!(
                "sequence gap: expected {}, found {}",
                seq + 1,
                l.seq
            )));
        }
        let content: Value = serde_json::from_str(&l.payload)
            .map_err(|e| broken(format!("stored content is not JSON: {e}")))?;
        let actual = hash_value(&content);
        if actual != l.replay_hash {
            return Err(broken(format!(
                "content hash {actual} does not match replay_hash {}",
                l.replay_hash
            )));
        }
        if l.prev_hash != hash
            || content.get("previousHash").and_then(Value::as_str) != Some(hash.as_str())
        {
            return Err(broken(format!(
                "does not bind the previous receipt's hash {hash}"
            )));
        }
        if content.get("sequence").and_then(Value::as_i64) != Some(l.seq) {
            return Err(broken(
                "content sequence differs from the stored sequence".into(),
            ));
        }
        seq = l.seq;
        hash = l.replay_hash.clone();
    }
    Ok((seq, hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Sealing member by member gives exactly what canonicalizing the whole content gives:
    /// the payload, its hash and every field digest, whatever the keys (non-ASCII keys sort by
    /// UTF-16 code units in JCS, not by bytes).
    #[test]
    fn sealed_content_hashes_as_the_whole_and_reads_back_the_same() {
        let content = json!({
            "version": 1, "kind": "proxy_write", "scores": {"risk": 0.2, "authority": 1e30, "zero": -0.0, "one": 1.0},
            "reasonCodes": ["a", "b"], "context": {"\u{e9}t\u{e9}": 1, "z": [null, true], "\u{1f600}": "x", "\u{ff61}": 2},
            "\u{1f600}top": "emoji key", "\u{ff61}top": "halfwidth key", "previousHash": "stale",
        });
        let map = content.as_object().unwrap().clone();
        let sealed = CanonicalContent::new(map.clone()).seal(42, "abc");
        let mut whole = map;
        whole.insert("sequence".into(), json!(42));
        whole.insert("previousHash".into(), json!("abc"));
        let whole = Value::Object(whole);
        assert_eq!(sealed.replay_hash, hash_value(&whole));
        let digests: Value = serde_json::from_str(&sealed.field_digests).unwrap();
        assert_eq!(
            digests,
            Value::Object(field_digests(whole.as_object().unwrap()))
        );
        // What is stored reads back as the very same values (-0.0 stays a float, 1e30 too),
        // and hashes to the replay hash.
        let parsed: Value = serde_json::from_str(&sealed.payload).unwrap();
        assert_eq!(parsed, whole);
        assert_eq!(hash_value(&parsed), sealed.replay_hash);
    }

    /// RFC 8785 section 3.2.2 / appendix examples: key order, number forms, escapes.
    #[test]
    fn canonical_json_matches_rfc8785_examples() {
        let v: Value = serde_json::from_str(
            r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&v).unwrap(),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        let sorted: Value = serde_json::from_str(r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}"#).unwrap();
        let c = canonical_json(&sorted).unwrap();
        let order: Vec<&str> = [
            "\r",
            "1",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
        ]
        .to_vec();
        let mut last = 0;
        for k in order {
            let pos = c
                .find(&format!("\"{}\"", k.replace('\r', "\\r")))
                .expect("key present");
            assert!(pos >= last, "key {k:?} out of UTF-16 order in {c}");
            last = pos;
        }
    }

    #[test]
    fn canonical_form_is_stable_under_key_order_and_number_spelling() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1.0, "a": [1e2, -0.0], "c": {"y": 1, "x": 2}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"c": {"x": 2, "y": 1}, "a": [100, 0], "b": 1}"#).unwrap();
        assert_eq!(canonical_json(&a).unwrap(), canonical_json(&b).unwrap());
        let once = canonical_json(&a).unwrap();
        let twice = canonical_json(&serde_json::from_str(&once).unwrap()).unwrap();
        assert_eq!(once, twice, "canonicalization is idempotent");
    }

    /// Any JSON value: keys and strings from all of Unicode, numbers of every kind serde_json
    /// keeps (u64, i64, f64), nested.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[a-z\\u{0}-\\u{1f}\\u{e000}-\\u{e010}\\u{ff00}-\\u{ff10}\\u{10000}-\\u{10010}]{0,6}"
                .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        "[a-zA-Z0-9_]{0,8}",
                        "[a-z\\u{80}-\\u{ff}\\u{e000}-\\u{e010}\\u{ffe0}-\\u{ffef}\\u{1f600}-\\u{1f610}]{1,4}",
                        any::<String>(),
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// The fast path writes byte for byte what the canonicalizer crate writes, and a
        /// member's stored form reads back as the value it was made from.
        #[test]
        fn canonical_json_equals_the_crate(v in any_json()) {
            let ours = canonical_json(&v).unwrap();
            let crate_form = serde_json_canonicalizer::to_string(&v).unwrap();
            proptest::prop_assert_eq!(&ours, &crate_form);
            let m = Member::new("k".into(), &v);
            let back: Value = serde_json::from_str(&format!("{{{}}}", m.plain)).unwrap();
            proptest::prop_assert_eq!(&back["k"], &v);
        }
    }

    fn chain(n: i64) -> Vec<ChainLink> {
        let mut prev = GENESIS_HASH.to_string();
        (1..=n)
            .map(|seq| {
                let content = json!({"sequence": seq, "previousHash": prev, "decision": "allow"});
                let h = hash_value(&content);
                let l = ChainLink {
                    id: format!("r{seq}"),
                    seq,
                    replay_hash: h.clone(),
                    prev_hash: prev.clone(),
                    payload: content.to_string(),
                };
                prev = h;
                l
            })
            .collect()
    }

    #[test]
    fn an_intact_chain_verifies_and_a_changed_byte_is_found() {
        let links = chain(5);
        assert_eq!(verify_links(0, GENESIS_HASH, &links).unwrap().0, 5);
        let mut bad = links.clone();
        bad[2].payload = bad[2].payload.replace("allow", "block");
        let e = verify_links(0, GENESIS_HASH, &bad).unwrap_err();
        assert_eq!(e.seq, 3);
        let mut gap = links.clone();
        gap.remove(1);
        assert_eq!(verify_links(0, GENESIS_HASH, &gap).unwrap_err().seq, 3);
    }

    #[test]
    fn changed_fields_names_the_altered_field() {
        let content = json!({"decision": "allow", "signal": {"id": "x"}});
        let rec = field_digests(content.as_object().unwrap());
        let altered = json!({"decision": "block", "signal": {"id": "x"}});
        assert_eq!(
            changed_fields(altered.as_object().unwrap(), &rec),
            vec!["decision".to_string()]
        );
        // Receipts recorded with whole digests (by earlier versions) read the same way.
        let whole: Map<String, Value> = content
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(hash_value(v))))
            .collect();
        assert_eq!(
            changed_fields(altered.as_object().unwrap(), &whole),
            vec!["decision".to_string()]
        );
        assert!(changed_fields(content.as_object().unwrap(), &whole).is_empty());
        // A digest too short to mean anything names its field.
        let mut short = rec.clone();
        short.insert("signal".into(), json!("ab"));
        assert_eq!(
            changed_fields(content.as_object().unwrap(), &short),
            vec!["signal".to_string()]
        );
    }
}
