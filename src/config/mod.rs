//! Configuration: the TOML schema (every struct `deny_unknown_fields`), loading
//! with includes and a size cap, and validation that collects every problem
//! with its path. Flow: file → merged TOML → typed `Config` → `validate` →
//! [`crate::state::Runtime`] (compiled policies, route table) → swapped in.

mod load;
mod policy;
pub mod reload;

pub use load::{load, load_str, ConfigProblem, Loaded};
pub use policy::{PolicyConfig, RequirementConfig};

use serde::Deserialize;
use std::collections::BTreeMap;

/// Largest config (or included, or filter-pack) file we read: a config is
/// human-written; anything bigger is a mistake or an attack.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Further TOML files merged into this one (paths relative to this file):
    /// typically a Secret-mounted file with tenants and API key hashes.
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub service: ServiceConfig,
    #[serde(default)]
    pub listeners: Listeners,
    #[serde(default)]
    pub storage: StorageConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub logging: LoggingConfig,
    #[serde(default)]
    pub upstream: UpstreamConfig,
    #[serde(default)]
    pub proxy: ProxyConfig,
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    #[serde(default)]
    pub checkpoints: CheckpointsConfig,
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Named policies; tenants refer to one by name.
    #[serde(default)]
    pub policies: BTreeMap<String, PolicyConfig>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    #[serde(default = "default_service_name")]
    pub name: String,
    /// Bound on graceful shutdown: in-flight requests get this long to finish.
    #[serde(default = "default_shutdown_secs")]
    pub shutdown_timeout_secs: u64,
    /// Watch the config file's directory and reload on change (SIGHUP always reloads).
    #[serde(default = "yes")]
    pub watch: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            name: default_service_name(),
            shutdown_timeout_secs: default_shutdown_secs(),
            watch: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Listeners {
    #[serde(default = "default_api")]
    pub api: String,
    #[serde(default = "default_proxy")]
    pub proxy: String,
    #[serde(default = "default_metrics")]
    pub metrics: String,
    /// Pingora worker threads for the proxy listener.
    #[serde(default = "default_proxy_threads")]
    pub proxy_threads: usize,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            api: default_api(),
            proxy: default_proxy(),
            metrics: default_metrics(),
            proxy_threads: default_proxy_threads(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite://path` (embedded default) or `postgres://...` (fleet).
    #[serde(default = "default_storage_url")]
    pub url: String,
    /// When set, the URL is read from this environment variable instead
    /// (a Kubernetes Secret), so no database password sits in a ConfigMap.
    #[serde(default)]
    pub url_env: Option<String>,
    /// A file holding the key (32 bytes, base64) that seals the store credentials kept in the
    /// database (held writes, journaled writes); relative to the config file. Without it they
    /// are kept as sent. Read at start and on reload; see `crate::seal`.
    #[serde(default)]
    pub credentials_key_file: Option<String>,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// SQLite `synchronous`: `normal` survives a process crash (WAL), `full` also a power loss.
    #[serde(default = "default_sqlite_sync")]
    pub sqlite_synchronous: String,
    /// SQLite: the state basis (trace phases, sources' records) is kept in memory up to this
    /// many traces (50-100 bytes each); past it, or 0, it is read from the database.
    #[serde(default = "default_memory_basis_traces")]
    pub memory_basis_traces: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: default_storage_url(),
            url_env: None,
            credentials_key_file: None,
            max_connections: default_max_connections(),
            sqlite_synchronous: default_sqlite_sync(),
            memory_basis_traces: default_memory_basis_traces(),
        }
    }
}

