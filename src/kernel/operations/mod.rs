//! Decision logic of the five canonical operations and of the governance
//! lifecycle, as pure functions: each takes a snapshot of the state it rests
//! on (loaded by `crate::operations`) and the compiled policy, and returns the
//! decision, obstructions and repair plans. No I/O and no clock (the time is
//! an input), so a receipt's replay material re-runs to the same answer.

pub mod action;
pub mod canonicalization;
pub mod claims;
pub mod configuration;
pub mod coordination;
pub mod lifecycle;
pub mod retrieval;
pub mod reversal;

use super::policy::{CompiledPolicy, NAMESPACE};
use super::types::*;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

// ---------------------------------------------------------------- references

/// What a reference names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Signal,
    Receipt,
    Trace,
    Action,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Signal => "signal",
            NodeKind::Receipt => "receipt",
            NodeKind::Trace => "trace",
            NodeKind::Action => "action",
        }
    }
    pub fn parse(s: &str) -> Option<NodeKind> {
        match s {
            "signal" => Some(NodeKind::Signal),
            "receipt" => Some(NodeKind::Receipt),
            "trace" => Some(NodeKind::Trace),
            "action" => Some(NodeKind::Action),
            _ => None,
        }
    }
}

/// A reference to a stored object: `receipt:<uuid>`, `signal:<uuid>`,
/// `trace:<uuid>`, or a bare UUID (`kind` None: resolved against receipts,
/// then signals, then traces of the same tenant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeRef {
    pub kind: Option<NodeKind>,
    pub id: Uuid,
}

/// Parses a reference. Anything else (a URL, a ticket number) is external
/// evidence, not an edge of the dependency graph: `None`.
pub fn parse_ref(raw: &str) -> Option<NodeRef> {
    let s = raw.trim();
    if let Some((prefix, rest)) = s.split_once(':') {
        let kind = match prefix.to_ascii_lowercase().as_str() {
            "receipt" => NodeKind::Receipt,
            "signal" => NodeKind::Signal,
            "trace" => NodeKind::Trace,
            _ => return None,
        };
        return Uuid::parse_str(rest.trim()).ok().map(|id| NodeRef {
            kind: Some(kind),
            id,
        });
    }
    // Only the hyphenated form: a 32-hex run inside a ticket id is not a reference.
    if s.len() == 36 {
        return Uuid::parse_str(s).ok().map(|id| NodeRef { kind: None, id });
    }
    None
}

/// What a reference field of a request accepts, as documented in `/openapi.json`.
pub const SUBJECT_REF_PATTERN: &str = "^((trace|signal|receipt):)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// Parses a reference named in a request; the error message is for a 400.
/// Stricter than [`parse_ref`] (which reads references out of free text): exactly
/// [`SUBJECT_REF_PATTERN`], no surrounding space, lower-case prefix, hyphenated UUID.
pub fn parse_subject_ref(raw: &str) -> Result<NodeRef, String> {
    let (kind, rest) = match raw.split_once(':') {
        Some(("receipt", rest)) => (Some(NodeKind::Receipt), rest),
        Some(("signal", rest)) => (Some(NodeKind::Signal), rest),
        Some(("trace", rest)) => (Some(NodeKind::Trace), rest),
        Some(_) => (None, ""),
        None => (None, raw),
    };
    // 36 characters that parse are the hyphenated form (simple, braced and URN differ in length).
    let parsed = (rest.len() == 36)
        .then(|| Uuid::parse_str(rest).ok())
        .flatten()
        .map(|id| NodeRef { kind, id });
    parsed.ok_or_else(|| {
        "must be a UUID or one of trace:<uuid>, signal:<uuid>, receipt:<uuid>".to_string()
    })
}

// ---------------------------------------------------------------- shared facts

