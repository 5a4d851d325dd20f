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

/// Readiness: a config is loaded, storage answers and the proxy listener accepts connections
/// (a sidecar that cannot take its agent's traffic is not ready).
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready to serve", body = HealthResponse),
    (status = 503, description = "Storage unreachable, or the proxy listener not accepting yet", body = HealthResponse)
))]
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<HealthResponse>) {
    let proxy = state.runtime().config.listeners.proxy.clone();
    let ok = state.store.ping().await && proxy_accepts(&proxy).await;
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(health_body(ok)),
    )
}

/// Whether the proxy listener accepts a connection (a wildcard address is tried on loopback).
async fn proxy_accepts(addr: &str) -> bool {
    let Ok(mut sa) = addr.parse::<std::net::SocketAddr>() else {
        // Not an address (the config refuses that): nothing to check here.
        return true;
    };
    if sa.port() == 0 {
        // A port the system picks cannot be named here.
        return true;
    }
    if sa.ip().is_unspecified() {
        sa.set_ip(match sa {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let connect = tokio::net::TcpStream::connect(sa);
    matches!(
        tokio::time::timeout(std::time::Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::proxy_accepts;

    #[tokio::test]
    async fn readiness_sees_whether_the_proxy_listener_accepts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(proxy_accepts(&format!("127.0.0.1:{port}")).await);
        assert!(proxy_accepts(&format!("0.0.0.0:{port}")).await);
        drop(listener);
        assert!(!proxy_accepts(&format!("127.0.0.1:{port}")).await);
    }
}
