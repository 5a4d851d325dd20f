//! The five canonical operations and the governance lifecycle on top of the
//! store. Each operation loads the state it rests on, calls its pure decision
//! function in [`crate::kernel::operations`], and commits one receipt (whose
//! replay material is that function's input) with every state change and
//! event it causes, before it answers.
//!
//! - [`configurations`]: `POST /substrate/configurations/evaluate`
//! - [`canonicalization`]: `POST /substrate/canonicalization/evaluate`
//! - [`retrieval`]: `POST /substrate/retrieval/filter`
//! - [`actions`]: `POST /substrate/actions/release`
//! - [`reversal`]: `POST /substrate/reversal/evaluate`
//! - [`graph`]: the dependency graph (lineage, dependents)
//! - [`lifecycle`]: obstruction and repair-plan moves, plan effects, the `on_repair_approved` hook
//! - [`coordination`]: coordination state per subject
//! - [`replay`]: re-execution of these receipts for `POST /substrate/receipts/{id}/replay`

pub mod actions;
pub mod canonicalization;
pub mod configurations;
pub mod coordination;
pub mod graph;
pub mod lifecycle;
pub mod replay;
pub mod retrieval;
pub mod reversal;
pub mod types;

use crate::api::error::ApiError;
use crate::kernel::operations::{
    claims, parse_subject_ref, NodeKind, OperationMaterial, SignalFacts, TraceFacts, Verdict,
};
use crate::kernel::policy::CompiledPolicy;
use crate::kernel::types::*;
use crate::state::{AppState, Principal};
use crate::store::{EventWrite, LifecycleTable, NewObstruction, NewPlan, SignalRow};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use uuid::Uuid;

/// Receipt kinds written by this module (replay dispatches on them).
pub const KINDS: &[&str] = &[
    "configuration",
    "canonicalization",
    "retrieval_filter",
    "action_release",
    "reversal",
    "lifecycle",
];

/// How many signals of a trace an operation reads (newest first).
pub const SIGNALS_PER_TRACE: i64 = 20;

/// The API key's authority ceiling (1 when the key sets none).
pub fn ceiling(p: &Principal) -> f64 {
    p.authority_ceiling.unwrap_or(1.0)
}

pub fn signal_facts(row: &SignalRow) -> SignalFacts {
    let s = &row.signal;
    let mut cl = claims::extract(&s.payload);
    if let Some(summary) = &s.payload_summary {
        cl.extend(claims::extract(summary));
    }
    SignalFacts {
        id: s.id,
        source_id: s.source_id.clone(),
        source_type: s.source_type,
        trust: s.source_trust_level,
        authority: s.source_authority_level,
        substrate: s.target_substrate,
        mutation: s.proposed_mutation,
        event_type: s.event_type,
        evidence_refs: s.evidence_refs.clone(),
        ingested_at: row.created_at.clone(),
        observed_at: s.observed_at.clone(),
        payload_digest: s.payload_digest.clone(),
        claims: cl,
    }
}

/// A trace with the signals that wrote it; None when neither a trace row
/// nor any signal names it.
pub async fn trace_facts(
    state: &AppState,
    tenant: Uuid,
    trace_id: Uuid,
) -> Result<Option<(TraceFacts, Option<crate::store::TraceRow>)>, ApiError> {
    let row = state.store.trace_row(tenant, trace_id).await?;
    let signals = state
        .store
        .signals_of_trace(tenant, trace_id, SIGNALS_PER_TRACE)
        .await?;
    if row.is_none() && signals.is_empty() {
        return Ok(None);
    }
    let substrate = row
        .as_ref()
        .and_then(|r| r.trace_type.as_deref())
        .and_then(TargetSubstrate::parse)
        .or_else(|| signals.first().map(|s| s.signal.target_substrate));
    let facts = TraceFacts {
        trace_id,
        phase: row.as_ref().map(|r| r.phase),
        influence: row
            .as_ref()
            .map(|r| r.influence)
            .unwrap_or(AllowedInfluence::None),
        substrate,
        signals: signals.iter().map(signal_facts).collect(),
    };
    Ok(Some((facts, row)))
}

