//! Shared harness for integration tests: starts the real `substrate-gate`
//! binary on ephemeral ports with a generated config, on SQLite or on a fresh
//! PostgreSQL database (from `TEST_DATABASE_URL`), and talks to it over HTTP.
#![allow(dead_code)]

pub mod upstream;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const DEMO_TENANT: &str = "00000000-0000-4000-8000-000000000001";
pub const OTHER_TENANT: &str = "00000000-0000-4000-8000-000000000002";
pub const DEMO_KEY: &str = "demo-key-change-me";
pub const OTHER_KEY: &str = "other-tenant-key";
/// Demo tenant, authority ceiling 0.2.
pub const LOW_KEY: &str = "low-authority-key";
/// Demo tenant, 2 requests per second, burst 2.
pub const LIMITED_KEY: &str = "rate-limited-key";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The backends to run a test on: SQLite always; PostgreSQL when
/// `TEST_DATABASE_URL` is set (said loudly when it is not).
pub fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Sqlite];
    if std::env::var("TEST_DATABASE_URL")
        .map(|u| !u.is_empty())
        .unwrap_or(false)
    {
        v.push(Backend::Postgres);
    } else {
        eprintln!("NOTE: TEST_DATABASE_URL is not set: skipping the PostgreSQL half of this test");
    }
    v
}

pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// A port to listen on, below the kernel's ephemeral range (32768-60999 here): a port asked of
/// the kernel (`bind(:0)`) comes from that range, and in the moment between handing it out and
/// the gate binding it, any outgoing connection (a database pool's, say, which then lives as
/// long as its gate) could be given the same port as its local one. Ports handed out once in
/// this process are not handed out again.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..10_000 {
        let port = 10_000 + (uuid::Uuid::new_v4().as_u128() % 22_000) as u16;
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn gate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_substrate-gate"))
}

/// A fresh PostgreSQL database for one gate (or one fleet of gates).
pub async fn fresh_postgres_db() -> String {
    let admin = std::env::var("TEST_DATABASE_URL").expect("TEST_DATABASE_URL");
    let name = format!("gate_test_{}", uuid::Uuid::new_v4().simple());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&admin)
        .await
        .expect("connect to TEST_DATABASE_URL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&pool)
        .await
        .expect("create test database");
    pool.close().await;
    match admin.rfind('/') {
        Some(i) => format!("{}/{}", &admin[..i], name),
        None => panic!("TEST_DATABASE_URL has no database part"),
    }
}

/// Options of a test gate.
#[derive(Clone)]
pub struct GateOptions {
    pub backend: Backend,
    /// A storage URL to use instead of a fresh one (a fleet shares one).
    pub storage_url: Option<String>,
    pub upstream: String,
    pub packs: Vec<String>,
    pub policy_mode: String,
    /// Extra keys of the `[policies.default]` table (thresholds, `release_authority`, ...).
    pub policy_extra: String,
    /// Appended to the generated config (extra sections).
    pub extra: String,
    pub webhook_schedule: String,
    /// Extra keys of the `[proxy]` table (`fail_open_routes = [...]`, `identity_header = ...`).
    pub proxy_extra: String,
    /// Extra keys of the `[upstream]` table.
    pub upstream_extra: String,
    /// `upstream.read_timeout_ms` (and the write timeout).
    pub upstream_read_timeout_ms: u64,
    /// Body of a `[limits]` section (e.g. `body_timeout_ms = 500`); none when empty.
    pub limits: String,
    /// Extra keys of the `[storage]` table. A test that edits the gate's database behind its
    /// back ([`Gate::sql`]) and wants the gate to see the edit sets `memory_basis_traces = 0`:
    /// on SQLite the gate keeps its state basis in memory (it is the database's only writer).
    pub storage_extra: String,
}

