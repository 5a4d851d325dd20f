//! Webhook deliveries survive the gate: a gate killed (SIGKILL) in the middle
//! of deliveries and restarted delivers every event at least once, and two
//! gates sharing one PostgreSQL database never send the same attempt twice.

mod common;
mod webhook_receiver;

use common::*;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use webhook_receiver::*;

fn opts(b: Backend, webhook_keys: &str) -> GateOptions {
    let mut o = GateOptions::new(b);
    // The harness writes `schedule_secs = {webhook_schedule}` inside
    // `[webhooks]`; further keys of that table follow on the next lines.
    o.webhook_schedule = format!("[0, 1, 1, 1, 1, 1]\n{webhook_keys}");
    o
}

async fn delivery_ids(g: &Gate) -> Vec<String> {
    let sql = "SELECT id FROM webhook_deliveries ORDER BY id";
    if g.storage_url.starts_with("sqlite:") {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect(&g.storage_url)
            .await
            .unwrap();
        let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows.into_iter().map(|r| r.0).collect()
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&g.storage_url)
            .await
            .unwrap();
        let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows.into_iter().map(|r| r.0).collect()
    }
}

/// Ingests `n` signals, `parallel` at a time, spread over the gates.
async fn ingest_many(gates: &[&Gate], n: usize, parallel: usize) {
    let mut i = 0;
    while i < n {
        let batch: Vec<_> = (i..(i + parallel).min(n))
            .map(|k| {
                let g = gates[k % gates.len()];
                async move {
                    g.ingest(
                        DEMO_KEY,
                        signal_body(json!({"payload": format!("note number {k}")})),
                    )
                    .await
                }
            })
            .collect();
        futures::future::join_all(batch).await;
        i += parallel;
    }
}

async fn delivered_metric(g: &Gate) -> f64 {
    let text = g.metrics_text().await;
    text.lines()
        .find(|l| l.starts_with("substrate_gate_webhook_deliveries_total{result=\"delivered\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn wait_all_delivered(g: &Gate, deadline: Duration) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if g.count("SELECT COUNT(*) FROM webhook_deliveries WHERE delivery_status <> 'delivered'")
            .await
            == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_gate_killed_mid_deliveries_delivers_every_event_after_restart() {
    const EVENTS: usize = 150;
    for b in backends() {
        let r = Receiver::start().await;
        r.set_default("/k", Reply::status(200).delay(Duration::from_millis(100)));
        let mut g = Gate::start(opts(b, "lease_secs = 7\nbatch_size = 16\nconcurrency = 8")).await;
        let (s, v) = g
            .post(
                DEMO_KEY,
                "/substrate/webhooks/subscriptions",
                &json!({"productSurface": "generic", "eventName": "signal.ingested", "targetUrl": r.url("/k")}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        ingest_many(&[&g], EVENTS, 10).await;
        assert!(
            r.wait_for(Duration::from_secs(30), |h| h.len() >= 30).await,
            "{b:?}: deliveries did not start\n{}",
            g.log()
        );
        g.kill();
        let undelivered = g
            .count("SELECT COUNT(*) FROM webhook_deliveries WHERE delivery_status <> 'delivered'")
            .await;
        assert!(
            undelivered > 0,
            "{b:?}: the kill came too late to test anything"
        );
        let in_flight = g
            .count("SELECT COUNT(*) FROM webhook_deliveries WHERE lease_owner IS NOT NULL")
            .await;

        g.spawn().await;
        assert!(
            wait_all_delivered(&g, Duration::from_secs(60)).await,
            "{b:?}: not everything was delivered after the restart\n{}",
            g.log()
        );
        let ids = delivery_ids(&g).await;
        assert_eq!(ids.len(), EVENTS, "one delivery per event");
        let hits = r.hits_on("/k");
        let seen: HashSet<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        let lost: Vec<&String> = ids
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .collect();
        assert!(lost.is_empty(), "{b:?}: lost deliveries {lost:?}");
        eprintln!(
            "{b:?}: {EVENTS} events, {undelivered} undelivered and {in_flight} leased at the kill, {} requests received ({} repeats, deduplicated by webhook-id)",
            hits.len(),
            hits.len() - seen.len()
        );
    }
}

#[tokio::test]
async fn two_gates_on_one_postgres_never_send_the_same_attempt_twice() {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    const EVENTS: usize = 400;
    let r = Receiver::start().await;
    r.set_default("/two", Reply::status(200).delay(Duration::from_millis(10)));
    let keys = "batch_size = 16\nconcurrency = 8";
    let g1 = Gate::start(opts(Backend::Postgres, keys)).await;
    let mut o2 = opts(Backend::Postgres, keys);
    o2.storage_url = Some(g1.storage_url.clone());
    let g2 = Gate::start(o2).await;
    let (s, v) = g1
        .post(
            DEMO_KEY,
            "/substrate/webhooks/subscriptions",
            &json!({"productSurface": "generic", "eventName": "signal.ingested", "targetUrl": r.url("/two")}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let t = Instant::now();
    ingest_many(&[&g1, &g2], EVENTS, 16).await;
    eprintln!(
        "ingested {EVENTS} in {:?}; {} delivered so far",
        t.elapsed(),
        r.hits().len()
    );
    // Well within the 60 s lease: nothing may wait for a lease to expire.
    assert!(
        wait_all_delivered(&g1, Duration::from_secs(30)).await,
        "not everything was delivered\n{}\n{}",
        g1.log(),
        g2.log()
    );
    eprintln!("all delivered after {:?}", t.elapsed());
    let hits = r.hits_on("/two");
    let mut per_attempt: HashMap<(String, u32), usize> = HashMap::new();
    for h in &hits {
        *per_attempt.entry((h.id.clone(), h.attempt)).or_default() += 1;
    }
    let twice: Vec<_> = per_attempt.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "attempts sent twice: {twice:?}");
    let ids: HashSet<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids.len(), EVENTS, "every event delivered");
    assert_eq!(
        hits.len(),
        EVENTS,
        "and each exactly once (the receiver always answered 200)"
    );
    let (d1, d2) = (delivered_metric(&g1).await, delivered_metric(&g2).await);
    eprintln!("gate 1 delivered {d1}, gate 2 delivered {d2}");
    assert_eq!(d1 + d2, EVENTS as f64);
    assert!(d1 > 0.0 && d2 > 0.0, "both gates took part ({d1} / {d2})");
}
