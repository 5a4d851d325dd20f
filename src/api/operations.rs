//! The five canonical operations (`POST /substrate/configurations/evaluate`,
//! `/canonicalization/evaluate`, `/retrieval/filter`, `/actions/release`,
//! `/reversal/evaluate`) and coordination state
//! (`GET /substrate/coordination/{subjectType}/{subjectId}`). Handlers
//! authenticate, check the body's tenant and hand over to `crate::operations`.

use super::error::{ApiError, Problem};
use super::extract::{ApiJson, Auth};
use crate::kernel::types::{CoordinationState, CoordinationSubjectType};
use crate::operations::types::*;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use std::sync::Arc;

/// Evaluate a candidate governed configuration: members meant to act together.
#[utoipa::path(post, path = "/substrate/configurations/evaluate", tag = "operations", request_body = ConfigurationEvaluateRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Decision on the configuration, with its receipt", body = ConfigurationEvaluateResponse),
        (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A member names nothing of this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Concurrent conflicting write", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn configurations(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<ConfigurationEvaluateRequest>,
) -> Result<Json<ConfigurationEvaluateResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::configurations::evaluate(&state, &auth.0, req).await?,
    ))
}

/// Evaluate promotion of a trace toward accepted, canonical or crystallized state.
#[utoipa::path(post, path = "/substrate/canonicalization/evaluate", tag = "operations", request_body = CanonicalizationEvaluateRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The transition it would make (made when promoted) and what is missing, with its receipt", body = CanonicalizationEvaluateResponse),
        (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown trace", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The trace changed concurrently", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn canonicalization(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<CanonicalizationEvaluateRequest>,
) -> Result<Json<CanonicalizationEvaluateResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::canonicalization::evaluate(&state, &auth.0, req).await?,
    ))
}

/// Retrieval treatment of candidate records under the current integrity state.
#[utoipa::path(post, path = "/substrate/retrieval/filter", tag = "operations", request_body = RetrievalFilterRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Treatment of each candidate, with its receipt", body = RetrievalFilterResponse),
        (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn retrieval(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<RetrievalFilterRequest>,
) -> Result<Json<RetrievalFilterResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::retrieval::filter(&state, &auth.0, req).await?,
    ))
}

/// Evaluate (and journal) the release of a protected action.
#[utoipa::path(post, path = "/substrate/actions/release", tag = "operations", request_body = ActionReleaseRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Released (journaled before this answer) or obstructed, with its receipt", body = ActionReleaseResponse),
        (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A basis reference names nothing of this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The action id names another action", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable (nothing is released)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn actions(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<ActionReleaseRequest>,
) -> Result<Json<ActionReleaseResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::actions::release(&state, &auth.0, req).await?,
    ))
}

/// Evaluate (and optionally apply) the reversal of a signal or receipt, with its residue.
#[utoipa::path(post, path = "/substrate/reversal/evaluate", tag = "operations", request_body = ReversalEvaluateRequest,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Dependents, residue and the moves (made when applied), with its receipt", body = ReversalEvaluateResponse),
        (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The target names nothing of this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A trace changed concurrently; nothing was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn reversal(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<ReversalEvaluateRequest>,
) -> Result<Json<ReversalEvaluateResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::reversal::evaluate(&state, &auth.0, req).await?,
    ))
}

/// Coordination state of a subject (a source or agent id) from its recent decisions.
#[utoipa::path(get, path = "/substrate/coordination/{subjectType}/{subjectId}", tag = "operations",
    params(
        ("subjectType" = CoordinationSubjectType, Path, description = "CoordinationSubjectType (e.g. agent, edge for a source)"),
        ("subjectId" = String, Path, description = "The source id the gate decided signals of")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Coordination state", body = CoordinationState),
        (status = 400, description = "Unknown subject type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No recorded decision for this subject", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn coordination(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((subject_type, subject_id)): Path<(String, String)>,
) -> Result<Json<CoordinationState>, ApiError> {
    let st = CoordinationSubjectType::parse(&subject_type).ok_or_else(|| {
        ApiError::field(
            "subjectType",
            format!(
                "must be one of {}",
                CoordinationSubjectType::ALL
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    crate::operations::check_text(&subject_id, "subjectId", 1, 256)?;
    Ok(Json(
        crate::operations::coordination::state_of(&state, &auth.0, st, &subject_id).await?,
    ))
}