/// What the operations know of one signal that wrote a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalFacts {
    pub id: Uuid,
    pub source_id: String,
    pub source_type: SourceType,
    pub trust: f64,
    /// After the API key's ceiling.
    pub authority: f64,
    pub substrate: TargetSubstrate,
    pub mutation: ProposedMutation,
    #[serde(default)]
    pub event_type: Option<EventType>,
    #[serde(default)]
    pub evidence_refs: Vec<String>,
    /// When the gate stored it (its own clock).
    pub ingested_at: String,
    /// When the source says it observed it.
    #[serde(default)]
    pub observed_at: Option<String>,
    pub payload_digest: String,
    /// Directive claims extracted from the payload (see [`claims`]).
    #[serde(default)]
    pub claims: Vec<claims::Claim>,
}

impl SignalFacts {
    /// Authority as far as trust backs it (the kernel's authority score).
    pub fn authority_score(&self) -> f64 {
        round(self.authority * (0.6 + 0.4 * self.trust.clamp(0.0, 1.0)))
    }
}

/// A trace as an operation sees it: phase, influence, substrate, and the
/// signals that wrote it (newest first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceFacts {
    pub trace_id: Uuid,
    /// None: the trace's signal was ingested but never evaluated.
    #[serde(default)]
    pub phase: Option<TracePhase>,
    pub influence: AllowedInfluence,
    #[serde(default)]
    pub substrate: Option<TargetSubstrate>,
    #[serde(default)]
    pub signals: Vec<SignalFacts>,
}

impl TraceFacts {
    pub fn phase_or_observed(&self) -> TracePhase {
        self.phase.unwrap_or(TracePhase::Observed)
    }
    /// Best authority among the signals that wrote it.
    pub fn authority(&self) -> f64 {
        self.signals
            .iter()
            .map(SignalFacts::authority_score)
            .fold(0.0, f64::max)
    }
    pub fn substrate_or(&self, d: TargetSubstrate) -> TargetSubstrate {
        self.substrate
            .or_else(|| self.signals.first().map(|s| s.substrate))
            .unwrap_or(d)
    }
    pub fn view(&self) -> Trace {
        Trace {
            id: self.trace_id,
            current_phase: self.phase_or_observed(),
            allowed_influence: self.influence,
            trace_type: self.substrate.map(|s| s.as_str().to_string()),
        }
    }
}

/// Phases whose content may not act at all.
pub fn is_dead(p: TracePhase) -> bool {
    matches!(
        p,
        TracePhase::Quarantined | TracePhase::Revoked | TracePhase::Tombstoned
    )
}

// ---------------------------------------------------------------- verdicts

/// What an operation decided, with the lifecycle objects it opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub decision: RuntimeDecision,
    pub outcome: GovernanceOutcome,
    pub reason_codes: Vec<String>,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    /// What approving a plan does, by plan id.
    pub effects: Vec<PlanEffectEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEffectEntry {
    pub plan_id: Uuid,
    pub effect: PlanEffect,
}

/// The state change an approved repair plan carries out (stored beside the plan).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanEffect {
    /// Re-check the canonicalization with the approver's authority and the
    /// group's approved obstructions waived; promote when nothing is left.
    Promote {
        #[serde(rename = "traceId")]
        trace_id: Uuid,
        #[serde(rename = "toPhase")]
        to_phase: TracePhase,
        group: Uuid,
    },
    /// Apply a reversal (dependency-aware revocation).
    Reverse {
        target: String,
        mode: reversal::ReversalMode,
    },
    /// Quarantine a trace whose retrieved text turned out to be poisoned.
    QuarantineTrace {
        #[serde(rename = "traceId")]
        trace_id: Uuid,
    },
}

/// Ranks decisions by severity, for combining several findings into one.
pub fn severity_rank(d: RuntimeDecision) -> u8 {
    use RuntimeDecision as D;
    match d {
        D::Allow => 0,
        D::AllowWithWarning => 1,
        D::MarkUntrusted | D::Harden => 2,
        D::Repair => 3,
        D::Defer => 4,
        D::RequireReview => 5,
        D::Quarantine => 6,
        D::Escalate => 7,
        D::Block => 8,
    }
}

pub fn worst(a: RuntimeDecision, b: RuntimeDecision) -> RuntimeDecision {
    if severity_rank(b) > severity_rank(a) {
        b
    } else {
        a
    }
}