/// The trace a reference names: a trace itself, a signal's trace, or the
/// trace of a receipt's signal. `field` names the request field for errors
/// (400 for a malformed reference, 404 for one that names nothing of the tenant).
pub async fn resolve_trace_id(
    state: &AppState,
    tenant: Uuid,
    raw: &str,
    field: &str,
) -> Result<(NodeKind, Uuid, Uuid), ApiError> {
    let r = parse_subject_ref(raw).map_err(|m| ApiError::field(field, m))?;
    let (kind, id) = state
        .store
        .resolve_ref(tenant, r)
        .await?
        .filter(|(k, _)| *k != NodeKind::Action)
        .ok_or_else(|| ApiError::not_found(&format!("{field} ({raw})")))?;
    let trace = match kind {
        NodeKind::Trace => id,
        NodeKind::Signal => {
            state
                .store
                .signal_row(tenant, id)
                .await?
                .ok_or_else(|| ApiError::not_found(field))?
                .signal
                .trace_id
        }
        NodeKind::Receipt => {
            let row = state
                .store
                .get_receipt(tenant, id)
                .await?
                .ok_or_else(|| ApiError::not_found(field))?;
            let sid = row
                .signal_id
                .as_deref()
                .and_then(|s| Uuid::parse_str(s).ok())
                .ok_or_else(|| {
                    ApiError::field(field, "names a receipt that is not about a signal")
                })?;
            state
                .store
                .signal_row(tenant, sid)
                .await?
                .ok_or_else(|| ApiError::not_found(field))?
                .signal
                .trace_id
        }
        NodeKind::Action => return Err(ApiError::not_found(field)),
    };
    Ok((kind, id, trace))
}

/// Resolves a reference to its trace's facts.
pub async fn resolve_trace(
    state: &AppState,
    tenant: Uuid,
    raw: &str,
    field: &str,
) -> Result<TraceFacts, ApiError> {
    let (_, _, trace) = resolve_trace_id(state, tenant, raw, field).await?;
    trace_facts(state, tenant, trace)
        .await?
        .map(|(f, _)| f)
        .ok_or_else(|| ApiError::not_found(field))
}

/// The content every operation receipt binds; `subject` adds what is
/// specific to the operation.
#[allow(clippy::too_many_arguments)]
pub fn content(
    kind: &str,
    receipt_id: Uuid,
    principal: &Principal,
    policy: &CompiledPolicy,
    verdict: &Verdict,
    material: &OperationMaterial,
    subject: Value,
    transitions: &[Transition],
    dependencies: &[Uuid],
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("version".into(), json!(1));
    m.insert("kind".into(), json!(kind));
    m.insert("receiptId".into(), json!(receipt_id));
    m.insert("tenantId".into(), json!(principal.tenant));
    m.insert("issuedAt".into(), json!(crate::store::now()));
    m.insert(
        "principal".into(),
        json!({"keyId": principal.key_id, "authorityCeiling": principal.authority_ceiling}),
    );
    m.insert("policy".into(), json!({"name": policy.name, "coefficientVersionId": policy.version_id, "contentHash": policy.content_hash}));
    m.insert("decision".into(), json!(verdict.decision));
    m.insert("governanceOutcome".into(), json!(verdict.outcome));
    m.insert("reasonCodes".into(), json!(verdict.reason_codes));
    m.insert("subject".into(), subject);
    m.insert(
        "obstructionIds".into(),
        json!(verdict
            .obstructions
            .iter()
            .map(|o| o.id)
            .collect::<Vec<_>>()),
    );
    m.insert(
        "repairPlanIds".into(),
        json!(verdict
            .repair_plans
            .iter()
            .map(|p| p.id)
            .collect::<Vec<_>>()),
    );
    m.insert("transitions".into(), json!(transitions));
    m.insert("dependencies".into(), json!(dependencies));
    m.insert(
        "replayMaterial".into(),
        serde_json::to_value(material).unwrap_or(Value::Null),
    );
    m
}

/// Obstructions and plans of a verdict, split into rows to insert (new ones)
/// and the objects to answer (stored ones keep their current status). The
/// same state opens the same obstruction ids, so a repeated evaluation does
/// not pile up duplicates or re-announce them.
pub struct Lifecycle {
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub new_obstructions: Vec<NewObstruction>,
    pub new_plans: Vec<NewPlan>,
    pub fresh: HashSet<Uuid>,
}

pub async fn lifecycle_rows(
    state: &AppState,
    tenant: Uuid,
    verdict: &Verdict,
    signal_id: Option<Uuid>,
    group: Option<Uuid>,
) -> Result<Lifecycle, ApiError> {
    let mut out = Lifecycle {
        obstructions: vec![],
        repair_plans: vec![],
        new_obstructions: vec![],
        new_plans: vec![],
        fresh: HashSet::new(),
    };
    for o in &verdict.obstructions {
        match state
            .store
            .get_lifecycle(LifecycleTable::Obstructions, tenant, o.id)
            .await?
        {
            Some(row) => out.obstructions.push(
                serde_json::from_str(&row.body)
                    .map_err(|_| ApiError::unavailable("stored obstruction is unreadable"))?,
            ),
            None => {
                out.fresh.insert(o.id);
                out.new_obstructions.push(NewObstruction {
                    id: o.id,
                    signal_id,
                    status: o.status.as_str().into(),
                    body: json!(o),
                });
                out.obstructions.push(o.clone());
            }
        }
    }
    for p in &verdict.repair_plans {
        match state
            .store
            .get_lifecycle(LifecycleTable::RepairPlans, tenant, p.id)
            .await?
        {
            Some(row) => out.repair_plans.push(
                serde_json::from_str(&row.body)
                    .map_err(|_| ApiError::unavailable("stored repair plan is unreadable"))?,
            ),
            None => {
                out.fresh.insert(p.id);
                let effect = verdict
                    .effects
                    .iter()
                    .find(|e| e.plan_id == p.id)
                    .and_then(|e| serde_json::to_string(&e.effect).ok())
                    .map(|e| (group, e));
                out.new_plans.push(NewPlan {
                    id: p.id,
                    obstruction_id: p.obstruction_id,
                    status: p.status.as_str().into(),
                    body: json!(p),
                    effect,
                });
                out.repair_plans.push(p.clone());
            }
        }
    }
    Ok(out)
}

