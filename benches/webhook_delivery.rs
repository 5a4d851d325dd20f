//! Webhook delivery throughput to a local receiver, end to end through the
//! real binary: claim → sign → POST → record, with the default batch size
//! and concurrency.
//!
//!   cargo bench --bench webhook_delivery
//!   WEBHOOK_BENCH_EVENTS=50000 BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!       cargo bench --bench webhook_delivery
//!
//! The gate starts with `webhooks.enabled = false`; the outbox is filled
//! with N pending deliveries (as N events would leave them) in one
//! transaction; then a config reload switches the worker on and the clock
//! runs until the receiver has N requests and the store has N deliveries
//! recorded `delivered`. PostgreSQL runs too when BENCH_DATABASE_URL (or
//! TEST_DATABASE_URL) names a server (a fresh database is created on it).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TENANT: &str = "00000000-0000-4000-8000-000000000001";
const KEY: &str = "bench-key";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn config(storage: &str, ports: (u16, u16, u16), enabled: bool) -> String {
    format!(
        r#"
[service]
watch = true
[listeners]
api = "127.0.0.1:{}"
proxy = "127.0.0.1:{}"
metrics = "127.0.0.1:{}"
[storage]
url = "{storage}"
[logging]
level = "warn"
[webhooks]
enabled = {enabled}
allow_networks = ["127.0.0.0/8"]
[[tenants]]
id = "{TENANT}"
[[tenants.api_keys]]
id = "bench"
sha256 = "{}"
[policies.default]
mode = "enforcement"
"#,
        ports.0,
        ports.1,
        ports.2,
        sha256_hex(KEY)
    )
}

struct Counter {
    n: AtomicU64,
    signed: AtomicU64,
}

async fn receive(State(c): State<Arc<Counter>>, headers: HeaderMap, _body: Bytes) -> &'static str {
    if headers.contains_key("webhook-signature") {
        c.signed.fetch_add(1, Ordering::Relaxed);
    }
    c.n.fetch_add(1, Ordering::Relaxed);
    "ok"
}

