//! Obstruction and repair-plan lifecycle: listing, fetching, and the route
//! actions (resolve / reject / escalate an obstruction; approve / reject /
//! complete a plan). Each action is decided by [`lifecycle::decide`] (status
//! table, authority), journaled as a `lifecycle` receipt, and may carry out
//! what the plan is for:
//!
//! - a `promote` effect (canonicalization plans) re-runs the canonicalization
//!   with the approver's authority and the group's approved obstructions
//!   waived, and promotes when nothing is left;
//! - a `reverse` effect applies the reversal;
//! - a `quarantine_trace` effect quarantines the trace;
//! - a plan without effect whose obstruction's signal is held (quarantined)
//!   or untrusted releases the trace to `accepted`, then calls the
//!   `on_repair_approved` hook (the proxy forwards the held record).

use super::types::{LifecycleResponse, ObstructionDetail, RepairPlanDetail};
use super::*;
use crate::kernel::operations::lifecycle::{
    self as lc_kernel, obstruction_is_closed, obstruction_move_allowed, plan_is_live, Action,
    LifecycleInput, LifecycleMaterial, Object, Refusal,
};
use crate::kernel::operations::reversal::ReversalMode;
use crate::kernel::operations::{
    canonicalization as canon_kernel, reversal as rev_kernel, PlanEffect,
};
use crate::kernel::transitions;
use crate::store::{Expect, LifecycleRow, LifecycleTable, OperationWrite, StatusMove, TraceMove};
use futures::future::BoxFuture;
use std::sync::{Arc, OnceLock};

// ---------------------------------------------------------------- hook

/// What the `on_repair_approved` hook is told after an approval committed.
#[derive(Debug, Clone)]
pub struct ApprovedRepair {
    pub tenant: Uuid,
    pub plan: RepairPlan,
    pub obstruction: Obstruction,
    /// The signal the obstruction was opened for (a proxied record's signal).
    pub signal_id: Option<Uuid>,
    pub trace_id: Option<Uuid>,
    /// The approval released the trace from quarantine.
    pub released: bool,
    /// The lifecycle receipt of the approval.
    pub receipt_id: Uuid,
}

/// Called after an approval is committed; answers a JSON object reported in
/// the approval's response as `hook` (an error is reported, never fatal: the
/// approval stands).
pub type RepairApprovedHook = Arc<
    dyn Fn(Arc<AppState>, ApprovedRepair) -> BoxFuture<'static, Result<Value, String>>
        + Send
        + Sync,
>;

static ON_REPAIR_APPROVED: OnceLock<RepairApprovedHook> = OnceLock::new();

/// Registers the hook (once per process; the lead wires the proxy's release
/// of held records here). Returns false when one is already set.
pub fn on_repair_approved(hook: RepairApprovedHook) -> bool {
    ON_REPAIR_APPROVED.set(hook).is_ok()
}

// ---------------------------------------------------------------- reads

fn obstruction_of(row: &LifecycleRow) -> Result<Obstruction, ApiError> {
    let mut o: Obstruction = serde_json::from_str(&row.body)
        .map_err(|_| ApiError::unavailable("stored obstruction is unreadable"))?;
    if let Some(s) = ObstructionStatus::parse(&row.status) {
        o.status = s;
    }
    Ok(o)
}

fn plan_of(row: &LifecycleRow) -> Result<RepairPlan, ApiError> {
    let mut p: RepairPlan = serde_json::from_str(&row.body)
        .map_err(|_| ApiError::unavailable("stored repair plan is unreadable"))?;
    if let Some(s) = RepairStatus::parse(&row.status) {
        p.status = s;
    }
    Ok(p)
}

pub async fn list_obstructions(
    state: &AppState,
    tenant: Uuid,
    status: Option<ObstructionStatus>,
    target_id: Option<&str>,
    limit: i64,
) -> Result<Vec<Obstruction>, ApiError> {
    state
        .store
        .list_lifecycle(
            LifecycleTable::Obstructions,
            tenant,
            status.map(|s| s.as_str()),
            target_id,
            limit,
        )
        .await?
        .iter()
        .map(obstruction_of)
        .collect()
}