/// One gap found by an operation, before ids are minted.
#[derive(Debug, Clone)]
pub struct Gap {
    pub kind: ObstructionType,
    pub severity: Severity,
    pub target_type: ObstructionTargetType,
    pub target_id: String,
    pub explanation: String,
    pub repair: RepairClass,
    pub candidates: Vec<RepairClass>,
    pub approvals: Vec<String>,
    pub steps: Vec<RepairStep>,
    pub expected: ExpectedOutcome,
    pub status: Option<ObstructionStatus>,
    pub effect: Option<PlanEffect>,
}

impl Gap {
    pub fn new(
        kind: ObstructionType,
        severity: Severity,
        target: (ObstructionTargetType, String),
        explanation: String,
        repair: RepairClass,
    ) -> Gap {
        Gap {
            kind,
            severity,
            target_type: target.0,
            target_id: target.1,
            explanation,
            repair,
            candidates: vec![repair],
            approvals: vec![],
            steps: vec![],
            expected: ExpectedOutcome::AllowAfterRepair,
            status: None,
            effect: None,
        }
    }
    pub fn candidates(mut self, c: &[RepairClass]) -> Gap {
        self.candidates = c.to_vec();
        self
    }
    pub fn approvals(mut self, a: &[&str]) -> Gap {
        self.approvals = a.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn step(mut self, s: RepairStep) -> Gap {
        self.steps.push(s);
        self
    }
    pub fn expected(mut self, e: ExpectedOutcome) -> Gap {
        self.expected = e;
        self
    }
    pub fn status(mut self, s: ObstructionStatus) -> Gap {
        self.status = Some(s);
        self
    }
    pub fn effect(mut self, e: PlanEffect) -> Gap {
        self.effect = Some(e);
        self
    }
}

pub fn step(id: &str, description: impl Into<String>, effect: &str) -> RepairStep {
    RepairStep {
        step_id: id.into(),
        description: description.into(),
        expected_effect: effect.into(),
        required_actor_role: None,
        required_authority: None,
        required_evidence: vec![],
        automatable: false,
    }
}

/// A step that only a principal with `authority` may carry out.
pub fn authority_step(
    id: &str,
    description: impl Into<String>,
    effect: &str,
    role: &str,
    authority: f64,
) -> RepairStep {
    let mut s = step(id, description, effect);
    s.required_actor_role = Some(role.into());
    s.required_authority = Some(format!("{authority:.2}"));
    s
}

/// Deterministic ids: UUIDv5 of the operation, a key that names the state
/// the decision rests on, and what is minted.
pub fn mint(operation: &str, key: &str, what: &str) -> Uuid {
    Uuid::new_v5(&NAMESPACE, format!("{operation}:{key}:{what}").as_bytes())
}

/// Turns gaps into obstructions and plans with ids minted from `key`.
pub fn materialize(
    operation: &str,
    key: &str,
    gaps: Vec<Gap>,
) -> (Vec<Obstruction>, Vec<RepairPlan>, Vec<PlanEffectEntry>) {
    let mut obstructions = Vec::with_capacity(gaps.len());
    let mut plans = Vec::with_capacity(gaps.len());
    let mut effects = Vec::new();
    for (i, g) in gaps.into_iter().enumerate() {
        let tag = format!("{}:{}:{}", i, g.kind.as_str(), g.target_id);
        let oid = mint(operation, key, &format!("obstruction:{tag}"));
        let pid = mint(operation, key, &format!("repair_plan:{tag}"));
        let status = g.status.unwrap_or(if g.approvals.is_empty() {
            ObstructionStatus::RepairPlanned
        } else {
            ObstructionStatus::AwaitingAuthority
        });
        obstructions.push(Obstruction {
            id: oid,
            obstruction_type: g.kind,
            severity: g.severity,
            status,
            target_type: g.target_type,
            target_id: g.target_id,
            explanation: g.explanation,
            candidate_repair_classes: g.candidates,
        });
        plans.push(RepairPlan {
            id: pid,
            obstruction_id: oid,
            repair_class: g.repair,
            status: RepairStatus::Proposed,
            expected_outcome: g.expected,
            proposed_steps: g.steps,
            required_approvals: g.approvals,
            completion_receipt_id: None,
        });
        if let Some(effect) = g.effect {
            effects.push(PlanEffectEntry {
                plan_id: pid,
                effect,
            });
        }
    }
    (obstructions, plans, effects)
}

/// Builds a verdict from gaps: the decision given, the outcome following from it.
pub fn verdict(
    operation: &str,
    key: &str,
    decision: RuntimeDecision,
    outcome: GovernanceOutcome,
    mut reason_codes: Vec<String>,
    gaps: Vec<Gap>,
) -> Verdict {
    dedup(&mut reason_codes);
    let (obstructions, repair_plans, effects) = materialize(operation, key, gaps);
    Verdict {
        decision,
        outcome,
        reason_codes,
        obstructions,
        repair_plans,
        effects,
    }
}

pub fn dedup(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(x.clone()));
}

