//! The JSON API on the api listener: one file per resource, the edge
//! (auth, limits, problem+json) in `extract` and `error`, the OpenAPI
//! document generated from the same types in `openapi`.

pub mod error;
pub mod evaluate;
pub mod extract;
pub mod health;
pub mod lifecycle;
pub mod openapi;
pub mod operations;
pub mod quarantine;
pub mod receipts;
pub mod signals;
pub mod webhooks;

use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use std::sync::Arc;

/// Routes of the api listener. Later issues' resources merge in here.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(openapi::serve))
        .route("/substrate/signals/ingest", post(signals::ingest))
        .route("/substrate/integrity/evaluate", post(evaluate::evaluate))
        .route(
            "/substrate/receipts/checkpoint",
            get(receipts::latest_checkpoint).post(receipts::sign_checkpoint),
        )
        .route(
            "/substrate/receipts/checkpoint/key",
            get(receipts::checkpoint_key),
        )
        .route("/substrate/receipts/{id}", get(receipts::fetch))
        .route("/substrate/receipts/{id}/replay", post(receipts::replay))
        .route(
            "/substrate/configurations/evaluate",
            post(operations::configurations),
        )
        .route(
            "/substrate/canonicalization/evaluate",
            post(operations::canonicalization),
        )
        .route("/substrate/retrieval/filter", post(operations::retrieval))
        .route("/substrate/actions/release", post(operations::actions))
        .route("/substrate/reversal/evaluate", post(operations::reversal))
        .route(
            "/substrate/coordination/{subjectType}/{subjectId}",
            get(operations::coordination),
        )
        .route("/substrate/obstructions", get(lifecycle::list_obstructions))
        .route(
            "/substrate/obstructions/{id}",
            get(lifecycle::get_obstruction),
        )
        .route(
            "/substrate/obstructions/{id}/resolve",
            post(lifecycle::resolve_obstruction),
        )
        .route(
            "/substrate/obstructions/{id}/reject",
            post(lifecycle::reject_obstruction),
        )
        .route(
            "/substrate/obstructions/{id}/escalate",
            post(lifecycle::escalate_obstruction),
        )
        .route("/substrate/repair-plans", get(lifecycle::list_plans))
        .route("/substrate/repair-plans/{id}", get(lifecycle::get_plan))
        .route(
            "/substrate/repair-plans/{id}/approve",
            post(lifecycle::approve_plan),
        )
        .route(
            "/substrate/repair-plans/{id}/reject",
            post(lifecycle::reject_plan),
        )
        .route(
            "/substrate/repair-plans/{id}/complete",
            post(lifecycle::complete_plan),
        )
        .route(
            "/substrate/webhooks/subscriptions",
            post(webhooks::upsert_subscription).get(webhooks::list_subscriptions),
        )
        .route(
            "/substrate/webhooks/subscriptions/{id}/rotate",
            post(webhooks::rotate_secret),
        )
        .route(
            "/substrate/webhooks/dead-letters",
            get(webhooks::dead_letters),
        )
        .route(
            "/substrate/webhooks/deliveries/{id}/redrive",
            post(webhooks::redrive),
        )
        .route("/substrate/quarantine", get(quarantine::list))
        .route("/substrate/quarantine/{id}", get(quarantine::fetch))
        .route(
            "/substrate/quarantine/{id}/release",
            post(quarantine::release),
        )
        .route(
            "/substrate/quarantine/{id}/reject",
            post(quarantine::reject),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), edge))
        .with_state(state)
}

/// An error answered by the framework itself (an extractor's rejection: a path parameter that
/// is not UTF-8 once percent-decoded, ...) in its plain-text form becomes a problem like every
/// other error; the framework's message is its detail.
async fn as_problem(resp: Response) -> Response {
    let status = resp.status();
    // Only the framework's plain-text answers: every handler's error is a problem already,
    // and a JSON error body of a route's own (`/readyz`) is its documented answer.
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.starts_with("text/plain"));
    if !(status.is_client_error() || status.is_server_error()) || !plain {
        return resp;
    }
    let body = axum::body::to_bytes(resp.into_body(), 16 * 1024)
        .await
        .unwrap_or_default();
    let detail = String::from_utf8_lossy(&body).trim().to_string();
    let (status, code) = match status.as_u16() {
        400 => (status, "validation_failed"),
        401 => (status, "unauthenticated"),
        404 => (status, "not_found"),
        405 => (status, "method_not_allowed"),
        413 => (status, "payload_too_large"),
        415 => (status, "unsupported_media_type"),
        429 => (status, "rate_limited"),
        _ if status.is_client_error() => (StatusCode::BAD_REQUEST, "invalid_request"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let detail = if detail.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        detail
    };
    ApiError::new(status, code, detail).into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// Request id (taken from `x-request-id` when it is sane, else minted), a
/// span carrying it, the metrics counter, and a last guard: a panic anywhere
/// below becomes a 503 problem, never a dropped connection or a 500.
async fn edge(State(_state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let rid = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 128
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        })
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let span = tracing::info_span!("request", request_id = %rid, method = %req.method(), path = %req.uri().path(), tenant = tracing::field::Empty);
    // A NUL in a path parameter or query value: PostgreSQL stores and compares no NUL in text,
    // so it is refused here, on both backends alike, not failed at the database as an outage.
    let nul = req
        .uri()
        .path_and_query()
        .is_some_and(|pq| pq.as_str().contains("%00"));
    let has_body = req
        .headers()
        .contains_key(axum::http::header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let fut = error::REQUEST_ID.scope(rid.clone(), async move {
        use futures::FutureExt;
        if nul {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "validation_failed",
                "the request path or query holds a NUL character (%00)",
            )
            .into_response();
        }
        match std::panic::AssertUnwindSafe(next.run(req))
            .catch_unwind()
            .await
        {
            Ok(r) => r,
            Err(_) => {
                tracing::error!("handler panicked");
                ApiError::unavailable("internal fault; nothing was changed").into_response()
            }
        }
    });
    let resp = tracing::Instrument::instrument(fut, span).await;
    let mut resp = error::REQUEST_ID.scope(rid.clone(), as_problem(resp)).await;
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    // Refused before its body was read (no key, a rate limit, no such route, a content type or
    // size refused up front): the unread body is left on the connection, which then cannot
    // carry another request. Saying so lets the client open a new one instead of failing its
    // next request on this one.
    if has_body && matches!(resp.status().as_u16(), 401 | 404 | 405 | 413 | 415 | 429) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            HeaderValue::from_static("close"),
        );
    }
    let class = match resp.status().as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    crate::metrics::HTTP_REQUESTS
        .with_label_values(&["api", class])
        .inc();
    resp
}
