//! Replay of a stored receipt: recompute its hash from the stored material,
//! check every binding against an independent copy (the signal row, the
//! coefficient version, the previous receipt), and, unless told not to,
//! re-run the kernel with the pinned (or a named) coefficient version.

use super::{changed_fields, hash_value, sha256_hex, GENESIS_HASH};
use crate::api::error::ApiError;
use crate::kernel::policy::CompiledPolicy;
use crate::kernel::types::*;
use crate::kernel::{self, KernelInput, NormalizedSignal};
use crate::state::AppState;
use crate::store::{EventWrite, ReceiptRow};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use uuid::Uuid;

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_str()
}

fn artifact(
    binding_type: &str,
    id: Option<Uuid>,
    verified: bool,
    detail: impl Into<String>,
) -> Option<KernelArtifact> {
    id.map(|binding_id| KernelArtifact {
        binding_type: binding_type.into(),
        binding_id,
        verified,
        detail: Some(detail.into()),
    })
}

/// Loads a compiled policy for a coefficient version: the running one when it
/// matches, else the stored content (compiled once and cached).
pub async fn policy_for_version(
    state: &AppState,
    tenant: Uuid,
    version: Uuid,
) -> Result<Option<Arc<CompiledPolicy>>, ApiError> {
    let rt = state.runtime();
    if let Some(t) = rt.tenant(tenant) {
        if t.policy.version_id == version {
            return Ok(Some(t.policy.clone()));
        }
    }
    if let Some(p) = state.versions.get(&version) {
        // Versions are content-addressed, but a tenant only sees versions it has used.
        if state
            .store
            .get_coefficient_version(tenant, version)
            .await?
            .is_some()
        {
            return Ok(Some(p));
        }
        return Ok(None);
    }
    let Some((_hash, content)) = state.store.get_coefficient_version(tenant, version).await? else {
        return Ok(None);
    };
    let compiled = Arc::new(CompiledPolicy::from_content(&content).map_err(ApiError::unavailable)?);
    state.versions.insert(version, compiled.clone());
    Ok(Some(compiled))
}