impl StorageConfig {
    /// The URL to connect to, after `url_env` indirection.
    pub fn resolved_url(&self) -> Result<String, String> {
        match &self.url_env {
            Some(var) => {
                std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))
            }
            None => Ok(self.url.clone()),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest API request body (413 above).
    #[serde(default = "default_api_body")]
    pub api_body_bytes: usize,
    /// Largest mutating request body the proxy reads whole (413 above).
    #[serde(default = "default_proxy_body")]
    pub proxy_body_bytes: usize,
    /// Most records one proxied write or delete may carry (413 above, before any record is
    /// judged); a pack's or route's `max_records` (the store's own batch limit) may be lower.
    #[serde(default = "default_proxy_max_records")]
    pub proxy_max_records: usize,
    /// Records of proxied batches (writes and deletes of more than 64 records) being handled
    /// at once, over every request of the process; each holds as many as it carries, from its
    /// count to its answer. What bounds the memory of concurrent batches. A batch waits its
    /// turn, in order, for at most `body_timeout_ms`, then is answered 503. Smaller writes take
    /// their room from a lane of their own (1,024 records), so they never queue behind a batch.
    /// Default (absent): `proxy_max_records`, one batch at the cap at a time. At least
    /// `proxy_max_records`; read at start (a reload does not change it).
    #[serde(default)]
    pub proxy_records_in_flight: Option<usize>,
    /// Largest read answer the proxy buffers for retrieval treatment (502 above: an answer
    /// that cannot be treated is not passed on untreated).
    #[serde(default = "default_proxy_response")]
    pub proxy_response_bytes: usize,
    /// Deepest JSON nesting accepted anywhere.
    #[serde(default = "default_json_depth")]
    pub json_max_depth: usize,
    /// Time a client gets to send a whole request body (slowloris bound); also how long a
    /// proxy connection may sit idle before its next request (keep-alive, a connection that
    /// sends nothing). The API listener closes an idle connection after `head_timeout_ms`.
    #[serde(default = "default_body_timeout")]
    pub body_timeout_ms: u64,
    /// Client connections each listener (api, proxy) holds open at once; one beyond is closed
    /// as soon as it is accepted, so idle clients cannot take every file descriptor.
    #[serde(default = "default_max_client_connections")]
    pub max_client_connections: usize,
    /// Client connections one client address may hold open on a listener (its share of
    /// `max_client_connections`); one beyond is closed as soon as it is accepted. Clients in
    /// the sidecar's own pod share the loopback address.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
    /// Time a client gets to send a whole request head (slowloris bound): on the proxy from the
    /// head's first byte, on the API from the moment the listener waits for it (so an idle
    /// API connection is closed after it too).
    #[serde(default = "default_head_timeout")]
    pub head_timeout_ms: u64,
}

impl Limits {
    /// `proxy_records_in_flight`, or its default: one batch at the cap.
    pub fn records_in_flight(&self) -> usize {
        self.proxy_records_in_flight
            .unwrap_or(self.proxy_max_records)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            api_body_bytes: default_api_body(),
            proxy_body_bytes: default_proxy_body(),
            proxy_max_records: default_proxy_max_records(),
            proxy_records_in_flight: None,
            proxy_response_bytes: default_proxy_response(),
            json_max_depth: default_json_depth(),
            body_timeout_ms: default_body_timeout(),
            max_client_connections: default_max_client_connections(),
            max_connections_per_client: default_max_connections_per_client(),
            head_timeout_ms: default_head_timeout(),
        }
    }
}

/// Signed checkpoints of the receipt chains (`crate::checkpoint`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointsConfig {
    /// A file holding the Ed25519 signing key's 32-byte seed in base64, relative to the config
    /// file. Without it no checkpoint is signed.
    #[serde(default)]
    pub key_file: Option<String>,
    /// The key's name: the checkpoints' origin is `NAME/TENANT`, and verifiers know the key by
    /// it (no spaces, no `+`).
    #[serde(default = "default_checkpoint_name")]
    pub name: String,
    /// Each tenant whose chain grew is checkpointed this often; 0 signs on demand only.
    #[serde(default = "default_checkpoint_interval")]
    pub interval_secs: u64,
}

impl Default for CheckpointsConfig {
    fn default() -> Self {
        CheckpointsConfig {
            key_file: None,
            name: default_checkpoint_name(),
            interval_secs: default_checkpoint_interval(),
        }
    }
}

