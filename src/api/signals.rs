//! `POST /substrate/signals/ingest`: validate, normalize, digest, store.

use super::error::{ApiError, Problem};
use super::extract::{ApiJson, Auth};
use crate::kernel::types::{IngestRequest, IngestResponse};
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use std::sync::Arc;

/// Ingest a signal that proposes to change a protected substrate.
#[utoipa::path(post, path = "/substrate/signals/ingest", tag = "signals", request_body = IngestRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Stored and normalized", body = IngestResponse),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn ingest(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<IngestRequest>,
) -> Result<Json<IngestResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(crate::engine::ingest(&state, &auth.0, req).await?))
}
