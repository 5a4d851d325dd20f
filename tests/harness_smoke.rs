//! The harness itself: a gate starts on each backend, answers health, and stops.

mod common;
use common::*;

#[tokio::test]
async fn gate_starts_and_answers_health_on_every_backend() {
    for b in backends() {
        let g = Gate::start(GateOptions::new(b)).await;
        let (s, v) = g.get(DEMO_KEY, "/health").await;
        assert_eq!(s, 200);
        assert_eq!(
            v,
            serde_json::json!({"ok": true, "service": "substrate-gate", "version": env!("CARGO_PKG_VERSION")})
        );
        let (s, v) = g.get(DEMO_KEY, "/readyz").await;
        assert_eq!((s, v["ok"].as_bool()), (200, Some(true)), "{b:?}");
    }
}
