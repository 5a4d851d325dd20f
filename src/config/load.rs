//! Reading a config: regular files only, capped in size, includes merged,
//! each section deserialized on its own so that one mistake does not hide
//! the next, then semantic validation. Every problem carries its path
//! (`tenants[1].api_keys[0].sha256: not 64 hex characters`).

use super::{Config, MAX_CONFIG_BYTES};
use crate::kernel::policy::CompiledPolicy;
use crate::kernel::types::{
    AllowedInfluence, EvaluationMode, EvaluationProfile, ProposedMutation, TargetSubstrate,
};
use serde::de::DeserializeOwned;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// One problem in a config, with the path of the field (or file) at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

fn problem(path: impl Into<String>, message: impl Into<String>) -> ConfigProblem {
    ConfigProblem {
        path: path.into(),
        message: message.into(),
    }
}

/// A loaded, validated config with what was read to build it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// The config file and every included file / filter pack (for the watcher).
    pub files: Vec<PathBuf>,
    /// Directory relative paths are resolved against.
    pub base_dir: PathBuf,
    /// (file name, text) of every filter pack named by `proxy.packs`.
    pub packs: Vec<(String, String)>,
}

/// Reads a file that must be a regular file no larger than [`MAX_CONFIG_BYTES`].
pub fn read_capped(path: &Path) -> Result<String, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{} is {} bytes, over the {} byte limit",
            path.display(),
            meta.len(),
            MAX_CONFIG_BYTES
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Loads and validates the config at `path`, with its includes and filter packs.
pub fn load(path: &Path) -> Result<Loaded, Vec<ConfigProblem>> {
    let text = read_capped(path).map_err(|e| vec![problem("", e)])?;
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base_dir
    };
    let mut loaded = load_str(&text, &base_dir)?;
    loaded.files.insert(0, path.to_path_buf());
    Ok(loaded)
}

/// Loads a config from text; includes and packs are resolved against `base_dir`.
pub fn load_str(text: &str, base_dir: &Path) -> Result<Loaded, Vec<ConfigProblem>> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    let mut root: toml::Table = match text.parse() {
        Ok(t) => t,
        Err(e) => {
            return Err(vec![problem(
                "",
                format!("not valid TOML: {}", e.to_string().trim()),
            )])
        }
    };

    // Includes: merged in order, depth one (an included file may not include).
    if let Some(inc) = root.get("include").cloned() {
        match inc {
            toml::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let Some(rel) = item.as_str() else {
                        problems.push(problem(format!("include[{i}]"), "must be a string path"));
                        continue;
                    };
                    let p = base_dir.join(rel);
                    match read_capped(&p).and_then(|t| {
                        t.parse::<toml::Table>().map_err(|e| {
                            format!("{}: not valid TOML: {}", p.display(), e.to_string().trim())
                        })
                    }) {
                        Ok(t) => {
                            if t.contains_key("include") {
                                problems.push(problem(
                                    format!("include[{i}]"),
                                    "an included file may not include others",
                                ));
                            }
                            merge(&mut root, t);
                            files.push(p);
                        }
                        Err(e) => problems.push(problem(format!("include[{i}]"), e)),
                    }
                }
            }
            _ => problems.push(problem("include", "must be an array of paths")),
        }
    }

    let config = deserialize_sections(&root, &mut problems);
    let Some(config) = config else {
        return Err(problems);
    };

    let mut packs = Vec::new();
    for (i, rel) in config.proxy.packs.iter().enumerate() {
        let p = base_dir.join(rel);
        match read_capped(&p) {
            Ok(t) => {
                packs.push((rel.clone(), t));
                files.push(p);
            }
            Err(e) => problems.push(problem(format!("proxy.packs[{i}]"), e)),
        }
    }

    validate(&config, &mut problems);
    // Filter packs compile as part of validation: a config can only name packs that compile.
    if let Err(errs) = crate::state::compile_route_table(&packs) {
        problems.extend(
            errs.into_iter()
                .map(|e| problem("proxy.packs", e.to_string())),
        );
    }

    if problems.is_empty() {
        Ok(Loaded {
            config,
            files,
            base_dir: base_dir.to_path_buf(),
            packs,
        })
    } else {
        Err(problems)
    }
}

