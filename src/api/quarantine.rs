//! The quarantine review API: records the sidecar held (quarantine, require_review, defer)
//! are listed and read here, and a reviewer releases one (its exact request is forwarded to
//! the upstream, with a new receipt) or rejects it. Tenant-isolated like every resource: an
//! entry of another tenant is a 404. Releasing needs a key whose authority ceiling reaches the
//! policy's `release_authority`.
//!
//! - `GET /substrate/quarantine?status=&limit=`
//! - `GET /substrate/quarantine/{id}`
//! - `POST /substrate/quarantine/{id}/release`
//! - `POST /substrate/quarantine/{id}/reject`

use super::error::{ApiError, Problem};
use super::extract::{ApiJsonOrEmpty, Auth};
use super::receipts::path_id;
use crate::kernel::types::RuntimeDecision;
use crate::operations::types::LifecycleActionRequest;
use crate::state::AppState;
use crate::store::QuarantineRow;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use utoipa::ToSchema;
use uuid::Uuid;

/// Where a held record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuarantineStatus {
    /// Waiting for review.
    Held,
    /// A release is being forwarded to the upstream.
    Releasing,
    /// Forwarded to the upstream, which took it.
    Released,
    /// Rejected by a reviewer; never forwarded.
    Rejected,
}

/// The `status` filter of the quarantine list: one status, or `all`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // documents the query parameter; the handler parses the raw query itself
pub enum QuarantineFilter {
    Held,
    Releasing,
    Released,
    Rejected,
    All,
}

impl QuarantineStatus {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "held" => Self::Held,
            "releasing" => Self::Releasing,
            "released" => Self::Released,
            "rejected" => Self::Rejected,
            _ => return None,
        })
    }
}

/// The held request, as the gate will forward it on release. Values of credential headers
/// (`authorization`, `x-api-key`, `api-key`, `x-chroma-token`) are shown as `[redacted]`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeldRequest {
    pub method: String,
    /// Path and query as the agent sent them.
    pub path: String,
    /// End-to-end request headers, `[name, value]` pairs.
    pub headers: Vec<(String, String)>,
    /// The single-record body: JSON when it parses, else its text (NDJSON).
    #[schema(value_type = Object)]
    pub body: Value,
}

