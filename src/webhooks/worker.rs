//! The delivery worker: claims due deliveries in batches (as many as it has
//! free send slots, so every claimed delivery is sent at once and its lease
//! only has to cover one attempt), sends them concurrently, signed, and hands
//! each result to a recorder task that writes many results per transaction.
//! A gate that dies mid-way loses nothing: unrecorded claims come due again
//! when their lease ends, and the receiver deduplicates by `webhook-id`.

use super::repo::{AttemptRecord, Claimed, Outcome, Recorded};
use super::schedule::{next_delay, parse_retry_after, Jitter};
use super::signing::signature_header;
use super::ssrf::{GuardedResolver, NetPolicy};
use crate::config::WebhooksConfig;
use crate::kernel::types::SubscriptionStatus;
use crate::metrics::{DEAD_LETTERS, WEBHOOK_DELIVERIES};
use crate::state::AppState;
use crate::store::ts;
use arc_swap::ArcSwap;
use chrono::Utc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

/// Results written per recorder transaction, at most.
const RECORD_BATCH: usize = 512;
/// Characters of a failed answer's body kept in `lastError`.
const ERROR_BODY_CHARS: usize = 200;

/// What one send came to, before the schedule is consulted.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    Delivered(u16),
    Failed {
        http_status: Option<u16>,
        error: String,
        retry_after: Option<Duration>,
        gone: bool,
    },
    /// Not sent: the subscription was paused after the claim, too little
    /// of the lease was left, or the gate is stopping. The claim is undone.
    NotSent,
    /// The subscription was revoked or deleted after the claim.
    Cancelled(String),
}

/// Starts the worker (unless `webhooks.enabled` is false at start-up, it
/// also follows later reloads of that flag).
pub fn spawn(state: Arc<AppState>, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state, shutdown))
}

struct ClientCache {
    client: reqwest::Client,
    timeout_ms: u64,
    pool: usize,
}

