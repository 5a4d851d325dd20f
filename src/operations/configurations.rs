//! `POST /substrate/configurations/evaluate`: loads each member's trace and
//! lineage, runs [`configuration::evaluate`], journals the receipt with the
//! obstructions and plans it opens.

use super::types::{ConfigurationEvaluateRequest, ConfigurationEvaluateResponse};
use super::*;
use crate::kernel::operations::configuration::{self, ConfigurationInput, MemberFacts};
use crate::store::OperationWrite;

pub async fn evaluate(
    state: &AppState,
    principal: &Principal,
    req: ConfigurationEvaluateRequest,
) -> Result<ConfigurationEvaluateResponse, ApiError> {
    check_len(&req.members, "members", 1, 100)?;
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let mut members = Vec::with_capacity(req.members.len());
    let mut seen = HashSet::new();
    for (i, m) in req.members.iter().enumerate() {
        let field = format!("members[{i}].ref");
        let facts = resolve_trace(state, tenant, &m.reference, &field).await?;
        if !seen.insert(facts.trace_id) {
            return Err(ApiError::field(
                field,
                format!("names trace {} a second time", facts.trace_id),
            ));
        }
        let lineage = graph::lineage(state, tenant, &facts).await?;
        members.push(MemberFacts {
            reference: m.reference.clone(),
            role: m.role.clone(),
            trace: facts,
            lineage,
        });
    }
    let required = req
        .required_influence
        .unwrap_or(AllowedInfluence::AcceptedContext);
    // The same members in the same states give the same configuration id and obstructions.
    let key = crate::receipts::sha256_hex(
        serde_json::to_string(&(
            tenant,
            &members
                .iter()
                .map(|m| {
                    (
                        m.trace.trace_id,
                        m.trace.phase,
                        m.lineage
                            .iter()
                            .map(|a| (a.trace_id, a.phase))
                            .collect::<Vec<_>>(),
                    )
                })
                .collect::<Vec<_>>(),
            req.target_substrate,
            req.proposed_mutation,
            required,
        ))
        .unwrap_or_default()
        .as_bytes(),
    );
    let input = ConfigurationInput {
        configuration_id: crate::kernel::operations::mint("configuration", &key, "id"),
        key,
        members,
        target_substrate: req.target_substrate,
        proposed_mutation: req.proposed_mutation,
        required_influence: required,
    };
    let out = configuration::evaluate(&input, &policy);
    let v = &out.verdict;
    let receipt_id = Uuid::new_v4();
    let lc = lifecycle_rows(state, tenant, v, None, None).await?;
    let material = OperationMaterial::Configuration(input.clone());
    let subject = json!({
        "configurationId": input.configuration_id,
        "members": input.members.iter().map(|m| json!({"ref": m.reference, "traceId": m.trace.trace_id, "phase": m.trace.phase})).collect::<Vec<_>>(),
        "targetSubstrate": out.target_substrate,
        "requiredAuthority": out.required_authority,
        "weakestAuthority": out.weakest,
    });
    let deps: Vec<Uuid> = vec![];
    let mut w = OperationWrite::new(
        tenant,
        receipt_id,
        "configuration",
        content(
            "configuration",
            receipt_id,
            principal,
            &policy,
            v,
            &material,
            subject,
            &[],
            &deps,
        ),
    );
    w.decision = v.decision.as_str().into();
    w.outcome = v.outcome.as_str().into();
    w.refused = !matches!(
        v.decision,
        RuntimeDecision::Allow | RuntimeDecision::AllowWithWarning
    );
    w.finish = finish_with(v.decision, lc.announce(), |_| vec![]);
    w.obstructions = lc.new_obstructions;
    w.repair_plans = lc.new_plans;
    let c = state.store.commit_operation(w).await?;
    Ok(ConfigurationEvaluateResponse {
        configuration_id: input.configuration_id,
        decision: v.decision,
        governance_decision: governance(input.configuration_id, c.id, v, None),
        target_substrate: out.target_substrate,
        required_authority: out.required_authority,
        required_influence: required,
        weakest_authority: out.weakest.clone(),
        boundaries: out.boundaries.clone(),
        conflicts: out.conflicts.clone(),
        members: out.members.clone(),
        obstructions: lc.obstructions,
        repair_plans: lc.repair_plans,
        receipt: receipt_ref(c.id, &c.replay_hash, v.decision),
        reason_codes: v.reason_codes.clone(),
    })
}
