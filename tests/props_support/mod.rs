//! Strategies and helpers shared by the property tests (`tests/props_*.rs`).
//!
//! Case counts: each property states its own default for `cargo test`; `PROPTEST_CASES` (set by
//! `scripts/fuzz.sh`) overrides it, as do the other `PROPTEST_*` variables (`PROPTEST_RNG_SEED`
//! replays a run). Failing inputs are persisted beside the test file
//! (`tests/props_*.proptest-regressions`) and replayed first by every later run.
#![allow(dead_code)]

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use serde_json::{Map, Number, Value};

/// The property's own case count unless `PROPTEST_CASES` says otherwise.
pub fn cfg(default_cases: u32) -> Config {
    let mut c = Config {
        // Beside the test file: `tests/props_x.proptest-regressions` (the default looks for a
        // lib.rs above tests/, finds none and says so before doing the same).
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = default_cases;
    }
    c
}

/// Strings that are hard on parsers and escapers: quotes, backslashes, control characters,
/// non-BMP characters, the UTF-16 sort-order traps of RFC 8785, and plain text.
pub fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9 _.-]{0,12}",
        2 => "\\PC{0,16}",
        2 => prop::collection::vec(
            prop_oneof![
                Just('"'), Just('\\'), Just('/'), Just('\u{0}'), Just('\u{1f}'), Just('\u{7f}'),
                Just('\n'), Just('\r'), Just('\t'), Just('\u{80}'), Just('\u{2028}'),
                Just('\u{20ac}'), Just('\u{fb33}'), Just('\u{ffff}'), Just('\u{1f600}'),
                Just('\u{10ffff}'), Just('a'), Just('1'), Just('\u{e9}'), Just('\u{65}'),
                Just('\u{301}'),
            ],
            0..10,
        )
        .prop_map(|cs| cs.into_iter().collect()),
    ]
}

/// Numbers as JSON holds them: integers of every width, and finite doubles including the
/// edges (subnormals, -0.0, the largest finite, integers past 2^53).
pub fn json_number() -> impl Strategy<Value = Number> {
    prop_oneof![
        3 => any::<i64>().prop_map(Number::from),
        1 => any::<u64>().prop_map(Number::from),
        2 => (-1000i64..1000).prop_map(Number::from),
        3 => any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Number::from_f64(f).expect("finite")),
        1 => prop_oneof![
            Just(0.0f64), Just(-0.0), Just(f64::MAX), Just(f64::MIN), Just(f64::MIN_POSITIVE),
            Just(5e-324), Just(1e21), Just(1e-7), Just(9007199254740993.0), Just(0.1), Just(1e300),
        ]
        .prop_map(|f| Number::from_f64(f).expect("finite")),
    ]
}

/// Any JSON value, up to `depth` levels of arrays/objects.
pub fn json_value(depth: u32) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number().prop_map(Value::Number),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
    .boxed()
}

/// A JSON object with arbitrary members.
pub fn json_object(depth: u32) -> BoxedStrategy<Map<String, Value>> {
    prop::collection::btree_map(nasty_string(), json_value(depth), 0..8)
        .prop_map(|m| m.into_iter().collect())
        .boxed()
}
