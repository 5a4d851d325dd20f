//! `POST /substrate/integrity/evaluate`: run the kernel on a stored signal,
//! commit the receipt, answer the spec's evaluate response.

use super::error::{ApiError, Problem};
use super::extract::{ApiJson, Auth};
use crate::engine::{evaluate_signal, EvalOptions};
use crate::kernel::types::{EvaluateRequest, EvaluateResponse, EvaluationProfile};
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use std::sync::Arc;

/// Evaluate whether an ingested signal may acquire influence.
#[utoipa::path(post, path = "/substrate/integrity/evaluate", tag = "signals", request_body = EvaluateRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Decision with its receipt", body = EvaluateResponse),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown signal", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Concurrent conflicting write", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn evaluate(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<EvaluateRequest>,
) -> Result<Json<EvaluateResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    let signal = state
        .store
        .get_signal(auth.0.tenant, req.signal_id)
        .await?
        .ok_or_else(|| ApiError::not_found("signal"))?;
    let opts = EvalOptions::api(
        req.evaluation_profile
            .unwrap_or(EvaluationProfile::Standard),
        req.evaluation_mode,
        req.equation_bundles.unwrap_or_default(),
    );
    Ok(Json(evaluate_signal(&state, signal, opts).await?.response))
}
