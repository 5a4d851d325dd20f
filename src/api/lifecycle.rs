//! Governance lifecycle routes: obstructions (list, fetch, resolve, reject,
//! escalate) and repair plans (list, fetch, approve, reject, complete).
//! Moves follow the tables in `kernel::operations::lifecycle`; a move the
//! table does not allow is a 409 naming where it would be allowed from.

use super::error::{ApiError, Problem};
use super::extract::{ApiJsonOrEmpty, Auth};
use super::receipts::path_id;
use crate::kernel::operations::lifecycle::Action;
use crate::kernel::types::{Obstruction, ObstructionStatus, RepairPlan, RepairStatus};
use crate::operations::types::{
    LifecycleActionRequest, LifecycleResponse, ObstructionDetail, RepairPlanDetail,
};
use crate::state::AppState;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use std::collections::BTreeMap;
use std::sync::Arc;
use uuid::Uuid;

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                out.push(hex(b[i + 1])? * 16 + hex(b[i + 2])?);
                i += 2;
            }
            b'%' => return None,
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Parses a query string into exactly the `allowed` keys (400 naming any other).
pub fn query(raw: Option<String>, allowed: &[&str]) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for pair in raw
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k =
            decode(k).ok_or_else(|| ApiError::field("query", "is not valid percent-encoding"))?;
        let v =
            decode(v).ok_or_else(|| ApiError::field(k.clone(), "is not valid percent-encoding"))?;
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::field(
                k,
                format!(
                    "unknown query parameter, expected one of {}",
                    allowed.join(", ")
                ),
            ));
        }
        if out.insert(k.clone(), v).is_some() {
            return Err(ApiError::field(k, "given more than once"));
        }
    }
    Ok(out)
}

fn limit(q: &BTreeMap<String, String>) -> Result<i64, ApiError> {
    match q.get("limit") {
        None => Ok(50),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=200).contains(n))
            .ok_or_else(|| ApiError::field("limit", "must be an integer from 1 to 200")),
    }
}

fn tenant_param(auth: &Auth, q: &BTreeMap<String, String>) -> Result<(), ApiError> {
    match q.get("tenantId") {
        None => Ok(()),
        Some(t) => {
            let t = Uuid::parse_str(t).map_err(|_| ApiError::field("tenantId", "not a UUID"))?;
            auth.check_body_tenant(Some(t))
        }
    }
}

fn one_of<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> String {
    all.iter().map(|x| name(*x)).collect::<Vec<_>>().join(", ")
}

/// List obstructions, newest first.
#[utoipa::path(get, path = "/substrate/obstructions", tag = "lifecycle",
    params(
        ("tenantId" = Option<Uuid>, Query, description = "Must be the API key's tenant"),
        ("status" = Option<ObstructionStatus>, Query, description = "Only obstructions in this status"),
        ("targetId" = Option<String>, Query, description = "Only obstructions of this target (trace, action, record...)"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "1 to 200, default 50")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Obstructions", body = [Obstruction]),
        (status = 400, description = "Invalid query parameter (named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_obstructions(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Obstruction>>, ApiError> {
    let q = query(raw, &["tenantId", "status", "targetId", "limit"])?;
    tenant_param(&auth, &q)?;
    let status = match q.get("status") {
        None => None,
        Some(s) => Some(ObstructionStatus::parse(s).ok_or_else(|| {
            ApiError::field(
                "status",
                format!(
                    "must be one of {}",
                    one_of(ObstructionStatus::ALL, |x| x.as_str())
                ),
            )
        })?),
    };
    Ok(Json(
        crate::operations::lifecycle::list_obstructions(
            &state,
            auth.0.tenant,
            status,
            q.get("targetId").map(String::as_str),
            limit(&q)?,
        )
        .await?,
    ))
}

/// Fetch an obstruction with its repair plans.
#[utoipa::path(get, path = "/substrate/obstructions/{id}", tag = "lifecycle",
    params(("id" = String, Path, description = "Obstruction id (UUID)")),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The obstruction", body = ObstructionDetail),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown obstruction", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_obstruction(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<ObstructionDetail>, ApiError> {
    let id = path_id(&id, "obstruction")?;
    Ok(Json(
        crate::operations::lifecycle::get_obstruction(&state, auth.0.tenant, id).await?,
    ))
}

async fn obstruction_action(
    state: Arc<AppState>,
    auth: Auth,
    id: String,
    req: LifecycleActionRequest,
    action: Action,
) -> Result<Json<LifecycleResponse>, ApiError> {
    let id = path_id(&id, "obstruction")?;
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::lifecycle::act_on_obstruction(&state, &auth.0, id, action, req.reason)
            .await?,
    ))
}

async fn plan_action(
    state: Arc<AppState>,
    auth: Auth,
    id: String,
    req: LifecycleActionRequest,
    action: Action,
) -> Result<Json<LifecycleResponse>, ApiError> {
    let id = path_id(&id, "repair plan")?;
    auth.check_body_tenant(req.tenant_id)?;
    Ok(Json(
        crate::operations::lifecycle::act_on_plan(&state, &auth.0, id, action, req.reason).await?,
    ))
}

