//! Properties of the RFC 8785 (JCS) canonicalizer that receipts are hashed with
//! (`receipts::canonical_json`): canonical form is idempotent, valid JSON, sorted by UTF-16
//! code units, and the same whatever the key order, the whitespace, the string escapes or the
//! spelling of the numbers (`1`, `1.0`, `1e0`, `10E-1`, `-0`) of the text it was parsed from.
//! A receipt's hash must not depend on how its content was written down.

mod props_support;

use props_support::{cfg, json_value};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Number, Value};
use substrate_gate::receipts::{canonical_json, hash_value};

/// Largest integer a double holds exactly: integers up to it may be re-spelled as fractions.
const EXACT: u64 = 1 << 53;

fn spell_number(n: &Number, rng: &mut StdRng) -> String {
    if let Some(i) = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)) {
        if i.unsigned_abs() > EXACT as u128 {
            return i.to_string();
        }
        let spellings = [
            i.to_string(),
            format!("{i}.0"),
            format!("{i}.000"),
            format!("{i}e0"),
            format!("{i}E+0"),
            format!("{i}0e-1"),
            format!("{:e}", i as f64),
            format!("{:E}", i as f64),
        ];
        let mut s = spellings[rng.gen_range(0..spellings.len())].clone();
        if i == 0 && rng.gen_bool(0.3) {
            s = ["-0", "-0.0", "0e5", "-0E-3"][rng.gen_range(0..4)].to_string();
        }
        return s;
    }
    let f = n.as_f64().expect("a JSON number is i64, u64 or f64");
    let spellings = [
        format!("{f}"),
        format!("{f:e}"),
        format!("{f:E}"),
        format!("{f:?}"),
    ];
    let s = spellings[rng.gen_range(0..spellings.len())].clone();
    // Rust writes `inf`/`NaN` only for non-finite values, which JSON values never hold.
    if s.ends_with(".0") || !s.contains(['.', 'e', 'E']) {
        return s;
    }
    s
}

fn spell_string(s: &str, rng: &mut StdRng) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        let must = c == '"' || c == '\\' || (c as u32) < 0x20;
        if must || rng.gen_bool(0.15) {
            match (c, rng.gen_range(0..3)) {
                ('"', 0) => out.push_str("\\\""),
                ('\\', 0) => out.push_str("\\\\"),
                ('\n', 0) => out.push_str("\\n"),
                ('/', 0) => out.push_str("\\/"),
                _ => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        if rng.gen_bool(0.5) {
                            out.push_str(&format!("\\u{u:04x}"));
                        } else {
                            out.push_str(&format!("\\u{u:04X}"));
                        }
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

fn ws(rng: &mut StdRng) -> &'static str {
    [""; 4]
        .iter()
        .chain([" ", "\n", "\t ", "\r\n  "].iter())
        .nth(rng.gen_range(0..8))
        .copied()
        .unwrap_or("")
}

/// The same value written differently: keys shuffled, whitespace, escapes, number spellings.
fn spell(v: &Value, rng: &mut StdRng) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => spell_number(n, rng),
        Value::String(s) => spell_string(s, rng),
        Value::Array(a) => {
            let items: Vec<String> = a
                .iter()
                .map(|x| format!("{}{}{}", ws(rng), spell(x, rng), ws(rng)))
                .collect();
            format!("[{}{}]", items.join(","), ws(rng))
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.shuffle(rng);
            let items: Vec<String> = members
                .into_iter()
                .map(|(k, x)| {
                    format!(
                        "{}{}{}:{}{}",
                        ws(rng),
                        spell_string(k, rng),
                        ws(rng),
                        ws(rng),
                        spell(x, rng)
                    )
                })
                .collect();
            format!("{{{}{}}}", items.join(","), ws(rng))
        }
    }
}