pub async fn list_plans(
    state: &AppState,
    tenant: Uuid,
    status: Option<RepairStatus>,
    obstruction_id: Option<Uuid>,
    limit: i64,
) -> Result<Vec<RepairPlan>, ApiError> {
    let oid = obstruction_id.map(|o| o.to_string());
    state
        .store
        .list_lifecycle(
            LifecycleTable::RepairPlans,
            tenant,
            status.map(|s| s.as_str()),
            oid.as_deref(),
            limit,
        )
        .await?
        .iter()
        .map(plan_of)
        .collect()
}

async fn plans_of(
    state: &AppState,
    tenant: Uuid,
    obstruction: Uuid,
) -> Result<Vec<LifecycleRow>, ApiError> {
    Ok(state
        .store
        .list_lifecycle(
            LifecycleTable::RepairPlans,
            tenant,
            None,
            Some(&obstruction.to_string()),
            200,
        )
        .await?)
}

pub async fn get_obstruction(
    state: &AppState,
    tenant: Uuid,
    id: Uuid,
) -> Result<ObstructionDetail, ApiError> {
    let row = state
        .store
        .get_lifecycle(LifecycleTable::Obstructions, tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("obstruction"))?;
    let mut plans = plans_of(state, tenant, id)
        .await?
        .iter()
        .map(plan_of)
        .collect::<Result<Vec<_>, _>>()?;
    plans.reverse();
    Ok(ObstructionDetail {
        obstruction: obstruction_of(&row)?,
        repair_plans: plans,
        signal_id: row.parent.as_deref().and_then(|s| Uuid::parse_str(s).ok()),
        receipt_id: row
            .receipt_id
            .as_deref()
            .and_then(|s| Uuid::parse_str(s).ok()),
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

pub async fn get_plan(
    state: &AppState,
    tenant: Uuid,
    id: Uuid,
) -> Result<RepairPlanDetail, ApiError> {
    let row = state
        .store
        .get_lifecycle(LifecycleTable::RepairPlans, tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("repair plan"))?;
    let plan = plan_of(&row)?;
    let orow = state
        .store
        .get_lifecycle(LifecycleTable::Obstructions, tenant, plan.obstruction_id)
        .await?
        .ok_or_else(|| ApiError::unavailable("repair plan's obstruction is missing"))?;
    let effect = state
        .store
        .plan_effect(tenant, id)
        .await?
        .and_then(|(_, e)| serde_json::from_str::<Value>(&e).ok())
        .and_then(|v| v.as_object().cloned());
    Ok(RepairPlanDetail {
        repair_plan: plan,
        obstruction: obstruction_of(&orow)?,
        effect,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

// ---------------------------------------------------------------- moves

fn refusal(r: Refusal, what: &str) -> ApiError {
    match r {
        Refusal::NotApplicable => ApiError::not_found("route"),
        Refusal::Conflict {
            from,
            to,
            allowed_from,
        } => ApiError::conflict(format!(
            "the {what} is {from}; it can become {to} only from: {}",
            if allowed_from.is_empty() {
                "nowhere".to_string()
            } else {
                allowed_from.join(", ")
            }
        )),
        Refusal::Forbidden { needed, have } => ApiError::forbidden(format!(
            "this needs authority {needed:.2}; the API key's ceiling is {have:.2}"
        )),
    }
}

/// Everything one lifecycle action writes, gathered before the commit.
struct Plan {
    moves: Vec<StatusMove>,
    traces: Vec<TraceMove>,
    transitions: Vec<Transition>,
    superseded: Vec<Uuid>,
    released: bool,
    effect: Option<Value>,
    extra_events: Vec<(Uuid, Uuid)>,
    new_lc: Option<Lifecycle>,
    material_canon: Option<canon_kernel::CanonicalizationInput>,
    material_rev: Option<rev_kernel::ReversalInput>,
    nested: Vec<Value>,
    reasons: Vec<String>,
}

impl Plan {
    fn new() -> Plan {
        Plan {
            moves: vec![],
            traces: vec![],
            transitions: vec![],
            superseded: vec![],
            released: false,
            effect: None,
            extra_events: vec![],
            new_lc: None,
            material_canon: None,
            material_rev: None,
            nested: vec![],
            reasons: vec![],
        }
    }
}

/// Live plans of an obstruction (other than `except`) → superseded.
async fn supersede_siblings(
    state: &AppState,
    tenant: Uuid,
    obstruction: Uuid,
    except: Option<Uuid>,
    plan: &mut Plan,
) -> Result<(), ApiError> {
    for row in plans_of(state, tenant, obstruction).await? {
        let Ok(id) = Uuid::parse_str(&row.id) else {
            continue;
        };
        if Some(id) == except || plan.moves.iter().any(|m| m.id == id) {
            continue;
        }
        let Some(st) = RepairStatus::parse(&row.status) else {
            continue;
        };
        if !plan_is_live(st) {
            continue;
        }
        let mut p = plan_of(&row)?;
        p.status = RepairStatus::Superseded;
        plan.moves.push(StatusMove {
            table: LifecycleTable::RepairPlans,
            id,
            from: row.status.clone(),
            to: "superseded".into(),
            body: json!(p),
        });
        plan.superseded.push(id);
    }
    Ok(())
}

fn move_obstruction(o: &mut Obstruction, from: &str, to: ObstructionStatus, plan: &mut Plan) {
    let Some(f) = ObstructionStatus::parse(from) else {
        return;
    };
    if f == to || !obstruction_move_allowed(f, to) {
        return;
    }
    o.status = to;
    plan.moves
        .retain(|m| !(m.table == LifecycleTable::Obstructions && m.id == o.id));
    plan.moves.push(StatusMove {
        table: LifecycleTable::Obstructions,
        id: o.id,
        from: from.to_string(),
        to: to.as_str().into(),
        body: json!(o),
    });
}

async fn commit_lifecycle(
    state: &AppState,
    principal: &Principal,
    input: LifecycleInput,
    decision: lc_kernel::LifecycleDecision,
    subject: Value,
    mut plan: Plan,
    receipt_id: Uuid,
) -> Result<(crate::store::Committed, Plan), ApiError> {
    let policy = policy_of(state, principal)?;
    let verdict = crate::kernel::operations::Verdict {
        decision: decision.decision,
        outcome: decision.outcome,
        reason_codes: plan.reasons.clone(),
        obstructions: plan
            .new_lc
            .as_ref()
            .map(|l| l.obstructions.clone())
            .unwrap_or_default(),
        repair_plans: plan
            .new_lc
            .as_ref()
            .map(|l| l.repair_plans.clone())
            .unwrap_or_default(),
        effects: vec![],
    };
    let material = OperationMaterial::Lifecycle(LifecycleMaterial {
        lifecycle: input,
        canonicalization: plan.material_canon.take(),
        reversal: plan.material_rev.take(),
    });
    let mut c = content(
        "lifecycle",
        receipt_id,
        principal,
        &policy,
        &verdict,
        &material,
        subject,
        &plan.transitions,
        &[],
    );
    c.insert("effects".into(), Value::Array(plan.nested.clone()));
    let mut w = OperationWrite::new(principal.tenant, receipt_id, "lifecycle", c);
    w.decision = decision.decision.as_str().into();
    w.outcome = decision.outcome.as_str().into();
    w.status_moves = std::mem::take(&mut plan.moves);
    w.traces = std::mem::take(&mut plan.traces);
    let announce = plan
        .new_lc
        .as_ref()
        .map(|l| l.announce())
        .unwrap_or_default();
    if let Some(l) = plan.new_lc.as_mut() {
        w.obstructions = std::mem::take(&mut l.new_obstructions);
        w.repair_plans = std::mem::take(&mut l.new_plans);
    }
    let blocked = std::mem::take(&mut plan.extra_events);
    let released = plan.released;
    let released_traces: Vec<Uuid> = plan.transitions.iter().map(|t| t.trace_id).collect();
    let target = subject_target(&w.content);
    w.finish = finish_with(decision.decision, announce, move |r| {
        let mut ev = super::reversal::blocked_events(blocked, target)(r);
        if released {
            ev.push(EventWrite {
                name: "quarantine.released".into(),
                data: json!({"traceIds": released_traces, "receipt": r}),
            });
        }
        ev
    });
    let committed = state.store.commit_operation(w).await?;
    Ok((committed, plan))
}

fn subject_target(c: &Map<String, Value>) -> String {
    c.get("subject")
        .and_then(|s| s.get("id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Resolve, reject or escalate an obstruction.
pub async fn act_on_obstruction(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    action: Action,
    reason: Option<String>,
) -> Result<LifecycleResponse, ApiError> {
    if let Some(r) = &reason {
        check_text(r, "reason", 0, 2000)?;
    }
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let row = state
        .store
        .get_lifecycle(LifecycleTable::Obstructions, tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("obstruction"))?;
    let mut o = obstruction_of(&row)?;
    let input = LifecycleInput {
        object: Object::Obstruction,
        action,
        from_status: row.status.clone(),
        required_authority: lc_kernel::required_authority(
            Object::Obstruction,
            action,
            None,
            policy.release_authority,
        ),
        principal_ceiling: ceiling(principal),
    };
    let decided = lc_kernel::decide(&input).map_err(|r| refusal(r, "obstruction"))?;
    let mut plan = Plan::new();
    let to = ObstructionStatus::parse(&decided.to_status).unwrap_or(o.status);
    move_obstruction(&mut o, &row.status, to, &mut plan);
    if obstruction_is_closed(to) {
        supersede_siblings(state, tenant, id, None, &mut plan).await?;
    }
    plan.reasons
        .push(format!("obstruction_{}", action.as_str()));
    let receipt_id = Uuid::new_v4();
    let subject = json!({"object": "obstruction", "id": id.to_string(), "action": action, "from": row.status, "to": decided.to_status, "reason": reason, "supersededPlans": plan.superseded});
    let (c, plan) = commit_lifecycle(
        state,
        principal,
        input,
        decided.clone(),
        subject,
        plan,
        receipt_id,
    )
    .await?;
    Ok(LifecycleResponse {
        decision: decided.decision,
        obstruction: o,
        repair_plan: None,
        superseded_plans: plan.superseded,
        transitions: vec![],
        released: false,
        effect: None,
        hook: None,
        receipt: receipt_ref(c.id, &c.replay_hash, decided.decision),
        reason_codes: plan.reasons,
    })
}

/// Approve, reject or complete a repair plan.
pub async fn act_on_plan(
    state: &Arc<AppState>,
    principal: &Principal,
    id: Uuid,
    action: Action,
    reason: Option<String>,
) -> Result<LifecycleResponse, ApiError> {
    if let Some(r) = &reason {
        check_text(r, "reason", 0, 2000)?;
    }
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let row = state
        .store
        .get_lifecycle(LifecycleTable::RepairPlans, tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found("repair plan"))?;
    let mut p = plan_of(&row)?;
    let orow = state
        .store
        .get_lifecycle(LifecycleTable::Obstructions, tenant, p.obstruction_id)
        .await?
        .ok_or_else(|| ApiError::unavailable("repair plan's obstruction is missing"))?;
    let mut o = obstruction_of(&orow)?;
    let input = LifecycleInput {
        object: Object::RepairPlan,
        action,
        from_status: row.status.clone(),
        required_authority: lc_kernel::required_authority(
            Object::RepairPlan,
            action,
            Some(&p),
            policy.release_authority,
        ),
        principal_ceiling: ceiling(principal),
    };
    let decided = lc_kernel::decide(&input).map_err(|r| refusal(r, "repair plan"))?;
    let receipt_id = Uuid::new_v4();
    let mut plan = Plan::new();
    let mut final_status = RepairStatus::parse(&decided.to_status).unwrap_or(p.status);
    let mut signal_id = orow.parent.as_deref().and_then(|s| Uuid::parse_str(s).ok());
    let mut trace_id = None;
    let effect = state
        .store
        .plan_effect(tenant, id)
        .await?
        .and_then(|(_, e)| serde_json::from_str::<PlanEffect>(&e).ok());

    match action {
        Action::Reject => {
            plan.reasons.push("repair_plan_rejected".into());
            // The obstruction is open again when no live plan is left.
            let others_live = plans_of(state, tenant, o.id).await?.iter().any(|r| {
                r.id != id.to_string() && RepairStatus::parse(&r.status).is_some_and(plan_is_live)
            });
            if !others_live {
                move_obstruction(&mut o, &orow.status, ObstructionStatus::Open, &mut plan);
            }
        }
        Action::Approve | Action::Complete => {
            let done = match &effect {
                Some(PlanEffect::Promote {
                    trace_id: t,
                    to_phase,
                    group,
                }) => {
                    trace_id = Some(*t);
                    promote(
                        state, principal, *t, *to_phase, *group, &o, receipt_id, id, &mut plan,
                    )
                    .await?
                }
                Some(PlanEffect::Reverse { target, mode }) => {
                    reverse(
                        state,
                        principal,
                        target,
                        *mode,
                        policy.release_authority,
                        &mut plan,
                    )
                    .await?
                }
                Some(PlanEffect::QuarantineTrace { trace_id: t }) => {
                    trace_id = Some(*t);
                    quarantine(state, tenant, *t, &mut plan).await?
                }
                None => {
                    let refused = match orow
                        .receipt_id
                        .as_deref()
                        .and_then(|r| Uuid::parse_str(r).ok())
                    {
                        Some(r) => state
                            .store
                            .get_receipt(tenant, r)
                            .await?
                            .is_some_and(|row| {
                                matches!(row.decision.as_str(), "block" | "escalate")
                            }),
                        None => false,
                    };
                    let r = if refused
                        || o.obstruction_type == ObstructionType::SensitivityViolation
                    {
                        // A refused write was never admitted: approving its plan
                        // (e.g. "remove the secret and resubmit") admits nothing.
                        plan.effect = Some(
                            json!({"kind": "release", "applied": false, "why": "the write was refused; resubmit it repaired"}),
                        );
                        (None, false)
                    } else {
                        release(state, tenant, signal_id, &mut plan).await?
                    };
                    if let Some((sid, tid)) = r.0 {
                        signal_id = Some(sid);
                        trace_id = Some(tid);
                    }
                    r.1
                }
            };
            if action == Action::Complete
                && matches!(effect, Some(PlanEffect::Promote { .. }))
                && !done
            {
                return Err(ApiError::conflict(format!(
                    "the promotion still lacks what the other obstructions of this attempt name ({}); approve their plans or add what is missing",
                    plan.reasons.join(", ")
                )));
            }
            if done || action == Action::Complete {
                final_status = RepairStatus::Completed;
                p.completion_receipt_id = Some(receipt_id);
                move_obstruction(&mut o, &orow.status, ObstructionStatus::Resolved, &mut plan);
                supersede_siblings(state, tenant, o.id, Some(id), &mut plan).await?;
                plan.reasons.push(if action == Action::Approve {
                    "approved_and_completed".into()
                } else {
                    "repair_completed".into()
                });
            } else {
                move_obstruction(
                    &mut o,
                    &orow.status,
                    ObstructionStatus::Repairing,
                    &mut plan,
                );
                plan.reasons.push("repair_plan_approved".into());
            }
        }
        _ => return Err(ApiError::not_found("route")),
    }
    p.status = final_status;
    plan.moves.insert(
        0,
        StatusMove {
            table: LifecycleTable::RepairPlans,
            id,
            from: row.status.clone(),
            to: final_status.as_str().into(),
            body: json!(p),
        },
    );
    let subject = json!({"object": "repair_plan", "id": id.to_string(), "obstructionId": o.id, "action": action, "from": row.status, "to": final_status, "reason": reason, "supersededPlans": plan.superseded, "effect": plan.effect});
    let (c, plan) = commit_lifecycle(
        state,
        principal,
        input,
        decided.clone(),
        subject,
        plan,
        receipt_id,
    )
    .await?;

    let mut hook = None;
    if action == Action::Approve {
        if let Some(h) = ON_REPAIR_APPROVED.get() {
            let info = ApprovedRepair {
                tenant,
                plan: p.clone(),
                obstruction: o.clone(),
                signal_id,
                trace_id,
                released: plan.released,
                receipt_id: c.id,
            };
            hook = Some(match h(state.clone(), info).await {
                Ok(Value::Object(m)) => m,
                Ok(other) => json!({"result": other})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                Err(e) => json!({"error": e}).as_object().cloned().unwrap_or_default(),
            });
        }
    }
    Ok(LifecycleResponse {
        decision: decided.decision,
        obstruction: o,
        repair_plan: Some(p),
        superseded_plans: plan.superseded,
        transitions: plan.transitions,
        released: plan.released,
        effect: plan.effect.and_then(|e| e.as_object().cloned()),
        hook,
        receipt: receipt_ref(c.id, &c.replay_hash, decided.decision),
        reason_codes: plan.reasons,
    })
}

/// A promotion plan: re-run the canonicalization with the approver's
/// authority and the group's approved obstructions waived.
#[allow(clippy::too_many_arguments)]
async fn promote(
    state: &AppState,
    principal: &Principal,
    trace: Uuid,
    to_phase: TracePhase,
    group: Uuid,
    o: &Obstruction,
    receipt_id: Uuid,
    plan_id: Uuid,
    plan: &mut Plan,
) -> Result<bool, ApiError> {
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let mut waived = vec![o.obstruction_type];
    for (_, status, _, oid) in state
        .store
        .plans_in_group(tenant, &group.to_string())
        .await?
    {
        if matches!(status.as_str(), "approved" | "completed") {
            if let Ok(oid) = Uuid::parse_str(&oid) {
                if let Some(row) = state
                    .store
                    .get_lifecycle(LifecycleTable::Obstructions, tenant, oid)
                    .await?
                {
                    if let Ok(x) = obstruction_of(&row) {
                        waived.push(x.obstruction_type);
                    }
                }
            }
        }
    }
    waived.sort();
    waived.dedup();
    let input = super::canonicalization::load_input(
        state,
        tenant,
        trace,
        to_phase,
        true,
        ceiling(principal),
        waived,
    )
    .await?;
    let out = canon_kernel::evaluate(&input, &policy);
    plan.nested
        .push(json!({"operation": "canonicalization", "decision": out.verdict.decision}));
    let remaining: Vec<_> = out
        .verdict
        .obstructions
        .iter()
        .map(|x| x.obstruction_type)
        .collect();
    plan.effect = Some(
        json!({"kind": "promote", "traceId": trace, "toPhase": to_phase, "applied": out.promote, "remaining": remaining}),
    );
    if out.promote {
        let pw = super::canonicalization::promotion_writes(
            state,
            tenant,
            &input,
            &out,
            receipt_id,
            Some(plan_id),
        )
        .await?;
        plan.traces.extend(pw.traces);
        plan.moves.extend(pw.moves);
        plan.transitions.extend(pw.transitions);
        plan.superseded.extend(pw.closed_plans);
        plan.reasons.push("promoted".into());
    } else {
        plan.reasons.extend(
            remaining
                .iter()
                .map(|r| format!("still_missing:{}", r.as_str())),
        );
    }
    plan.material_canon = Some(input);
    Ok(out.promote)
}

/// A reversal plan: apply the reversal.
async fn reverse(
    state: &AppState,
    principal: &Principal,
    target: &str,
    mode: ReversalMode,
    release_authority: f64,
    plan: &mut Plan,
) -> Result<bool, ApiError> {
    let tenant = principal.tenant;
    let p = super::reversal::prepare(
        state,
        tenant,
        target,
        mode,
        true,
        ceiling(principal),
        release_authority,
    )
    .await?;
    let out = rev_kernel::evaluate(&p.input);
    plan.nested
        .push(json!({"operation": "reversal", "decision": out.verdict.decision}));
    let (moves, blocked) = super::reversal::writes(&p, &out);
    plan.traces.extend(moves);
    plan.transitions.extend(out.transitions.clone());
    plan.extra_events = blocked;
    plan.effect = Some(
        json!({"kind": "reverse", "target": target, "mode": mode, "applied": out.applied, "residue": out.residue, "blockedActions": out.blocked_actions}),
    );
    if out.applied {
        plan.reasons.push("reversal_applied".into());
        plan.new_lc = Some(lifecycle_rows(state, tenant, &out.verdict, None, None).await?);
    }
    plan.material_rev = Some(p.input);
    Ok(out.applied)
}

/// A quarantine plan (poisoned text found at retrieval): quarantine the trace.
async fn quarantine(
    state: &AppState,
    tenant: Uuid,
    trace: Uuid,
    plan: &mut Plan,
) -> Result<bool, ApiError> {
    let Some(row) = state.store.trace_row(tenant, trace).await? else {
        return Err(ApiError::not_found("trace"));
    };
    let applied = transitions::allowed(row.phase, TracePhase::Quarantined);
    plan.effect = Some(json!({"kind": "quarantine_trace", "traceId": trace, "applied": applied}));
    if applied && row.phase != TracePhase::Quarantined {
        plan.traces.push(TraceMove {
            id: trace,
            expect: Expect::Phase(Some(row.phase)),
            phase: TracePhase::Quarantined,
            influence: AllowedInfluence::None,
            trace_type: row.trace_type.clone(),
        });
        plan.transitions.push(Transition {
            trace_id: trace,
            from_phase: row.phase,
            to_phase: TracePhase::Quarantined,
            from_influence: row.influence,
            to_influence: AllowedInfluence::None,
            transition_name: Some(transitions::name(row.phase, TracePhase::Quarantined)),
            enforced: true,
            reason_codes: vec!["quarantined_by_repair_plan".into()],
        });
        plan.reasons.push("trace_quarantined".into());
    }
    Ok(applied)
}

/// A plan without effect (opened by an evaluation): when its signal's trace
/// is held or untrusted, the approval releases it to `accepted` (capped by
/// the policy's influence for the signal's substrate and mutation).
/// Returns (signal, trace) when there is one, and whether the plan is done.
async fn release(
    state: &AppState,
    tenant: Uuid,
    signal_id: Option<Uuid>,
    plan: &mut Plan,
) -> Result<(Option<(Uuid, Uuid)>, bool), ApiError> {
    let Some(sid) = signal_id else {
        return Ok((None, false));
    };
    let Some(srow) = state.store.signal_row(tenant, sid).await? else {
        return Ok((None, false));
    };
    let s = &srow.signal;
    let row = state.store.trace_row(tenant, s.trace_id).await?;
    let from = row.as_ref().map(|r| r.phase);
    let phase = from.unwrap_or(TracePhase::Observed);
    let releasable = matches!(
        phase,
        TracePhase::Quarantined
            | TracePhase::Untrusted
            | TracePhase::Observed
            | TracePhase::Working
    );
    if !releasable {
        plan.effect = Some(
            json!({"kind": "release", "traceId": s.trace_id, "applied": false, "phase": phase}),
        );
        return Ok((Some((sid, s.trace_id)), false));
    }
    let policy_influence = state
        .runtime()
        .tenant(tenant)
        .map(|t| {
            t.policy
                .requirement(s.target_substrate, s.proposed_mutation)
                .max_influence
        })
        .unwrap_or(AllowedInfluence::AcceptedContext);
    let to_influence =
        transitions::phase_ceiling(TracePhase::Accepted, s.target_substrate).min(policy_influence);
    plan.traces.push(TraceMove {
        id: s.trace_id,
        expect: Expect::Phase(from),
        phase: TracePhase::Accepted,
        influence: to_influence,
        trace_type: Some(s.target_substrate.as_str().to_string()),
    });
    plan.transitions.push(Transition {
        trace_id: s.trace_id,
        from_phase: phase,
        to_phase: TracePhase::Accepted,
        from_influence: row
            .as_ref()
            .map(|r| r.influence)
            .unwrap_or(AllowedInfluence::None),
        to_influence,
        transition_name: Some(transitions::name(phase, TracePhase::Accepted)),
        enforced: true,
        reason_codes: vec!["released_by_repair_plan".into()],
    });
    plan.released = phase == TracePhase::Quarantined;
    plan.effect =
        Some(json!({"kind": "release", "traceId": s.trace_id, "applied": true, "from": phase}));
    plan.reasons.push(if plan.released {
        "released_from_quarantine".into()
    } else {
        "trace_accepted".into()
    });
    Ok((Some((sid, s.trace_id)), true))
}
