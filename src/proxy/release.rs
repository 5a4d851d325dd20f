//! Reviewing a held record: release (its exact stored request is forwarded to the upstream,
//! behind a receipt of kind `quarantine_release` that moves its trace to `working`, journaled
//! before dispatch like any admitted write) or reject (a receipt of kind `quarantine_reject`;
//! nothing is sent, and the record's trace stays as it is, since it describes what the store
//! holds, which the held write never changed). A release is refused (409) when the record's
//! trace moved after the write was held (a newer write reached the store, or the record was
//! deleted or revoked): forwarding the old write would overwrite newer data; the writer sends
//! it again and it is judged anew. A reviewer decision is not a kernel evaluation: the receipt
//! binds the held record's receipt, the reviewer's key and the policy that asked for the
//! authority.

use super::upstream::{self, SendError};
use super::INSTANCE_ID;
use crate::api::error::ApiError;
use crate::kernel::transitions;
use crate::kernel::types::*;
use crate::state::{AppState, Principal};
use crate::store::{
    dispatch_rows, quarantine_transition, DispatchWrite, EventWrite, Finish, QuarantineRow,
    ReceiptWrite, StoreError, TraceWrite,
};
use axum::http::StatusCode;
use serde_json::{json, Map, Value};
use uuid::Uuid;

/// What a release did.
pub struct Released {
    pub entry: QuarantineRow,
    pub receipt_id: Uuid,
    pub upstream_status: u16,
    pub upstream_body: Value,
}

fn conflict_or(e: StoreError, what: &str) -> ApiError {
    match e {
        StoreError::Conflict(_) => ApiError::conflict(format!(
            "the quarantine entry is no longer held; it cannot be {what}"
        )),
        other => other.into(),
    }
}

async fn held_entry(
    state: &AppState,
    tenant: Uuid,
    id: Uuid,
    what: &str,
) -> Result<QuarantineRow, ApiError> {
    let row = state
        .store
        .get_quarantine(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("quarantine entry"))?;
    if row.status != "held" {
        return Err(ApiError::conflict(format!(
            "the quarantine entry is {}; only a held entry can be {what}",
            row.status
        )));
    }
    Ok(row)
}

fn uuid_of(s: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(s).map_err(|_| ApiError::unavailable(format!("stored {what} is corrupt")))
}

