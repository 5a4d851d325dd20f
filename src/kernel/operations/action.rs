//! Protected-action release: a tool execution, a disclosure or a deployment
//! is released only when every trace it rests on may serve as
//! `execution_basis`, and the requesting key has the authority the policy
//! asks for that action. Anything else is an obstruction with a repair plan.

use super::super::policy::CompiledPolicy;
use super::super::types::*;
use super::{authority_step, requirement_of, step, verdict, worst, Gap, TraceFacts, Verdict};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    ExecuteTool,
    ReleaseDisclosure,
    DeployCode,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::ExecuteTool => "execute_tool",
            ActionKind::ReleaseDisclosure => "release_disclosure",
            ActionKind::DeployCode => "deploy_code",
        }
    }
    /// Where the policy's requirement for the action is looked up.
    pub fn requirement_key(self) -> (TargetSubstrate, ProposedMutation) {
        match self {
            ActionKind::ExecuteTool => (
                TargetSubstrate::ExecutionBoundary,
                ProposedMutation::ExecuteTool,
            ),
            ActionKind::ReleaseDisclosure => (
                TargetSubstrate::ExecutionBoundary,
                ProposedMutation::ReleaseAction,
            ),
            ActionKind::DeployCode => {
                (TargetSubstrate::CodeSubstrate, ProposedMutation::DeployCode)
            }
        }
    }
    fn obstruction_target(self) -> ObstructionTargetType {
        match self {
            ActionKind::ExecuteTool => ObstructionTargetType::Action,
            ActionKind::ReleaseDisclosure => ObstructionTargetType::Disclosure,
            ActionKind::DeployCode => ObstructionTargetType::CodeChange,
        }
    }
}