/// Scores rounded to 6 decimals, as the kernel does, so they hash alike everywhere.
pub fn round(x: f64) -> f64 {
    (x.clamp(0.0, 1.0) * 1e6).round() / 1e6
}

/// Seconds between two RFC 3339 times (`later - earlier`), or None if either does not parse.
pub fn seconds_between(earlier: &str, later: &str) -> Option<i64> {
    let a = chrono::DateTime::parse_from_rfc3339(earlier).ok()?;
    let b = chrono::DateTime::parse_from_rfc3339(later).ok()?;
    Some((b - a).num_seconds())
}

/// The requirement a policy sets for `mutation` on `substrate`, as plain numbers.
pub fn requirement_of(
    policy: &CompiledPolicy,
    substrate: TargetSubstrate,
    mutation: ProposedMutation,
) -> (f64, u32, AllowedInfluence) {
    let r = policy.requirement(substrate, mutation);
    (r.min_authority, r.min_evidence, r.max_influence)
}

/// Input of any operation, as a receipt's replay material binds it. Built
/// once per request and serialized, so variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "operation", content = "input", rename_all = "snake_case")]
pub enum OperationMaterial {
    Configuration(configuration::ConfigurationInput),
    Canonicalization(canonicalization::CanonicalizationInput),
    Retrieval(retrieval::RetrievalInput),
    ActionRelease(action::ActionInput),
    Reversal(reversal::ReversalInput),
    Lifecycle(lifecycle::LifecycleMaterial),
}

/// Decision, outcome, and the decisions of nested operations (an approval
/// that promotes or reverses), as a re-execution gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct Reexecuted {
    pub decision: RuntimeDecision,
    pub outcome: GovernanceOutcome,
    pub nested: Vec<(String, RuntimeDecision)>,
}