fn build_client(
    policy: &Arc<ArcSwap<NetPolicy>>,
    cfg: &WebhooksConfig,
) -> Result<reqwest::Client, reqwest::Error> {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        // A redirect could lead anywhere (including inside): never follow one.
        .redirect(reqwest::redirect::Policy::none())
        // A proxy would resolve and connect by itself, past the guard.
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            policy: policy.clone(),
        }))
        .pool_max_idle_per_host(cfg.concurrency)
        .user_agent(concat!("substrate-gate/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Sleeps `d`, or less when shutdown is signalled or `wake` fires.
async fn pause(shutdown: &mut watch::Receiver<bool>, d: Duration, wake: Option<&Notify>) {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    let stop = async {
        // A dropped sender cannot signal any more: then only the sleep ends the pause.
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let woken = async {
        match wake {
            Some(n) => n.notified().await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = &mut sleep => {}
        _ = stop => {}
        _ = woken => {}
    }
}

/// The claim / send loop; returns after shutdown once in-flight sends are
/// recorded (bounded by the send timeout).
pub async fn run(state: Arc<AppState>, mut shutdown: watch::Receiver<bool>) {
    let first = state.runtime().config.webhooks.clone();
    let policy = Arc::new(ArcSwap::from_pointee(NetPolicy::new(&first.allow_networks)));
    let mut allow = first.allow_networks.clone();
    let mut cache = match build_client(&policy, &first) {
        Ok(client) => ClientCache {
            client,
            timeout_ms: first.timeout_ms,
            pool: first.concurrency,
        },
        Err(e) => {
            tracing::error!(error = %e, "webhook worker cannot build its HTTP client; deliveries stay queued");
            return;
        }
    };
    let (tx, rx) = mpsc::channel::<AttemptRecord>(4 * RECORD_BATCH);
    let recorder = tokio::spawn(record_loop(state.clone(), rx));
    let finished = Arc::new(Notify::new());
    let mut pools = Pools::new(&first);
    tracing::info!(
        concurrency = first.concurrency,
        batch = first.batch_size,
        "webhook delivery worker started"
    );

    while !*shutdown.borrow() {
        let rt = state.runtime();
        let cfg = Arc::new(rt.config.webhooks.clone());
        drop(rt);
        let poll = Duration::from_millis(cfg.poll_interval_ms);
        let mut rebuild = cfg.timeout_ms != cache.timeout_ms || cfg.concurrency != cache.pool;
        if cfg.allow_networks != allow {
            policy.store(Arc::new(NetPolicy::new(&cfg.allow_networks)));
            allow = cfg.allow_networks.clone();
            // Pooled connections were checked against the old policy: drop them.
            rebuild = true;
        }
        if rebuild {
            match build_client(&policy, &cfg) {
                Ok(c) => {
                    cache = ClientCache {
                        client: c,
                        timeout_ms: cfg.timeout_ms,
                        pool: cfg.concurrency,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rebuild the webhook HTTP client; keeping the old one")
                }
            }
        }
        if pools.sized_for != (cfg.concurrency, cfg.batch_size) {
            // Tasks under way keep their permits of the old semaphores.
            pools = Pools::new(&cfg);
        }
        if !cfg.enabled {
            pause(&mut shutdown, poll, None).await;
            continue;
        }
        // Claim ahead: up to one batch more than can be sent at once is
        // claimed, so the next sends never wait for a claim round trip.
        // Below a quarter of the budget, wait for sends to finish first, so
        // claims stay batches rather than a trickle of single rows.
        let free = pools.budget.available_permits();
        let outstanding = pools.budget_size - free;
        let low = (pools.budget_size / 4).clamp(1, cfg.batch_size as usize);
        if free == 0 || (free < low && outstanding > 0) {
            pause(&mut shutdown, poll, Some(&finished)).await;
            continue;
        }
        let want = free.min(cfg.batch_size as usize);
        let lease = Duration::from_secs(cfg.lease_secs);
        let lease_end = Instant::now() + lease;
        let first_delay = Duration::from_secs(cfg.schedule_secs.first().copied().unwrap_or(0));
        let claimed = match state.store.claim_deliveries(want, lease, first_delay).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "webhook claim failed; retrying after the poll interval");
                pause(&mut shutdown, poll, None).await;
                continue;
            }
        };
        let got = claimed.len();
        if got > want {
            tracing::warn!(
                got,
                want,
                "webhook claim returned more deliveries than asked for"
            );
        }
        for c in claimed {
            // The claim took no more than the free budget, so this succeeds;
            // should it not, the delivery is still sent, never dropped.
            let budget = pools.budget.clone().try_acquire_owned().ok();
            let slots = pools.slots.clone();
            let stop = shutdown.clone();
            let (client, policy, cfg, tx, finished) = (
                cache.client.clone(),
                policy.load_full(),
                cfg.clone(),
                tx.clone(),
                finished.clone(),
            );
            tokio::spawn(async move {
                let Ok(slot) = slots.acquire_owned().await else {
                    return;
                };
                // A send must end well inside the lease, or another gate
                // could send the same delivery meanwhile: if too little of
                // the lease is left (or the gate is stopping), undo the claim.
                let must_end =
                    Instant::now() + Duration::from_millis(cfg.timeout_ms) + LEASE_MARGIN;
                let result = if must_end > lease_end || *stop.borrow() {
                    SendResult::NotSent
                } else {
                    send(&client, &policy, &cfg, &c).await
                };
                let record = decide(c, result, &cfg);
                let _ = tx.send(record).await;
                drop(slot);
                drop(budget);
                finished.notify_one();
            });
        }
        if got < want {
            // Nothing more is due now.
            pause(&mut shutdown, poll, None).await;
        }
    }
    // Let sends in flight finish and be recorded (they are bounded by the
    // send timeout; queued ones are released unsent); anything cut short
    // comes due again after its lease.
    let bound = Duration::from_millis(cache.timeout_ms) + Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, pools.budget.acquire_many(pools.budget_size as u32)).await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), recorder).await;
    tracing::info!("webhook delivery worker stopped");
}