/// The receipt of a review: binds the held record's receipt, the reviewer and the trace move
/// (`to` is `None` when the review leaves the trace where it is).
#[allow(clippy::too_many_arguments)]
fn review_receipt(
    state: &AppState,
    principal: &Principal,
    row: &QuarantineRow,
    kind: &'static str,
    decision: RuntimeDecision,
    outcome: GovernanceOutcome,
    from: (Option<TracePhase>, AllowedInfluence),
    to: Option<(TracePhase, AllowedInfluence)>,
    events: Vec<EventWrite>,
    reason: Option<&str>,
) -> Result<(ReceiptWrite, Uuid), ApiError> {
    let rt = state.runtime();
    let tenant = rt
        .tenant(principal.tenant)
        .ok_or_else(|| ApiError::forbidden("the API key's tenant is not configured"))?;
    let policy = &tenant.policy;
    let receipt_id = crate::store::new_id();
    let trace_id = uuid_of(&row.trace_id, "trace id")?;
    let held_receipt = uuid_of(&row.receipt_id, "receipt id")?;
    let from_phase = from.0.unwrap_or(TracePhase::Observed);
    let moves = to.is_some();
    let to = to.unwrap_or((from_phase, from.1));
    let mut m = Map::new();
    m.insert("version".into(), json!(1));
    m.insert("kind".into(), json!(kind));
    m.insert("receiptId".into(), json!(receipt_id));
    m.insert("tenantId".into(), json!(principal.tenant));
    m.insert("issuedAt".into(), json!(crate::store::now()));
    m.insert(
        "quarantine".into(),
        json!({
            "id": row.id, "heldReceiptId": row.receipt_id, "heldDecision": row.decision,
            "pack": row.pack, "route": row.route, "collection": row.collection, "recordId": row.record_id,
            "method": row.method, "path": row.path,
            "requestDigest": crate::receipts::sha256_hex(row.body.as_bytes()),
        }),
    );
    let mut reviewer =
        json!({"keyId": principal.key_id, "authorityCeiling": principal.authority_ceiling});
    if let Some(r) = reason {
        reviewer["reason"] = json!(r);
    }
    m.insert("reviewer".into(), reviewer);
    m.insert(
        "policy".into(),
        json!({"name": policy.name, "coefficientVersionId": policy.version_id, "contentHash": policy.content_hash, "releaseAuthority": policy.release_authority}),
    );
    m.insert("decision".into(), json!(decision));
    m.insert("governanceOutcome".into(), json!(outcome));
    m.insert(
        "mutation".into(),
        json!({"transition": {
            "traceId": trace_id, "fromPhase": from_phase, "toPhase": to.0,
            "fromInfluence": from.1, "toInfluence": to.1,
            "transitionName": transitions::name(from_phase, to.0), "enforced": moves,
        }}),
    );
    m.insert("dependencies".into(), json!([held_receipt]));
    let write = ReceiptWrite {
        tenant: principal.tenant,
        id: receipt_id,
        kind: kind.into(),
        signal_id: Uuid::parse_str(&row.signal_id).ok(),
        source_id: None,
        refused: false,
        decision: decision.as_str().into(),
        outcome: outcome.as_str().into(),
        idem_key: None,
        content: crate::receipts::CanonicalContent::new(m),
        trace: moves.then_some(TraceWrite {
            id: trace_id,
            phase: to.0,
            influence: to.1,
            trace_type: None,
        }),
        obstruction: None,
        repair_plan: None,
        finish: Box::new(move |sealed| {
            let receipt = json!(ReceiptRef {
                id: sealed.receipt_id,
                replay_hash: Some(sealed.replay_hash.to_string()),
                decision: Some(decision),
            });
            let mut all = vec![EventWrite {
                name: "receipt.created".into(),
                data: receipt.clone(),
            }];
            for e in &events {
                let mut e = e.clone();
                if let Value::Object(o) = &mut e.data {
                    o.insert("receipt".into(), receipt.clone());
                }
                all.push(e);
            }
            Finish {
                result: None,
                events: all,
            }
        }),
    };
    Ok((write, receipt_id))
}

