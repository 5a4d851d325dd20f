//! Receipts: fetch (`GET /substrate/receipts/{id}`) and replay
//! (`POST /substrate/receipts/{id}/replay`).

use super::error::{ApiError, Problem};
use super::extract::{ApiJsonOrEmpty, Auth};
use crate::kernel::types::{
    KernelReplayResponse, ReceiptBody, ReceiptResponse, ReplayRequest, RuntimeDecision,
};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use std::sync::Arc;
use uuid::Uuid;

/// Path ids that are not UUIDs name nothing: 404, like an id of another tenant.
pub fn path_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}

/// Fetch a receipt.
#[utoipa::path(get, path = "/substrate/receipts/{id}", tag = "receipts",
    params(("id" = String, Path, description = "Receipt id (UUID)")),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The receipt", body = ReceiptResponse),
        (status = 400, description = "Invalid tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown receipt", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn fetch(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<ReceiptResponse>, ApiError> {
    let id = path_id(&id, "receipt")?;
    let row = state
        .store
        .get_receipt(auth.0.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("receipt"))?;
    let payload = serde_json::from_str::<serde_json::Value>(&row.payload)
        .ok()
        .and_then(|v| v.as_object().cloned());
    let decision = RuntimeDecision::parse(&row.decision)
        .ok_or_else(|| ApiError::unavailable("stored receipt decision is corrupt"))?;
    let replay_available = payload
        .as_ref()
        .is_some_and(|p| p.get("replayMaterial").is_some_and(|m| !m.is_null()));
    Ok(Json(ReceiptResponse {
        receipt: ReceiptBody {
            id,
            replay_hash: row.replay_hash,
            decision,
            receipt_payload: payload,
        },
        replay_available,
    }))
}

/// Replay a receipt: recompute its hash and (by default) re-run the decision.
#[utoipa::path(post, path = "/substrate/receipts/{id}/replay", tag = "receipts",
    params(("id" = String, Path, description = "Receipt id (UUID)")),
    request_body = Option<ReplayRequest>,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Replay result", body = KernelReplayResponse),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown receipt or coefficient version", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn replay(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    ApiJsonOrEmpty(req): ApiJsonOrEmpty<ReplayRequest>,
) -> Result<Json<KernelReplayResponse>, ApiError> {
    let id = path_id(&id, "receipt")?;
    Ok(Json(
        crate::receipts::replay::replay(&state, auth.0.tenant, &auth.0.key_id, id, req).await?,
    ))
}

/// A checkpoint note as the answer: `text/plain`, the C2SP signed note itself.
fn note_response(status: axum::http::StatusCode, note: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        status,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        note,
    )
        .into_response()
}

fn checkpoints_off() -> ApiError {
    ApiError::not_found("checkpoint key (checkpoints.key_file is not configured)")
}

/// The latest signed checkpoint of the caller's receipt chain: a C2SP signed note of the
/// chain head (origin `NAME/TENANT`, the chain's length, the head's hash). Keep copies
/// elsewhere; `substrate-gate receipts verify --checkpoint FILE` checks the chain against one.
#[utoipa::path(get, path = "/substrate/receipts/checkpoint", tag = "receipts",
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The latest checkpoint, a signed note", body = String, content_type = "text/plain"),
        (status = 400, description = "Invalid tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No checkpoint yet, or no checkpoint key configured", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn latest_checkpoint(
    State(state): State<Arc<AppState>>,
    auth: Auth,
) -> Result<axum::response::Response, ApiError> {
    if state.runtime().checkpoints.is_none() {
        return Err(checkpoints_off());
    }
    let (_, note) = state
        .store
        .latest_checkpoint(auth.0.tenant)
        .await?
        .ok_or_else(|| ApiError::not_found("checkpoint"))?;
    Ok(note_response(axum::http::StatusCode::OK, note))
}

/// Signs the caller's chain head now and answers the checkpoint (the same one again when the
/// head has not moved since the last).
#[utoipa::path(post, path = "/substrate/receipts/checkpoint", tag = "receipts",
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 201, description = "The checkpoint of the current head, a signed note", body = String, content_type = "text/plain"),
        (status = 400, description = "Invalid tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No receipt yet, or no checkpoint key configured", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn sign_checkpoint(
    State(state): State<Arc<AppState>>,
    auth: Auth,
) -> Result<axum::response::Response, ApiError> {
    let signer = state
        .runtime()
        .checkpoints
        .clone()
        .ok_or_else(checkpoints_off)?;
    let note = crate::audit::checkpoint_now(&state.store, &signer, auth.0.tenant)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| ApiError::not_found("receipt chain"))?;
    Ok(note_response(axum::http::StatusCode::CREATED, note))
}

/// The checkpoint key's public half, as a C2SP verifier key (`NAME+KEYID+KEY`): what a
/// verifier needs, and all it needs.
#[utoipa::path(get, path = "/substrate/receipts/checkpoint/key", tag = "receipts",
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The verifier key", body = String, content_type = "text/plain"),
        (status = 400, description = "Invalid tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No checkpoint key configured", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn checkpoint_key(
    State(state): State<Arc<AppState>>,
    _auth: Auth,
) -> Result<axum::response::Response, ApiError> {
    let signer = state
        .runtime()
        .checkpoints
        .clone()
        .ok_or_else(checkpoints_off)?;
    Ok(note_response(
        axum::http::StatusCode::OK,
        format!("{}\n", signer.verifier().encode()),
    ))
}
