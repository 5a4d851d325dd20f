//! `POST /substrate/reversal/evaluate`: follows the dependency graph from a
//! signal, receipt or trace to everything derived from it, gathers the
//! residue (released actions, delivered events, records forwarded upstream)
//! and runs [`reversal::evaluate`]. With `apply` (and the release authority)
//! every trace moves to revoked (the root to tombstoned if asked) in one
//! transaction with its receipt and `signal.blocked` events; retrieval
//! treatment (API and proxy) reads trace phases, so revoked records are hidden
//! from the next read on.

use super::graph::{self, Dependents};
use super::types::{Dependent, ReversalEvaluateRequest, ReversalEvaluateResponse};
use super::*;
use crate::kernel::operations::reversal::{
    self, ActionFacts, DeliveryFacts, GraphTrace, ReversalInput, ReversalMode, ReversalOutput,
    UpstreamFacts,
};
use crate::store::{Expect, OperationWrite, TraceMove};

/// Most delivered events and forwarded records listed as residue.
const MAX_RESIDUE: usize = 100;

pub struct Prepared {
    pub input: ReversalInput,
    pub reached: Dependents,
}

pub async fn prepare(
    state: &AppState,
    tenant: Uuid,
    target: &str,
    mode: ReversalMode,
    apply: bool,
    principal_ceiling: f64,
    release_authority: f64,
) -> Result<Prepared, ApiError> {
    let (_, _, root) = resolve_trace_id(state, tenant, target, "target").await?;
    let reached = graph::dependents(state, tenant, root).await?;
    let traces: Vec<GraphTrace> = reached
        .traces
        .iter()
        .map(|r| GraphTrace {
            trace_id: r.trace_id,
            phase: r.row.as_ref().map(|x| x.phase),
            influence: r
                .row
                .as_ref()
                .map(|x| x.influence)
                .unwrap_or(AllowedInfluence::None),
            substrate: r.substrate,
            signal_ids: r.signal_ids.clone(),
            depth: r.depth,
            via: r.via.clone(),
        })
        .collect();
    let mut actions = Vec::new();
    for a in &reached.actions {
        if let Some(row) = state.store.action_row(tenant, *a).await? {
            actions.push(ActionFacts {
                id: *a,
                kind: row.kind,
                target: row.target,
                status: row.status,
                receipt_id: Uuid::parse_str(&row.receipt_id).ok(),
                basis: graph::action_basis(state, tenant, *a).await?,
            });
        }
    }
    let signals: Vec<Uuid> = traces.iter().flat_map(|t| t.signal_ids.clone()).collect();
    let mut deliveries: Vec<DeliveryFacts> = Vec::new();
    for s in signals.iter().take(50) {
        if deliveries.len() >= MAX_RESIDUE {
            break;
        }
        for (id, event_name, subscription_id) in state
            .store
            .delivered_mentioning(tenant, &s.to_string(), 20)
            .await?
        {
            let Ok(id) = Uuid::parse_str(&id) else {
                continue;
            };
            if !deliveries.iter().any(|d| d.id == id) {
                deliveries.push(DeliveryFacts {
                    id,
                    event_name,
                    subscription_id,
                });
            }
        }
    }
    deliveries.truncate(MAX_RESIDUE);
    let mut upstream: Vec<UpstreamFacts> = state
        .store
        .forwarded_receipts(tenant, &signals)
        .await?
        .into_iter()
        .map(|(receipt_id, signal_id, kind)| UpstreamFacts {
            receipt_id,
            signal_id,
            kind,
        })
        .collect();
    upstream.truncate(MAX_RESIDUE);
    let key = crate::receipts::sha256_hex(
        serde_json::to_string(&(
            tenant,
            root,
            traces
                .iter()
                .map(|t| (t.trace_id, t.phase))
                .collect::<Vec<_>>(),
            actions
                .iter()
                .map(|a| (a.id, &a.status))
                .collect::<Vec<_>>(),
        ))
        .unwrap_or_default()
        .as_bytes(),
    );
    Ok(Prepared {
        input: ReversalInput {
            key,
            target: target.to_string(),
            root_trace: root,
            mode,
            apply,
            principal_ceiling,
            release_authority,
            traces,
            actions,
            deliveries,
            upstream,
            truncated: reached.truncated,
        },
        reached,
    })
}

