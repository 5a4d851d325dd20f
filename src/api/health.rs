//! Liveness, readiness and the service's identity. No key needed.

use crate::kernel::types::HealthResponse;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use std::sync::Arc;

pub const SERVICE: &str = "substrate-gate";

fn health_body(ok: bool) -> HealthResponse {
    HealthResponse {
        ok,
        service: Some(SERVICE.into()),
        version: Some(env!("CARGO_PKG_VERSION").into()),
    }
}

/// Service health.
#[utoipa::path(get, path = "/health", tag = "health", responses((status = 200, description = "The service is up", body = HealthResponse)))]
pub async fn health() -> Json<HealthResponse> {
    Json(health_body(true))
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The process is alive", body = HealthResponse)))]
pub async fn healthz() -> Json<HealthResponse> {
    Json(health_body(true))
}

/// Readiness: a config is loaded and storage answers.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready to serve", body = HealthResponse),
    (status = 503, description = "Storage unreachable", body = HealthResponse)
))]
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<HealthResponse>) {
    let ok = state.store.ping().await;
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(health_body(ok)),
    )
}