/// Influence every basis trace of an action must carry.
pub fn required_basis_influence(_kind: ActionKind) -> AllowedInfluence {
    AllowedInfluence::ExecutionBasis
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasisFacts {
    /// The reference as the caller wrote it.
    #[serde(rename = "ref")]
    pub reference: String,
    pub trace: TraceFacts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionInput {
    /// The requesting tenant: action ids are the caller's choice, so the ids minted from one
    /// are scoped by tenant (two tenants may pick the same action id).
    #[serde(default)]
    pub tenant: Uuid,
    pub action_id: Uuid,
    pub kind: ActionKind,
    pub target: String,
    pub basis: Vec<BasisFacts>,
    pub principal_ceiling: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BasisView {
    #[serde(rename = "ref")]
    pub reference: String,
    pub trace: Trace,
    pub eligible: bool,
    pub reason_codes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ActionOutput {
    pub verdict: Verdict,
    pub released: bool,
    pub required_influence: AllowedInfluence,
    pub required_authority: f64,
    pub basis: Vec<BasisView>,
}

pub fn evaluate(input: &ActionInput, policy: &CompiledPolicy) -> ActionOutput {
    let required = required_basis_influence(input.kind);
    let (substrate, mutation) = input.kind.requirement_key();
    let (min_authority, _, _) = requirement_of(policy, substrate, mutation);
    let key = input.action_id.to_string();
    let action_target = (input.kind.obstruction_target(), key.clone());
    let owner = format!("{}_owner", substrate.as_str());
    let mut decision = RuntimeDecision::Allow;
    let mut reasons = Vec::new();
    let mut gaps = Vec::new();
    let mut views = Vec::with_capacity(input.basis.len());

    for b in &input.basis {
        let t = &b.trace;
        let phase = t.phase_or_observed();
        let mut why = Vec::new();
        match phase {
            TracePhase::Revoked | TracePhase::Tombstoned | TracePhase::Quarantined => {
                let held = phase == TracePhase::Quarantined;
                why.push(if held {
                    "basis_quarantined".to_string()
                } else {
                    "basis_revoked".to_string()
                });
                decision = worst(decision, RuntimeDecision::Block);
                gaps.push(
                    Gap::new(
                        ObstructionType::UnsafeActionBasis,
                        Severity::Critical,
                        action_target.clone(),
                        format!(
                            "The {} of {:?} rests on trace {} which is {}; it may not serve as a basis for action.",
                            input.kind.as_str(), input.target, t.trace_id, phase.as_str()
                        ),
                        if held { RepairClass::ManualReview } else { RepairClass::Substitution },
                    )
                    .candidates(&[RepairClass::Substitution, RepairClass::ScopeReduction, RepairClass::ManualReview])
                    .expected(if held { ExpectedOutcome::ManualResolutionRequired } else { ExpectedOutcome::Route })
                    .step(step(
                        "replace-basis",
                        format!("Base the action on live content instead of {}.", b.reference),
                        "every basis trace may serve as execution basis",
                    )),
                );
            }
            TracePhase::Superseded => {
                why.push("basis_superseded".into());
                decision = worst(decision, RuntimeDecision::Repair);
                gaps.push(
                    Gap::new(
                        ObstructionType::StaleBasis,
                        Severity::High,
                        action_target.clone(),
                        format!("Basis trace {} has been superseded; the action would rest on stale content.", t.trace_id),
                        RepairClass::Substitution,
                    )
                    .step(step("use-successor", "Base the action on the trace that superseded it.", "the action rests on current content")),
                );
            }
            _ if t.influence < required => {
                why.push(if t.phase.is_none() {
                    "basis_not_evaluated".to_string()
                } else {
                    "basis_influence_below_execution_basis".to_string()
                });
                decision = worst(decision, RuntimeDecision::Repair);
                let canonical_possible = matches!(
                    t.substrate,
                    Some(TargetSubstrate::ExecutionBoundary | TargetSubstrate::CodeSubstrate)
                );
                gaps.push(
                    Gap::new(
                        ObstructionType::UnsafeActionBasis,
                        Severity::High,
                        action_target.clone(),
                        format!(
                            "Basis trace {} ({}, {}) carries influence {}; releasing {} needs {} from every basis trace.",
                            t.trace_id,
                            t.substrate.map(|s| s.as_str()).unwrap_or("unknown substrate"),
                            phase.as_str(),
                            t.influence.as_str(),
                            input.kind.as_str(),
                            required.as_str()
                        ),
                        if canonical_possible { RepairClass::Recanonicalization } else { RepairClass::Substitution },
                    )
                    .candidates(&[RepairClass::Recanonicalization, RepairClass::AuthorityRerouting, RepairClass::Substitution])
                    .approvals(&[&owner])
                    .step(authority_step(
                        "establish-basis",
                        if canonical_possible {
                            format!("Canonicalize {} (canonicalization/evaluate with apply) with authority of at least {min_authority:.2}.", t.trace_id)
                        } else {
                            format!("Record the decision to act as a canonical {} trace (with authority of at least {min_authority:.2}) derived from {}, and base the action on it.", substrate.as_str(), t.trace_id)
                        },
                        "every basis trace may serve as execution basis",
                        &owner,
                        min_authority,
                    )),
                );
            }
            _ => {}
        }
        views.push(BasisView {
            reference: b.reference.clone(),
            trace: t.view(),
            eligible: why.is_empty(),
            reason_codes: why,
        });
    }
    if input.principal_ceiling + 1e-9 < min_authority {
        reasons.push("principal_authority_below_requirement".to_string());
        decision = worst(decision, RuntimeDecision::Repair);
        gaps.push(
            Gap::new(
                ObstructionType::AuthorityGap,
                Severity::High,
                action_target.clone(),
                format!(
                    "Releasing {} requires authority {:.2}; the requesting key has {:.2}.",
                    input.kind.as_str(),
                    min_authority,
                    input.principal_ceiling
                ),
                RepairClass::AuthorityRerouting,
            )
            .candidates(&[RepairClass::AuthorityRerouting, RepairClass::Escalation])
            .approvals(&[&owner])
            .step(authority_step(
                "request-with-authority",
                "Have a principal with the required authority request the release.",
                "the release is requested with authority",
                &owner,
                min_authority,
            )),
        );
    }
    for v in &views {
        for r in &v.reason_codes {
            reasons.push(r.clone());
        }
    }
    let released = decision == RuntimeDecision::Allow;
    let outcome = match decision {
        RuntimeDecision::Allow => GovernanceOutcome::Allow,
        RuntimeDecision::Block => GovernanceOutcome::Deny,
        _ => GovernanceOutcome::RepairRequired,
    };
    if released {
        reasons.push("released".into());
    }
    ActionOutput {
        verdict: verdict(
            "action_release",
            &format!("{}:{key}", input.tenant),
            decision,
            outcome,
            reasons,
            gaps,
        ),
        released,
        required_influence: required,
        required_authority: min_authority,
        basis: views,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    fn input(basis: Vec<TraceFacts>, ceiling: f64) -> ActionInput {
        ActionInput {
            tenant: Uuid::from_u128(1),
            action_id: Uuid::from_u128(77),
            kind: ActionKind::ExecuteTool,
            target: "payments.transfer".into(),
            basis: basis
                .into_iter()
                .map(|t| BasisFacts {
                    reference: t.trace_id.to_string(),
                    trace: t,
                })
                .collect(),
            principal_ceiling: ceiling,
        }
    }

    #[test]
    fn canonical_execution_boundary_basis_releases() {
        let t = trace(
            1,
            Some(TracePhase::Canonical),
            TargetSubstrate::ExecutionBoundary,
            vec![],
        );
        assert_eq!(t.influence, AllowedInfluence::ExecutionBasis);
        let out = evaluate(&input(vec![t], 0.9), &policy());
        assert!(out.released);
        assert_eq!(out.verdict.decision, RuntimeDecision::Allow);
        assert!(out.verdict.obstructions.is_empty());
    }

    #[test]
    fn memory_basis_is_not_an_execution_basis() {
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![],
        );
        let out = evaluate(&input(vec![t], 0.9), &policy());
        assert!(!out.released);
        assert_eq!(out.verdict.decision, RuntimeDecision::Repair);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::UnsafeActionBasis
        );
        assert_eq!(
            out.verdict.repair_plans[0].repair_class,
            RepairClass::Substitution
        );
    }

    #[test]
    fn revoked_basis_blocks_and_weak_key_is_an_authority_gap() {
        let ok = trace(
            1,
            Some(TracePhase::Canonical),
            TargetSubstrate::ExecutionBoundary,
            vec![],
        );
        let gone = trace(
            2,
            Some(TracePhase::Revoked),
            TargetSubstrate::ExecutionBoundary,
            vec![],
        );
        let out = evaluate(&input(vec![ok.clone(), gone], 0.9), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Block);
        assert_eq!(out.verdict.outcome, GovernanceOutcome::Deny);
        assert!(out.basis[0].eligible && !out.basis[1].eligible);
        let out = evaluate(&input(vec![ok], 0.5), &policy());
        assert!(!out.released);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::AuthorityGap
        );
    }
}