/// Tables merge key by key; arrays of the included file are appended; other
/// values of the included file replace the main file's.
fn merge(into: &mut toml::Table, from: toml::Table) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            (Some(toml::Value::Array(a)), toml::Value::Array(b)) => a.extend(b),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

fn section<T: DeserializeOwned + Default>(
    root: &toml::Table,
    key: &str,
    problems: &mut Vec<ConfigProblem>,
) -> T {
    match root.get(key) {
        None => T::default(),
        Some(v) => from_value(v.clone(), key, problems).unwrap_or_default(),
    }
}

fn from_value<T: DeserializeOwned>(
    v: toml::Value,
    prefix: &str,
    problems: &mut Vec<ConfigProblem>,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(v) {
        Ok(t) => Some(t),
        Err(e) => {
            let inner = e.path().to_string();
            let path = if inner == "." {
                prefix.to_string()
            } else {
                format!("{prefix}.{inner}")
            };
            // toml's messages for a missing or unknown field name it; keep them whole.
            // toml appends "in `field`" on a second line: the path already says it.
            let msg = e.inner().to_string();
            problems.push(problem(
                path,
                msg.lines().next().unwrap_or("").trim().to_string(),
            ));
            None
        }
    }
}

/// Deserializes each top-level section separately (and each tenant and policy
/// on its own) so every structural mistake is reported, not just the first.
fn deserialize_sections(root: &toml::Table, problems: &mut Vec<ConfigProblem>) -> Option<Config> {
    const KNOWN: &[&str] = &[
        "include",
        "service",
        "listeners",
        "storage",
        "limits",
        "logging",
        "upstream",
        "proxy",
        "webhooks",
        "checkpoints",
        "tenants",
        "policies",
    ];
    for k in root.keys() {
        if !KNOWN.contains(&k.as_str()) {
            problems.push(problem(
                // An empty key (`"" = 1`) still needs a path a reader can see.
                if k.is_empty() {
                    "\"\"".to_string()
                } else {
                    k.clone()
                },
                format!("unknown section, expected one of {}", KNOWN.join(", ")),
            ));
        }
    }
    let before = problems.len();
    let mut config = Config {
        include: Vec::new(),
        service: section(root, "service", problems),
        listeners: section(root, "listeners", problems),
        storage: section(root, "storage", problems),
        limits: section(root, "limits", problems),
        logging: section(root, "logging", problems),
        upstream: section(root, "upstream", problems),
        proxy: section(root, "proxy", problems),
        webhooks: section(root, "webhooks", problems),
        checkpoints: section(root, "checkpoints", problems),
        tenants: Vec::new(),
        policies: Default::default(),
    };
    match root.get("tenants") {
        None => {}
        Some(toml::Value::Array(items)) => {
            for (i, t) in items.iter().enumerate() {
                if let Some(t) = from_value(t.clone(), &format!("tenants[{i}]"), problems) {
                    config.tenants.push(t);
                }
            }
        }
        Some(_) => problems.push(problem(
            "tenants",
            "must be an array of tables ([[tenants]])",
        )),
    }
    match root.get("policies") {
        None => {
            config.policies.insert("default".into(), Default::default());
        }
        Some(toml::Value::Table(t)) => {
            for (name, p) in t {
                if let Some(p) = from_value(p.clone(), &format!("policies.{name}"), problems) {
                    config.policies.insert(name.clone(), p);
                }
            }
        }
        Some(_) => problems.push(problem("policies", "must be a table of named policies")),
    }
    let _ = before;
    // Broken sections were replaced by their defaults, so semantic validation
    // still runs on the rest and reports its problems in the same pass.
    Some(config)
}