/// A JSON tree that remembers member order, to check the order canonical form writes.
enum Ordered {
    Leaf,
    Array(Vec<Ordered>),
    Object(Vec<(String, Ordered)>),
}

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Ordered::Array(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, Ordered>()? {
                    v.push((k, x));
                }
                Ok(Ordered::Object(v))
            }
        }
        d.deserialize_any(V)
    }
}

fn assert_utf16_sorted(o: &Ordered) -> Result<(), TestCaseError> {
    match o {
        Ordered::Leaf => Ok(()),
        Ordered::Array(a) => a.iter().try_for_each(assert_utf16_sorted),
        Ordered::Object(m) => {
            for w in m.windows(2) {
                let a: Vec<u16> = w[0].0.encode_utf16().collect();
                let b: Vec<u16> = w[1].0.encode_utf16().collect();
                prop_assert!(
                    a < b,
                    "keys {:?} and {:?} out of UTF-16 order",
                    w[0].0,
                    w[1].0
                );
            }
            m.iter().try_for_each(|(_, x)| assert_utf16_sorted(x))
        }
    }
}

fn whitespace_outside_strings(text: &str) -> bool {
    let (mut in_str, mut esc) = (false, false);
    for c in text.chars() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
        } else if c == '"' {
            in_str = true;
        } else if c.is_whitespace() {
            return true;
        }
    }
    false
}

/// Numbers compared as doubles (what JCS serializes), everything else exactly.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| same_value(p, q)))
        }
        _ => a == b,
    }
}

proptest! {
    #![proptest_config(cfg(512))]

    /// Canonical form of canonical form is itself; it is valid JSON holding the same value,
    /// with no insignificant whitespace, and every object's keys in UTF-16 order.
    #[test]
    fn canonical_form_is_idempotent_valid_and_sorted(v in json_value(4)) {
        let once = canonical_json(&v).expect("every JSON value has a canonical form");
        let parsed: Value = serde_json::from_str(&once).expect("canonical form is JSON");
        prop_assert!(same_value(&parsed, &v), "canonical form changed the value: {once}");
        let twice = canonical_json(&parsed).expect("canonical");
        prop_assert_eq!(&once, &twice);
        let ordered: Ordered = serde_json::from_str(&once).expect("JSON");
        assert_utf16_sorted(&ordered)?;
        prop_assert!(!whitespace_outside_strings(&once), "insignificant whitespace in {}", once);
    }

    /// Writing the same value differently (member order, whitespace, escapes, number
    /// spellings) gives the same canonical form and therefore the same receipt hash.
    #[test]
    fn canonical_form_ignores_how_the_text_was_written(v in json_value(4), seed in any::<u64>()) {
        let mut rng = StdRng::seed_from_u64(seed);
        let text = spell(&v, &mut rng);
        let reparsed: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("respelled text is not JSON ({e}): {text}")))?;
        let a = canonical_json(&v).expect("canonical");
        let b = canonical_json(&reparsed).expect("canonical");
        prop_assert_eq!(&a, &b, "respelled as {}", text);
        prop_assert_eq!(hash_value(&v), hash_value(&reparsed));
    }
}

/// Number spellings the RFC's examples and our receipts care about, fixed.
#[test]
fn number_spellings_canonicalize_alike() {
    for group in [
        &["1", "1.0", "1e0", "10E-1", "0.1e1", "1.000"][..],
        &["0", "-0", "0.0", "-0.0", "0e10"][..],
        &["100", "1e2", "1E+2", "100.0"][..],
        &["1e21", "1000000000000000000000", "1E21"][..],
        &["1e-7", "0.0000001", "1E-7"][..],
        &[
            "9007199254740992",
            "9007199254740992.0",
            "9.007199254740992e15",
        ][..],
    ] {
        let forms: Vec<String> = group
            .iter()
            .map(|t| canonical_json(&serde_json::from_str::<Value>(t).unwrap()).unwrap())
            .collect();
        assert!(
            forms.iter().all(|f| f == &forms[0]),
            "{group:?} -> {forms:?}"
        );
    }
}