pub async fn replay(
    state: &AppState,
    tenant: Uuid,
    key_id: &str,
    receipt_id: Uuid,
    req: ReplayRequest,
) -> Result<KernelReplayResponse, ApiError> {
    // The spec types the replay's profile as any string. A profile name re-executes under that
    // profile; another string cannot be re-executed (the kernel knows no such profile): the
    // replay verifies what it can, is `partial`, and its audit says why.
    if let Some(p) = &req.evaluation_profile {
        crate::operations::check_text(p, "evaluationProfile", 0, 128)?;
    }
    let profile_override = req
        .evaluation_profile
        .as_deref()
        .and_then(EvaluationProfile::parse);
    let unknown_profile = req
        .evaluation_profile
        .as_deref()
        .filter(|_| profile_override.is_none());
    // Set when a kernel receipt was not re-executed for that reason (an operation's receipt
    // re-runs its operation, which has no profile).
    let mut not_reexecuted: Option<&str> = None;
    let row = state
        .store
        .get_receipt(tenant, receipt_id)
        .await?
        .ok_or_else(|| ApiError::not_found("receipt"))?;
    let mut resp = KernelReplayResponse {
        receipt_id,
        replay_status: ReplayStatus::Matched,
        expected_hash: Some(row.replay_hash.clone()),
        actual_hash: None,
        mismatches: vec![],
        kernel_artifacts: vec![],
        kernel_artifact_count: 0,
        verified_kernel_artifact_count: 0,
        reexecution: None,
        audit: None,
    };
    let content: Value = match serde_json::from_str(&row.payload) {
        Ok(v) => v,
        Err(e) => {
            resp.replay_status = ReplayStatus::Failed;
            resp.mismatches
                .push(format!("receipt_payload: not readable JSON ({e})"));
            finish(state, tenant, &row, &mut resp, key_id).await;
            return Ok(resp);
        }
    };
    let actual = hash_value(&content);
    resp.actual_hash = Some(actual.clone());
    let mut partial = false;
    if actual != row.replay_hash {
        let recorded: Map<String, Value> =
            serde_json::from_str(&row.field_digests).unwrap_or_default();
        let named = content
            .as_object()
            .map(|c| changed_fields(c, &recorded))
            .unwrap_or_default();
        if named.is_empty() {
            resp.mismatches.push("receipt_payload".into());
        }
        resp.mismatches
            .extend(named.into_iter().map(|f| format!("receipt_payload.{f}")));
    }
    if s(&content, &["decision"]) != Some(row.decision.as_str()) {
        resp.mismatches.push("decision".into());
    }
    if s(&content, &["previousHash"]) != Some(row.prev_hash.as_str()) {
        resp.mismatches.push("previousHash".into());
    }

    // Previous receipt: the chain link this one binds.
    if row.seq > 1 {
        let prev = state.store.get_receipt_by_seq(tenant, row.seq - 1).await?;
        let ok = prev
            .as_ref()
            .is_some_and(|p| p.replay_hash == row.prev_hash);
        if !ok {
            resp.mismatches.push("previousReceipt".into());
        }
        let id = prev.as_ref().and_then(|p| Uuid::parse_str(&p.id).ok());
        resp.kernel_artifacts.extend(artifact(
            "previous_receipt",
            id,
            ok,
            if ok {
                "chain link verified"
            } else {
                "previous receipt's hash differs from the bound one"
            },
        ));
    } else if row.prev_hash != GENESIS_HASH {
        resp.mismatches.push("previousHash".into());
    }

    // Signal: the stored row must still hash to the bound digest.
    let material: Option<KernelInput> = content
        .get("replayMaterial")
        .and_then(|m| serde_json::from_value(m.clone()).ok());
    let signal_id = s(&content, &["signal", "id"]).and_then(|x| Uuid::parse_str(x).ok());
    if let Some(sid) = signal_id {
        let bound = s(&content, &["signal", "payloadDigest"]).unwrap_or("");
        match state.store.get_signal_body(tenant, sid).await? {
            None => {
                partial = true;
                resp.kernel_artifacts.extend(artifact(
                    "signal",
                    Some(sid),
                    false,
                    "signal is no longer stored",
                ));
            }
            Some((digest_col, body)) => {
                let stored: Option<NormalizedSignal> = serde_json::from_str(&body).ok();
                let recomputed = stored.as_ref().map(|x| sha256_hex(x.payload.as_bytes()));
                let ok = digest_col == bound
                    && recomputed.as_deref() == Some(bound)
                    && material
                        .as_ref()
                        .map(|m| Some(&m.signal) == stored.as_ref())
                        .unwrap_or(true);
                if !ok {
                    resp.mismatches.push("signal.payloadDigest".into());
                }
                resp.kernel_artifacts.extend(artifact(
                    "signal",
                    Some(sid),
                    ok,
                    if ok {
                        "payload digest verified"
                    } else {
                        "stored signal differs from the bound digest"
                    },
                ));
            }
        }
    }

    // Coefficient version: stored content must hash to the bound content hash.
    let pinned =
        s(&content, &["policy", "coefficientVersionId"]).and_then(|x| Uuid::parse_str(x).ok());
    if let Some(v) = pinned {
        let bound = s(&content, &["policy", "contentHash"]).unwrap_or("");
        let ok = match state.store.get_coefficient_version(tenant, v).await? {
            Some((h, c)) => h == bound && sha256_hex(c.as_bytes()) == bound,
            None => false,
        };
        if !ok {
            resp.mismatches.push("policy.coefficientVersionId".into());
        }
        resp.kernel_artifacts.extend(artifact(
            "coefficient_version",
            Some(v),
            ok,
            if ok {
                "policy content hash verified"
            } else {
                "stored coefficient version differs or is missing"
            },
        ));
    }
    let trace_id = s(&content, &["stateBasis", "traceId"]).and_then(|x| Uuid::parse_str(x).ok());
    resp.kernel_artifacts.extend(artifact(
        "trace",
        trace_id,
        actual == row.replay_hash,
        "state basis bound in the receipt",
    ));
    for (kind, key) in [
        ("obstruction", "obstructionId"),
        ("repair_plan", "repairPlanId"),
    ] {
        let id = s(&content, &[key]).and_then(|x| Uuid::parse_str(x).ok());
        resp.kernel_artifacts
            .extend(artifact(kind, id, actual == row.replay_hash, "bound by id"));
    }
    let operation = crate::operations::replay::handles(&row.kind);
    if operation {
        resp.kernel_artifacts
            .extend(crate::operations::replay::artifacts(
                &content,
                actual == row.replay_hash,
            ));
    }

    // Re-execution.
    if req.reexecute.unwrap_or(true) {
        let mut re = Reexecution {
            attempted: true,
            replay_mode: true,
            ..Default::default()
        };
        re.original_decision = s(&content, &["decision"]).map(str::to_string);
        re.original_outcome = s(&content, &["governanceOutcome"]).map(str::to_string);
        re.coefficient_version_id = pinned;
        let wanted = req.coefficient_version_id.or(pinned);
        re.coefficient_version_pinned = Some(req.coefficient_version_id.is_none());
        re.replay_coefficient_version_id = wanted;
        re.coefficient_version_matched = Some(wanted.is_some() && wanted == pinned);
        let policy = match wanted {
            Some(v) => policy_for_version(state, tenant, v).await?,
            None => None,
        };
        if req.coefficient_version_id.is_some() && policy.is_none() {
            return Err(ApiError::not_found("coefficient version"));
        }
        match (material, policy) {
            (Some(_), Some(_)) if unknown_profile.is_some() => {
                re.attempted = false;
                partial = true;
                not_reexecuted = unknown_profile;
            }
            (Some(mut input), Some(policy)) => {
                if let Some(p) = profile_override {
                    input.profile = p;
                }
                let out = kernel::evaluate(&input, &policy);
                re.replay_decision = Some(out.decision.as_str().into());
                re.replay_outcome = Some(out.outcome.as_str().into());
                let dm = re.original_decision.as_deref() == Some(out.decision.as_str());
                let om = re.original_outcome.as_deref() == Some(out.outcome.as_str());
                re.decision_matched = Some(dm);
                re.governance_outcome_matched = Some(om);
                let same_conditions = re.coefficient_version_matched == Some(true)
                    && profile_override.is_none_or(|p| {
                        Some(p.as_str()) == s(&content, &["replayMaterial", "profile"])
                    });
                if !(dm && om) {
                    if same_conditions {
                        // Same input, same policy, different answer: the record is not what was decided.
                        resp.mismatches.push("reexecution.decision".into());
                    } else {
                        partial = true;
                    }
                }
            }
            // Operation receipts: re-run the operation's pure decision function.
            (_, Some(policy)) if operation => {
                match crate::operations::replay::reexecute(&content, &policy) {
                    Ok(r) => {
                        let dm = re.original_decision.as_deref() == Some(r.decision.as_str());
                        let om = re.original_outcome.as_deref() == Some(r.outcome.as_str());
                        re.replay_decision = Some(r.decision);
                        re.replay_outcome = Some(r.outcome);
                        re.decision_matched = Some(dm);
                        re.governance_outcome_matched = Some(om);
                        if !(dm && om && r.nested_mismatches.is_empty()) {
                            if re.coefficient_version_matched == Some(true) {
                                resp.mismatches.push("reexecution.decision".into());
                                resp.mismatches.extend(r.nested_mismatches);
                            } else {
                                partial = true;
                            }
                        }
                    }
                    Err(_) => partial = true,
                }
            }
            _ => {
                partial = true;
            }
        }
        resp.reexecution = Some(re);
    }

    resp.replay_status = if !resp.mismatches.is_empty() {
        ReplayStatus::Mismatch
    } else if partial {
        ReplayStatus::Partial
    } else {
        ReplayStatus::Matched
    };
    finish(state, tenant, &row, &mut resp, key_id).await;
    if let (Some(p), Some(audit)) = (not_reexecuted, resp.audit.as_mut()) {
        audit.insert(
            "evaluationProfile".into(),
            json!({"requested": p, "known": false, "detail": format!(
                "not a profile of this kernel ({}): not re-executed",
                EvaluationProfile::ALL.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
            )}),
        );
    }
    Ok(resp)
}

async fn finish(
    state: &AppState,
    tenant: Uuid,
    row: &ReceiptRow,
    resp: &mut KernelReplayResponse,
    key_id: &str,
) {
    resp.mismatches.sort();
    resp.mismatches.dedup();
    resp.kernel_artifact_count = resp.kernel_artifacts.len() as u64;
    resp.verified_kernel_artifact_count =
        resp.kernel_artifacts.iter().filter(|a| a.verified).count() as u64;
    resp.audit = json!({"replayedAt": crate::store::now(), "replayedBy": key_id, "sequence": row.seq, "receiptKind": row.kind, "storedAt": row.created_at})
        .as_object()
        .cloned();
    if resp.replay_status == ReplayStatus::Mismatch || resp.replay_status == ReplayStatus::Failed {
        let ev = EventWrite {
            name: "replay.mismatch".into(),
            data: json!({"receiptId": resp.receipt_id, "replayStatus": resp.replay_status, "mismatches": resp.mismatches, "expectedHash": resp.expected_hash, "actualHash": resp.actual_hash}),
        };
        if let Err(e) = state.store.enqueue_events(tenant, &[ev]).await {
            tracing::warn!(error = %e, "could not queue replay.mismatch event");
        }
    }
}