fn unit(v: f64) -> bool {
    (0.0..=1.0).contains(&v)
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Semantic checks, all of them, each with its path. No I/O.
pub fn validate(c: &Config, problems: &mut Vec<ConfigProblem>) {
    for (name, addr) in [
        ("listeners.api", &c.listeners.api),
        ("listeners.proxy", &c.listeners.proxy),
        ("listeners.metrics", &c.listeners.metrics),
    ] {
        if addr.parse::<SocketAddr>().is_err() {
            problems.push(problem(name, format!("not an ip:port address: {addr:?}")));
        }
    }
    if c.listeners.proxy_threads == 0 || c.listeners.proxy_threads > 64 {
        problems.push(problem("listeners.proxy_threads", "must be 1 to 64"));
    }
    let url = match c.storage.url_env {
        Some(_) => None,
        None => Some(c.storage.url.as_str()),
    };
    if let Some(url) = url {
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            problems.push(problem(
                "storage.url",
                "must start with sqlite:, postgres:// or postgresql://",
            ));
        }
    }
    if c.storage.max_connections == 0 || c.storage.max_connections > 1000 {
        problems.push(problem("storage.max_connections", "must be 1 to 1000"));
    }
    if !matches!(c.storage.sqlite_synchronous.as_str(), "normal" | "full") {
        problems.push(problem(
            "storage.sqlite_synchronous",
            "must be \"normal\" or \"full\"",
        ));
    }
    if c.limits.api_body_bytes < 1024 || c.limits.api_body_bytes > 64 * 1024 * 1024 {
        problems.push(problem("limits.api_body_bytes", "must be 1 KiB to 64 MiB"));
    }
    if c.limits.proxy_body_bytes < 1024 || c.limits.proxy_body_bytes > 256 * 1024 * 1024 {
        problems.push(problem(
            "limits.proxy_body_bytes",
            "must be 1 KiB to 256 MiB",
        ));
    }
    if c.limits.proxy_max_records < 1 || c.limits.proxy_max_records > 1_000_000 {
        problems.push(problem("limits.proxy_max_records", "must be 1 to 1000000"));
    }
    let in_flight = c.limits.records_in_flight();
    if in_flight < c.limits.proxy_max_records || in_flight > 10_000_000 {
        problems.push(problem(
            "limits.proxy_records_in_flight",
            "must be at least limits.proxy_max_records (a request at the cap must fit) and at most 10000000",
        ));
    }
    if c.limits.proxy_response_bytes < 1024 || c.limits.proxy_response_bytes > 1024 * 1024 * 1024 {
        problems.push(problem(
            "limits.proxy_response_bytes",
            "must be 1 KiB to 1 GiB",
        ));
    }
    if c.limits.json_max_depth < 4 || c.limits.json_max_depth > 512 {
        problems.push(problem("limits.json_max_depth", "must be 4 to 512"));
    }
    if c.limits.body_timeout_ms == 0 {
        problems.push(problem("limits.body_timeout_ms", "must be greater than 0"));
    }
    if c.limits.max_client_connections == 0 || c.limits.max_client_connections > 1_000_000 {
        problems.push(problem(
            "limits.max_client_connections",
            "must be 1 to 1000000",
        ));
    }
    // Above max_client_connections the share is simply the total.
    if c.limits.max_connections_per_client == 0 {
        problems.push(problem(
            "limits.max_connections_per_client",
            "must be greater than 0",
        ));
    }
    if c.limits.head_timeout_ms == 0 {
        problems.push(problem("limits.head_timeout_ms", "must be greater than 0"));
    }
    if tracing_subscriber::EnvFilter::try_new(&c.logging.level).is_err() {
        problems.push(problem(
            "logging.level",
            format!("not a log filter: {:?}", c.logging.level),
        ));
    }
    if !matches!(c.logging.format.as_str(), "json" | "text") {
        problems.push(problem("logging.format", "must be \"json\" or \"text\""));
    }
    if !c.upstream.address.contains(':') {
        problems.push(problem("upstream.address", "must be host:port"));
    }
    for (name, v) in [
        ("upstream.connect_timeout_ms", c.upstream.connect_timeout_ms),
        ("upstream.read_timeout_ms", c.upstream.read_timeout_ms),
        ("upstream.write_timeout_ms", c.upstream.write_timeout_ms),
    ] {
        if v == 0 {
            problems.push(problem(name, "must be greater than 0"));
        }
    }

    let mut tenant_ids = HashSet::new();
    let mut key_hashes = HashSet::new();
    for (i, t) in c.tenants.iter().enumerate() {
        let p = format!("tenants[{i}]");
        match uuid::Uuid::parse_str(&t.id) {
            Ok(u) => {
                if !tenant_ids.insert(u) {
                    problems.push(problem(format!("{p}.id"), "duplicate tenant id"));
                }
            }
            Err(_) => problems.push(problem(format!("{p}.id"), "not a UUID")),
        }
        if !c.policies.contains_key(&t.policy) {
            problems.push(problem(
                format!("{p}.policy"),
                format!("no policy named {:?} in [policies]", t.policy),
            ));
        }
        for (j, k) in t.api_keys.iter().enumerate() {
            let kp = format!("{p}.api_keys[{j}]");
            if k.id.is_empty() {
                problems.push(problem(format!("{kp}.id"), "must not be empty"));
            }
            if !is_sha256_hex(&k.sha256) {
                problems.push(problem(format!("{kp}.sha256"), "not 64 hex characters"));
            } else if !key_hashes.insert(k.sha256.clone()) {
                problems.push(problem(
                    format!("{kp}.sha256"),
                    "the same key is configured twice",
                ));
            }
            if let Some(a) = k.authority_ceiling {
                if !unit(a) {
                    problems.push(problem(format!("{kp}.authority_ceiling"), "must be 0 to 1"));
                }
            }
            if k.rate_limit_per_second == Some(0) {
                problems.push(problem(
                    format!("{kp}.rate_limit_per_second"),
                    "must be greater than 0",
                ));
            }
            if k.rate_limit_burst == Some(0) {
                problems.push(problem(
                    format!("{kp}.rate_limit_burst"),
                    "must be greater than 0",
                ));
            }
        }
    }

    for (name, pol) in &c.policies {
        let p = format!("policies.{name}");
        if EvaluationMode::parse(&pol.mode).is_none() {
            problems.push(problem(
                format!("{p}.mode"),
                format!("must be one of {}", names(EvaluationMode::ALL)),
            ));
        }
        if EvaluationProfile::parse(&pol.profile).is_none() {
            problems.push(problem(
                format!("{p}.profile"),
                format!("must be one of {}", names(EvaluationProfile::ALL)),
            ));
        }
        for (field, v) in [
            ("quarantine_threshold", pol.quarantine_threshold),
            ("block_threshold", pol.block_threshold),
            ("warn_threshold", pol.warn_threshold),
            ("trust_decay_ratio", pol.trust_decay_ratio),
            ("release_authority", pol.release_authority),
        ] {
            if !unit(v) {
                problems.push(problem(format!("{p}.{field}"), "must be 0 to 1"));
            }
        }
        if pol.warn_threshold > pol.quarantine_threshold
            || pol.quarantine_threshold > pol.block_threshold
        {
            problems.push(problem(
                format!("{p}.quarantine_threshold"),
                "thresholds must satisfy warn <= quarantine <= block",
            ));
        }
        for (j, r) in pol.requirements.iter().enumerate() {
            let rp = format!("{p}.requirements[{j}]");
            if r.substrate != "*" && TargetSubstrate::parse(&r.substrate).is_none() {
                problems.push(problem(
                    format!("{rp}.substrate"),
                    format!("must be * or one of {}", names(TargetSubstrate::ALL)),
                ));
            }
            if r.mutation != "*" && ProposedMutation::parse(&r.mutation).is_none() {
                problems.push(problem(
                    format!("{rp}.mutation"),
                    format!("must be * or one of {}", names(ProposedMutation::ALL)),
                ));
            }
            if !unit(r.min_authority) {
                problems.push(problem(format!("{rp}.min_authority"), "must be 0 to 1"));
            }
            if !unit(r.max_risk) {
                problems.push(problem(format!("{rp}.max_risk"), "must be 0 to 1"));
            }
            if AllowedInfluence::parse(&r.max_influence).is_none() {
                problems.push(problem(
                    format!("{rp}.max_influence"),
                    format!("must be one of {}", names(AllowedInfluence::ALL)),
                ));
            }
        }
        if let Err(e) = CompiledPolicy::compile(name, pol) {
            problems.push(problem(format!("{p}.detectors"), e));
        }
    }

    if let Some(t) = &c.proxy.tenant {
        match uuid::Uuid::parse_str(t) {
            Ok(u) if tenant_ids.contains(&u) => {}
            Ok(_) => problems.push(problem(
                "proxy.tenant",
                "no tenant with this id in [[tenants]]",
            )),
            Err(_) => problems.push(problem("proxy.tenant", "not a UUID")),
        }
    }
    for (i, s) in c.proxy.sources.iter().enumerate() {
        let p = format!("proxy.sources[{i}]");
        if s.source_id.is_empty() {
            problems.push(problem(format!("{p}.source_id"), "must not be empty"));
        }
        if s.identity.is_none() && s.upstream_key_sha256.is_none() {
            problems.push(problem(
                p.clone(),
                "needs identity or upstream_key_sha256 to be recognised",
            ));
        }
        if let Some(h) = &s.upstream_key_sha256 {
            if !is_sha256_hex(h) {
                problems.push(problem(
                    format!("{p}.upstream_key_sha256"),
                    "not 64 hex characters",
                ));
            }
        }
        if crate::kernel::types::SourceType::parse(&s.source_type).is_none() {
            problems.push(problem(format!("{p}.source_type"), "not a SourceType"));
        }
        if !unit(s.trust) {
            problems.push(problem(format!("{p}.trust"), "must be 0 to 1"));
        }
        if !unit(s.authority) {
            problems.push(problem(format!("{p}.authority"), "must be 0 to 1"));
        }
    }
    let d = &c.proxy.default_source;
    if !unit(d.trust) {
        problems.push(problem("proxy.default_source.trust", "must be 0 to 1"));
    }
    if !unit(d.authority) {
        problems.push(problem("proxy.default_source.authority", "must be 0 to 1"));
    }
    if crate::kernel::types::SourceType::parse(&d.source_type).is_none() {
        problems.push(problem(
            "proxy.default_source.source_type",
            "not a SourceType",
        ));
    }

    let w = &c.webhooks;
    if w.schedule_secs.is_empty() || w.schedule_secs.len() > 50 {
        problems.push(problem(
            "webhooks.schedule_secs",
            "must list 1 to 50 delays",
        ));
    }
    if w.timeout_ms == 0 || w.timeout_ms > 300_000 {
        problems.push(problem("webhooks.timeout_ms", "must be 1 to 300000"));
    }
    if w.batch_size == 0 || w.batch_size > 1000 {
        problems.push(problem("webhooks.batch_size", "must be 1 to 1000"));
    }
    if w.concurrency == 0 || w.concurrency > 1024 {
        problems.push(problem("webhooks.concurrency", "must be 1 to 1024"));
    }
    if w.poll_interval_ms == 0 {
        problems.push(problem(
            "webhooks.poll_interval_ms",
            "must be greater than 0",
        ));
    }
    if w.lease_secs.saturating_mul(1000) < w.timeout_ms.saturating_add(5000) {
        problems.push(problem(
            "webhooks.lease_secs",
            "must exceed timeout_ms by at least 5 seconds",
        ));
    }
    if !matches!(w.jitter.as_str(), "full" | "equal" | "none") {
        problems.push(problem(
            "webhooks.jitter",
            "must be one of full, equal, none",
        ));
    }
    if w.response_body_bytes == 0 || w.response_body_bytes > 16 * 1024 * 1024 {
        problems.push(problem(
            "webhooks.response_body_bytes",
            "must be 1 to 16777216",
        ));
    }
    if w.schedule_secs.iter().any(|d| *d > 7 * 24 * 3600) {
        problems.push(problem(
            "webhooks.schedule_secs",
            "no delay may exceed 604800 (7 days)",
        ));
    }
    for (i, n) in w.allow_networks.iter().enumerate() {
        if n.parse::<ipnet::IpNet>().is_err() {
            problems.push(problem(
                format!("webhooks.allow_networks[{i}]"),
                format!("not a CIDR network: {n:?}"),
            ));
        }
    }
}

