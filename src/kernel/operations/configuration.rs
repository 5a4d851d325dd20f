//! A candidate governed configuration: traces meant to act together (a
//! memory plus the policy it relies on, a plan plus its sources). Checked as
//! a whole: members that may not act (quarantined, revoked, superseded, or
//! derived from revoked content), members whose influence is below what the
//! configuration needs, contradictions between members, the weakest authority
//! in the chain (members and what they were derived from), and the boundaries
//! crossed when members of a lax substrate feed a strict one.

use super::super::outcome_of;
use super::super::policy::CompiledPolicy;
use super::super::types::*;
use super::claims::first_contradiction;
use super::{
    authority_step, requirement_of, round, step, verdict, worst, Gap, TraceFacts, Verdict,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A trace a member was derived from (through the dependency graph).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AncestorFacts {
    pub trace_id: Uuid,
    #[serde(default)]
    pub phase: Option<TracePhase>,
    pub authority: f64,
    pub depth: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberFacts {
    /// The reference as the caller wrote it.
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default)]
    pub role: Option<String>,
    pub trace: TraceFacts,
    #[serde(default)]
    pub lineage: Vec<AncestorFacts>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationInput {
    pub configuration_id: Uuid,
    /// Seeds obstruction ids: the same members in the same state open the same obstructions.
    pub key: String,
    pub members: Vec<MemberFacts>,
    #[serde(default)]
    pub target_substrate: Option<TargetSubstrate>,
    #[serde(default)]
    pub proposed_mutation: Option<ProposedMutation>,
    pub required_influence: AllowedInfluence,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeakestLink {
    /// The member (as referenced) whose chain holds the weakest authority.
    pub member: String,
    pub trace_id: Uuid,
    pub authority: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Boundary {
    pub member: String,
    pub from_substrate: TargetSubstrate,
    pub to_substrate: TargetSubstrate,
    pub from_min_authority: f64,
    pub to_min_authority: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Conflict {
    pub members: Vec<String>,
    pub obstruction_type: ObstructionType,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberView {
    pub member: String,
    pub trace: Trace,
    pub authority: f64,
    pub eligible: bool,
    pub reason_codes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigurationOutput {
    pub verdict: Verdict,
    pub target_substrate: TargetSubstrate,
    pub required_authority: f64,
    pub weakest: Option<WeakestLink>,
    pub boundaries: Vec<Boundary>,
    pub conflicts: Vec<Conflict>,
    pub members: Vec<MemberView>,
}

fn mutation_of(t: &TraceFacts) -> ProposedMutation {
    t.signals
        .first()
        .map(|s| s.mutation)
        .unwrap_or(ProposedMutation::CreateTrace)
}

pub fn evaluate(input: &ConfigurationInput, policy: &CompiledPolicy) -> ConfigurationOutput {
    let mut decision = RuntimeDecision::Allow;
    let mut reasons: Vec<String> = Vec::new();
    let mut gaps: Vec<Gap> = Vec::new();
    let mut views = Vec::with_capacity(input.members.len());

    // The substrate the configuration acts on: the one named, else the strictest member's.
    let member_req = |m: &MemberFacts| {
        let s = m.trace.substrate_or(TargetSubstrate::AgentMemory);
        (s, requirement_of(policy, s, mutation_of(&m.trace)).0)
    };
    let (target, required_authority) = match input.target_substrate {
        Some(t) => {
            let m = input
                .proposed_mutation
                .unwrap_or(ProposedMutation::UpdateTrace);
            (t, requirement_of(policy, t, m).0)
        }
        None => input
            .members
            .iter()
            .map(member_req)
            .fold(None::<(TargetSubstrate, f64)>, |acc, x| match acc {
                Some(a) if a.1 >= x.1 => Some(a),
                _ => Some(x),
            })
            .unwrap_or((TargetSubstrate::AgentMemory, 0.0)),
    };

    let mut weakest: Option<WeakestLink> = None;
    let mut boundaries = Vec::new();
    for m in &input.members {
        let t = &m.trace;
        let phase = t.phase_or_observed();
        let mut why = Vec::new();
        let mut eligible = true;
        let tid = t.trace_id.to_string();
        let member_target = (ObstructionTargetType::Trace, tid.clone());
        match phase {
            TracePhase::Revoked | TracePhase::Tombstoned => {
                eligible = false;
                why.push(format!("member_{}", phase.as_str()));
                decision = worst(decision, RuntimeDecision::Block);
                gaps.push(
                    Gap::new(
                        ObstructionType::RevocationRequired,
                        Severity::High,
                        member_target.clone(),
                        format!(
                            "Member {} is {}; a configuration cannot act on revoked content.",
                            m.reference,
                            phase.as_str()
                        ),
                        RepairClass::Substitution,
                    )
                    .candidates(&[
                        RepairClass::Substitution,
                        RepairClass::DependencyInvalidation,
                        RepairClass::ScopeReduction,
                    ])
                    .expected(ExpectedOutcome::Route)
                    .step(step(
                        "replace-member",
                        format!(
                            "Replace {} with a live trace, or drop it from the configuration.",
                            m.reference
                        ),
                        "every member may act",
                    )),
                );
            }
            TracePhase::Quarantined => {
                eligible = false;
                why.push("member_quarantined".into());
                decision = worst(decision, RuntimeDecision::RequireReview);
                gaps.push(
                    Gap::new(
                        ObstructionType::CoherenceDeficit,
                        Severity::High,
                        member_target.clone(),
                        format!("Member {} is held in quarantine; the configuration waits for its review.", m.reference),
                        RepairClass::ManualReview,
                    )
                    .candidates(&[RepairClass::ManualReview, RepairClass::Substitution, RepairClass::ScopeReduction])
                    .approvals(&["security_reviewer"])
                    .expected(ExpectedOutcome::ManualResolutionRequired)
                    .step(step("review-member", "Review the held member: release it or replace it.", "every member may act")),
                );
            }
            TracePhase::Superseded => {
                eligible = false;
                why.push("member_superseded".into());
                decision = worst(decision, RuntimeDecision::Repair);
                gaps.push(
                    Gap::new(
                        ObstructionType::StaleBasis,
                        Severity::Moderate,
                        member_target.clone(),
                        format!(
                            "Member {} has been superseded by newer content.",
                            m.reference
                        ),
                        RepairClass::Substitution,
                    )
                    .step(step(
                        "use-successor",
                        "Use the trace that superseded it.",
                        "the configuration rests on current content",
                    )),
                );
            }
            _ => {}
        }
        // Derived from content that may no longer act.
        if let Some(a) = m.lineage.iter().find(|a| {
            matches!(
                a.phase,
                Some(TracePhase::Revoked | TracePhase::Tombstoned | TracePhase::Quarantined)
            )
        }) {
            let held = a.phase == Some(TracePhase::Quarantined);
            eligible = false;
            why.push(if held {
                "derived_from_quarantined".into()
            } else {
                "derived_from_revoked".into()
            });
            decision = worst(
                decision,
                if held {
                    RuntimeDecision::RequireReview
                } else {
                    RuntimeDecision::Block
                },
            );
            gaps.push(
                Gap::new(
                    ObstructionType::RevocationRequired,
                    Severity::High,
                    member_target.clone(),
                    format!(
                        "Member {} was derived from trace {} which is {}; what rests on it must be revisited.",
                        m.reference,
                        a.trace_id,
                        a.phase.map(|p| p.as_str()).unwrap_or("observed")
                    ),
                    RepairClass::DependencyInvalidation,
                )
                .candidates(&[RepairClass::DependencyInvalidation, RepairClass::Substitution])
                .expected(ExpectedOutcome::Revoke)
                .step(step("reverse-basis", format!("Evaluate the reversal of {} and revoke its dependents.", a.trace_id), "no member rests on revoked content")),
            );
        }
        if eligible && t.influence < input.required_influence {
            eligible = false;
            why.push("influence_below_requirement".into());
            decision = worst(decision, RuntimeDecision::Repair);
            let canon = input.required_influence >= AllowedInfluence::CanonicalMemory;
            gaps.push(
                Gap::new(
                    if canon {
                        ObstructionType::CanonicalizationFailure
                    } else {
                        ObstructionType::AuthorityGap
                    },
                    Severity::Moderate,
                    member_target.clone(),
                    format!(
                        "Member {} carries influence {}; the configuration needs {}.",
                        m.reference,
                        t.influence.as_str(),
                        input.required_influence.as_str()
                    ),
                    if canon {
                        RepairClass::Recanonicalization
                    } else {
                        RepairClass::Recertification
                    },
                )
                .candidates(&[RepairClass::Recanonicalization, RepairClass::Recertification, RepairClass::Substitution])
                .step(step("promote-member", format!("Evaluate the canonicalization of {} and promote it through its repair plan.", t.trace_id), "the member carries the influence the configuration needs")),
            );
        } else if eligible
            && matches!(
                phase,
                TracePhase::Untrusted | TracePhase::Observed | TracePhase::Ephemeral
            )
        {
            why.push(format!("member_{}", phase.as_str()));
            decision = worst(decision, RuntimeDecision::AllowWithWarning);
        }

        // Authority of the chain: the member and everything it was derived from.
        let own = t.authority();
        let mut chain_min = (own, t.trace_id);
        for a in &m.lineage {
            if a.authority < chain_min.0 {
                chain_min = (a.authority, a.trace_id);
            }
        }
        if weakest.as_ref().is_none_or(|w| chain_min.0 < w.authority) {
            weakest = Some(WeakestLink {
                member: m.reference.clone(),
                trace_id: chain_min.1,
                authority: round(chain_min.0),
            });
        }
        // A member from a laxer substrate acting within a stricter one crosses a boundary.
        let (ms, mreq) = member_req(m);
        if ms != target && mreq < required_authority {
            boundaries.push(Boundary {
                member: m.reference.clone(),
                from_substrate: ms,
                to_substrate: target,
                from_min_authority: mreq,
                to_min_authority: required_authority,
            });
        }
        views.push(MemberView {
            member: m.reference.clone(),
            trace: t.view(),
            authority: round(own),
            eligible,
            reason_codes: why,
        });
    }

    if let Some(w) = &weakest {
        if w.authority + 1e-9 < required_authority {
            let crossed = !boundaries.is_empty();
            reasons.push("weakest_authority_below_requirement".into());
            decision = worst(decision, RuntimeDecision::Repair);
            gaps.push(
                Gap::new(
                    if crossed {
                        ObstructionType::ScopeViolation
                    } else {
                        ObstructionType::AuthorityGap
                    },
                    Severity::High,
                    (ObstructionTargetType::Trace, w.trace_id.to_string()),
                    format!(
                        "The weakest authority in the chain is {:.2} (through {}); acting within {} requires {:.2}.{}",
                        w.authority,
                        w.member,
                        target.as_str(),
                        required_authority,
                        if crossed { " Content crosses from a laxer substrate into a stricter one." } else { "" }
                    ),
                    RepairClass::AuthorityRerouting,
                )
                .candidates(&[RepairClass::AuthorityRerouting, RepairClass::ScopeReduction, RepairClass::Substitution])
                .approvals(&[&format!("{}_owner", target.as_str())])
                .step(authority_step(
                    "obtain-authority",
                    format!("Have a principal with authority of at least {required_authority:.2} for {} vouch for the weakest link, or drop it.", target.as_str()),
                    "every link of the chain carries the authority the target requires",
                    &format!("{}_owner", target.as_str()),
                    required_authority,
                )),
            );
        }
    }
    if !boundaries.is_empty() {
        reasons.push("boundary_crossed".into());
    }

    // Contradictions between members.
    let mut conflicts = Vec::new();
    for (i, a) in input.members.iter().enumerate() {
        for b in input.members.iter().skip(i + 1) {
            let ca: Vec<_> = a
                .trace
                .signals
                .iter()
                .flat_map(|s| s.claims.clone())
                .collect();
            let cb: Vec<_> = b
                .trace
                .signals
                .iter()
                .flat_map(|s| s.claims.clone())
                .collect();
            let Some((x, y)) = first_contradiction(&ca, &cb) else {
                continue;
            };
            let is_policy = |m: &MemberFacts| {
                m.trace.substrate == Some(TargetSubstrate::PolicyCorpus)
                    || m.trace
                        .signals
                        .iter()
                        .any(|s| s.event_type == Some(EventType::PolicyClaim))
            };
            let kind = if is_policy(a) || is_policy(b) {
                ObstructionType::PolicyConflict
            } else {
                ObstructionType::ContradictionUnresolved
            };
            let detail = format!("{:?} contradicts {:?}", x.text, y.text);
            reasons.push(format!("{}_between_members", kind.as_str()));
            decision = worst(decision, RuntimeDecision::Escalate);
            gaps.push(
                Gap::new(
                    kind,
                    Severity::High,
                    (ObstructionTargetType::Trace, a.trace.trace_id.to_string()),
                    format!(
                        "Members {} and {} contradict each other: {detail}.",
                        a.reference, b.reference
                    ),
                    if kind == ObstructionType::PolicyConflict {
                        RepairClass::PolicyClarification
                    } else {
                        RepairClass::ContradictionResolution
                    },
                )
                .candidates(&[
                    RepairClass::PolicyClarification,
                    RepairClass::ContradictionResolution,
                    RepairClass::ScopeReduction,
                ])
                .approvals(&[&format!("{}_owner", target.as_str())])
                .expected(ExpectedOutcome::ManualResolutionRequired)
                .step(step(
                    "resolve-contradiction",
                    "An owner decides which claim holds and supersedes or revokes the other.",
                    "the members agree",
                )),
            );
            conflicts.push(Conflict {
                members: vec![a.reference.clone(), b.reference.clone()],
                obstruction_type: kind,
                detail,
            });
        }
    }

    let outcome = outcome_of(decision).0;
    ConfigurationOutput {
        verdict: verdict(
            "configuration",
            &input.key,
            decision,
            outcome,
            reasons,
            gaps,
        ),
        target_substrate: target,
        required_authority,
        weakest,
        boundaries,
        conflicts,
        members: views,
    }
}

#[cfg(test)]
mod tests {
    use super::super::claims::extract;
    use super::super::testutil::*;
    use super::*;

    fn member(reference: &str, t: TraceFacts) -> MemberFacts {
        MemberFacts {
            reference: reference.into(),
            role: None,
            trace: t,
            lineage: vec![],
        }
    }

    fn input(members: Vec<MemberFacts>, target: Option<TargetSubstrate>) -> ConfigurationInput {
        ConfigurationInput {
            configuration_id: Uuid::from_u128(99),
            key: "k".into(),
            members,
            target_substrate: target,
            proposed_mutation: None,
            required_influence: AllowedInfluence::AcceptedContext,
        }
    }

    #[test]
    fn accepted_members_with_authority_act_together() {
        let a = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![signal(1, TargetSubstrate::AgentMemory, 0.5, 0.9)],
        );
        let b = trace(
            2,
            Some(TracePhase::Accepted),
            TargetSubstrate::RagStore,
            vec![signal(2, TargetSubstrate::RagStore, 0.2, 0.6)],
        );
        let out = evaluate(
            &input(vec![member("a", a), member("b", b)], None),
            &policy(),
        );
        assert_eq!(out.verdict.decision, RuntimeDecision::Allow);
        assert!(out.verdict.obstructions.is_empty());
        let w = out.weakest.unwrap();
        assert_eq!(w.member, "b");
    }

    #[test]
    fn memory_feeding_the_policy_corpus_crosses_a_boundary() {
        let mut pol = signal(1, TargetSubstrate::PolicyCorpus, 0.9, 0.9);
        pol.mutation = ProposedMutation::UpdatePolicy;
        let p = trace(
            1,
            Some(TracePhase::Canonical),
            TargetSubstrate::PolicyCorpus,
            vec![pol],
        );
        let m = trace(
            2,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![signal(2, TargetSubstrate::AgentMemory, 0.0, 0.5)],
        );
        let out = evaluate(
            &input(vec![member("policy", p), member("memory", m)], None),
            &policy(),
        );
        assert_eq!(out.target_substrate, TargetSubstrate::PolicyCorpus);
        assert_eq!(out.boundaries.len(), 1);
        assert_eq!(out.verdict.decision, RuntimeDecision::Repair);
        assert_eq!(out.verdict.outcome, GovernanceOutcome::RepairRequired);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::ScopeViolation
        );
        assert_eq!(
            out.verdict.repair_plans[0].repair_class,
            RepairClass::AuthorityRerouting
        );
    }

    #[test]
    fn revoked_member_or_revoked_ancestry_blocks() {
        let a = trace(
            1,
            Some(TracePhase::Revoked),
            TargetSubstrate::AgentMemory,
            vec![],
        );
        let out = evaluate(&input(vec![member("a", a)], None), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Block);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::RevocationRequired
        );

        let mut b = member(
            "b",
            trace(
                2,
                Some(TracePhase::Accepted),
                TargetSubstrate::AgentMemory,
                vec![],
            ),
        );
        b.lineage.push(AncestorFacts {
            trace_id: Uuid::from_u128(7),
            phase: Some(TracePhase::Revoked),
            authority: 0.0,
            depth: 1,
        });
        let out = evaluate(&input(vec![b], None), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Block);
        assert!(out.members[0]
            .reason_codes
            .contains(&"derived_from_revoked".to_string()));
    }

    #[test]
    fn contradictory_policy_claims_escalate() {
        let mut s1 = signal(1, TargetSubstrate::PolicyCorpus, 0.9, 0.9);
        s1.claims = extract("Refunds must be approved by a manager.");
        let mut s2 = signal(2, TargetSubstrate::AgentMemory, 0.9, 0.9);
        s2.claims = extract("Refunds must not be approved by a manager.");
        let a = trace(
            1,
            Some(TracePhase::Canonical),
            TargetSubstrate::PolicyCorpus,
            vec![s1],
        );
        let b = trace(
            2,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![s2],
        );
        let out = evaluate(
            &input(
                vec![member("a", a), member("b", b)],
                Some(TargetSubstrate::AgentMemory),
            ),
            &policy(),
        );
        assert_eq!(out.verdict.decision, RuntimeDecision::Escalate);
        assert_eq!(out.conflicts.len(), 1);
        assert_eq!(
            out.conflicts[0].obstruction_type,
            ObstructionType::PolicyConflict
        );
    }

    #[test]
    fn influence_below_requirement_needs_repair() {
        let a = trace(
            1,
            Some(TracePhase::Untrusted),
            TargetSubstrate::AgentMemory,
            vec![],
        );
        let out = evaluate(
            &input(vec![member("a", a)], Some(TargetSubstrate::AgentMemory)),
            &policy(),
        );
        assert_eq!(out.verdict.decision, RuntimeDecision::Repair);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::AuthorityGap
        );
        assert!(!out.members[0].eligible);
    }
}
