//! Properties of the config loader (`config::load_str`): whatever the text, it returns a loaded
//! config or a list of problems, never panics; every problem of a parseable file names the path
//! of the value at fault (`tenants[1].api_keys[0].sha256`), and a file that is not TOML is one
//! problem that gives the line. Inputs: arbitrary text, byte-level damage to the shipped
//! `config/local.toml` and to the test harness's config, and arbitrary TOML trees built from the
//! config's own vocabulary (so that deep, type-confused and out-of-range values are reached).

mod props_support;

use props_support::cfg;
use proptest::prelude::*;
use std::path::Path;
use substrate_gate::config::{load_str, ConfigProblem};

const SHIPPED: &str = include_str!("../config/local.toml");

const SECTIONS: &[&str] = &[
    "include",
    "service",
    "listeners",
    "storage",
    "limits",
    "logging",
    "upstream",
    "proxy",
    "webhooks",
    "tenants",
    "policies",
];

/// Every key the config schema knows (and a few it does not).
const KEYS: &[&str] = &[
    "address",
    "allow_networks",
    "api",
    "api_body_bytes",
    "api_keys",
    "authority",
    "authority_ceiling",
    "batch_size",
    "block_threshold",
    "body_timeout_ms",
    "concurrency",
    "connect_timeout_ms",
    "default_source",
    "detectors",
    "enabled",
    "fail_open_routes",
    "format",
    "host_header",
    "id",
    "identity",
    "identity_header",
    "idle_timeout_ms",
    "json_max_depth",
    "level",
    "max_connections",
    "max_influence",
    "max_risk",
    "metrics",
    "min_authority",
    "min_evidence",
    "mode",
    "mutation",
    "name",
    "packs",
    "policy",
    "poll_interval_ms",
    "profile",
    "proxy",
    "proxy_body_bytes",
    "proxy_threads",
    "quarantine_threshold",
    "rate_limit_burst",
    "rate_limit_per_second",
    "read_timeout_ms",
    "release_authority",
    "requirements",
    "retrieval_treatment",
    "rotation_grace_secs",
    "schedule_secs",
    "sha256",
    "shutdown_timeout_secs",
    "source_id",
    "source_type",
    "sources",
    "sqlite_synchronous",
    "substrate",
    "tenant",
    "tenant_header",
    "timeout_ms",
    "trust",
    "trust_decay_ratio",
    "url",
    "url_env",
    "warn_threshold",
    "watch",
    "write_timeout_ms",
    "upstream_key_sha256",
    "weights",
    "disabled",
    "known_hosts",
    "extra_injection_phrases",
    "extra_policy_phrases",
    "default",
    "bogus",
    "",
];

/// Strings a config holds, valid and not: addresses, URLs, UUIDs, hashes, enum names, filters.
const STRINGS: &[&str] = &[
    "127.0.0.1:0",
    "[::1]:0",
    "nowhere",
    "0.0.0.0:99999",
    "sqlite::memory:",
    "sqlite://x/../y.db",
    "postgres://u@h/db",
    "mysql://x",
    "00000000-0000-4000-8000-000000000001",
    "not-a-uuid",
    "090d1548c9d65f413a1a2c828a0bee3a7ae02d2137caf51e6029e6c3cb1f1fa4",
    "090D1548C9D65F413A1A2C828A0BEE3A7AE02D2137CAF51E6029E6C3CB1F1FA4",
    "abc",
    "json",
    "text",
    "info",
    "warn,substrate_gate=debug",
    "[[[",
    "=off",
    "normal",
    "full",
    "enforcement",
    "shadow",
    "standard",
    "yolo",
    "*",
    "agent_memory",
    "write_memory",
    "canonical_memory",
    "moon",
    "10.0.0.0/8",
    "::1/128",
    "300.0.0.0/8",
    "default",
    "user_input",
    "agent_output",
    "injection",
    "../filters/chroma.toml",
    "no/such/pack.toml",
    "",
    " ",
    "\u{0}",
    "\u{202e}",
    "(a+)+$",
    "docs.example.com",
];

