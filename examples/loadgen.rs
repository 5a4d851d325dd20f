//! HTTP load generator for the API: each worker ingests a signal, evaluates
//! it (a receipt is written) and repeats. Prints pairs per second and the
//! latency distribution of the pair.
//!
//!   cargo run --release --example loadgen -- http://127.0.0.1:8080 demo-key-change-me 32 20

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let key = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "demo-key-change-me".into());
    let workers: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(32);
    let secs: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(20);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(workers)
        .build()
        .expect("client");
    let payload = "Customer note: the order shipped on Tuesday and the customer asked for an invoice copy by email. ".repeat(10);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = vec![];
    for w in 0..workers {
        let (client, base, key, payload) =
            (client.clone(), base.clone(), key.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = vec![];
            let mut errors = 0u64;
            let mut n = 0u64;
            while Instant::now() < end {
                let t = Instant::now();
                let body = serde_json::json!({"productSurface": "generic", "sourceType": "agent_output", "sourceId": format!("agent-{w}"),
                    "targetSubstrate": "agent_memory", "proposedMutation": "write_memory", "payload": format!("{payload} #{n}")});
                n += 1;
                let ok = async {
                    let r = client.post(format!("{base}/substrate/signals/ingest")).bearer_auth(&key).json(&body).send().await.ok()?;
                    let v: serde_json::Value = r.json().await.ok()?;
                    let id = v["signal"]["id"].as_str()?.to_string();
                    let r = client.post(format!("{base}/substrate/integrity/evaluate")).bearer_auth(&key).json(&serde_json::json!({"signalId": id})).send().await.ok()?;
                    r.status().is_success().then_some(())
                }
                .await;
                if ok.is_some() {
                    lat.push(t.elapsed());
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = vec![];
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("worker");
        all.extend(l);
        errors += e;
    }
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    println!(
        "ingest+evaluate pairs: {} in {secs}s = {:.0}/s ({:.0} HTTP requests/s); errors {errors}; latency of a pair p50 {:.2} ms, p99 {:.2} ms",
        all.len(),
        all.len() as f64 / secs as f64,
        2.0 * all.len() as f64 / secs as f64,
        pct(0.5),
        pct(0.99)
    );
}