/// Releases a held record: needs a key whose authority ceiling reaches the policy's
/// `release_authority` (a key without a ceiling has full authority). Answers with what the
/// upstream answered; an upstream refusal or failure puts the entry back to `held`.
pub async fn release(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    reason: Option<&str>,
) -> Result<Released, ApiError> {
    let rt = state.runtime();
    let tenant_rt = rt
        .tenant(principal.tenant)
        .ok_or_else(|| ApiError::forbidden("the API key's tenant is not configured"))?;
    let required = tenant_rt.policy.release_authority;
    let row = held_entry(state, principal.tenant, id, "released").await?;
    let ceiling = principal.authority_ceiling.unwrap_or(1.0);
    if ceiling + 1e-9 < required {
        return Err(ApiError::forbidden(format!(
            "releasing a held record needs authority {required:.2}; this key's ceiling is {ceiling:.2}"
        )));
    }
    let trace_id = uuid_of(&row.trace_id, "trace id")?;
    // (Entries held by earlier versions moved the trace themselves: that move is not a change.)
    if let Some((moved, _)) = state
        .store
        .trace_last_move(principal.tenant, trace_id)
        .await?
        .filter(|(at, by)| *at > row.created_at && by.as_deref() != Some(row.receipt_id.as_str()))
    {
        return Err(ApiError::conflict(format!(
            "the record changed after this write was held (its trace moved at {moved}); releasing \
             it would overwrite newer data: reject it, and send the write again to have it judged"
        )));
    }
    let current = state.store.get_trace(principal.tenant, trace_id).await?;
    let (from_phase, from_inf) = match current {
        Some((p, i)) => (Some(p), i),
        None => (None, AllowedInfluence::None),
    };
    let fp = from_phase.unwrap_or(TracePhase::Observed);
    let to = if transitions::allowed(fp, TracePhase::Working) {
        let substrate = rt
            .routes
            .route(&row.pack, &row.route)
            .and_then(|r| TargetSubstrate::parse(&r.substrate))
            .unwrap_or(TargetSubstrate::RagStore);
        (
            TracePhase::Working,
            transitions::phase_ceiling(TracePhase::Working, substrate),
        )
    } else {
        (fp, from_inf)
    };
    let event = EventWrite {
        name: "quarantine.released".into(),
        data: json!({"quarantineId": row.id, "recordId": row.record_id, "pack": row.pack, "route": row.route, "collection": row.collection, "heldReceiptId": row.receipt_id, "releasedBy": principal.key_id}),
    };
    let (write, receipt_id) = review_receipt(
        state,
        principal,
        &row,
        "quarantine_release",
        RuntimeDecision::Allow,
        GovernanceOutcome::Allow,
        (from_phase, from_inf),
        Some(to),
        vec![event],
        reason,
    )?;
    let headers: Vec<(String, String)> = serde_json::from_str(&row.headers).unwrap_or_default();
    let headers = rt.sealer.open_credentials(headers, &row.id).map_err(|e| {
        tracing::warn!(quarantine = %row.id, error = %e, "held write's credentials do not open");
        ApiError::unavailable(format!(
            "the held write's stored credentials cannot be used: {e}"
        ))
    })?;
    let params: Vec<(String, String)> = serde_json::from_str(&row.params).unwrap_or_default();
    let creds: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| crate::seal::is_credential(n))
        .cloned()
        .collect();
    let journal_id = crate::store::new_id();
    let journal = DispatchWrite {
        id: journal_id,
        tenant: principal.tenant,
        request_id: id,
        instance_id: *INSTANCE_ID,
        receipt_id,
        trace_id,
        pack: row.pack.clone(),
        route: row.route.clone(),
        kind: rt
            .routes
            .route(&row.pack, &row.route)
            .map(|r| r.kind.as_str())
            .unwrap_or("write")
            .to_string(),
        params,
        collection: row.collection.clone(),
        record_id: row.record_id.clone(),
        upstream_headers: super::identity::journal_credentials(&rt.sealer, &creds, journal_id),
    };
    let extra = vec![
        quarantine_transition(
            principal.tenant,
            id,
            "held",
            "releasing",
            &principal.key_id,
            receipt_id,
        ),
        dispatch_rows(&[journal]),
    ];
    state
        .store
        .commit_receipts(principal.tenant, &[], vec![write], extra)
        .await
        .map_err(|e| conflict_or(e, "released"))?;

    let method = http::Method::from_bytes(row.method.as_bytes())
        .map_err(|_| ApiError::unavailable("stored request method is corrupt"))?;
    let hv: Vec<(http::HeaderName, http::HeaderValue)> = headers
        .iter()
        .filter_map(|(n, v)| {
            Some((
                http::HeaderName::from_bytes(n.as_bytes()).ok()?,
                http::HeaderValue::from_str(v).ok()?,
            ))
        })
        .collect();
    let cfg = &rt.config;
    let sent = upstream::exchange(
        &cfg.upstream,
        &method,
        &row.path,
        &hv,
        row.body.as_bytes(),
        cfg.limits.proxy_response_bytes,
    )
    .await;
    match sent {
        Ok((header, body)) => {
            let status = header.status.as_u16();
            let ok = (200..300).contains(&status);
            state
                .store
                .settle_dispatch(
                    id,
                    if ok { "completed" } else { "rejected" },
                    Some(status),
                    None,
                )
                .await?;
            state
                .store
                .settle_release(
                    principal.tenant,
                    id,
                    if ok { "released" } else { "held" },
                    Some(status),
                )
                .await?;
            crate::metrics::QUARANTINE_REVIEWS
                .with_label_values(&[if ok { "released" } else { "release_failed" }])
                .inc();
            let upstream_body = serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            if !ok {
                // The store's refusal is the gateway's failure, not the gate's own answer: its
                // 404 or 500 relayed as such would read as "no such entry" or a gate crash.
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_rejected",
                    format!(
                        "the upstream store answered {status} to the released request; the entry is held again: {}",
                        truncate(&upstream_body.to_string(), 500)
                    ),
                ));
            }
            let entry = state
                .store
                .get_quarantine(principal.tenant, id)
                .await?
                .ok_or_else(|| ApiError::not_found("quarantine entry"))?;
            Ok(Released {
                entry,
                receipt_id,
                upstream_status: status,
                upstream_body,
            })
        }
        Err(SendError {
            error,
            maybe_applied,
        }) => {
            let (status, code, detail) = upstream::failure_status(&error);
            tracing::warn!(error = %error, quarantine = %id, "releasing a held record failed upstream");
            let _ = state
                .store
                .settle_dispatch(
                    id,
                    if maybe_applied {
                        "dispatch_unknown"
                    } else {
                        "failed"
                    },
                    None,
                    Some(&error.to_string()),
                )
                .await;
            let _ = state
                .store
                .settle_release(principal.tenant, id, "held", None)
                .await;
            crate::metrics::QUARANTINE_REVIEWS
                .with_label_values(&["release_failed"])
                .inc();
            Err(ApiError::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                code,
                format!("{detail}; the entry is held again"),
            ))
        }
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Rejects a held record: it is never forwarded; the record's trace (the stored version, if
/// any) is left as it is.
pub async fn reject(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    reason: Option<&str>,
) -> Result<(QuarantineRow, Uuid), ApiError> {
    let row = held_entry(state, principal.tenant, id, "rejected").await?;
    let trace_id = uuid_of(&row.trace_id, "trace id")?;
    let current = state.store.get_trace(principal.tenant, trace_id).await?;
    let (from_phase, from_inf) = match current {
        Some((p, i)) => (Some(p), i),
        None => (None, AllowedInfluence::None),
    };
    let (write, receipt_id) = review_receipt(
        state,
        principal,
        &row,
        "quarantine_reject",
        RuntimeDecision::Block,
        GovernanceOutcome::Deny,
        (from_phase, from_inf),
        None,
        Vec::new(),
        reason,
    )?;
    let extra = vec![quarantine_transition(
        principal.tenant,
        id,
        "held",
        "rejected",
        &principal.key_id,
        receipt_id,
    )];
    state
        .store
        .commit_receipts(principal.tenant, &[], vec![write], extra)
        .await
        .map_err(|e| conflict_or(e, "rejected"))?;
    crate::metrics::QUARANTINE_REVIEWS
        .with_label_values(&["rejected"])
        .inc();
    let entry = state
        .store
        .get_quarantine(principal.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("quarantine entry"))?;
    Ok((entry, receipt_id))
}