fn toml_leaf() -> impl Strategy<Value = toml::Value> {
    prop_oneof![
        4 => prop::sample::select(STRINGS).prop_map(|s| toml::Value::String(s.to_string())),
        1 => "\\PC{0,12}".prop_map(toml::Value::String),
        2 => prop_oneof![
            Just(0i64), Just(1), Just(-1), Just(4), Just(64), Just(1024), Just(65536),
            Just(i64::MAX), Just(i64::MIN), Just(u32::MAX as i64 + 1), any::<i64>(),
        ]
        .prop_map(toml::Value::Integer),
        2 => prop_oneof![
            Just(0.0f64), Just(0.5), Just(1.0), Just(1.0000001), Just(-0.0), Just(f64::NAN),
            Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(1e300), any::<f64>(),
        ]
        .prop_map(toml::Value::Float),
        1 => any::<bool>().prop_map(toml::Value::Boolean),
        1 => Just(toml::Value::Datetime("1979-05-27T07:32:00Z".parse().expect("datetime"))),
    ]
}

fn toml_value(depth: u32) -> BoxedStrategy<toml::Value> {
    toml_leaf()
        .prop_recursive(depth, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(toml::Value::Array),
                prop::collection::btree_map(prop::sample::select(KEYS), inner, 0..6).prop_map(
                    |m| toml::Value::Table(
                        m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                    )
                ),
            ]
        })
        .boxed()
}

