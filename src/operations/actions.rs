//! `POST /substrate/actions/release`: a protected action and the traces it
//! rests on. The decision, the action row, its basis edges and the receipt
//! commit in one transaction before the answer says `released`: consequential
//! authority is journaled before dispatch. A released action id answers the
//! same release again (idempotent); an obstructed one is evaluated afresh.

use super::types::{ActionReleaseRequest, ActionReleaseResponse};
use super::*;
use crate::kernel::operations::action::{self, ActionInput, BasisFacts};
use crate::store::{ActionWrite, EdgeWrite, OperationWrite};

pub async fn release(
    state: &AppState,
    principal: &Principal,
    req: ActionReleaseRequest,
) -> Result<ActionReleaseResponse, ApiError> {
    check_text(&req.action.target, "action.target", 1, 512)?;
    if let Some(d) = &req.action.description {
        check_text(d, "action.description", 0, 2000)?;
    }
    check_len(&req.basis, "basis", 1, 100)?;
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let action_id = req.action.id.unwrap_or_else(Uuid::new_v4);
    if let Some(resp) = earlier_release(state, tenant, action_id, &req).await? {
        return Ok(resp);
    }
    let mut basis = Vec::with_capacity(req.basis.len());
    let mut seen = HashSet::new();
    for (i, raw) in req.basis.iter().enumerate() {
        let field = format!("basis[{i}]");
        let facts = resolve_trace(state, tenant, raw, &field).await?;
        if !seen.insert(facts.trace_id) {
            return Err(ApiError::field(
                field,
                format!("names trace {} a second time", facts.trace_id),
            ));
        }
        basis.push(BasisFacts {
            reference: raw.clone(),
            trace: facts,
        });
    }
    let input = ActionInput {
        tenant,
        action_id,
        kind: req.action.kind,
        target: req.action.target.clone(),
        basis,
        principal_ceiling: ceiling(principal),
    };
    let out = action::evaluate(&input, &policy);
    let v = out.verdict.clone();
    let receipt_id = Uuid::new_v4();
    let lc = lifecycle_rows(state, tenant, &v, None, None).await?;
    let parameters_digest = req
        .action
        .parameters
        .as_ref()
        .map(|p| crate::receipts::hash_value(&Value::Object(p.clone())));
    let subject = json!({
        "actionId": action_id,
        "kind": input.kind,
        "target": input.target,
        "parametersDigest": parameters_digest,
        "description": req.action.description,
        "basis": input.basis.iter().map(|b| json!({"ref": b.reference, "traceId": b.trace.trace_id, "phase": b.trace.phase, "influence": b.trace.influence})).collect::<Vec<_>>(),
        "released": out.released,
    });
    let material = OperationMaterial::ActionRelease(input.clone());
    let mut w = OperationWrite::new(
        tenant,
        receipt_id,
        "action_release",
        content(
            "action_release",
            receipt_id,
            principal,
            &policy,
            &v,
            &material,
            subject.clone(),
            &[],
            &[],
        ),
    );
    w.decision = v.decision.as_str().into();
    w.outcome = v.outcome.as_str().into();
    w.refused = !out.released;
    w.edges = input
        .basis
        .iter()
        .map(|b| EdgeWrite {
            child_kind: NodeKind::Action,
            child_id: action_id,
            parent_kind: NodeKind::Trace,
            parent_id: b.trace.trace_id,
            relation: "based_on",
        })
        .collect();
    w.actions = vec![ActionWrite {
        id: action_id,
        kind: input.kind.as_str().into(),
        target: input.target.clone(),
        status: if out.released {
            "released"
        } else {
            "obstructed"
        }
        .into(),
        body: subject.to_string(),
    }];
    let mut resp = ActionReleaseResponse {
        action_id,
        released: out.released,
        decision: v.decision,
        governance_decision: governance(action_id, receipt_id, &v, None),
        required_influence: out.required_influence,
        required_authority: out.required_authority,
        basis: out.basis.clone(),
        obstructions: lc.obstructions.clone(),
        repair_plans: lc.repair_plans.clone(),
        receipt: receipt_ref(receipt_id, "", v.decision),
        reason_codes: v.reason_codes.clone(),
    };
    let template = resp.clone();
    let announce = lc.announce();
    let decision = v.decision;
    w.finish = Box::new(move |sealed| {
        let mut r = template;
        r.receipt = receipt_ref(sealed.receipt_id, sealed.replay_hash, decision);
        crate::store::Finish {
            result: serde_json::to_string(&r).ok(),
            events: lifecycle_events(&r.receipt, &announce),
        }
    });
    w.obstructions = lc.new_obstructions;
    w.repair_plans = lc.new_plans;
    let c = match state.store.commit_operation(w).await {
        Ok(c) => c,
        // Another release of this id committed first: answer with it (or the 409 of a
        // different action under the same id), as a release sent after it would be answered.
        Err(crate::store::StoreError::Conflict(m)) => {
            return match earlier_release(state, tenant, action_id, &req).await? {
                Some(resp) => Ok(resp),
                None => Err(ApiError::conflict(m)),
            };
        }
        Err(e) => return Err(e.into()),
    };
    resp.receipt = receipt_ref(c.id, &c.replay_hash, v.decision);
    Ok(resp)
}

/// The answer an action id already has: its release's answer when it was released, a 409 when
/// the id names another kind or target; `None` when it is new or was obstructed (evaluated
/// afresh).
async fn earlier_release(
    state: &AppState,
    tenant: Uuid,
    action_id: Uuid,
    req: &ActionReleaseRequest,
) -> Result<Option<ActionReleaseResponse>, ApiError> {
    let Some(row) = state.store.action_row(tenant, action_id).await? else {
        return Ok(None);
    };
    if row.kind != req.action.kind.as_str() || row.target != req.action.target {
        return Err(ApiError::conflict(format!(
            "action {action_id} is a {} of {:?}; a different action needs a different id",
            row.kind, row.target
        )));
    }
    if row.status != "released" {
        return Ok(None);
    }
    let Ok(receipt) = Uuid::parse_str(&row.receipt_id) else {
        return Ok(None);
    };
    Ok(state
        .store
        .get_receipt(tenant, receipt)
        .await?
        .and_then(|r| r.result)
        .and_then(|t| serde_json::from_str::<ActionReleaseResponse>(&t).ok()))
}