/// Trace moves of an applied reversal, and the `signal.blocked` events announcing them.
pub fn writes(p: &Prepared, out: &ReversalOutput) -> (Vec<TraceMove>, Vec<(Uuid, Uuid)>) {
    let mut moves = Vec::new();
    let mut blocked = Vec::new();
    if !out.applied {
        return (moves, blocked);
    }
    for t in &out.transitions {
        let Some(g) = p.input.traces.iter().find(|g| g.trace_id == t.trace_id) else {
            continue;
        };
        moves.push(TraceMove {
            id: t.trace_id,
            expect: Expect::Phase(g.phase),
            phase: t.to_phase,
            influence: t.to_influence,
            trace_type: g.substrate.map(|s| s.as_str().to_string()),
        });
        for s in g.signal_ids.iter().take(20) {
            blocked.push((*s, t.trace_id));
        }
    }
    (moves, blocked)
}

pub fn blocked_events(
    blocked: Vec<(Uuid, Uuid)>,
    target: String,
) -> impl FnOnce(&ReceiptRef) -> Vec<EventWrite> + Send + 'static {
    move |r| {
        blocked
            .into_iter()
            .take(200)
            .map(|(signal, trace)| EventWrite {
                name: "signal.blocked".into(),
                data: json!({"signalId": signal, "traceId": trace, "decision": "block", "reasonCodes": ["revoked_by_reversal"], "reversalOf": target, "receipt": r}),
            })
            .collect()
    }
}

/// The dependents as an applied reversal left them: each moved trace in its new phase and
/// influence (the view is read before the moves).
fn dependents_after(mut view: Vec<Dependent>, out: &reversal::ReversalOutput) -> Vec<Dependent> {
    if out.applied {
        for d in &mut view {
            if let Some(t) = out.transitions.iter().find(|t| t.trace_id == d.trace.id) {
                d.trace.current_phase = t.to_phase;
                d.trace.allowed_influence = t.to_influence;
            }
        }
    }
    view
}

pub fn dependents_view(p: &Prepared) -> Vec<Dependent> {
    p.reached
        .traces
        .iter()
        .map(|r| Dependent {
            trace: Trace {
                id: r.trace_id,
                current_phase: r
                    .row
                    .as_ref()
                    .map(|x| x.phase)
                    .unwrap_or(TracePhase::Observed),
                allowed_influence: r
                    .row
                    .as_ref()
                    .map(|x| x.influence)
                    .unwrap_or(AllowedInfluence::None),
                trace_type: r.substrate.map(|s| s.as_str().to_string()),
            },
            signal_ids: r.signal_ids.clone(),
            depth: r.depth,
            via: r.via.clone(),
        })
        .collect()
}

pub async fn evaluate(
    state: &AppState,
    principal: &Principal,
    req: ReversalEvaluateRequest,
) -> Result<ReversalEvaluateResponse, ApiError> {
    if let Some(r) = &req.reason {
        check_text(r, "reason", 0, 2000)?;
    }
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let mode = req.mode.unwrap_or_default();
    let apply = req.apply.unwrap_or(false);
    let p = prepare(
        state,
        tenant,
        &req.target,
        mode,
        apply,
        ceiling(principal),
        policy.release_authority,
    )
    .await?;
    let out = reversal::evaluate(&p.input);
    let v = &out.verdict;
    let receipt_id = Uuid::new_v4();
    let lc = lifecycle_rows(state, tenant, v, None, None).await?;
    let (moves, blocked) = writes(&p, &out);
    let subject = json!({
        "target": p.input.target,
        "rootTraceId": p.input.root_trace,
        "mode": mode,
        "apply": apply,
        "applied": out.applied,
        "reason": req.reason,
        "residue": out.residue,
        "blockedActions": out.blocked_actions,
    });
    let material = OperationMaterial::Reversal(p.input.clone());
    let mut w = OperationWrite::new(
        tenant,
        receipt_id,
        "reversal",
        content(
            "reversal",
            receipt_id,
            principal,
            &policy,
            v,
            &material,
            subject,
            &out.transitions,
            &[],
        ),
    );
    w.decision = v.decision.as_str().into();
    w.outcome = v.outcome.as_str().into();
    w.traces = moves;
    w.finish = finish_with(
        v.decision,
        lc.announce(),
        blocked_events(blocked, p.input.target.clone()),
    );
    w.obstructions = lc.new_obstructions;
    w.repair_plans = lc.new_plans;
    let c = state.store.commit_operation(w).await?;
    Ok(ReversalEvaluateResponse {
        decision: v.decision,
        governance_decision: governance(p.input.root_trace, c.id, v, None),
        applied: out.applied,
        target: p.input.target.clone(),
        root_trace_id: p.input.root_trace,
        dependents: dependents_after(dependents_view(&p), &out),
        transitions: out.transitions.clone(),
        residue: out.residue.clone(),
        blocked_actions: out.blocked_actions.clone(),
        truncated: p.input.truncated,
        obstructions: lc.obstructions,
        repair_plans: lc.repair_plans,
        receipt: receipt_ref(c.id, &c.replay_hash, v.decision),
        reason_codes: v.reason_codes.clone(),
    })
}