/// Time a send must leave before its lease ends.
const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// The worker's two limits: deliveries claimed and not yet finished
/// (`concurrency + batch_size`), and sends in flight (`concurrency`).
struct Pools {
    budget: Arc<Semaphore>,
    budget_size: usize,
    slots: Arc<Semaphore>,
    sized_for: (usize, u32),
}

impl Pools {
    fn new(cfg: &WebhooksConfig) -> Pools {
        let budget_size = cfg.concurrency + cfg.batch_size as usize;
        Pools {
            budget: Arc::new(Semaphore::new(budget_size)),
            budget_size,
            slots: Arc::new(Semaphore::new(cfg.concurrency)),
            sized_for: (cfg.concurrency, cfg.batch_size),
        }
    }
}

/// Maps a send's result to what is recorded, using the schedule.
pub fn decide(c: Claimed, result: SendResult, cfg: &WebhooksConfig) -> AttemptRecord {
    let now = Utc::now();
    let (outcome, pause_subscription) = match result {
        SendResult::Delivered(code) => (
            Outcome::Delivered {
                http_status: code as i64,
            },
            false,
        ),
        SendResult::NotSent => (Outcome::Release, false),
        SendResult::Cancelled(error) => (Outcome::Cancel { error }, false),
        SendResult::Failed {
            http_status,
            error,
            retry_after,
            gone,
        } => {
            let jitter = Jitter::parse(&cfg.jitter);
            let attempts_done = c.cycle_attempt.max(0) as u32;
            let delay = next_delay(
                &cfg.schedule_secs,
                attempts_done,
                jitter,
                retry_after,
                &mut rand::thread_rng(),
            );
            let http_status = http_status.map(|s| s as i64);
            let outcome = match delay {
                Some(d) => Outcome::Retry {
                    http_status,
                    error,
                    next_retry_at: ts(now + chrono::Duration::from_std(d).unwrap_or_default()),
                },
                None => Outcome::DeadLetter { http_status, error },
            };
            (outcome, gone)
        }
    };
    AttemptRecord {
        claimed: c,
        outcome,
        pause_subscription,
    }
}

/// One signed POST of a claimed delivery.
pub async fn send(
    client: &reqwest::Client,
    policy: &NetPolicy,
    cfg: &WebhooksConfig,
    c: &Claimed,
) -> SendResult {
    let failed = |error: String| SendResult::Failed {
        http_status: None,
        error,
        retry_after: None,
        gone: false,
    };
    let Some(target) = &c.target else {
        return SendResult::Cancelled("subscription no longer exists".into());
    };
    match target.status {
        SubscriptionStatus::Active => {}
        SubscriptionStatus::Paused => return SendResult::NotSent,
        SubscriptionStatus::Revoked => return SendResult::Cancelled("subscription revoked".into()),
    }
    let url = match super::ssrf::parse_target(&target.url) {
        Ok(u) => u,
        Err(e) => return failed(format!("target URL {e}")),
    };
    // IP-literal hosts do not go through the resolver: judge them here.
    if let Err(e) = policy.check_literal(&url) {
        return failed(format!("target refused: {e}"));
    }
    let keys: Vec<Vec<u8>> = target.secrets.iter().filter_map(|s| s.key().ok()).collect();
    if keys.is_empty() {
        return failed("the subscription's secret is unusable; rotate it".into());
    }
    let timestamp = Utc::now().timestamp();
    let id = c.id.to_string();
    let signature = signature_header(&keys, &id, timestamp, c.payload.as_bytes());
    let request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header("webhook-attempt", c.attempt_count.to_string())
        .body(c.payload.clone());
    let mut resp = match request.send().await {
        Ok(r) => r,
        Err(e) => return failed(error_chain(&e.without_url())),
    };
    let status = resp.status();
    let retry_after = if status.as_u16() == 429 || status.as_u16() == 503 {
        resp.headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Utc::now()))
    } else {
        None
    };
    // Read (a bounded part of) the answer, so the connection can be reused
    // and a failure can say what the receiver said.
    let mut body = Vec::new();
    let mut read_error = None;
    while body.len() < cfg.response_body_bytes {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = cfg.response_body_bytes - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) => break,
            Err(e) => {
                read_error = Some(error_chain(&e.without_url()));
                break;
            }
        }
    }
    if status.is_success() {
        return SendResult::Delivered(status.as_u16());
    }
    let mut error = format!("receiver answered {status}");
    if status.is_redirection() {
        error.push_str(" (redirects are not followed)");
    }
    let text: String = String::from_utf8_lossy(&body)
        .chars()
        .filter(|ch| !ch.is_control())
        .take(ERROR_BODY_CHARS)
        .collect();
    if !text.trim().is_empty() {
        error.push_str(": ");
        error.push_str(text.trim());
    } else if let Some(e) = read_error {
        error.push_str(&format!(" (reading the answer failed: {e})"));
    }
    SendResult::Failed {
        http_status: Some(status.as_u16()),
        error,
        retry_after,
        gone: status.as_u16() == 410,
    }
}