/// A record held by the sidecar.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineEntry {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub status: QuarantineStatus,
    /// The kernel's decision that held the record.
    pub decision: RuntimeDecision,
    pub reason_codes: Vec<String>,
    /// The receipt of the decision that held it.
    pub receipt_id: Uuid,
    pub signal_id: Uuid,
    pub trace_id: Uuid,
    pub obstruction_id: Option<Uuid>,
    pub source_id: String,
    /// Filter pack and route that matched the write.
    pub pack: String,
    pub route: String,
    pub collection: Option<String>,
    pub record_id: Option<String>,
    /// Position of the record in the request it came in.
    pub record_index: i64,
    pub request: HeldRequest,
    pub created_at: String,
    pub updated_at: String,
    pub reviewed_at: Option<String>,
    /// Id (label) of the API key that reviewed it.
    pub reviewed_by: Option<String>,
    /// The receipt of the review (`quarantine_release` / `quarantine_reject`).
    pub review_receipt_id: Option<Uuid>,
    /// What the upstream answered to the released request.
    pub upstream_status: Option<u16>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineList {
    pub entries: Vec<QuarantineEntry>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineReleaseResponse {
    pub entry: QuarantineEntry,
    /// The `quarantine_release` receipt.
    pub receipt_id: Uuid,
    pub upstream_status: u16,
    /// The upstream's answer: JSON when it parses, else its text.
    #[schema(value_type = Object)]
    pub upstream_body: Value,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuarantineRejectResponse {
    pub entry: QuarantineEntry,
    /// The `quarantine_reject` receipt.
    pub receipt_id: Uuid,
}

fn corrupt(what: &str) -> ApiError {
    ApiError::unavailable(format!("stored quarantine {what} is corrupt"))
}

pub fn entry_of(r: QuarantineRow) -> Result<QuarantineEntry, ApiError> {
    let id = |s: &str, what: &str| Uuid::parse_str(s).map_err(|_| corrupt(what));
    let headers: Vec<(String, String)> = serde_json::from_str::<Vec<(String, String)>>(&r.headers)
        .map_err(|_| corrupt("headers"))?
        .into_iter()
        .map(|(n, v)| {
            if crate::seal::is_credential(&n) {
                (n, "[redacted]".to_string())
            } else {
                (n, v)
            }
        })
        .collect();
    Ok(QuarantineEntry {
        id: id(&r.id, "id")?,
        tenant_id: id(&r.tenant_id, "tenant")?,
        status: QuarantineStatus::parse(&r.status).ok_or_else(|| corrupt("status"))?,
        decision: RuntimeDecision::parse(&r.decision).ok_or_else(|| corrupt("decision"))?,
        reason_codes: serde_json::from_str(&r.reason_codes).map_err(|_| corrupt("reason codes"))?,
        receipt_id: id(&r.receipt_id, "receipt id")?,
        signal_id: id(&r.signal_id, "signal id")?,
        trace_id: id(&r.trace_id, "trace id")?,
        obstruction_id: r
            .obstruction_id
            .as_deref()
            .and_then(|o| Uuid::parse_str(o).ok()),
        source_id: r.source_id,
        pack: r.pack,
        route: r.route,
        collection: r.collection,
        record_id: r.record_id,
        record_index: r.record_index,
        request: HeldRequest {
            method: r.method,
            path: r.path,
            headers,
            body: serde_json::from_str(&r.body).unwrap_or(Value::String(r.body)),
        },
        created_at: r.created_at,
        updated_at: r.updated_at,
        reviewed_at: r.reviewed_at,
        reviewed_by: r.reviewed_by,
        review_receipt_id: r
            .review_receipt_id
            .as_deref()
            .and_then(|o| Uuid::parse_str(o).ok()),
        upstream_status: r.upstream_status.and_then(|s| u16::try_from(s).ok()),
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// List held records (newest first).
#[utoipa::path(get, path = "/substrate/quarantine", tag = "quarantine",
    params(
        ("status" = Option<QuarantineFilter>, Query, description = "held (default), releasing, released, rejected or all"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "1..200, default 50"),
        ("tenantId" = Option<Uuid>, Query, description = "Must be the API key's tenant when given")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Quarantine entries", body = QuarantineList),
        (status = 400, description = "Invalid query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    RawQuery(query): RawQuery,
) -> Result<Json<QuarantineList>, ApiError> {
    let mut status: Option<String> = Some("held".into());
    let mut limit: i64 = 50;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v =
            percent_decode(v).ok_or_else(|| ApiError::field(k, "not valid percent-encoding"))?;
        match k {
            "status" => {
                status = match v.as_str() {
                    "all" => None,
                    s if QuarantineStatus::parse(s).is_some() => Some(s.to_string()),
                    _ => {
                        return Err(ApiError::field(
                            "status",
                            "must be one of held, releasing, released, rejected, all",
                        ))
                    }
                }
            }
            "limit" => {
                limit = v
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (1..=200).contains(n))
                    .ok_or_else(|| ApiError::field("limit", "must be an integer from 1 to 200"))?
            }
            "tenantId" => {
                let t =
                    Uuid::parse_str(&v).map_err(|_| ApiError::field("tenantId", "not a UUID"))?;
                auth.check_body_tenant(Some(t))?;
            }
            other => return Err(ApiError::field(other, "unknown query parameter")),
        }
    }
    let rows = state
        .store
        .list_quarantine(auth.0.tenant, status.as_deref(), limit)
        .await?;
    Ok(Json(QuarantineList {
        entries: rows.into_iter().map(entry_of).collect::<Result<_, _>>()?,
    }))
}

/// Fetch one held record.
#[utoipa::path(get, path = "/substrate/quarantine/{id}", tag = "quarantine",
    params(("id" = String, Path, description = "Quarantine entry id (UUID)")),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The entry", body = QuarantineEntry),
        (status = 400, description = "Invalid tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown entry", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn fetch(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<QuarantineEntry>, ApiError> {
    let id = path_id(&id, "quarantine entry")?;
    let row = state
        .store
        .get_quarantine(auth.0.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("quarantine entry"))?;
    Ok(Json(entry_of(row)?))
}

/// Release a held record: its exact request is forwarded to the upstream behind a new
/// `quarantine_release` receipt (the trace moves to `working`; `quarantine.released` is
/// emitted). Answers with the upstream's status.
#[utoipa::path(post, path = "/substrate/quarantine/{id}/release", tag = "quarantine",
    params(("id" = String, Path, description = "Quarantine entry id (UUID)")),
    request_body(content = Option<LifecycleActionRequest>, description = "Optional; an empty body is fine. The reason is bound in the review's receipt"),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Released; the status is the upstream's (200, 201, ...)", body = QuarantineReleaseResponse),
        (status = 201, description = "Released; the upstream answered 201", body = QuarantineReleaseResponse),
        (status = 400, description = "Invalid request (the field is named) or tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch, or the key's authority ceiling is below the policy's release_authority", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown entry", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The entry is not held (already released, rejected, or being released)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The upstream could not be reached, or refused the request with any non-2xx status (named in the detail; the entry is held again)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "The upstream did not answer in time (the entry is held again)", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn release(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    ApiJsonOrEmpty(req): ApiJsonOrEmpty<LifecycleActionRequest>,
) -> Result<(StatusCode, Json<QuarantineReleaseResponse>), ApiError> {
    let id = path_id(&id, "quarantine entry")?;
    let reason = review_reason(&auth, &req)?;
    let r = crate::proxy::release::release(&state, &auth.0, id, reason).await?;
    let status = StatusCode::from_u16(r.upstream_status).unwrap_or(StatusCode::OK);
    Ok((
        status,
        Json(QuarantineReleaseResponse {
            entry: entry_of(r.entry)?,
            receipt_id: r.receipt_id,
            upstream_status: r.upstream_status,
            upstream_body: r.upstream_body,
        }),
    ))
}

/// Reject a held record: it is never forwarded; a `quarantine_reject` receipt moves its trace
/// to `revoked`.
#[utoipa::path(post, path = "/substrate/quarantine/{id}/reject", tag = "quarantine",
    params(("id" = String, Path, description = "Quarantine entry id (UUID)")),
    request_body(content = Option<LifecycleActionRequest>, description = "Optional; an empty body is fine. The reason is bound in the review's receipt"),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Rejected", body = QuarantineRejectResponse),
        (status = 400, description = "Invalid request (the field is named) or tenant header", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown entry", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The entry is not held", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn reject(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    ApiJsonOrEmpty(req): ApiJsonOrEmpty<LifecycleActionRequest>,
) -> Result<Json<QuarantineRejectResponse>, ApiError> {
    let id = path_id(&id, "quarantine entry")?;
    let reason = review_reason(&auth, &req)?;
    let (row, receipt_id) = crate::proxy::release::reject(&state, &auth.0, id, reason).await?;
    Ok(Json(QuarantineRejectResponse {
        entry: entry_of(row)?,
        receipt_id,
    }))
}

/// A review's optional body: its `tenantId` must be the key's, its `reason` (bound in the
/// review's receipt) at most 2,000 characters.
fn review_reason<'r>(
    auth: &Auth,
    req: &'r LifecycleActionRequest,
) -> Result<Option<&'r str>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    if let Some(r) = &req.reason {
        crate::operations::check_text(r, "reason", 0, 2000)?;
    }
    Ok(req.reason.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("held").as_deref(), Some("held"));
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b c"));
        assert_eq!(percent_decode("%zz"), None);
    }
}