/// Wires the lifecycle to the sidecar: approving a repair plan that releases a
/// held proxied record forwards that record (the approval itself already
/// required the policy's release authority, so the forward runs with it).
pub fn register_repair_hook() {
    let hook: crate::operations::lifecycle::RepairApprovedHook = std::sync::Arc::new(
        |state, info| {
            Box::pin(async move {
                let Some(signal_id) = info.signal_id.filter(|_| info.released) else {
                    return Ok(serde_json::json!({"forwarded": false}));
                };
                let Some(entry) = state
                    .store
                    .held_quarantine_of_signal(info.tenant, signal_id)
                    .await
                    .map_err(|e| e.to_string())?
                else {
                    return Ok(serde_json::json!({"forwarded": false}));
                };
                let principal = crate::state::Principal {
                    tenant: info.tenant,
                    key_id: format!("repair-plan:{}", info.plan.id),
                    authority_ceiling: Some(1.0),
                };
                let r = release(&state, &principal, entry, None)
                    .await
                    .map_err(|e| e.detail)?;
                Ok(
                    serde_json::json!({"forwarded": true, "quarantineId": entry, "receiptId": r.receipt_id, "upstreamStatus": r.upstream_status}),
                )
            })
        },
    );
    crate::operations::lifecycle::on_repair_approved(hook);
}