async fn fill_outbox(storage: &str, subscription: &str, n: usize) {
    let payload = serde_json::json!({
        "type": "receipt.created", "id": uuid::Uuid::new_v4(), "timestamp": "2026-01-01T00:00:00.000000Z",
        "tenantId": TENANT,
        "data": {"id": uuid::Uuid::new_v4(), "replay_hash": "9f2b6c1e4d7a8b3c5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d", "decision": "allow"}
    })
    .to_string();
    let now = "2026-01-01T00:00:00.000000Z";
    let rows: Vec<String> = (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    macro_rules! insert {
        ($pool:expr) => {{
            let mut tx = $pool.begin().await.unwrap();
            for chunk in rows.chunks(500) {
                let values: Vec<String> = (0..chunk.len())
                    .map(|i| format!("(${}, $1, $2, $3, 'receipt.created', $4, 'pending', 0, 0, $5, $5, $5)", i + 6))
                    .collect();
                let sql = format!("INSERT INTO webhook_deliveries (id, tenant_id, subscription_id, event_id, event_name, payload, delivery_status, attempt_count, redrive_count, next_retry_at, created_at, updated_at) VALUES {}", values.join(", "));
                let mut q = sqlx::query(&sql).bind(TENANT).bind(subscription).bind(uuid::Uuid::new_v4().to_string()).bind(&payload).bind(now);
                for id in chunk {
                    q = q.bind(id);
                }
                q.execute(&mut *tx).await.unwrap();
            }
            tx.commit().await.unwrap();
        }};
    }
    if storage.starts_with("sqlite:") {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect(storage)
            .await
            .unwrap();
        insert!(pool);
        pool.close().await;
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(storage)
            .await
            .unwrap();
        insert!(pool);
        pool.close().await;
    }
}

async fn delivered(storage: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM webhook_deliveries WHERE delivery_status = 'delivered'";
    if storage.starts_with("sqlite:") {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect(storage)
            .await
            .unwrap();
        let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(storage)
            .await
            .unwrap();
        let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    }
}

async fn run(label: &str, storage: String, dir: &Path, n: usize) {
    let counter = Arc::new(Counter {
        n: AtomicU64::new(0),
        signed: AtomicU64::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .fallback(receive)
        .with_state(counter.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let ports = (free_port(), free_port(), free_port());
    let cfg_path = dir.join(format!("{label}.toml"));
    std::fs::write(&cfg_path, config(&storage, ports, false)).unwrap();
    let mut gate: Child = Command::new(env!("CARGO_BIN_EXE_substrate-gate"))
        .args(["serve", "--config"])
        .arg(&cfg_path)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start substrate-gate");
    let api = format!("http://127.0.0.1:{}", ports.0);
    let client = reqwest::Client::new();
    let ready = Instant::now();
    while !client
        .get(format!("{api}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "gate did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sub: serde_json::Value = client
        .post(format!("{api}/substrate/webhooks/subscriptions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"productSurface": "generic", "eventName": "receipt.created", "targetUrl": target}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sub_id = sub["id"].as_str().expect("subscription id").to_string();
    fill_outbox(&storage, &sub_id, n).await;

    let tmp = dir.join(format!(".{label}.tmp"));
    std::fs::write(&tmp, config(&storage, ports, true)).unwrap();
    std::fs::rename(&tmp, &cfg_path).unwrap();
    let start = Instant::now();
    // Wait for the first request (the reload), then time the rest.
    while counter.n.load(Ordering::Relaxed) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the reload did not switch the worker on"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = Instant::now();
    while (counter.n.load(Ordering::Relaxed) as usize) < n {
        assert!(
            first.elapsed() < Duration::from_secs(600),
            "deliveries stalled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let received = first.elapsed();
    while (delivered(&storage).await as usize) < n {
        assert!(
            first.elapsed() < Duration::from_secs(600),
            "recording stalled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recorded = first.elapsed();
    let _ = gate.kill();
    let _ = gate.wait();
    assert_eq!(
        counter.signed.load(Ordering::Relaxed) as usize,
        counter.n.load(Ordering::Relaxed) as usize
    );
    println!(
        "webhook_delivery/{label}: {n} deliveries received in {:.2} s = {:.0}/s; all recorded delivered in {:.2} s = {:.0}/s ({} requests, {} repeats)",
        received.as_secs_f64(),
        n as f64 / received.as_secs_f64(),
        recorded.as_secs_f64(),
        n as f64 / recorded.as_secs_f64(),
        counter.n.load(Ordering::Relaxed),
        counter.n.load(Ordering::Relaxed) as usize - n,
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects a backend.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let n: usize = std::env::var("WEBHOOK_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().unwrap();
    if filter.as_deref().is_none_or(|f| "sqlite".contains(f)) {
        let storage = format!("sqlite://{}", dir.path().join("bench.db").display());
        run("sqlite", storage, dir.path(), n).await;
    }
    let pg = std::env::var("BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("TEST_DATABASE_URL"))
        .ok()
        .filter(|u| !u.is_empty());
    match pg {
        Some(admin) if filter.as_deref().is_none_or(|f| "postgres".contains(f)) => {
            let name = format!("gate_bench_{}", uuid::Uuid::new_v4().simple());
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&admin)
                .await
                .unwrap();
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&pool)
                .await
                .unwrap();
            let url = format!("{}/{}", &admin[..admin.rfind('/').unwrap()], name);
            run("postgres", url, dir.path(), n).await;
            sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .execute(&pool)
                .await
                .ok();
            pool.close().await;
        }
        Some(_) => {}
        None => println!(
            "webhook_delivery/postgres: skipped (set BENCH_DATABASE_URL or TEST_DATABASE_URL)"
        ),
    }
}