fn default_checkpoint_name() -> String {
    "substrate-gate".into()
}
fn default_checkpoint_interval() -> u64 {
    300
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// A tracing filter: `info`, `warn,substrate_gate=debug`, ...
    #[serde(default = "default_log_level")]
    pub level: String,
    /// `json` (default, for log pipelines) or `text`.
    #[serde(default = "default_log_format")]
    pub format: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: default_log_level(),
            format: default_log_format(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `host:port` of the protected store.
    #[serde(default = "default_upstream")]
    pub address: String,
    /// `Host` header sent upstream; defaults to the address.
    #[serde(default)]
    pub host_header: Option<String>,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_read_timeout")]
    pub read_timeout_ms: u64,
    #[serde(default = "default_read_timeout")]
    pub write_timeout_ms: u64,
    /// Idle keep-alive connections kept to the upstream.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            address: default_upstream(),
            host_header: None,
            connect_timeout_ms: default_connect_timeout(),
            read_timeout_ms: default_read_timeout(),
            write_timeout_ms: default_read_timeout(),
            idle_timeout_ms: default_idle_timeout(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Filter pack files (relative to the config file) compiled into the route table.
    #[serde(default)]
    pub packs: Vec<String>,
    /// Tenant whose policy governs proxied writes, unless `tenant_header` maps one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Header (set by the mesh, not the agent) that names the tenant of a proxied request.
    #[serde(default)]
    pub tenant_header: Option<String>,
    /// Header set by the mesh that names the calling workload (e.g. `x-forwarded-client-cert`
    /// or a SPIFFE id header). Its value is looked up in `sources`.
    #[serde(default)]
    pub identity_header: Option<String>,
    /// Known callers: their identity, trust and authority come from here, never from the request.
    #[serde(default)]
    pub sources: Vec<SourceConfig>,
    /// Who an unknown caller is: low trust, no authority.
    #[serde(default)]
    pub default_source: DefaultSource,
    /// Routes whose writes go through even when storage or the kernel is down.
    #[serde(default)]
    pub fail_open_routes: Vec<String>,
    /// Drop quarantined/revoked/tombstoned records from read answers.
    #[serde(default = "yes")]
    pub retrieval_treatment: bool,
    /// A POST, PUT, PATCH or DELETE that no route of the loaded packs describes: refused with
    /// 403 (`deny`, the default), or forwarded unjudged (`forward`).
    #[serde(default)]
    pub undescribed_mutations: UndescribedMutations,
}

/// What the proxy does with a mutating request no pack describes.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UndescribedMutations {
    /// Refuse it (403 problem+json, `undescribed_route`): nothing reaches the store unjudged.
    #[default]
    Deny,
    /// Forward it unjudged, as if the gate were not there.
    Forward,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            packs: Vec::new(),
            tenant: None,
            tenant_header: None,
            identity_header: None,
            sources: Vec::new(),
            default_source: DefaultSource::default(),
            fail_open_routes: Vec::new(),
            retrieval_treatment: true,
            undescribed_mutations: UndescribedMutations::Deny,
        }
    }
}

/// A known caller of the proxy. Matched by the identity header's value, or by
/// the sha256 of the upstream API key the agent presents (`Authorization` /
/// `x-api-key` / `api-key`), so the gate learns who writes without trusting
/// anything the writer says about itself.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub source_id: String,
    #[serde(default)]
    pub identity: Option<String>,
    #[serde(default)]
    pub upstream_key_sha256: Option<String>,
    #[serde(default = "default_source_type")]
    pub source_type: String,
    pub trust: f64,
    #[serde(default)]
    pub authority: f64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DefaultSource {
    #[serde(default = "default_unknown_source")]
    pub source_id: String,
    #[serde(default = "default_source_type")]
    pub source_type: String,
    #[serde(default = "default_low_trust")]
    pub trust: f64,
    #[serde(default)]
    pub authority: f64,
}