macro_rules! lifecycle_action {
    ($name:ident, $path:literal, $what:literal, $action:expr, $runner:ident, $doc:literal, $ok:literal) => {
        #[doc = $doc]
        #[utoipa::path(post, path = $path, tag = "lifecycle",
            params(("id" = String, Path, description = $what)),
            request_body(content = Option<LifecycleActionRequest>, description = "Optional; an empty body is fine"),
            security(("bearer" = []), ("tenantHeader" = [])),
            responses(
                (status = 200, description = $ok, body = LifecycleResponse),
                (status = 400, description = "Invalid request (the field is named)", body = Problem, content_type = "application/problem+json"),
                (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
                (status = 403, description = "Tenant mismatch, or the API key's authority ceiling is below what the action needs", body = Problem, content_type = "application/problem+json"),
                (status = 404, description = "Unknown id", body = Problem, content_type = "application/problem+json"),
                (status = 409, description = "The status does not allow this move (the answer names where it would be allowed from), or it changed concurrently", body = Problem, content_type = "application/problem+json"),
                (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
                (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
                (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
                (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
            ))]
        pub async fn $name(
            State(state): State<Arc<AppState>>,
            auth: Auth,
            Path(id): Path<String>,
            ApiJsonOrEmpty(req): ApiJsonOrEmpty<LifecycleActionRequest>,
        ) -> Result<Json<LifecycleResponse>, ApiError> {
            $runner(state, auth, id, req, $action).await
        }
    };
}

lifecycle_action!(resolve_obstruction, "/substrate/obstructions/{id}/resolve", "Obstruction id (UUID)", Action::Resolve, obstruction_action,
    "Resolve an obstruction: its cause no longer holds (needs the policy's release authority); its live plans are superseded.",
    "Resolved, with its receipt");
lifecycle_action!(reject_obstruction, "/substrate/obstructions/{id}/reject", "Obstruction id (UUID)", Action::Reject, obstruction_action,
    "Reject an obstruction: the obstructed change is refused for good; its live plans are superseded.",
    "Rejected, with its receipt");
lifecycle_action!(
    escalate_obstruction,
    "/substrate/obstructions/{id}/escalate",
    "Obstruction id (UUID)",
    Action::Escalate,
    obstruction_action,
    "Escalate an obstruction to a higher authority.",
    "Escalated, with its receipt"
);
lifecycle_action!(approve_plan, "/substrate/repair-plans/{id}/approve", "Repair plan id (UUID)", Action::Approve, plan_action,
    "Approve a repair plan (needs the policy's release authority, or more if a step names it) and carry out what it is for: promote, reverse, quarantine, or release a held trace.",
    "Approved (and completed when its effect was carried out), with its receipt");
lifecycle_action!(
    reject_plan,
    "/substrate/repair-plans/{id}/reject",
    "Repair plan id (UUID)",
    Action::Reject,
    plan_action,
    "Reject a repair plan; its obstruction opens again when no live plan is left.",
    "Rejected, with its receipt"
);
lifecycle_action!(complete_plan, "/substrate/repair-plans/{id}/complete", "Repair plan id (UUID)", Action::Complete, plan_action,
    "Mark an approved repair plan completed (needs the same authority as approving); its obstruction is resolved.",
    "Completed, with its receipt");

/// List repair plans, newest first.
#[utoipa::path(get, path = "/substrate/repair-plans", tag = "lifecycle",
    params(
        ("tenantId" = Option<Uuid>, Query, description = "Must be the API key's tenant"),
        ("status" = Option<RepairStatus>, Query, description = "Only plans in this status"),
        ("obstructionId" = Option<Uuid>, Query, description = "Only plans of this obstruction"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "1 to 200, default 50")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Repair plans", body = [RepairPlan]),
        (status = 400, description = "Invalid query parameter (named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn list_plans(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<RepairPlan>>, ApiError> {
    let q = query(raw, &["tenantId", "status", "obstructionId", "limit"])?;
    tenant_param(&auth, &q)?;
    let status = match q.get("status") {
        None => None,
        Some(s) => Some(RepairStatus::parse(s).ok_or_else(|| {
            ApiError::field(
                "status",
                format!(
                    "must be one of {}",
                    one_of(RepairStatus::ALL, |x| x.as_str())
                ),
            )
        })?),
    };
    let obstruction = match q.get("obstructionId") {
        None => None,
        Some(s) => {
            Some(Uuid::parse_str(s).map_err(|_| ApiError::field("obstructionId", "not a UUID"))?)
        }
    };
    Ok(Json(
        crate::operations::lifecycle::list_plans(
            &state,
            auth.0.tenant,
            status,
            obstruction,
            limit(&q)?,
        )
        .await?,
    ))
}

/// Fetch a repair plan with its obstruction and effect.
#[utoipa::path(get, path = "/substrate/repair-plans/{id}", tag = "lifecycle",
    params(("id" = String, Path, description = "Repair plan id (UUID)")),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The repair plan", body = RepairPlanDetail),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown repair plan", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = "application/problem+json")
    ))]
pub async fn get_plan(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<RepairPlanDetail>, ApiError> {
    let id = path_id(&id, "repair plan")?;
    Ok(Json(
        crate::operations::lifecycle::get_plan(&state, auth.0.tenant, id).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing_names_what_is_wrong() {
        let q = query(
            Some("status=open&targetId=a%2Fb+c&limit=5".into()),
            &["status", "targetId", "limit"],
        )
        .unwrap();
        assert_eq!(q["targetId"], "a/b c");
        assert_eq!(limit(&q).unwrap(), 5);
        let e = query(Some("nope=1".into()), &["status"]).unwrap_err();
        assert_eq!(e.errors[0].field, "nope");
        let e = query(Some("status=a&status=b".into()), &["status"]).unwrap_err();
        assert_eq!(e.errors[0].field, "status");
        assert!(query(Some("status=%zz".into()), &["status"]).is_err());
        assert!(query(Some("status=%4".into()), &["status"]).is_err());
        let q = query(Some("limit=0".into()), &["limit"]).unwrap();
        assert_eq!(limit(&q).unwrap_err().errors[0].field, "limit");
        assert!(query(None, &["limit"]).unwrap().is_empty());
    }
}
