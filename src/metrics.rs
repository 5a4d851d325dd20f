//! Prometheus metrics, served on the metrics listener at `/metrics`. One
//! registry for the process; names are prefixed `substrate_gate_`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::LazyLock;

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

fn reg<T: prometheus::core::Collector + Clone + 'static>(c: T) -> T {
    // Registration only fails on a duplicate name, which is a programming error caught by tests.
    let _ = REGISTRY.register(Box::new(c.clone()));
    c
}

const LATENCY_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

pub static HTTP_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_http_requests_total",
            "API and proxy requests by listener and status class",
        ),
        &["listener", "status"],
    )
    .expect("metric"))
});
pub static CONNECTIONS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_connections_refused_total",
            "Client connections closed on accept: the listener held limits.max_client_connections (reason total) or the client's address held limits.max_connections_per_client (reason per_client)",
        ),
        &["listener", "reason"],
    )
    .expect("metric"))
});
pub static DECISIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_decisions_total",
            "Kernel decisions by outcome and substrate",
        ),
        &["decision", "substrate"],
    )
    .expect("metric"))
});
pub static KERNEL_LATENCY: LazyLock<Histogram> = LazyLock::new(|| {
    reg(Histogram::with_opts(
        HistogramOpts::new(
            "substrate_gate_kernel_seconds",
            "Uncached kernel evaluation time",
        )
        .buckets(LATENCY_BUCKETS.to_vec()),
    )
    .expect("metric"))
});
pub static KERNEL_CACHE: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_kernel_cache_total",
            "Kernel cache lookups by result",
        ),
        &["result"],
    )
    .expect("metric"))
});
pub static JOURNAL_COMMIT: LazyLock<Histogram> = LazyLock::new(|| {
    reg(Histogram::with_opts(
        HistogramOpts::new(
            "substrate_gate_journal_commit_seconds",
            "Receipt transaction commit time",
        )
        .buckets(LATENCY_BUCKETS.to_vec()),
    )
    .expect("metric"))
});
pub static GROUP_COMMIT_BATCHES: LazyLock<Histogram> = LazyLock::new(|| {
    reg(Histogram::with_opts(
        HistogramOpts::new(
            "substrate_gate_group_commit_batches",
            "Proxied receipt batches per group-commit transaction",
        )
        .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
    )
    .expect("metric"))
});
pub static UPSTREAM: LazyLock<HistogramVec> = LazyLock::new(|| {
    reg(HistogramVec::new(
        HistogramOpts::new(
            "substrate_gate_upstream_seconds",
            "Upstream answer time by status class",
        )
        .buckets(LATENCY_BUCKETS.to_vec()),
        &["status"],
    )
    .expect("metric"))
});
pub static PROXY_RECORDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_proxy_records_total",
            "Records of proxied writes by what the gate did (forwarded, held, blocked), writes that failed closed or open, and writes refused for want of room (busy)",
        ),
        &["action"],
    )
    .expect("metric"))
});
pub static UNDESCRIBED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_proxy_undescribed_total",
            "Mutating proxied requests that no pack describes, by what the gate did (denied, forwarded)",
        ),
        &["outcome"],
    )
    .expect("metric"))
});
pub static RETRIEVAL: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_retrieval_records_total",
            "Records of read answers dropped or marked by retrieval treatment, and answers passed untreated",
        ),
        &["treatment"],
    )
    .expect("metric"))
});
pub static QUARANTINE_REVIEWS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_quarantine_reviews_total",
            "Quarantine reviews by result (released, rejected, release_failed)",
        ),
        &["result"],
    )
    .expect("metric"))
});
pub static WEBHOOK_DELIVERIES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_webhook_deliveries_total",
            "Webhook delivery attempts by result",
        ),
        &["result"],
    )
    .expect("metric"))
});
pub static DEAD_LETTERS: LazyLock<IntCounter> = LazyLock::new(|| {
    reg(IntCounter::new(
        "substrate_gate_dead_letters_total",
        "Deliveries dead-lettered",
    )
    .expect("metric"))
});
pub static RELOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    reg(IntCounterVec::new(
        Opts::new(
            "substrate_gate_config_reloads_total",
            "Config reloads by result",
        ),
        &["result"],
    )
    .expect("metric"))
});
pub static CONFIG_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    reg(IntGaugeVec::new(
        Opts::new(
            "substrate_gate_config_info",
            "The running config version (label) is 1",
        ),
        &["version"],
    )
    .expect("metric"))
});

/// Touches every metric so `/metrics` lists them all from the first scrape.
pub fn init() {
    LazyLock::force(&HTTP_REQUESTS);
    LazyLock::force(&CONNECTIONS_REFUSED);
    LazyLock::force(&DECISIONS);
    LazyLock::force(&KERNEL_LATENCY);
    LazyLock::force(&KERNEL_CACHE);
    LazyLock::force(&JOURNAL_COMMIT);
    LazyLock::force(&GROUP_COMMIT_BATCHES);
    LazyLock::force(&UPSTREAM);
    LazyLock::force(&PROXY_RECORDS);
    LazyLock::force(&UNDESCRIBED);
    LazyLock::force(&RETRIEVAL);
    LazyLock::force(&QUARANTINE_REVIEWS);
    LazyLock::force(&WEBHOOK_DELIVERIES);
    LazyLock::force(&DEAD_LETTERS);
    LazyLock::force(&RELOADS);
    LazyLock::force(&CONFIG_INFO);
}

/// Marks `version` as the running config version.
pub fn set_config_version(version: &str) {
    CONFIG_INFO.reset();
    CONFIG_INFO.with_label_values(&[version]).set(1);
}

pub fn render() -> String {
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&REGISTRY.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