impl GateOptions {
    pub fn new(backend: Backend) -> Self {
        GateOptions {
            backend,
            storage_url: None,
            upstream: "127.0.0.1:9".into(),
            packs: vec![],
            policy_mode: "enforcement".into(),
            policy_extra: String::new(),
            extra: String::new(),
            webhook_schedule: "[0, 1, 1]".into(),
            proxy_extra: String::new(),
            upstream_extra: String::new(),
            upstream_read_timeout_ms: 5000,
            limits: String::new(),
            storage_extra: String::new(),
        }
    }
}

pub struct Gate {
    pub child: Option<Child>,
    pub api: String,
    pub proxy: String,
    pub metrics: String,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub storage_url: String,
    pub opts: GateOptions,
    pub ports: (u16, u16, u16),
    pub client: reqwest::Client,
    pub log_path: PathBuf,
}

/// The config a test gate runs with: two tenants, four keys, the default policy.
pub fn config_text(opts: &GateOptions, storage_url: &str, ports: (u16, u16, u16)) -> String {
    let packs = opts
        .packs
        .iter()
        .map(|p| format!("{:?}", repo_root().join(p).display().to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[service]
shutdown_timeout_secs = 5
watch = true

[listeners]
api = "127.0.0.1:{api}"
proxy = "127.0.0.1:{proxy}"
metrics = "127.0.0.1:{metrics}"

[storage]
url = "{storage_url}"
max_connections = 8
{storage_extra}

[logging]
level = "info"
format = "json"

[upstream]
address = "{upstream}"
connect_timeout_ms = 1000
read_timeout_ms = {read_timeout}
write_timeout_ms = {read_timeout}
{upstream_extra}

[proxy]
packs = [{packs}]
tenant = "{DEMO_TENANT}"
{proxy_extra}

[webhooks]
schedule_secs = {schedule}
timeout_ms = 2000
rotation_grace_secs = 2
poll_interval_ms = 50
allow_networks = ["127.0.0.0/8", "::1/128"]

[[tenants]]
id = "{DEMO_TENANT}"
name = "demo"

[[tenants.api_keys]]
id = "demo"
sha256 = "{demo}"
authority_ceiling = 0.9

[[tenants.api_keys]]
id = "low"
sha256 = "{low}"
authority_ceiling = 0.2

[[tenants.api_keys]]
id = "limited"
sha256 = "{limited}"
rate_limit_per_second = 2
rate_limit_burst = 2

[[tenants]]
id = "{OTHER_TENANT}"
name = "other"

[[tenants.api_keys]]
id = "other"
sha256 = "{other}"
authority_ceiling = 0.9

[policies.default]
mode = "{mode}"
{policy_extra}
{limits}
{extra}
"#,
        api = ports.0,
        proxy = ports.1,
        metrics = ports.2,
        upstream = opts.upstream,
        schedule = opts.webhook_schedule,
        demo = sha256_hex(DEMO_KEY),
        low = sha256_hex(LOW_KEY),
        limited = sha256_hex(LIMITED_KEY),
        other = sha256_hex(OTHER_KEY),
        mode = opts.policy_mode,
        policy_extra = opts.policy_extra,
        limits = if opts.limits.is_empty() {
            String::new()
        } else {
            format!("[limits]\n{}\n", opts.limits)
        },
        extra = opts.extra,
        upstream_extra = opts.upstream_extra,
        read_timeout = opts.upstream_read_timeout_ms,
        proxy_extra = opts.proxy_extra,
        storage_extra = opts.storage_extra,
    )
}

impl Gate {
    pub async fn start(opts: GateOptions) -> Gate {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage_url = match (&opts.storage_url, opts.backend) {
            (Some(u), _) => u.clone(),
            (None, Backend::Sqlite) => format!("sqlite://{}", dir.path().join("gate.db").display()),
            (None, Backend::Postgres) => fresh_postgres_db().await,
        };
        let ports = (free_port(), free_port(), free_port());
        let config_path = dir.path().join("gate.toml");
        std::fs::write(&config_path, config_text(&opts, &storage_url, ports))
            .expect("write config");
        let log_path = dir.path().join("gate.log");
        let mut g = Gate {
            child: None,
            api: format!("http://127.0.0.1:{}", ports.0),
            proxy: format!("http://127.0.0.1:{}", ports.1),
            metrics: format!("http://127.0.0.1:{}", ports.2),
            dir,
            config_path,
            storage_url,
            opts,
            ports,
            // No idle pool: tests send requests the gate answers early (413) and then closes;
            // a pooled client would send the next request onto that closed connection.
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
            log_path,
        };
        g.spawn().await;
        g
    }

    /// Starts (or restarts) the process and waits until `/readyz` answers 200. A restart can
    /// find one of its ports taken for a moment: while the gate was down, the kernel may have
    /// handed the port to another process's outgoing connection as its ephemeral port. Such a
    /// start is tried again until the port is free (within the start deadline).
    pub async fn spawn(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let before = std::fs::metadata(&self.log_path)
                .map(|m| m.len())
                .unwrap_or(0);
            match self.spawn_once(deadline).await {
                Ok(()) => return,
                Err(status) => {
                    let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                    let this_start = text.get(before as usize..).unwrap_or_default();
                    if this_start.contains("Address already in use") && Instant::now() < deadline {
                        eprintln!("gate start: a port was taken ({status}); trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    panic!("gate exited with {status} during start:\n{}", self.log());
                }
            }
        }
    }

    async fn spawn_once(&mut self, deadline: Instant) -> Result<(), std::process::ExitStatus> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("log file");
        let child = Command::new(gate_bin())
            .args(["serve", "--config"])
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start substrate-gate");
        self.child = Some(child);
        loop {
            if let Ok(r) = self.client.get(format!("{}/readyz", self.api)).send().await {
                // The proxy listener runs on its own (Pingora) thread and may bind a moment
                // after the API answers: wait for it too.
                let proxy = format!("127.0.0.1:{}", self.ports.1);
                if r.status().is_success() && tokio::net::TcpStream::connect(&proxy).await.is_ok() {
                    return Ok(());
                }
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(status);
                }
            }
            if Instant::now() > deadline {
                panic!("gate did not become ready:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("running")
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status();
    }

    /// SIGKILL, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit; returns how long it took.
    pub fn terminate(&mut self) -> Duration {
        let t = Instant::now();
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
        t.elapsed()
    }

    pub fn write_config(&self, text: &str) {
        // Write-then-rename, as editors and ConfigMaps do: the watcher never sees half a file.
        let tmp = self.dir.path().join(".gate.toml.tmp");
        std::fs::write(&tmp, text).expect("write config");
        std::fs::rename(&tmp, &self.config_path).expect("swap config");
    }

    pub fn config_with(&self, opts: &GateOptions) -> String {
        config_text(opts, &self.storage_url, self.ports)
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(gate_bin())
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run cli")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.api, path)
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request");
        status_json(r).await
    }

    pub async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request");
        status_json(r).await
    }

    /// The metrics listener's text.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.metrics))
            .send()
            .await
            .expect("metrics request")
            .text()
            .await
            .expect("metrics text")
    }

    /// `substrate_gate_config_reloads_total` for one result (`ok`, `failed`).
    pub async fn reloads(&self, result: &str) -> u64 {
        self.metrics_text()
            .await
            .lines()
            .find(|l| {
                l.starts_with("substrate_gate_config_reloads_total")
                    && l.contains(&format!("result=\"{result}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .unwrap_or(0)
    }

    /// Ingests a signal and returns its id.
    pub async fn ingest(&self, key: &str, body: Value) -> String {
        let (s, v) = self.post(key, "/substrate/signals/ingest", &body).await;
        assert_eq!(s, 200, "ingest failed: {v}");
        v["signal"]["id"].as_str().expect("signal id").to_string()
    }

    pub async fn evaluate(&self, key: &str, signal_id: &str) -> Value {
        let (s, v) = self
            .post(
                key,
                "/substrate/integrity/evaluate",
                &serde_json::json!({"signalId": signal_id}),
            )
            .await;
        assert_eq!(s, 200, "evaluate failed: {v}");
        v
    }

    /// Runs SQL against the gate's own database (tamper tests, assertions). A gate on SQLite
    /// keeps its state basis (trace phases, sources' records) in memory: a test whose edit must
    /// change decisions starts its gate without it (see [`GateOptions::storage_extra`]).
    pub async fn sql(&self, statement: &str) {
        if self.storage_url.starts_with("sqlite:") {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open sqlite");
            sqlx::query(statement).execute(&pool).await.expect("sql");
            pool.close().await;
        } else {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open postgres");
            sqlx::query(statement).execute(&pool).await.expect("sql");
            pool.close().await;
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        if self.storage_url.starts_with("sqlite:") {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open sqlite");
            let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.expect("count");
            pool.close().await;
            n
        } else {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open postgres");
            let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.expect("count");
            pool.close().await;
            n
        }
    }
}

impl Gate {
    /// Rows in every table of the gate's database (migration bookkeeping aside): to show that a
    /// refused request left no trace, compare before and after.
    pub async fn table_counts(&self) -> std::collections::BTreeMap<String, i64> {
        let list = if self.storage_url.starts_with("sqlite:") {
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%' ORDER BY name"
        } else {
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name NOT LIKE '_sqlx%' ORDER BY 1"
        };
        let mut out = std::collections::BTreeMap::new();
        if self.storage_url.starts_with("sqlite:") {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open sqlite");
            let names: Vec<(String,)> =
                sqlx::query_as(list).fetch_all(&pool).await.expect("tables");
            for (t,) in names {
                let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM \"{t}\""))
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                out.insert(t, n);
            }
            pool.close().await;
        } else {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&self.storage_url)
                .await
                .expect("open postgres");
            let names: Vec<(String,)> =
                sqlx::query_as(list).fetch_all(&pool).await.expect("tables");
            for (t,) in names {
                let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM \"{t}\""))
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                out.insert(t, n);
            }
            pool.close().await;
        }
        out
    }

    /// The served OpenAPI document.
    pub async fn openapi(&self) -> Value {
        let r = self
            .client
            .get(self.url("/openapi.json"))
            .send()
            .await
            .expect("openapi");
        r.json().await.expect("openapi is JSON")
    }

    /// One request as a client would send it: method, path (with query), key, extra headers,
    /// and a JSON body. Returns status, content type and the body (JSON, else a string).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> (u16, String, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut rb = self.client.request(m, self.url(path));
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        for (h, v) in headers {
            rb = rb.header(*h, *v);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let r = rb.send().await.expect("request");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let (s, v) = status_json(r).await;
        (s, ct, v)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn status_json(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A benign ingest body; override fields with `with`.
pub fn signal_body(extra: Value) -> Value {
    let mut base = serde_json::json!({
        "productSurface": "generic",
        "sourceType": "user_input",
        "sourceId": "user-1",
        "sourceTrustLevel": 0.8,
        "targetSubstrate": "agent_memory",
        "proposedMutation": "write_memory",
        "payload": "The customer prefers email over phone calls."
    });
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// Asserts a problem+json body with the contract's fields and the given status/code.
pub fn assert_problem(status: u16, body: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status, want_status, "status; body: {body}");
    for f in [
        "type",
        "title",
        "status",
        "detail",
        "code",
        "requestId",
        "errors",
    ] {
        assert!(body.get(f).is_some(), "problem lacks {f}: {body}");
    }
    assert_eq!(body["status"], want_status, "{body}");
    assert_eq!(body["code"], want_code, "{body}");
}

pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