/// An error and its causes on one line ("a: b: c"), without repeats.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// Writes results in batches: everything that arrived since the last write
/// goes into one transaction. A write that fails is retried a few times;
/// after that the results are dropped and their leases bring the
/// deliveries back (sent again: at least once, never lost).
async fn record_loop(state: Arc<AppState>, mut rx: mpsc::Receiver<AttemptRecord>) {
    let mut buf: Vec<AttemptRecord> = Vec::with_capacity(RECORD_BATCH);
    while let Some(first) = rx.recv().await {
        buf.push(first);
        while buf.len() < RECORD_BATCH {
            match rx.try_recv() {
                Ok(r) => buf.push(r),
                Err(_) => break,
            }
        }
        let mut tries = 0;
        loop {
            match state.store.record_attempts(&buf).await {
                Ok(results) => {
                    account(&buf, &results);
                    break;
                }
                Err(e) if tries < 3 => {
                    tries += 1;
                    tracing::warn!(error = %e, attempts = buf.len(), "recording webhook attempts failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, attempts = buf.len(), "could not record webhook attempts; they will be sent again when their leases end");
                    break;
                }
            }
        }
        buf.clear();
    }
}

fn account(records: &[AttemptRecord], results: &[Recorded]) {
    for (r, res) in records.iter().zip(results) {
        let c = &r.claimed;
        if *res == Recorded::LeaseLost {
            WEBHOOK_DELIVERIES.with_label_values(&["lease_lost"]).inc();
            tracing::warn!(delivery = %c.id, attempt = c.attempt_count, "webhook attempt outlived its lease; its result was dropped");
            continue;
        }
        match &r.outcome {
            Outcome::Delivered { http_status } => {
                WEBHOOK_DELIVERIES.with_label_values(&["delivered"]).inc();
                tracing::debug!(delivery = %c.id, subscription = %c.subscription_id, event = %c.event_name, attempt = c.attempt_count, http_status, "webhook delivered");
            }
            Outcome::Retry {
                http_status, error, ..
            } => {
                WEBHOOK_DELIVERIES.with_label_values(&["failed"]).inc();
                tracing::info!(delivery = %c.id, subscription = %c.subscription_id, event = %c.event_name, attempt = c.attempt_count, http_status, error = %error, "webhook attempt failed; retry scheduled");
            }
            Outcome::DeadLetter { http_status, error } => {
                WEBHOOK_DELIVERIES.with_label_values(&["failed"]).inc();
                DEAD_LETTERS.inc();
                tracing::warn!(delivery = %c.id, subscription = %c.subscription_id, event = %c.event_name, attempt = c.attempt_count, http_status, error = %error, "webhook delivery dead-lettered");
            }
            Outcome::Release => {
                tracing::debug!(delivery = %c.id, "webhook claim released unsent");
            }
            Outcome::Cancel { error } => {
                WEBHOOK_DELIVERIES.with_label_values(&["cancelled"]).inc();
                tracing::info!(delivery = %c.id, subscription = %c.subscription_id, error = %error, "webhook delivery cancelled");
            }
        }
        if r.pause_subscription {
            tracing::warn!(subscription = %c.subscription_id, "receiver answered 410 Gone; subscription paused");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhooks::repo::Target;
    use crate::webhooks::signing::Secret;
    use uuid::Uuid;

    fn claimed(cycle_attempt: i64) -> Claimed {
        Claimed {
            id: Uuid::new_v4(),
            tenant_id: Uuid::new_v4(),
            subscription_id: Uuid::new_v4(),
            event_id: Uuid::new_v4().to_string(),
            event_name: "receipt.created".into(),
            payload: "{}".into(),
            attempt_count: cycle_attempt,
            cycle_attempt,
            redrive_count: 0,
            redriven_at: None,
            created_at: crate::store::now(),
            lease_token: "t".into(),
            target: Some(Target {
                url: "http://127.0.0.1:9/".into(),
                secrets: vec![Secret::new("whsec_c2VjcmV0")],
                status: SubscriptionStatus::Active,
            }),
        }
    }

    fn failure(retry_after: Option<Duration>, gone: bool) -> SendResult {
        SendResult::Failed {
            http_status: Some(500),
            error: "boom".into(),
            retry_after,
            gone,
        }
    }

    #[test]
    fn failures_follow_the_schedule_then_dead_letter() {
        let cfg = WebhooksConfig {
            schedule_secs: vec![0, 60, 120],
            jitter: "none".into(),
            ..Default::default()
        };
        let before = Utc::now();
        let r = decide(claimed(1), failure(None, false), &cfg);
        let Outcome::Retry { next_retry_at, .. } = &r.outcome else {
            panic!("{:?}", r.outcome)
        };
        let at = chrono::DateTime::parse_from_rfc3339(next_retry_at).unwrap();
        let secs = (at.with_timezone(&Utc) - before).num_seconds();
        assert!((59..=61).contains(&secs), "{secs}");
        let r = decide(claimed(3), failure(None, true), &cfg);
        assert!(matches!(
            r.outcome,
            Outcome::DeadLetter {
                http_status: Some(500),
                ..
            }
        ));
        assert!(r.pause_subscription);
    }

    #[test]
    fn retry_after_pushes_the_next_attempt_back() {
        let cfg = WebhooksConfig {
            schedule_secs: vec![0, 1, 1],
            jitter: "none".into(),
            ..Default::default()
        };
        let before = Utc::now();
        let r = decide(
            claimed(1),
            failure(Some(Duration::from_secs(600)), false),
            &cfg,
        );
        let Outcome::Retry { next_retry_at, .. } = &r.outcome else {
            panic!()
        };
        let at = chrono::DateTime::parse_from_rfc3339(next_retry_at).unwrap();
        assert!((at.with_timezone(&Utc) - before).num_seconds() >= 599);
    }

    #[test]
    fn paused_and_revoked_subscriptions_get_nothing() {
        let cfg = WebhooksConfig::default();
        let r = decide(claimed(1), SendResult::NotSent, &cfg);
        assert_eq!(r.outcome, Outcome::Release);
        let r = decide(claimed(1), SendResult::Cancelled("x".into()), &cfg);
        assert!(matches!(r.outcome, Outcome::Cancel { .. }));
    }
}