impl Default for DefaultSource {
    fn default() -> Self {
        DefaultSource {
            source_id: default_unknown_source(),
            source_type: default_source_type(),
            trust: default_low_trust(),
            authority: 0.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Delay before each attempt, in seconds (the first is normally 0).
    #[serde(default = "default_schedule")]
    pub schedule_secs: Vec<u64>,
    #[serde(default = "default_webhook_timeout")]
    pub timeout_ms: u64,
    /// How long a rotated-out secret keeps signing beside the new one.
    #[serde(default = "default_grace")]
    pub rotation_grace_secs: u64,
    /// Networks (CIDR) webhook targets may resolve to although they are
    /// loopback/private/link-local. Empty in production.
    #[serde(default)]
    pub allow_networks: Vec<String>,
    /// Delivery worker poll interval.
    #[serde(default = "default_poll")]
    pub poll_interval_ms: u64,
    /// Deliveries claimed per poll.
    #[serde(default = "default_batch")]
    pub batch_size: u32,
    /// Concurrent sends per worker.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a claimed delivery stays leased to the gate that claimed it.
    /// A gate that dies mid-send loses the lease after this and another gate
    /// (or the restarted one) sends the delivery again. Must exceed
    /// `timeout_ms` by at least 5 s; a send that could not end 2 s before
    /// its lease does is not started (the claim is undone instead).
    #[serde(default = "default_lease")]
    pub lease_secs: u64,
    /// Randomization of each retry delay: `full` (uniform in 0..=delay, the
    /// default), `equal` (delay/2..=delay) or `none` (exactly the schedule).
    #[serde(default = "default_jitter")]
    pub jitter: String,
    /// Most bytes of a receiver's answer that are read (the rest is dropped).
    #[serde(default = "default_response_cap")]
    pub response_body_bytes: usize,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            schedule_secs: default_schedule(),
            timeout_ms: default_webhook_timeout(),
            rotation_grace_secs: default_grace(),
            allow_networks: Vec::new(),
            poll_interval_ms: default_poll(),
            batch_size: default_batch(),
            concurrency: default_concurrency(),
            enabled: true,
            lease_secs: default_lease(),
            jitter: default_jitter(),
            response_body_bytes: default_response_cap(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// Name of an entry of `[policies]`; `default` when absent.
    #[serde(default = "default_policy_name")]
    pub policy: String,
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// A label for logs and metrics (never the key).
    pub id: String,
    /// Lowercase hex sha256 of the key. The key itself is never stored.
    pub sha256: String,
    /// Highest `sourceAuthorityLevel` a caller with this key may claim.
    #[serde(default)]
    pub authority_ceiling: Option<f64>,
    /// Sustained requests per second (429 above); absent means unlimited.
    #[serde(default)]
    pub rate_limit_per_second: Option<u32>,
    #[serde(default)]
    pub rate_limit_burst: Option<u32>,
}

fn yes() -> bool {
    true
}
fn default_service_name() -> String {
    "substrate-gate".into()
}
fn default_shutdown_secs() -> u64 {
    10
}
fn default_api() -> String {
    "127.0.0.1:8080".into()
}
fn default_proxy() -> String {
    "127.0.0.1:8081".into()
}
fn default_metrics() -> String {
    "127.0.0.1:9090".into()
}
fn default_proxy_threads() -> usize {
    1
}
fn default_storage_url() -> String {
    "sqlite://data/gate.db".into()
}
fn default_max_connections() -> u32 {
    8
}
fn default_memory_basis_traces() -> usize {
    1_000_000
}
fn default_sqlite_sync() -> String {
    "normal".into()
}
fn default_api_body() -> usize {
    1024 * 1024
}
fn default_proxy_body() -> usize {
    8 * 1024 * 1024
}
/// Chroma's largest batch (`max_batch_size` on a default server), the largest of the packs'.
fn default_proxy_max_records() -> usize {
    5461
}
fn default_proxy_response() -> usize {
    64 * 1024 * 1024
}
fn default_json_depth() -> usize {
    64
}
fn default_body_timeout() -> u64 {
    30_000
}
fn default_max_client_connections() -> usize {
    4096
}
/// A quarter of the default total: one address holding its whole share leaves three quarters
/// to everyone else.
fn default_max_connections_per_client() -> usize {
    1024
}
/// As long as a body may take: hyper's head timer (the API listener) also runs while a
/// kept-alive connection waits, so a shorter default would close idle API connections sooner
/// than before.
fn default_head_timeout() -> u64 {
    30_000
}
fn default_log_level() -> String {
    "info".into()
}
fn default_log_format() -> String {
    "json".into()
}
fn default_upstream() -> String {
    "127.0.0.1:8000".into()
}
fn default_connect_timeout() -> u64 {
    2_000
}
fn default_read_timeout() -> u64 {
    30_000
}
fn default_idle_timeout() -> u64 {
    60_000
}
fn default_source_type() -> String {
    "agent_output".into()
}
fn default_unknown_source() -> String {
    "unknown".into()
}
fn default_low_trust() -> f64 {
    0.2
}
fn default_schedule() -> Vec<u64> {
    vec![0, 5, 300, 1800, 7200, 18000, 36000, 36000]
}
fn default_webhook_timeout() -> u64 {
    15_000
}
fn default_grace() -> u64 {
    24 * 3600
}
fn default_poll() -> u64 {
    200
}
fn default_batch() -> u32 {
    64
}
fn default_concurrency() -> usize {
    32
}
fn default_lease() -> u64 {
    60
}
fn default_jitter() -> String {
    "full".into()
}
fn default_response_cap() -> usize {
    64 * 1024
}
fn default_policy_name() -> String {
    "default".into()
}
