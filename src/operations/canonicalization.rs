//! `POST /substrate/canonicalization/evaluate`: loads the trace, its signals
//! and the canonical traces it could contradict, runs
//! [`canonicalization::evaluate`], and journals the answer. A promotion (apply
//! with authority, or an approved plan re-running it) moves the trace in the
//! same transaction, supersedes what it beat, and closes the plans of the
//! attempt.

use super::types::{CanonicalizationEvaluateRequest, CanonicalizationEvaluateResponse};
use super::*;
use crate::kernel::operations::canonicalization::{
    self, CanonicalizationInput, CanonicalizationOutput, PeerFacts, TARGETS,
};
use crate::kernel::operations::lifecycle::{obstruction_move_allowed, plan_is_live};
use crate::kernel::transitions;
use crate::store::{Expect, OperationWrite, StatusMove, TraceMove};

/// Most canonical traces a promotion is compared with.
const MAX_PEERS: i64 = 100;

/// Loads what a canonicalization of `trace_id` toward `target` rests on.
pub async fn load_input(
    state: &AppState,
    tenant: Uuid,
    trace_id: Uuid,
    target: TracePhase,
    apply: bool,
    principal_ceiling: f64,
    waived: Vec<ObstructionType>,
) -> Result<CanonicalizationInput, ApiError> {
    let (facts, row) = trace_facts(state, tenant, trace_id)
        .await?
        .ok_or_else(|| ApiError::not_found("trace"))?;
    // Scoped by tenant: record traces are named by (collection, record id) in every tenant.
    let basis = row
        .as_ref()
        .and_then(|r| r.last_receipt_id.clone())
        .or_else(|| facts.signals.first().map(|s| s.id.to_string()))
        .unwrap_or_default();
    let key = format!("{tenant}:{basis}");
    let mut peers = Vec::new();
    if target != TracePhase::Accepted {
        if let Some(sub) = facts.substrate {
            let rows = state
                .store
                .traces_in_phases(
                    tenant,
                    sub.as_str(),
                    &[TracePhase::Canonical, TracePhase::Crystallized],
                    MAX_PEERS,
                )
                .await?;
            for r in rows.into_iter().filter(|r| r.id != trace_id) {
                let claims: Vec<_> = state
                    .store
                    .signals_of_trace(tenant, r.id, 3)
                    .await?
                    .iter()
                    .flat_map(|s| signal_facts(s).claims)
                    .collect();
                if !claims.is_empty() {
                    peers.push(PeerFacts {
                        trace_id: r.id,
                        phase: r.phase,
                        claims,
                    });
                }
            }
        }
    }
    Ok(CanonicalizationInput {
        key,
        trace: facts,
        target_phase: target,
        now: crate::store::now(),
        phase_since: row.map(|r| r.updated_at),
        peers,
        apply,
        principal_ceiling,
        waived,
    })
}

/// The writes a promotion makes: the trace moves, what it contradicted is
/// superseded, the attempt's live plans close (approved ones complete with
/// this receipt, proposed ones are superseded) and their obstructions resolve.
pub struct Promotion {
    pub traces: Vec<TraceMove>,
    pub moves: Vec<StatusMove>,
    pub transitions: Vec<Transition>,
    pub closed_plans: Vec<Uuid>,
}