fn names<T: std::fmt::Display>(all: &[T]) -> String {
    all.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(text: &str) -> Vec<String> {
        match load_str(text, Path::new(".")) {
            Ok(_) => vec![],
            Err(p) => p.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn empty_config_is_valid_with_defaults() {
        let l = load_str("", Path::new(".")).expect("empty config loads");
        assert_eq!(l.config.listeners.api, "127.0.0.1:8080");
        assert_eq!(l.config.storage.url, "sqlite://data/gate.db");
        assert!(l.config.policies.contains_key("default"));
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let p = problems_of(
            r#"
[listeners]
api = "nowhere"
[[tenants]]
id = "00000000-0000-4000-8000-000000000001"
[[tenants.api_keys]]
id = "k"
sha256 = "abc"
authority_ceiling = 2.0
[[tenants]]
id = "not-a-uuid"
policy = "missing"
"#,
        );
        let want = [
            "listeners.api: not an ip:port address: \"nowhere\"",
            "tenants[0].api_keys[0].sha256: not 64 hex characters",
            "tenants[0].api_keys[0].authority_ceiling: must be 0 to 1",
            "tenants[1].id: not a UUID",
            "tenants[1].policy: no policy named \"missing\" in [policies]",
        ];
        for w in want {
            assert!(p.iter().any(|x| x == w), "missing {w:?} in {p:#?}");
        }
    }

    #[test]
    fn unknown_fields_are_named_in_every_section() {
        let p = problems_of("[listeners]\napi_port = 1\n[storage]\nuri = \"x\"\n[bogus]\n");
        assert!(
            p.iter()
                .any(|x| x.starts_with("listeners") && x.contains("api_port")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("storage") && x.contains("uri")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|x| x.starts_with("bogus: unknown section")),
            "{p:?}"
        );
    }

    #[test]
    fn records_in_flight_default_to_one_batch_and_must_hold_one() {
        let l = load_str("[limits]\nproxy_max_records = 500\n", Path::new(".")).unwrap();
        assert_eq!(l.config.limits.records_in_flight(), 500);
        let l = load_str("[limits]\nproxy_records_in_flight = 9000\n", Path::new(".")).unwrap();
        assert_eq!(l.config.limits.records_in_flight(), 9000);
        let p = problems_of("[limits]\nproxy_max_records = 500\nproxy_records_in_flight = 499\n");
        assert!(
            p.iter()
                .any(|x| x.starts_with("limits.proxy_records_in_flight: must be at least")),
            "{p:?}"
        );
    }

    #[test]
    fn wrong_types_and_policy_values_are_named() {
        let p = problems_of("[limits]\napi_body_bytes = \"big\"\n[policies.default]\nmode = \"yolo\"\n[[policies.default.requirements]]\nsubstrate = \"moon\"\nmax_influence = \"all\"\n");
        assert!(
            p.iter().any(|x| x.starts_with("limits.api_body_bytes")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("policies.default.mode: must be one of")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("policies.default.requirements[0].substrate")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("policies.default.requirements[0].max_influence")),
            "{p:?}"
        );
    }

    #[test]
    fn webhook_worker_settings_are_validated() {
        let p = problems_of(
            "[webhooks]\ntimeout_ms = 15000\nlease_secs = 10\njitter = \"random\"\nresponse_body_bytes = 0\nschedule_secs = [0, 999999]\nallow_networks = [\"10.0.0.0/33\"]\n",
        );
        for want in [
            "webhooks.lease_secs",
            "webhooks.jitter",
            "webhooks.response_body_bytes",
            "webhooks.schedule_secs",
            "webhooks.allow_networks[0]",
        ] {
            assert!(p.iter().any(|x| x.starts_with(want)), "{want} not in {p:?}");
        }
        assert!(
            problems_of("[webhooks]\ntimeout_ms = 2000\nlease_secs = 7\njitter = \"none\"\n")
                .is_empty()
        );
    }

    #[test]
    fn invalid_toml_is_one_clear_problem() {
        let p = problems_of("[listeners\napi=");
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("not valid TOML"), "{p:?}");
    }

    #[test]
    fn includes_merge_tenants_and_missing_include_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("secrets.toml"),
            "[[tenants]]\nid = \"00000000-0000-4000-8000-000000000002\"\n",
        )
        .unwrap();
        let main = "include = [\"secrets.toml\"]\n[[tenants]]\nid = \"00000000-0000-4000-8000-000000000001\"\n";
        let l = load_str(main, dir.path()).expect("loads");
        assert_eq!(l.config.tenants.len(), 2);
        let p = load_str("include = [\"nope.toml\"]\n", dir.path()).unwrap_err();
        assert!(
            p[0].to_string().starts_with("include[0]: cannot read"),
            "{p:?}"
        );
    }

    #[test]
    fn oversized_and_non_regular_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        assert!(read_capped(&big).unwrap_err().contains("over the"));
        assert!(read_capped(dir.path())
            .unwrap_err()
            .contains("not a regular file"));
    }
}