/// The new obstructions and plans of an answer, to announce once committed.
#[derive(Clone, Default)]
pub struct Announce {
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
}

impl Lifecycle {
    pub fn announce(&self) -> Announce {
        Announce {
            obstructions: self
                .obstructions
                .iter()
                .filter(|o| self.fresh.contains(&o.id))
                .cloned()
                .collect(),
            repair_plans: self
                .repair_plans
                .iter()
                .filter(|p| self.fresh.contains(&p.id))
                .cloned()
                .collect(),
        }
    }
}

/// `receipt.created`, and `obstruction.opened` / `repair.proposed` for what is new.
pub fn lifecycle_events(receipt: &ReceiptRef, a: &Announce) -> Vec<EventWrite> {
    let r = json!(receipt);
    let mut v = vec![EventWrite {
        name: "receipt.created".into(),
        data: json!({"id": receipt.id, "replay_hash": receipt.replay_hash, "decision": receipt.decision}),
    }];
    for o in &a.obstructions {
        v.push(EventWrite {
            name: "obstruction.opened".into(),
            data: json!({"obstruction": o, "receipt": r}),
        });
    }
    for p in &a.repair_plans {
        v.push(EventWrite {
            name: "repair.proposed".into(),
            data: json!({"repairPlan": p, "receipt": r}),
        });
    }
    v
}

/// The `finish` of an operation's commit: its lifecycle events, plus `extra`
/// events built from the sealed receipt reference.
pub fn finish_with(
    decision: RuntimeDecision,
    announce: Announce,
    extra: impl FnOnce(&ReceiptRef) -> Vec<EventWrite> + Send + 'static,
) -> Box<dyn FnOnce(crate::store::Sealed<'_>) -> crate::store::Finish + Send> {
    Box::new(move |sealed| {
        let r = receipt_ref(sealed.receipt_id, sealed.replay_hash, decision);
        let mut events = lifecycle_events(&r, &announce);
        events.extend(extra(&r));
        crate::store::Finish {
            result: None,
            events,
        }
    })
}

pub fn receipt_ref(id: Uuid, hash: &str, decision: RuntimeDecision) -> ReceiptRef {
    ReceiptRef {
        id,
        replay_hash: Some(hash.to_string()),
        decision: Some(decision),
    }
}

/// The spec's GovernanceDecision for an operation. `signalId` is the id of
/// the operation's subject (the configuration, the action, the trace, the
/// reversed signal): the operation request acts as the signal proposing it.
pub fn governance(
    subject_id: Uuid,
    receipt_id: Uuid,
    verdict: &Verdict,
    allowed_influence: Option<FreeForm>,
) -> GovernanceDecision {
    GovernanceDecision {
        id: Some(crate::kernel::operations::mint(
            "governance_decision",
            &receipt_id.to_string(),
            "",
        )),
        signal_id: subject_id,
        receipt_id: Some(receipt_id),
        outcome: verdict.outcome,
        reason_codes: verdict.reason_codes.clone(),
        runtime_decision: Some(verdict.decision),
        allowed_influence,
        risk_score: None,
        authority_score: None,
        evidence_score: None,
    }
}

/// The policy of the caller's tenant.
pub fn policy_of(
    state: &AppState,
    principal: &Principal,
) -> Result<std::sync::Arc<CompiledPolicy>, ApiError> {
    state
        .runtime()
        .tenant(principal.tenant)
        .map(|t| t.policy.clone())
        .ok_or_else(|| ApiError::forbidden("the API key's tenant is not configured"))
}

/// Checks the length of a list field: 400 naming it when out of bounds.
pub fn check_len<T>(v: &[T], field: &str, min: usize, max: usize) -> Result<(), ApiError> {
    if v.len() < min {
        return Err(ApiError::field(
            field,
            format!("must have at least {min} item(s)"),
        ));
    }
    if v.len() > max {
        return Err(ApiError::field(
            field,
            format!("must have at most {max} items"),
        ));
    }
    Ok(())
}

pub fn check_text(v: &str, field: &str, min: usize, max: usize) -> Result<(), ApiError> {
    let n = v.chars().count();
    if n < min {
        return Err(ApiError::field(
            field,
            format!("must be at least {min} character(s)"),
        ));
    }
    if n > max {
        return Err(ApiError::field(
            field,
            format!("must be at most {max} characters"),
        ));
    }
    Ok(())
}