pub async fn promotion_writes(
    state: &AppState,
    tenant: Uuid,
    input: &CanonicalizationInput,
    out: &CanonicalizationOutput,
    receipt_id: Uuid,
    skip_plan: Option<Uuid>,
) -> Result<Promotion, ApiError> {
    let t = &input.trace;
    let substrate = t.substrate_or(TargetSubstrate::AgentMemory);
    let mut p = Promotion {
        traces: vec![TraceMove {
            id: t.trace_id,
            expect: Expect::Phase(t.phase),
            phase: out.transition.to_phase,
            influence: out.transition.to_influence,
            trace_type: Some(substrate.as_str().to_string()),
        }],
        moves: vec![],
        transitions: vec![out.transition.clone()],
        closed_plans: vec![],
    };
    for peer in input
        .peers
        .iter()
        .filter(|x| out.supersede.contains(&x.trace_id))
    {
        let to_influence = transitions::phase_ceiling(TracePhase::Superseded, substrate);
        p.traces.push(TraceMove {
            id: peer.trace_id,
            expect: Expect::Phase(Some(peer.phase)),
            phase: TracePhase::Superseded,
            influence: to_influence,
            trace_type: Some(substrate.as_str().to_string()),
        });
        p.transitions.push(Transition {
            trace_id: peer.trace_id,
            from_phase: peer.phase,
            to_phase: TracePhase::Superseded,
            from_influence: transitions::phase_ceiling(peer.phase, substrate),
            to_influence,
            transition_name: Some(transitions::name(peer.phase, TracePhase::Superseded)),
            enforced: true,
            reason_codes: vec!["superseded_by_promotion".into(), t.trace_id.to_string()],
        });
    }
    let mut obstructions_done = HashSet::new();
    for (pid, status, body, oid) in state
        .store
        .plans_in_group(tenant, &out.group.to_string())
        .await?
    {
        let (Ok(pid), Some(st)) = (Uuid::parse_str(&pid), RepairStatus::parse(&status)) else {
            continue;
        };
        if Some(pid) == skip_plan || !plan_is_live(st) {
            continue;
        }
        let Ok(mut plan) = serde_json::from_str::<RepairPlan>(&body) else {
            continue;
        };
        let to = if st == RepairStatus::Approved {
            plan.completion_receipt_id = Some(receipt_id);
            RepairStatus::Completed
        } else {
            RepairStatus::Superseded
        };
        plan.status = to;
        p.moves.push(StatusMove {
            table: crate::store::LifecycleTable::RepairPlans,
            id: pid,
            from: status,
            to: to.as_str().into(),
            body: json!(plan),
        });
        p.closed_plans.push(pid);
        if let Ok(oid) = Uuid::parse_str(&oid) {
            obstructions_done.insert(oid);
        }
    }
    for oid in obstructions_done {
        if let Some(row) = state
            .store
            .get_lifecycle(crate::store::LifecycleTable::Obstructions, tenant, oid)
            .await?
        {
            if let (Some(st), Ok(mut o)) = (
                ObstructionStatus::parse(&row.status),
                serde_json::from_str::<Obstruction>(&row.body),
            ) {
                if obstruction_move_allowed(st, ObstructionStatus::Resolved) {
                    o.status = ObstructionStatus::Resolved;
                    p.moves.push(StatusMove {
                        table: crate::store::LifecycleTable::Obstructions,
                        id: oid,
                        from: row.status,
                        to: "resolved".into(),
                        body: json!(o),
                    });
                }
            }
        }
    }
    Ok(p)
}

pub async fn evaluate(
    state: &AppState,
    principal: &Principal,
    req: CanonicalizationEvaluateRequest,
) -> Result<CanonicalizationEvaluateResponse, ApiError> {
    if !TARGETS.contains(&req.target_phase) {
        return Err(ApiError::field(
            "targetPhase",
            "must be one of accepted, canonical, crystallized",
        ));
    }
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let apply = req.apply.unwrap_or(false);
    let input = load_input(
        state,
        tenant,
        req.trace_id,
        req.target_phase,
        apply,
        ceiling(principal),
        vec![],
    )
    .await?;
    let out = canonicalization::evaluate(&input, &policy);
    let v = &out.verdict;
    let receipt_id = Uuid::new_v4();
    let lc = lifecycle_rows(state, tenant, v, None, Some(out.group)).await?;
    let promotion = if out.promote {
        Some(promotion_writes(state, tenant, &input, &out, receipt_id, None).await?)
    } else {
        None
    };
    let transitions = promotion
        .as_ref()
        .map(|p| p.transitions.clone())
        .unwrap_or_else(|| vec![out.transition.clone()]);
    let material = OperationMaterial::Canonicalization(input.clone());
    let subject = json!({
        "traceId": input.trace.trace_id,
        "targetPhase": input.target_phase,
        "apply": apply,
        "group": out.group,
        "assessment": out.assessment,
    });
    let mut w = OperationWrite::new(
        tenant,
        receipt_id,
        "canonicalization",
        content(
            "canonicalization",
            receipt_id,
            principal,
            &policy,
            v,
            &material,
            subject,
            &transitions,
            &[],
        ),
    );
    w.decision = v.decision.as_str().into();
    w.outcome = v.outcome.as_str().into();
    w.refused = !out.promote && v.decision != RuntimeDecision::Allow;
    w.finish = finish_with(v.decision, lc.announce(), |_| vec![]);
    w.obstructions = lc.new_obstructions;
    w.repair_plans = lc.new_plans;
    let mut superseded = vec![];
    if let Some(p) = promotion {
        w.traces = p.traces;
        w.status_moves = p.moves;
        superseded = out.supersede.clone();
    }
    let c = state.store.commit_operation(w).await?;
    let trace = if out.promote {
        Trace {
            id: input.trace.trace_id,
            current_phase: out.transition.to_phase,
            allowed_influence: out.transition.to_influence,
            trace_type: input.trace.substrate.map(|s| s.as_str().to_string()),
        }
    } else {
        input.trace.view()
    };
    let allowed = json!({"level": trace.allowed_influence, "phase": trace.current_phase, "wouldBe": out.transition.to_influence});
    Ok(CanonicalizationEvaluateResponse {
        decision: v.decision,
        governance_decision: governance(
            input.trace.trace_id,
            c.id,
            v,
            allowed.as_object().cloned(),
        ),
        trace,
        transition: out.transition.clone(),
        promoted: out.promote,
        assessment: out.assessment.clone(),
        superseded_traces: superseded,
        obstructions: lc.obstructions,
        repair_plans: lc.repair_plans,
        receipt: receipt_ref(c.id, &c.replay_hash, v.decision),
        reason_codes: v.reason_codes.clone(),
    })
}