/// Re-runs an operation from its replay material.
pub fn reexecute(material: &OperationMaterial, policy: &CompiledPolicy) -> Reexecuted {
    let plain = |v: &Verdict| Reexecuted {
        decision: v.decision,
        outcome: v.outcome,
        nested: vec![],
    };
    match material {
        OperationMaterial::Configuration(i) => plain(&configuration::evaluate(i, policy).verdict),
        OperationMaterial::Canonicalization(i) => {
            plain(&canonicalization::evaluate(i, policy).verdict)
        }
        OperationMaterial::Retrieval(i) => plain(&retrieval::evaluate(i, policy).verdict),
        OperationMaterial::ActionRelease(i) => plain(&action::evaluate(i, policy).verdict),
        OperationMaterial::Reversal(i) => plain(&reversal::evaluate(i).verdict),
        OperationMaterial::Lifecycle(m) => {
            let (decision, outcome) = match lifecycle::decide(&m.lifecycle) {
                Ok(d) => (d.decision, d.outcome),
                Err(_) => (RuntimeDecision::Block, GovernanceOutcome::Deny),
            };
            let mut nested = vec![];
            if let Some(c) = &m.canonicalization {
                nested.push((
                    "canonicalization".into(),
                    canonicalization::evaluate(c, policy).verdict.decision,
                ));
            }
            if let Some(r) = &m.reversal {
                nested.push(("reversal".into(), reversal::evaluate(r).verdict.decision));
            }
            Reexecuted {
                decision,
                outcome,
                nested,
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use crate::config::PolicyConfig;

    pub fn policy() -> CompiledPolicy {
        CompiledPolicy::compile("default", &PolicyConfig::default()).expect("default policy")
    }

    pub fn signal(n: u128, substrate: TargetSubstrate, authority: f64, trust: f64) -> SignalFacts {
        SignalFacts {
            id: Uuid::from_u128(n),
            source_id: format!("source-{n}"),
            source_type: SourceType::UserInput,
            trust,
            authority,
            substrate,
            mutation: ProposedMutation::CreateTrace,
            event_type: None,
            evidence_refs: vec![],
            ingested_at: "2024-01-01T00:00:00.000000Z".into(),
            observed_at: None,
            payload_digest: "d".into(),
            claims: vec![],
        }
    }

    pub fn trace(
        n: u128,
        phase: Option<TracePhase>,
        substrate: TargetSubstrate,
        signals: Vec<SignalFacts>,
    ) -> TraceFacts {
        TraceFacts {
            trace_id: Uuid::from_u128(n),
            phase,
            influence: phase
                .map(|p| super::super::transitions::phase_ceiling(p, substrate))
                .unwrap_or(AllowedInfluence::None),
            substrate: Some(substrate),
            signals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_in_every_form() {
        let id = "6f1c1f7e-8a43-4d38-9c1a-0d7c1ad0b0f1";
        let u = Uuid::parse_str(id).unwrap();
        assert_eq!(
            parse_ref(&format!("receipt:{id}")),
            Some(NodeRef {
                kind: Some(NodeKind::Receipt),
                id: u
            })
        );
        assert_eq!(
            parse_ref(&format!(" Signal:{id} ")).unwrap().kind,
            Some(NodeKind::Signal)
        );
        assert_eq!(parse_ref(id), Some(NodeRef { kind: None, id: u }));
        assert_eq!(parse_ref("https://example.com/doc"), None);
        assert_eq!(parse_ref("JIRA-1234"), None);
        assert_eq!(parse_ref("receipt:not-a-uuid"), None);
        assert_eq!(parse_ref("6f1c1f7e8a434d389c1a0d7c1ad0b0f1"), None);
        assert!(parse_subject_ref("x").is_err());
    }

    #[test]
    fn worst_decision_wins() {
        use RuntimeDecision as D;
        assert_eq!(worst(D::Allow, D::Repair), D::Repair);
        assert_eq!(worst(D::Block, D::Repair), D::Block);
        assert_eq!(worst(D::AllowWithWarning, D::Allow), D::AllowWithWarning);
    }

    #[test]
    fn minted_ids_are_stable_and_distinct() {
        let gaps = || {
            vec![
                Gap::new(
                    ObstructionType::EvidenceGap,
                    Severity::Moderate,
                    (ObstructionTargetType::Trace, "t".into()),
                    "x".into(),
                    RepairClass::EvidenceInsertion,
                ),
                Gap::new(
                    ObstructionType::AuthorityGap,
                    Severity::High,
                    (ObstructionTargetType::Trace, "t".into()),
                    "y".into(),
                    RepairClass::AuthorityRerouting,
                )
                .approvals(&["owner"]),
            ]
        };
        let (o1, p1, _) = materialize("op", "k", gaps());
        let (o2, p2, _) = materialize("op", "k", gaps());
        assert_eq!(o1, o2);
        assert_eq!(p1, p2);
        assert_ne!(o1[0].id, o1[1].id);
        assert_eq!(p1[1].obstruction_id, o1[1].id);
        assert_eq!(o1[1].status, ObstructionStatus::AwaitingAuthority);
        assert_eq!(o1[0].status, ObstructionStatus::RepairPlanned);
    }
}
