//! Promotion of a trace toward `accepted`, `canonical` or `crystallized`:
//! authority, evidence, maturity (age since observation, corroboration by
//! independent sources and evidence) and contradictions with what is already
//! canonical. Answers the transition it would make and what is missing. It
//! promotes only when asked to (`apply`) by a principal whose authority meets
//! the policy's requirement, or when an approved repair plan re-runs it with
//! the approver's authority and the approved obstructions waived.

use super::super::policy::CompiledPolicy;
use super::super::transitions;
use super::super::types::*;
use super::claims::{first_contradiction, Claim};
use super::{
    authority_step, mint, requirement_of, round, seconds_between, step, verdict, Gap, PlanEffect,
    TraceFacts, Verdict,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use uuid::Uuid;

/// Maturity a target phase asks for: minimum age in seconds and minimum
/// corroboration (distinct sources plus distinct evidence references).
pub fn maturity(target: TracePhase) -> (i64, usize) {
    match target {
        TracePhase::Crystallized => (86_400, 3),
        TracePhase::Canonical => (3_600, 2),
        _ => (0, 1),
    }
}

/// The mutation whose policy requirement governs a promotion to `target`.
pub fn mutation_for(target: TracePhase) -> ProposedMutation {
    match target {
        TracePhase::Accepted => ProposedMutation::PromoteTrace,
        _ => ProposedMutation::CanonicalizeTrace,
    }
}

pub const TARGETS: &[TracePhase] = &[
    TracePhase::Accepted,
    TracePhase::Canonical,
    TracePhase::Crystallized,
];

fn rank(p: TracePhase) -> u8 {
    use TracePhase as P;
    match p {
        P::Observed | P::Ephemeral => 0,
        P::Untrusted => 1,
        P::Working => 2,
        P::Accepted => 3,
        P::Locked => 4,
        P::Canonical => 5,
        P::Crystallized => 6,
        P::Quarantined | P::Superseded | P::Revoked | P::Tombstoned => 0,
    }
}

/// A canonical trace of the same substrate, with its claims.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerFacts {
    pub trace_id: Uuid,
    pub phase: TracePhase,
    #[serde(default)]
    pub claims: Vec<Claim>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanonicalizationInput {
    /// Names the trace's state (its last receipt): seeds the obstruction ids.
    pub key: String,
    pub trace: TraceFacts,
    pub target_phase: TracePhase,
    /// The gate's clock when the request was decided.
    pub now: String,
    /// When the trace entered its current phase.
    #[serde(default)]
    pub phase_since: Option<String>,
    #[serde(default)]
    pub peers: Vec<PeerFacts>,
    pub apply: bool,
    pub principal_ceiling: f64,
    /// Obstruction types an approved repair plan of this promotion has waived.
    #[serde(default)]
    pub waived: Vec<ObstructionType>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assessment {
    pub authority: f64,
    pub required_authority: f64,
    pub evidence: usize,
    pub required_evidence: u32,
    pub corroboration: usize,
    pub required_corroboration: usize,
    pub age_seconds: i64,
    pub required_age_seconds: i64,
    pub contradictions: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalizationOutput {
    pub verdict: Verdict,
    pub transition: Transition,
    /// The trace moves now (apply, or an approval, with nothing missing).
    pub promote: bool,
    /// Canonical traces the promotion supersedes (a contradiction resolved by approval).
    pub supersede: Vec<Uuid>,
    pub assessment: Assessment,
    /// Binds the obstructions of this attempt together (plan effects name it).
    pub group: Uuid,
}

pub fn evaluate(input: &CanonicalizationInput, policy: &CompiledPolicy) -> CanonicalizationOutput {
    let t = &input.trace;
    let target = input.target_phase;
    let substrate = t.substrate_or(TargetSubstrate::AgentMemory);
    let from = t.phase_or_observed();
    let key = format!("{}:{}:{}", input.key, t.trace_id, target.as_str());
    let group = mint("canonicalization", &key, "group");
    let (min_authority, req_evidence, max_influence) =
        requirement_of(policy, substrate, mutation_for(target));
    let min_evidence = if target == TracePhase::Crystallized {
        req_evidence + 1
    } else {
        req_evidence
    };
    let (min_age, min_corroboration) = maturity(target);
    let to_influence = transitions::phase_ceiling(target, substrate).min(max_influence);

    // Assessment.
    let content_authority = t.authority();
    let authority = if input.apply {
        content_authority.max(input.principal_ceiling)
    } else {
        content_authority
    };
    let evidence: BTreeSet<&str> = t
        .signals
        .iter()
        .flat_map(|s| s.evidence_refs.iter().map(String::as_str))
        .collect();
    let sources: BTreeSet<&str> = t.signals.iter().map(|s| s.source_id.as_str()).collect();
    let corroboration = evidence.len() + sources.len();
    let age = if target == TracePhase::Crystallized {
        // Crystallized content must have held as canonical for a while.
        match (from, &input.phase_since) {
            (TracePhase::Canonical, Some(since)) => seconds_between(since, &input.now).unwrap_or(0),
            _ => 0,
        }
    } else {
        // An observation time counts when the source has the authority the
        // target requires; otherwise the gate's own ingest time does.
        t.signals
            .iter()
            .filter_map(|s| {
                let observed = s
                    .observed_at
                    .as_deref()
                    .filter(|_| s.authority_score() + 1e-9 >= min_authority)
                    .filter(|o| seconds_between(o, &input.now).is_some_and(|d| d >= 0));
                seconds_between(observed.unwrap_or(&s.ingested_at), &input.now)
            })
            .max()
            .unwrap_or(0)
    };
    let claims: Vec<Claim> = t.signals.iter().flat_map(|s| s.claims.clone()).collect();
    let contradictions: Vec<Uuid> = input
        .peers
        .iter()
        .filter(|p| p.trace_id != t.trace_id)
        .filter(|p| first_contradiction(&claims, &p.claims).is_some())
        .map(|p| p.trace_id)
        .collect();
    let assessment = Assessment {
        authority: round(authority),
        required_authority: min_authority,
        evidence: evidence.len(),
        required_evidence: min_evidence,
        corroboration,
        required_corroboration: min_corroboration,
        age_seconds: age,
        required_age_seconds: min_age,
        contradictions: contradictions.clone(),
    };

    let mut transition = Transition {
        trace_id: t.trace_id,
        from_phase: from,
        to_phase: target,
        from_influence: t.influence,
        to_influence,
        transition_name: Some(transitions::name(from, target)),
        enforced: false,
        reason_codes: vec![],
    };
    let tid = t.trace_id.to_string();
    let trace_target = (ObstructionTargetType::Trace, tid.clone());
    let promote_effect = PlanEffect::Promote {
        trace_id: t.trace_id,
        to_phase: target,
        group,
    };
    let done = |v: Verdict, transition: Transition, promote: bool, supersede: Vec<Uuid>| {
        CanonicalizationOutput {
            verdict: v,
            transition,
            promote,
            supersede,
            assessment: assessment.clone(),
            group,
        }
    };

    // Traces that may not be promoted at all.
    if super::is_dead(from) || from == TracePhase::Superseded {
        let (repair, role, what) = match from {
            TracePhase::Quarantined => (
                RepairClass::ManualReview,
                "security_reviewer",
                "Release the trace from quarantine (approve its repair plan) before promoting it.",
            ),
            TracePhase::Superseded => (
                RepairClass::Recanonicalization,
                "owner",
                "Promote the trace that superseded it instead.",
            ),
            _ => (
                RepairClass::Substitution,
                "owner",
                "Ingest new content with the authority and evidence required; revoked content stays revoked.",
            ),
        };
        let gap = Gap::new(
            ObstructionType::CanonicalizationFailure,
            Severity::High,
            trace_target,
            format!(
                "Trace {} is {}; it cannot become {}.",
                t.trace_id,
                from.as_str(),
                target.as_str()
            ),
            repair,
        )
        .approvals(&[role])
        .expected(ExpectedOutcome::ManualResolutionRequired)
        .step(step("prerequisite", what, "the content can be promoted"));
        transition.to_phase = from;
        transition.to_influence = t.influence;
        transition.transition_name = Some(transitions::name(from, from));
        transition.reason_codes = vec![format!("trace_{}", from.as_str())];
        let v = verdict(
            "canonicalization",
            &key,
            RuntimeDecision::Block,
            GovernanceOutcome::Deny,
            transition.reason_codes.clone(),
            vec![gap],
        );
        return done(v, transition, false, vec![]);
    }
    if from == target {
        transition.reason_codes = vec!["already_in_phase".into()];
        transition.to_influence = t.influence;
        let v = verdict(
            "canonicalization",
            &key,
            RuntimeDecision::Allow,
            GovernanceOutcome::Allow,
            transition.reason_codes.clone(),
            vec![],
        );
        return done(v, transition, false, vec![]);
    }
    if rank(target) <= rank(from) {
        transition.reason_codes = vec!["not_a_promotion".into()];
        transition.to_phase = from;
        transition.to_influence = t.influence;
        transition.transition_name = Some(transitions::name(from, from));
        let v = verdict(
            "canonicalization",
            &key,
            RuntimeDecision::Block,
            GovernanceOutcome::Deny,
            transition.reason_codes.clone(),
            vec![],
        );
        return done(v, transition, false, vec![]);
    }
    if !transitions::allowed(from, target) {
        let via = if target == TracePhase::Crystallized {
            TracePhase::Canonical
        } else {
            TracePhase::Accepted
        };
        transition.reason_codes = vec!["transition_not_allowed".into()];
        let gap = Gap::new(
            ObstructionType::CanonicalizationFailure,
            Severity::Moderate,
            trace_target,
            format!(
                "A {} trace cannot move to {} directly; it must become {} first.",
                from.as_str(),
                target.as_str(),
                via.as_str()
            ),
            RepairClass::PrerequisiteInsertion,
        )
        .candidates(&[RepairClass::PrerequisiteInsertion, RepairClass::Reordering])
        .step(step(
            "promote-first",
            format!(
                "Promote the trace to {} first, then evaluate {} again.",
                via.as_str(),
                target.as_str()
            ),
            "the promotion path is allowed",
        ));
        let v = verdict(
            "canonicalization",
            &key,
            RuntimeDecision::Repair,
            GovernanceOutcome::RepairRequired,
            transition.reason_codes.clone(),
            vec![gap],
        );
        return done(v, transition, false, vec![]);
    }

    // What is missing.
    let waived = |k: ObstructionType| input.waived.contains(&k);
    let mut reasons = Vec::new();
    let mut gaps = Vec::new();
    let owner = format!("{}_owner", substrate.as_str());
    if authority + 1e-9 < min_authority
        || (input.apply && input.principal_ceiling + 1e-9 < min_authority)
    {
        if waived(ObstructionType::AuthorityGap) {
            reasons.push("authority_gap_waived_by_approval".into());
        } else {
            reasons.push(if input.apply {
                "principal_authority_below_requirement".into()
            } else {
                "authority_below_requirement".to_string()
            });
            gaps.push(
                Gap::new(
                    ObstructionType::AuthorityGap,
                    if substrate == TargetSubstrate::PolicyCorpus { Severity::High } else { Severity::Moderate },
                    trace_target.clone(),
                    format!(
                        "Becoming {} on {} requires authority {:.2}; the content carries {:.2}{}.",
                        target.as_str(), substrate.as_str(), min_authority, content_authority,
                        if input.apply { format!(" and the requesting key {:.2}", input.principal_ceiling) } else { String::new() }
                    ),
                    RepairClass::AuthorityRerouting,
                )
                .candidates(&[RepairClass::AuthorityRerouting, RepairClass::ManualReview])
                .approvals(&[&owner])
                .effect(promote_effect.clone())
                .step(authority_step(
                    "approve-promotion",
                    format!("A principal with authority of at least {min_authority:.2} approves this plan (or evaluates again with apply)."),
                    "the promotion carries the authority the policy requires",
                    &owner,
                    min_authority,
                )),
            );
        }
    }
    let evidence_short = (evidence.len() as u32) < min_evidence;
    let corroboration_short = corroboration < min_corroboration;
    if evidence_short || corroboration_short {
        if waived(ObstructionType::EvidenceGap) {
            reasons.push("evidence_gap_waived_by_approval".into());
        } else {
            if evidence_short {
                reasons.push("evidence_below_requirement".into());
            }
            if corroboration_short {
                reasons.push("corroboration_below_requirement".into());
            }
            let mut s = step(
                "attach-evidence",
                format!(
                    "Attach evidence (ingest a signal on this trace with evidenceRefs, or from an independent source): {} reference(s) and corroboration {} are needed; there are {} and {}.",
                    min_evidence, min_corroboration, evidence.len(), corroboration
                ),
                "the promotion rests on enough independent evidence",
            );
            s.required_evidence = vec![format!("{} evidence reference(s)", min_evidence)];
            gaps.push(
                Gap::new(
                    ObstructionType::EvidenceGap,
                    Severity::Moderate,
                    trace_target.clone(),
                    format!(
                        "Becoming {} requires {} evidence reference(s) and corroboration {}; the trace has {} and {}.",
                        target.as_str(), min_evidence, min_corroboration, evidence.len(), corroboration
                    ),
                    RepairClass::EvidenceInsertion,
                )
                .candidates(&[RepairClass::EvidenceInsertion, RepairClass::ManualReview])
                .status(ObstructionStatus::AwaitingEvidence)
                .effect(promote_effect.clone())
                .step(s),
            );
        }
    }
    if age < min_age {
        if waived(ObstructionType::TemporalMaturityFailure) {
            reasons.push("maturity_waived_by_approval".into());
        } else {
            reasons.push("maturity_below_requirement".into());
            gaps.push(
                Gap::new(
                    ObstructionType::TemporalMaturityFailure,
                    Severity::Low,
                    trace_target.clone(),
                    format!(
                        "Becoming {} requires the content to have held for {} s; it has for {} s.",
                        target.as_str(), min_age, age.max(0)
                    ),
                    RepairClass::Reordering,
                )
                .candidates(&[RepairClass::Reordering, RepairClass::ManualReview])
                .effect(promote_effect.clone())
                .step(step(
                    "wait",
                    format!("Evaluate again after {} more second(s), or have an owner approve an earlier promotion.", (min_age - age).max(0)),
                    "the content is mature",
                )),
            );
        }
    }
    let canonical_target = target != TracePhase::Accepted;
    let mut supersede = vec![];
    if !contradictions.is_empty() {
        if !canonical_target {
            reasons.push("contradicts_canonical".into());
        } else if waived(ObstructionType::ContradictionUnresolved) {
            reasons.push("contradiction_resolved_by_approval".into());
            supersede = contradictions.clone();
        } else {
            reasons.push("contradicts_canonical".into());
            gaps.push(
                Gap::new(
                    ObstructionType::ContradictionUnresolved,
                    Severity::High,
                    trace_target.clone(),
                    format!(
                        "The trace contradicts canonical trace(s) {}; both cannot be canonical.",
                        contradictions.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    RepairClass::ContradictionResolution,
                )
                .candidates(&[RepairClass::ContradictionResolution, RepairClass::Recanonicalization])
                .approvals(&[&owner])
                .expected(ExpectedOutcome::ManualResolutionRequired)
                .effect(promote_effect.clone())
                .step(authority_step(
                    "decide",
                    "An owner approves this plan to let this trace win (the contradicting canonical traces are superseded), or rejects it.",
                    "one account of the matter is canonical",
                    &owner,
                    min_authority,
                )),
            );
        }
    }

    let (decision, outcome, promote) = if !gaps.is_empty() {
        (
            RuntimeDecision::Repair,
            GovernanceOutcome::RepairRequired,
            false,
        )
    } else if input.apply {
        reasons.push("promoted".into());
        (RuntimeDecision::Allow, GovernanceOutcome::Allow, true)
    } else {
        reasons.push("would_promote".into());
        (RuntimeDecision::Allow, GovernanceOutcome::Allow, false)
    };
    transition.enforced = promote;
    transition.reason_codes = reasons.clone();
    let v = verdict("canonicalization", &key, decision, outcome, reasons, gaps);
    done(
        v,
        transition,
        promote,
        if promote { supersede } else { vec![] },
    )
}

#[cfg(test)]
mod tests {
    use super::super::claims::extract;
    use super::super::testutil::*;
    use super::super::SignalFacts;
    use super::*;

    const NOW: &str = "2024-01-03T00:00:00.000000Z";

    fn input(
        t: TraceFacts,
        target: TracePhase,
        apply: bool,
        ceiling: f64,
    ) -> CanonicalizationInput {
        CanonicalizationInput {
            key: "r1".into(),
            trace: t,
            target_phase: target,
            now: NOW.into(),
            phase_since: None,
            peers: vec![],
            apply,
            principal_ceiling: ceiling,
            waived: vec![],
        }
    }

    fn supported(n: u128, authority: f64) -> SignalFacts {
        let mut s = signal(n, TargetSubstrate::AgentMemory, authority, 0.9);
        s.evidence_refs = vec!["https://tickets/1".into(), "https://tickets/2".into()];
        s.observed_at = Some("2024-01-01T00:00:00Z".into());
        s
    }

    #[test]
    fn authoritative_mature_evidenced_trace_would_promote_and_apply_promotes() {
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![supported(1, 0.9)],
        );
        let out = evaluate(
            &input(t.clone(), TracePhase::Canonical, false, 0.9),
            &policy(),
        );
        assert_eq!(out.verdict.decision, RuntimeDecision::Allow);
        assert!(!out.promote && !out.transition.enforced);
        assert_eq!(
            out.transition.to_influence,
            AllowedInfluence::CanonicalMemory
        );
        let out = evaluate(&input(t, TracePhase::Canonical, true, 0.9), &policy());
        assert!(out.promote && out.transition.enforced);
        assert!(out.verdict.obstructions.is_empty());
    }

    #[test]
    fn low_authority_young_unsupported_trace_lists_what_is_missing() {
        let mut s = signal(1, TargetSubstrate::AgentMemory, 0.0, 0.5);
        s.ingested_at = "2024-01-02T23:59:00.000000Z".into();
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![s],
        );
        let out = evaluate(
            &input(t.clone(), TracePhase::Canonical, false, 0.9),
            &policy(),
        );
        assert_eq!(out.verdict.decision, RuntimeDecision::Repair);
        let kinds: Vec<_> = out
            .verdict
            .obstructions
            .iter()
            .map(|o| o.obstruction_type)
            .collect();
        assert_eq!(
            kinds,
            vec![
                ObstructionType::AuthorityGap,
                ObstructionType::EvidenceGap,
                ObstructionType::TemporalMaturityFailure
            ]
        );
        assert_eq!(out.verdict.effects.len(), 3);
        assert_eq!(out.assessment.age_seconds, 60);
        // Apply by a principal with authority removes only the authority gap.
        let out = evaluate(
            &input(t.clone(), TracePhase::Canonical, true, 0.9),
            &policy(),
        );
        assert!(!out.promote);
        assert_eq!(out.verdict.obstructions.len(), 2);
        // Approval that waived everything promotes.
        let mut i = input(t, TracePhase::Canonical, true, 0.9);
        i.waived = vec![
            ObstructionType::EvidenceGap,
            ObstructionType::TemporalMaturityFailure,
        ];
        assert!(evaluate(&i, &policy()).promote);
    }

    #[test]
    fn apply_by_a_weak_key_does_not_promote() {
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![supported(1, 0.9)],
        );
        let out = evaluate(&input(t, TracePhase::Canonical, true, 0.5), &policy());
        assert!(!out.promote);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::AuthorityGap
        );
    }

    #[test]
    fn observed_at_of_a_weak_source_does_not_make_it_mature() {
        let mut s = supported(1, 0.0);
        s.ingested_at = "2024-01-02T23:00:00.000000Z".into();
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![s],
        );
        let out = evaluate(&input(t, TracePhase::Canonical, false, 0.9), &policy());
        assert_eq!(out.assessment.age_seconds, 3600);
    }

    #[test]
    fn contradiction_with_canonical_content_obstructs_and_approval_supersedes() {
        let mut s = supported(1, 0.9);
        s.claims = extract("Refunds must be approved by a manager.");
        let t = trace(
            1,
            Some(TracePhase::Accepted),
            TargetSubstrate::AgentMemory,
            vec![s],
        );
        let mut i = input(t, TracePhase::Canonical, true, 0.9);
        i.peers = vec![PeerFacts {
            trace_id: Uuid::from_u128(5),
            phase: TracePhase::Canonical,
            claims: extract("Refunds must not be approved by a manager."),
        }];
        let out = evaluate(&i, &policy());
        assert!(!out.promote);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::ContradictionUnresolved
        );
        i.waived = vec![ObstructionType::ContradictionUnresolved];
        let out = evaluate(&i, &policy());
        assert!(out.promote);
        assert_eq!(out.supersede, vec![Uuid::from_u128(5)]);
    }

    #[test]
    fn paths_that_are_not_promotions() {
        let q = trace(
            1,
            Some(TracePhase::Quarantined),
            TargetSubstrate::AgentMemory,
            vec![],
        );
        let out = evaluate(&input(q, TracePhase::Accepted, true, 1.0), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Block);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::CanonicalizationFailure
        );
        let w = trace(
            1,
            Some(TracePhase::Working),
            TargetSubstrate::AgentMemory,
            vec![supported(1, 0.9)],
        );
        let out = evaluate(&input(w, TracePhase::Canonical, true, 1.0), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Repair);
        assert_eq!(
            out.verdict.repair_plans[0].repair_class,
            RepairClass::PrerequisiteInsertion
        );
        let c = trace(
            1,
            Some(TracePhase::Canonical),
            TargetSubstrate::AgentMemory,
            vec![],
        );
        let out = evaluate(
            &input(c.clone(), TracePhase::Accepted, true, 1.0),
            &policy(),
        );
        assert_eq!(
            out.transition.reason_codes,
            vec!["not_a_promotion".to_string()]
        );
        let out = evaluate(&input(c, TracePhase::Canonical, true, 1.0), &policy());
        assert_eq!(out.verdict.decision, RuntimeDecision::Allow);
        assert!(!out.promote);
    }
}