/// A whole config: known sections (and some unknown), each a tree of known keys.
fn toml_config() -> impl Strategy<Value = toml::Table> {
    prop::collection::btree_map(
        prop_oneof![8 => prop::sample::select(SECTIONS), 1 => prop::sample::select(KEYS)],
        prop_oneof![
            3 => toml_value(3),
            // [[tenants]] / [[policies.x.requirements]]-like arrays of tables.
            1 => prop::collection::vec(
                prop::collection::btree_map(prop::sample::select(KEYS), toml_value(2), 0..6),
                0..3
            )
            .prop_map(|ts| toml::Value::Array(
                ts.into_iter()
                    .map(|m| toml::Value::Table(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
                    .collect()
            )),
        ],
        0..8,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn harness_config() -> String {
    format!(
        r#"
[listeners]
api = "127.0.0.1:0"
proxy = "127.0.0.1:0"
metrics = "127.0.0.1:0"
[storage]
url = "sqlite://gate.db"
[proxy]
packs = ["{root}/filters/generic.toml"]
tenant = "00000000-0000-4000-8000-000000000001"
[[tenants]]
id = "00000000-0000-4000-8000-000000000001"
name = "demo"
[[tenants.api_keys]]
id = "demo"
sha256 = "090d1548c9d65f413a1a2c828a0bee3a7ae02d2137caf51e6029e6c3cb1f1fa4"
authority_ceiling = 0.9
rate_limit_per_second = 2
[policies.default]
mode = "enforcement"
"#,
        root = env!("CARGO_MANIFEST_DIR")
    )
}

fn mutate(text: &str, edits: &[(usize, u8, String)]) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for (pos, op, chunk) in edits {
        if s.is_empty() {
            s.extend(chunk.chars());
            continue;
        }
        let i = pos % s.len();
        match op % 5 {
            0 => {
                let end = (i + chunk.len() % 8 + 1).min(s.len());
                s.drain(i..end);
            }
            1 => {
                s.splice(i..i, chunk.chars());
            }
            2 => {
                let end = (i + 40).min(s.len());
                let dup: Vec<char> = s[i..end].to_vec();
                s.splice(i..i, dup);
            }
            3 => {
                if let Some(c) = chunk.chars().next() {
                    s[i] = c;
                }
            }
            _ => {
                // Swap two lines' worth of text around.
                let j = (pos / 7) % s.len();
                let (a, b) = (i.min(j), i.max(j));
                s[a..=b].reverse();
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
            Just("[".to_string()),
            Just("]]".to_string()),
            Just("=".to_string()),
            Just("\"".to_string()),
            Just("'''".to_string()),
            Just("#".to_string()),
            Just("\n[[tenants]]\n".to_string()),
            Just("\n[policies.default]\n".to_string()),
            Just(" = 1e999\n".to_string()),
            Just("{ a = [1, \"x\"] }".to_string()),
            "\\PC{0,6}",
        ],
    )
}

/// Loads with includes and packs resolved in an empty directory (nothing to read by accident).
fn load(text: &str) -> Result<(), Vec<ConfigProblem>> {
    let dir = tempfile::tempdir().expect("tempdir");
    load_str(text, dir.path()).map(|_| ())
}

/// A problem names where it is: a path when the file parsed, else the parser's line.
fn assert_located(text: &str, problems: &[ConfigProblem]) -> Result<(), TestCaseError> {
    prop_assert!(!problems.is_empty(), "an error without problems");
    let parses = text.parse::<toml::Table>().is_ok();
    for p in problems {
        prop_assert!(!p.message.is_empty(), "problem without a message: {:?}", p);
        if parses {
            prop_assert!(
                !p.path.is_empty(),
                "problem without a path: {:?}\nconfig:\n{}",
                p,
                text
            );
        } else {
            prop_assert_eq!(
                problems.len(),
                1,
                "unparseable text is one problem: {:?}",
                problems
            );
            prop_assert!(p.message.starts_with("not valid TOML"), "{:?}", p);
            prop_assert!(p.message.contains("line "), "no line in {:?}", p);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cfg(256))]

    /// Arbitrary text never panics the loader.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        if let Err(p) = load(&text) {
            assert_located(&text, &p)?;
        }
    }

}

// A config that parses costs most of a second to validate in a debug build (compiling the
// detectors of its policies): few cases here, many in `scripts/fuzz.sh`'s release build.
proptest! {
    #![proptest_config(cfg(24))]

    /// Damaged copies of the shipped config and of the test config: a config or located problems.
    #[test]
    fn damaged_configs_are_reported_with_paths(
        shipped in any::<bool>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let base = if shipped { SHIPPED.to_string() } else { harness_config() };
        let text = mutate(&base, &edits);
        if let Err(p) = load(&text) {
            assert_located(&text, &p)?;
        }
    }

    /// Arbitrary TOML trees over the config's vocabulary: every problem has a path whose first
    /// segment is the section (or unknown key) it is in.
    #[test]
    fn toml_trees_are_validated_with_paths(tree in toml_config()) {
        let Ok(text) = toml::to_string(&tree) else { return Ok(()); };
        match load(&text) {
            Ok(()) => {}
            Err(problems) => {
                assert_located(&text, &problems)?;
                if text.parse::<toml::Table>().is_ok() {
                    for p in &problems {
                        let head = p.path.split(['.', '[']).next().unwrap_or("");
                        let head = if head == "\"\"" { "" } else { head };
                        prop_assert!(
                            tree.contains_key(head) || SECTIONS.contains(&head),
                            "path {:?} is not under a section of the config: {:?}", p.path, p
                        );
                    }
                }
            }
        }
    }

    /// A valid config with one value replaced by an arbitrary TOML value: loaded, or problems that
    /// all have paths (and the replaced one among them when it is invalid).
    #[test]
    fn one_bad_value_is_named(
        section in prop::sample::select(&["listeners", "storage", "limits", "logging", "upstream", "webhooks", "service"][..]),
        key in prop::sample::select(KEYS),
        value in toml_value(2),
    ) {
        let mut tree: toml::Table = harness_config().parse().expect("harness config parses");
        let slot = tree.entry(section.to_string()).or_insert_with(|| toml::Value::Table(Default::default()));
        if let toml::Value::Table(t) = slot {
            t.insert(key.to_string(), value);
        }
        let Ok(text) = toml::to_string(&tree) else { return Ok(()); };
        if let Err(problems) = load(&text) {
            assert_located(&text, &problems)?;
            prop_assert!(
                problems.iter().any(|p| p.path.starts_with(section)),
                "the changed section {} is not named: {:?}", section, problems
            );
        }
    }
}

/// The shipped config and the harness config load as they are (the properties above start
/// from them).
#[test]
fn the_bases_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    load_str(SHIPPED, &dir).expect("config/local.toml loads");
    load(&harness_config()).expect("the harness config loads");
}

/// Inputs the properties found, kept as plain tests.
#[test]
fn found_by_properties() {
    // An unknown empty top-level key was reported with an empty path.
    let p = load("\"\" = \"127.0.0.1:0\"\n").unwrap_err();
    assert_eq!(p[0].path, "\"\"", "{p:?}");
    assert!(
        p[0].to_string().starts_with("\"\": unknown section"),
        "{p:?}"
    );
}
