//! The integrity kernel: a pure function from (normalized signal, policy,
//! state basis) to every typed object of the specification. No I/O, no clock,
//! no randomness: ids it mints are UUIDv5 of the input digest, so the same
//! input gives the same output, byte for byte, which is what makes replay work.

pub mod cache;
pub mod detectors;
pub mod learned;
pub mod operations;
pub mod policy;
pub mod transitions;
pub mod types;

use detectors::{DetectorKind, Finding, ScanContext};
use policy::{CompiledPolicy, NAMESPACE};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use types::*;
use uuid::Uuid;

/// A signal after validation and defaults: what is stored and what the kernel reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NormalizedSignal {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub product_surface: ProductSurface,
    pub source_type: SourceType,
    pub source_id: String,
    pub source_trust_level: f64,
    /// After the API key's ceiling.
    pub source_authority_level: f64,
    /// The caller asked for more authority than its key allows.
    #[serde(default)]
    pub authority_ceiling_applied: bool,
    pub target_substrate: TargetSubstrate,
    #[serde(default)]
    pub target_region_id: Option<Uuid>,
    /// The trace this signal proposes to change (the region, or a new trace).
    pub trace_id: Uuid,
    pub proposed_mutation: ProposedMutation,
    #[serde(default)]
    pub event_type: Option<EventType>,
    pub payload: String,
    pub payload_digest: String,
    #[serde(default)]
    pub payload_summary: Option<String>,
    #[serde(default)]
    pub raw_payload_ref: Option<String>,
    #[serde(default)]
    pub authority_claim: Option<String>,
    #[serde(default)]
    pub evidence_refs: Vec<String>,
    #[serde(default)]
    pub observed_at: Option<String>,
    #[serde(default)]
    pub metadata: FreeForm,
}

/// What the decision rests on besides the signal: the target trace as it is
/// now, and the recent record of the source (for coordination state).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateBasis {
    pub trace_id: Uuid,
    /// None: the trace does not exist yet.
    #[serde(default)]
    pub phase: Option<TracePhase>,
    pub influence: AllowedInfluence,
    #[serde(default)]
    pub source_recent: u32,
    #[serde(default)]
    pub source_refused: u32,
}

/// The kernel's whole input; stored in receipts as replay material.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelInput {
    pub signal: NormalizedSignal,
    pub profile: EvaluationProfile,
    pub mode: EvaluationMode,
    #[serde(default)]
    pub equation_bundles: Vec<String>,
    pub basis: StateBasis,
}

/// Everything the kernel decides. The service adds receipt ids and assembles
/// the spec's response objects from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelOutput {
    pub input_digest: String,
    pub decision: RuntimeDecision,
    pub outcome: GovernanceOutcome,
    pub status: KernelStatus,
    pub risk_score: f64,
    pub authority_score: f64,
    pub evidence_score: f64,
    pub reason_codes: Vec<String>,
    pub governed_signal: GovernedSignal,
    pub governance_decision_id: Uuid,
    pub kernel_result_id: Uuid,
    pub allowed_influence: FreeForm,
    pub trace: Trace,
    pub transition: Transition,
    pub obstruction: Option<Obstruction>,
    pub repair_plan: Option<RepairPlan>,
    pub coordination_state: Option<CoordinationState>,
    pub profile_artifacts: FreeForm,
    /// The trace as the store should keep it (unchanged when not enforced).
    pub next_phase: TracePhase,
    pub next_influence: AllowedInfluence,
}

/// Detectors whose findings alone can hold or block a write: content that
/// attacks whoever reads it. Claims (policy, authority, laundering,
/// generated-as-observed) only lower influence and open obstructions.
fn is_poisoning(kind: DetectorKind) -> bool {
    matches!(
        kind,
        DetectorKind::PromptInjection
            | DetectorKind::Obfuscation
            | DetectorKind::Secret
            | DetectorKind::UnknownUrl
    )
}

/// The weights of the findings `keep` selects, as risk combines them: each rule's finding as
/// independent evidence, while the learned detector is a second opinion on the question the
/// injection rules answer, so it adds only what goes beyond them (the larger of the two).
fn weights<'a>(
    findings: &'a [Finding],
    keep: impl Fn(&Finding) -> bool + 'a,
) -> impl Iterator<Item = f64> + 'a {
    let rules_injection = combine(
        findings
            .iter()
            .filter(|f| {
                f.kind == DetectorKind::PromptInjection && !detectors::is_learned(f.reason_code)
            })
            .map(|f| f.weight),
    );
    findings.iter().filter(move |f| keep(f)).map(move |f| {
        if detectors::is_learned(f.reason_code) {
            // Counted as max(rules, model): what the rules already count is not added twice.
            let joint = rules_injection.max(f.weight);
            if rules_injection >= 1.0 {
                0.0
            } else {
                1.0 - (1.0 - joint) / (1.0 - rules_injection)
            }
        } else {
            f.weight
        }
    })
}

fn combine(ws: impl IntoIterator<Item = f64>) -> f64 {
    1.0 - ws
        .into_iter()
        .fold(1.0, |acc, w| acc * (1.0 - w.clamp(0.0, 1.0)))
}

/// Scores are rounded to 6 decimals so they print and hash the same on every platform.
fn round(x: f64) -> f64 {
    (x.clamp(0.0, 1.0) * 1e6).round() / 1e6
}

fn mutation_base_risk(m: ProposedMutation) -> f64 {
    use ProposedMutation::*;
    match m {
        DeployCode => 0.2,
        ExecuteTool | ReleaseAction | UpdatePolicy => 0.15,
        CanonicalizeTrace | PromoteTrace | ChangeWorkflowState => 0.1,
        _ => 0.0,
    }
}

pub fn intent_of(m: ProposedMutation, e: Option<EventType>) -> Intent {
    use ProposedMutation as M;
    match (m, e) {
        (M::ReleaseAction, Some(EventType::DisclosureRelease)) => Intent::Disclose,
        (M::CreateTrace, Some(EventType::InformationExchange)) => Intent::Observe,
        (M::CreateTrace, _) => Intent::CreateCandidate,
        (M::UpdateTrace, _) => Intent::UpdateDocument,
        (M::PromoteTrace, _) => Intent::PromoteTrace,
        (M::CanonicalizeTrace, _) => Intent::Canonicalize,
        (M::WriteMemory, _) | (M::UpdateEmbedding, _) => Intent::WriteMemory,
        (M::UpdatePolicy, _) | (M::ChangeWorkflowState, _) => Intent::Commit,
        (M::LockDocumentSection, _) => Intent::LockSection,
        (M::ReleaseAction, _) => Intent::Approve,
        (M::ExecuteTool, _) => Intent::ExecuteTool,
        (M::SubmitReview, _) => Intent::Suggest,
        (M::FinalizeSection, _) => Intent::FinalizeDocument,
        (M::DeployCode, _) => Intent::DeployCode,
    }
}

pub fn target_type_of(s: TargetSubstrate) -> GovernedTargetType {
    use TargetSubstrate as S;
    match s {
        S::AgentMemory => GovernedTargetType::Memory,
        S::RagStore => GovernedTargetType::Retrieval,
        S::PolicyCorpus => GovernedTargetType::Policy,
        S::Document | S::KnowledgeBase => GovernedTargetType::Document,
        S::WorkflowState => GovernedTargetType::Workflow,
        S::ReviewRoom => GovernedTargetType::Room,
        S::PaperSection => GovernedTargetType::DocumentSection,
        S::ExecutionBoundary => GovernedTargetType::ExternalSystem,
        S::CoordinationField => GovernedTargetType::CoordinationState,
        S::CodeSubstrate => GovernedTargetType::CodeRepository,
    }
}

fn obstruction_target(s: TargetSubstrate) -> ObstructionTargetType {
    use TargetSubstrate as S;
    match s {
        S::AgentMemory | S::RagStore | S::KnowledgeBase => ObstructionTargetType::Memory,
        S::PolicyCorpus => ObstructionTargetType::Policy,
        S::Document => ObstructionTargetType::Document,
        S::PaperSection => ObstructionTargetType::DocumentSection,
        S::WorkflowState | S::ReviewRoom => ObstructionTargetType::Workflow,
        S::ExecutionBoundary => ObstructionTargetType::Action,
        S::CodeSubstrate => ObstructionTargetType::CodeChange,
        S::CoordinationField => ObstructionTargetType::CoordinationState,
    }
}

pub fn risk_class(r: f64) -> RiskClass {
    if r >= 0.75 {
        RiskClass::Critical
    } else if r >= 0.5 {
        RiskClass::High
    } else if r >= 0.25 {
        RiskClass::Moderate
    } else {
        RiskClass::Low
    }
}

pub fn outcome_of(d: RuntimeDecision) -> (GovernanceOutcome, KernelStatus) {
    use RuntimeDecision as D;
    match d {
        D::Allow => (GovernanceOutcome::Allow, KernelStatus::Executed),
        D::AllowWithWarning | D::MarkUntrusted | D::Harden => (
            GovernanceOutcome::AllowWithConstraints,
            KernelStatus::Executed,
        ),
        D::Quarantine => (GovernanceOutcome::Quarantine, KernelStatus::Quarantined),
        D::RequireReview | D::Defer => (GovernanceOutcome::Defer, KernelStatus::Deferred),
        D::Repair => (
            GovernanceOutcome::RepairRequired,
            KernelStatus::RepairRequired,
        ),
        D::Block => (GovernanceOutcome::Deny, KernelStatus::Denied),
        D::Escalate => (GovernanceOutcome::Escalate, KernelStatus::Escalated),
    }
}

/// Canonical digest of a kernel input: the cache key and the seed of every id
/// the kernel mints. The serialization is canonical without a JCS pass: struct
/// fields have a fixed order and JSON objects are `BTreeMap`s (sorted keys),
/// which keeps the hot path to one `to_vec` and one sha256.
///
/// The payload enters through its sha256 (`payloadDigest`, which normalization
/// computes and replay re-checks against the stored payload), so a 1 KiB
/// payload is not serialized a second time on the hot path.
pub fn input_digest(input: &KernelInput) -> String {
    let s = &input.signal;
    let view = DigestView {
        signal: SignalView {
            id: &s.id,
            tenant_id: &s.tenant_id,
            product_surface: s.product_surface,
            source_type: s.source_type,
            source_id: &s.source_id,
            source_trust_level: s.source_trust_level,
            source_authority_level: s.source_authority_level,
            authority_ceiling_applied: s.authority_ceiling_applied,
            target_substrate: s.target_substrate,
            target_region_id: &s.target_region_id,
            trace_id: &s.trace_id,
            proposed_mutation: s.proposed_mutation,
            event_type: s.event_type,
            payload_digest: &s.payload_digest,
            payload_summary: &s.payload_summary,
            raw_payload_ref: &s.raw_payload_ref,
            authority_claim: &s.authority_claim,
            evidence_refs: &s.evidence_refs,
            observed_at: &s.observed_at,
            metadata: &s.metadata,
        },
        profile: input.profile,
        mode: input.mode,
        equation_bundles: &input.equation_bundles,
        basis: &input.basis,
    };
    let bytes = serde_json::to_vec(&view).unwrap_or_default();
    crate::receipts::sha256_hex(&bytes)
}

/// [`KernelInput`] without the payload text (see [`input_digest`]).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DigestView<'a> {
    signal: SignalView<'a>,
    profile: EvaluationProfile,
    mode: EvaluationMode,
    equation_bundles: &'a [String],
    basis: &'a StateBasis,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SignalView<'a> {
    id: &'a Uuid,
    tenant_id: &'a Uuid,
    product_surface: ProductSurface,
    source_type: SourceType,
    source_id: &'a str,
    source_trust_level: f64,
    source_authority_level: f64,
    authority_ceiling_applied: bool,
    target_substrate: TargetSubstrate,
    target_region_id: &'a Option<Uuid>,
    trace_id: &'a Uuid,
    proposed_mutation: ProposedMutation,
    event_type: Option<EventType>,
    payload_digest: &'a str,
    payload_summary: &'a Option<String>,
    raw_payload_ref: &'a Option<String>,
    authority_claim: &'a Option<String>,
    evidence_refs: &'a [String],
    observed_at: &'a Option<String>,
    metadata: &'a FreeForm,
}

struct Gap {
    kind: ObstructionType,
    severity: Severity,
    explanation: String,
    repair: RepairClass,
    candidates: Vec<RepairClass>,
    approvals: Vec<String>,
    steps: Vec<RepairStep>,
    expected: ExpectedOutcome,
}

fn step(id: &str, description: String, effect: &str) -> RepairStep {
    RepairStep {
        step_id: id.into(),
        description,
        expected_effect: effect.into(),
        required_actor_role: None,
        required_authority: None,
        required_evidence: vec![],
        automatable: false,
    }
}

/// Evaluates one signal. Pure and deterministic.
pub fn evaluate(input: &KernelInput, policy: &CompiledPolicy) -> KernelOutput {
    evaluate_with_digest(input, policy, input_digest(input))
}

/// [`evaluate`] with the input digest already computed (the cache computes it for its key).
pub fn evaluate_with_digest(
    input: &KernelInput,
    policy: &CompiledPolicy,
    digest: String,
) -> KernelOutput {
    let mint = |what: &str| Uuid::new_v5(&NAMESPACE, format!("{what}:{digest}").as_bytes());
    let s = &input.signal;
    let basis = &input.basis;
    let mut reasons: Vec<String> = Vec::new();

    // Profile tightens or loosens the policy's thresholds.
    let (shift, authority_bump, evidence_bump) = match input.profile {
        EvaluationProfile::Lightweight => (0.05, 0.0, 0),
        EvaluationProfile::Standard | EvaluationProfile::FullGeometric => (0.0, 0.0, 0),
        EvaluationProfile::HighAssurance | EvaluationProfile::ProductDeep => (-0.1, 0.1, 1),
    };
    let warn_th = (policy.warn_threshold + shift).clamp(0.0, 1.0);
    let quarantine_th = (policy.quarantine_threshold + shift).clamp(0.0, 1.0);
    let block_th = (policy.block_threshold + shift).clamp(0.0, 1.0);
    let req = policy.requirement(s.target_substrate, s.proposed_mutation);
    let min_authority = (req.min_authority
        + if req.min_authority > 0.0 {
            authority_bump
        } else {
            0.0
        })
    .min(1.0);
    let min_evidence = req.min_evidence
        + if req.min_evidence > 0 {
            evidence_bump
        } else {
            0
        };

    // Coordination: a source whose recent writes keep being refused loses trust.
    let refused_ratio = if basis.source_recent == 0 {
        0.0
    } else {
        basis.source_refused as f64 / basis.source_recent as f64
    };
    let decaying = basis.source_recent >= 4 && refused_ratio >= policy.trust_decay_ratio;
    let mut trust = s.source_trust_level;
    if decaying {
        trust *= 1.0 - refused_ratio;
        reasons.push("source_trust_decayed".into());
    }
    if s.authority_ceiling_applied {
        reasons.push("authority_ceiling_applied".into());
    }

    // Detectors. Lightweight runs only the poisoning ones.
    let meta_text = if s.metadata.is_empty() {
        None
    } else {
        serde_json::to_string(&s.metadata).ok()
    };
    let ctx = ScanContext {
        source_type: s.source_type.as_str(),
        source_trust: trust,
        source_authority: s.source_authority_level,
        authority_claim: s.authority_claim.as_deref(),
        event_type: s.event_type.map(|e| e.as_str()),
        metadata_text: meta_text.as_deref(),
        metadata: Some(&s.metadata),
    };
    let mut findings: Vec<Finding> = policy.detectors.scan(&s.payload, &ctx);
    if let Some(summary) = &s.payload_summary {
        for f in policy.detectors.scan(summary, &ctx) {
            if !findings.iter().any(|g| g.reason_code == f.reason_code) {
                findings.push(f);
            }
        }
    }
    if input.profile == EvaluationProfile::Lightweight {
        findings.retain(|f| is_poisoning(f.kind));
    }
    findings.sort_by(|a, b| (a.kind, a.reason_code).cmp(&(b.kind, b.reason_code)));
    for f in &findings {
        reasons.push(f.reason_code.to_string());
    }

    // A claim is only risky from a source without the authority to make it:
    // policy language from the policy owner is what a policy corpus is for. The
    // learned detector judges wording, and orders to agents are what a source with
    // authority over them writes, so its findings are discounted the same way; in
    // the policy corpus, where authority requirements govern influence, it warns
    // and never holds a write by itself.
    let claim_discount = 1.0 - s.source_authority_level.clamp(0.0, 1.0);
    for f in findings.iter_mut() {
        let learned = detectors::is_learned(f.reason_code);
        if learned
            || matches!(
                f.kind,
                DetectorKind::PolicyClaim | DetectorKind::AuthorityClaim
            )
        {
            f.weight *= claim_discount;
        }
        if learned && s.target_substrate == TargetSubstrate::PolicyCorpus {
            f.weight = f.weight.min(detectors::MODEL_WARN_WEIGHT);
        }
    }
    let has = |k: DetectorKind| findings.iter().any(|f| f.kind == k);
    let trust_risk = 0.25 * (1.0 - trust.clamp(0.0, 1.0));
    let base = mutation_base_risk(s.proposed_mutation);
    let poisoning = round(combine(
        weights(&findings, |f| is_poisoning(f.kind)).chain([base, trust_risk]),
    ));
    let risk = round(combine(
        weights(&findings, |_| true).chain([base, trust_risk]),
    ));
    // Authority counts only as far as trust backs it; a bare claim in the text adds nothing.
    let authority = round(s.source_authority_level * (0.6 + 0.4 * trust.clamp(0.0, 1.0)));
    let evidence = round(1.0 - 0.5f64.powi(s.evidence_refs.len().min(30) as i32));

    let authority_gap = authority + 1e-9 < min_authority;
    let evidence_gap = (s.evidence_refs.len() as u32) < min_evidence;
    let sensitivity = detectors::sensitivity(&findings);

    // The decision, in order of severity.
    let mut gap: Option<Gap> = None;
    let mut decision;
    if has(DetectorKind::Secret) || poisoning >= block_th {
        decision = RuntimeDecision::Block;
        reasons.push(if has(DetectorKind::Secret) {
            "secret_in_payload".into()
        } else {
            "risk_above_block_threshold".to_string()
        });
        gap = Some(if has(DetectorKind::Secret) {
            Gap {
                kind: ObstructionType::SensitivityViolation,
                severity: Severity::Critical,
                explanation: "The payload carries a secret or credential; it must not be stored where models read it.".into(),
                repair: RepairClass::DisclosureRewrite,
                candidates: vec![RepairClass::DisclosureRewrite, RepairClass::Tombstone],
                approvals: vec![],
                steps: vec![step("remove-secret", "Remove or redact the credential from the payload and resubmit.".into(), "the write no longer discloses a secret")],
                expected: ExpectedOutcome::AllowAfterRepair,
            }
        } else {
            poisoning_gap(poisoning, block_th)
        });
    } else if poisoning >= quarantine_th {
        decision = RuntimeDecision::Quarantine;
        reasons.push("risk_above_quarantine_threshold".into());
        gap = Some(poisoning_gap(poisoning, quarantine_th));
    } else if has(DetectorKind::SourceLaundering)
        && s.target_substrate != TargetSubstrate::PolicyCorpus
    {
        // Outside the policy corpus nothing gates a policy-like claim by
        // authority. RAG stores are full of legal texts, policies and rules, so
        // the claim alone does not hold the write: it stays observable, marked
        // untrusted, and may not become an action basis. Orders aimed at an AI
        // reader are held by the injection findings above.
        decision = RuntimeDecision::MarkUntrusted;
        reasons.push("policy_claim_outside_policy_corpus".into());
        gap = Some(Gap {
            kind: ObstructionType::SourceLaundering,
            severity: Severity::Moderate,
            explanation: format!(
                "A low-trust source (trust {:.2}) writes policy-like or authoritative language into {}; it stays observable as untrusted content and carries no authority until its owner confirms it.",
                trust, s.target_substrate.as_str()
            ),
            repair: RepairClass::AuthorityRerouting,
            candidates: vec![RepairClass::AuthorityRerouting, RepairClass::ManualReview],
            approvals: vec![format!("{}_owner", s.target_substrate.as_str())],
            steps: vec![step("route-to-authority", "Route the claim to its owner; it gains authority only with their approval, or by moving it to the policy corpus.".into(), "the claim carries real authority or stays untrusted")],
            expected: ExpectedOutcome::AllowAfterRepair,
        });
    } else if authority_gap || evidence_gap {
        decision = RuntimeDecision::MarkUntrusted;
        if authority_gap {
            reasons.push("authority_below_requirement".into());
        }
        if evidence_gap {
            reasons.push("evidence_below_requirement".into());
        }
        let laundering = has(DetectorKind::SourceLaundering);
        let mut steps = Vec::new();
        let mut approvals = Vec::new();
        if authority_gap {
            approvals.push(format!("{}_owner", s.target_substrate.as_str()));
            let mut st = step(
                "obtain-authority",
                format!("Have a principal with authority of at least {min_authority:.2} for {} approve or resubmit this content.", s.target_substrate.as_str()),
                "the signal carries the authority the policy requires",
            );
            st.required_actor_role = Some(format!("{}_owner", s.target_substrate.as_str()));
            st.required_authority = Some(format!("{min_authority:.2}"));
            steps.push(st);
        }
        if evidence_gap {
            let mut st = step(
                "attach-evidence",
                format!("Attach at least {min_evidence} evidence reference(s) (documents, receipts, tickets) supporting this content."),
                "the signal meets the evidence requirement",
            );
            st.required_evidence = vec![format!("{min_evidence} evidence reference(s)")];
            steps.push(st);
        }
        gap = Some(Gap {
            kind: if laundering {
                ObstructionType::SourceLaundering
            } else if authority_gap {
                ObstructionType::AuthorityGap
            } else {
                ObstructionType::EvidenceGap
            },
            severity: if matches!(s.target_substrate, TargetSubstrate::PolicyCorpus | TargetSubstrate::ExecutionBoundary | TargetSubstrate::CodeSubstrate) { Severity::High } else { Severity::Moderate },
            explanation: format!(
                "{} requires authority {:.2} and {} evidence reference(s); the signal has authority {:.2} and {} evidence reference(s). It stays observable with a warning and may not become {}.",
                s.target_substrate.as_str(), min_authority, min_evidence, authority, s.evidence_refs.len(), req.max_influence.as_str()
            ),
            repair: if authority_gap { RepairClass::AuthorityRerouting } else { RepairClass::EvidenceInsertion },
            candidates: [authority_gap.then_some(RepairClass::AuthorityRerouting), evidence_gap.then_some(RepairClass::EvidenceInsertion), Some(RepairClass::ManualReview)].into_iter().flatten().collect(),
            approvals,
            steps,
            expected: ExpectedOutcome::AllowAfterRepair,
        });
    } else if has(DetectorKind::GeneratedAsObserved) && risk >= warn_th {
        decision = RuntimeDecision::MarkUntrusted;
        gap = Some(Gap {
            kind: ObstructionType::GeneratedAsObserved,
            severity: Severity::Moderate,
            explanation: "Agent or tool output presents itself as first-hand observation; it is kept as untrusted until corroborated.".into(),
            repair: RepairClass::EvidenceInsertion,
            candidates: vec![RepairClass::EvidenceInsertion, RepairClass::ManualReview],
            approvals: vec![],
            steps: vec![step("corroborate", "Attach an independent observation (evidence reference) of the claimed fact.".into(), "the claim is backed by observation")],
            expected: ExpectedOutcome::AllowAfterRepair,
        });
    } else if risk > req.max_risk {
        decision = RuntimeDecision::MarkUntrusted;
        reasons.push("risk_above_max_risk".into());
    } else if risk >= warn_th {
        decision = RuntimeDecision::AllowWithWarning;
        reasons.push("risk_above_warn_threshold".into());
    } else {
        decision = RuntimeDecision::Allow;
    }

    // The mode decides how hard gaps bite.
    match input.mode {
        EvaluationMode::Approval if decision == RuntimeDecision::MarkUntrusted && gap.is_some() => {
            decision = RuntimeDecision::RequireReview;
            reasons.push("mode_approval_requires_review".into());
        }
        EvaluationMode::HighAssurance => {
            if decision == RuntimeDecision::Quarantine {
                decision = RuntimeDecision::Block;
                reasons.push("mode_high_assurance_blocks".into());
            } else if matches!(
                decision,
                RuntimeDecision::MarkUntrusted | RuntimeDecision::AllowWithWarning
            ) {
                decision = RuntimeDecision::RequireReview;
                reasons.push("mode_high_assurance_requires_review".into());
            }
        }
        _ => {}
    }

    // Where the trace would go.
    let from_phase = basis.phase.unwrap_or(TracePhase::Observed);
    let from_influence = basis.influence;
    let wanted = match decision {
        RuntimeDecision::Allow | RuntimeDecision::AllowWithWarning | RuntimeDecision::Harden => {
            let canonical = matches!(
                s.proposed_mutation,
                ProposedMutation::CanonicalizeTrace
                    | ProposedMutation::UpdatePolicy
                    | ProposedMutation::DeployCode
            ) && min_authority > 0.0
                && req.max_influence >= AllowedInfluence::CanonicalMemory;
            if canonical && decision == RuntimeDecision::Allow {
                TracePhase::Canonical
            } else if decision == RuntimeDecision::Allow {
                TracePhase::Accepted
            } else {
                TracePhase::Working
            }
        }
        RuntimeDecision::MarkUntrusted => TracePhase::Untrusted,
        RuntimeDecision::Quarantine
        | RuntimeDecision::RequireReview
        | RuntimeDecision::Defer
        | RuntimeDecision::Repair => TracePhase::Quarantined,
        // A refused mutation does not change the substrate.
        RuntimeDecision::Block | RuntimeDecision::Escalate => from_phase,
    };
    let mut to_phase = wanted;
    if !transitions::allowed(from_phase, wanted) {
        // e.g. an unauthorised update of canonical content: hold it for review
        // rather than let it downgrade (or replace) what is canonical.
        to_phase = from_phase;
        reasons.push("transition_not_allowed".into());
        if !matches!(decision, RuntimeDecision::Block | RuntimeDecision::Escalate) {
            decision = RuntimeDecision::RequireReview;
            gap = Some(Gap {
                kind: if s.target_substrate == TargetSubstrate::PolicyCorpus { ObstructionType::PolicyConflict } else { ObstructionType::MemoryConflict },
                severity: Severity::High,
                explanation: format!(
                    "The trace is {}; moving it to {} is not an allowed transition. The change needs review by an owner with authority.",
                    from_phase.as_str(), wanted.as_str()
                ),
                repair: RepairClass::ManualReview,
                candidates: vec![RepairClass::ManualReview, RepairClass::Recanonicalization],
                approvals: vec![format!("{}_owner", s.target_substrate.as_str())],
                steps: vec![step("review", "An owner reviews the change against the current canonical content.".into(), "the change is applied or rejected deliberately")],
                expected: ExpectedOutcome::ManualResolutionRequired,
            });
        }
    }
    let ceiling = transitions::phase_ceiling(to_phase, s.target_substrate).min(req.max_influence);
    let to_influence = if matches!(decision, RuntimeDecision::Block | RuntimeDecision::Escalate) {
        from_influence.min(ceiling)
    } else {
        ceiling
    };
    if transitions::phase_ceiling(to_phase, s.target_substrate) > req.max_influence {
        reasons.push("influence_capped_by_policy".into());
    }

    let shadow = input.mode == EvaluationMode::Shadow;
    let enforced = !shadow && input.mode != EvaluationMode::Advisory;
    let (mut outcome, mut status) = outcome_of(decision);
    if gap.is_some() && matches!(decision, RuntimeDecision::MarkUntrusted) {
        outcome = GovernanceOutcome::RepairRequired;
        status = KernelStatus::RepairRequired;
    }
    if shadow {
        outcome = GovernanceOutcome::SimulateOnly;
        status = KernelStatus::Simulated;
        reasons.push("mode_shadow".into());
    }
    if input.mode == EvaluationMode::Advisory {
        reasons.push("mode_advisory".into());
    }
    dedup(&mut reasons);

    let target_id = s.target_region_id.unwrap_or(s.trace_id).to_string();
    let obstruction_and_plan = gap.map(|g| {
        let oid = mint("obstruction");
        let obstruction = Obstruction {
            id: oid,
            obstruction_type: g.kind,
            severity: g.severity,
            status: if g.approvals.is_empty() {
                ObstructionStatus::RepairPlanned
            } else {
                ObstructionStatus::AwaitingAuthority
            },
            target_type: obstruction_target(s.target_substrate),
            target_id: target_id.clone(),
            explanation: g.explanation,
            candidate_repair_classes: g.candidates,
        };
        let plan = RepairPlan {
            id: mint("repair_plan"),
            obstruction_id: oid,
            repair_class: g.repair,
            status: RepairStatus::Proposed,
            expected_outcome: g.expected,
            proposed_steps: g.steps,
            required_approvals: g.approvals,
            completion_receipt_id: None,
        };
        (obstruction, plan)
    });
    let (obstruction, repair_plan) = match obstruction_and_plan {
        Some((o, p)) => (Some(o), Some(p)),
        None => (None, None),
    };

    let governed_signal = GovernedSignal {
        id: Some(mint("governed_signal")),
        tenant_id: s.tenant_id,
        substrate_signal_id: Some(s.id),
        source_type: s.source_type.as_str().to_string(),
        source_id: s.source_id.clone(),
        intent: intent_of(s.proposed_mutation, s.event_type),
        target_type: target_type_of(s.target_substrate),
        target_id: target_id.clone(),
        risk_class: risk_class(risk),
        sensitivity: sensitivity.to_string(),
        status: match status {
            KernelStatus::Executed | KernelStatus::RepairRequired => "executed",
            KernelStatus::Denied => "denied",
            KernelStatus::Deferred => "deferred",
            KernelStatus::Escalated => "escalated",
            KernelStatus::Quarantined => "quarantined",
            _ => "decisioned",
        }
        .to_string(),
        proposed_effect: Some(
            json!({
                "proposedMutation": s.proposed_mutation,
                "targetSubstrate": s.target_substrate,
                "requestedInfluence": req.max_influence,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        ),
    };

    let coordination = {
        let friction = round(refused_ratio.max(if obstruction.is_some() { 0.25 } else { 0.0 }));
        let load = round((basis.source_recent as f64 / 100.0).min(1.0));
        let regime = if decaying {
            CoordinationRegime::TrustDecay
        } else if decision == RuntimeDecision::Block {
            CoordinationRegime::Unsafe
        } else if load >= 0.8 {
            CoordinationRegime::LoadRisk
        } else if has(DetectorKind::AuthorityClaim) && authority_gap {
            CoordinationRegime::AuthorityAmbiguous
        } else if friction >= 0.5 {
            CoordinationRegime::FrictionSpike
        } else {
            CoordinationRegime::Stable
        };
        let wanted = matches!(
            input.profile,
            EvaluationProfile::FullGeometric
                | EvaluationProfile::ProductDeep
                | EvaluationProfile::HighAssurance
        ) || regime != CoordinationRegime::Stable;
        wanted.then(|| CoordinationState {
            id: mint("coordination_state"),
            subject_type: if s.source_type == SourceType::AgentOutput
                || s.source_type == SourceType::ToolOutput
            {
                CoordinationSubjectType::Agent
            } else {
                CoordinationSubjectType::Edge
            },
            subject_id: s.source_id.clone(),
            regime,
            coherence_score: round(1.0 - risk),
            friction,
            load,
            source_receipt_id: None,
        })
    };

    let mut allowed_influence = FreeForm::new();
    allowed_influence.insert("level".into(), json!(to_influence));
    allowed_influence.insert("ceiling".into(), json!(req.max_influence));
    allowed_influence.insert("phase".into(), json!(to_phase));

    let mut artifacts = FreeForm::new();
    artifacts.insert("coefficientVersionId".into(), json!(policy.version_id));
    artifacts.insert("policy".into(), json!(policy.name));
    artifacts.insert(
        "requirement".into(),
        json!({"minAuthority": min_authority, "minEvidence": min_evidence, "maxRisk": req.max_risk, "maxInfluence": req.max_influence}),
    );
    artifacts.insert("thresholds".into(), json!({"warn": round(warn_th), "quarantine": round(quarantine_th), "block": round(block_th)}));
    artifacts.insert("poisoningRisk".into(), json!(poisoning));
    artifacts.insert(
        "findings".into(),
        Value::Array(findings.iter().map(|f| json!({"kind": f.kind, "reasonCode": f.reason_code, "weight": round(f.weight), "detail": f.detail})).collect()),
    );

    let trace = Trace {
        id: s.trace_id,
        current_phase: if enforced { to_phase } else { from_phase },
        allowed_influence: if enforced {
            to_influence
        } else {
            from_influence
        },
        trace_type: Some(s.target_substrate.as_str().to_string()),
    };
    let transition = Transition {
        trace_id: s.trace_id,
        from_phase,
        to_phase,
        from_influence,
        to_influence,
        transition_name: Some(transitions::name(from_phase, to_phase)),
        enforced,
        reason_codes: reasons.clone(),
    };

    KernelOutput {
        input_digest: digest.clone(),
        decision,
        outcome,
        status,
        risk_score: risk,
        authority_score: authority,
        evidence_score: evidence,
        reason_codes: reasons,
        governed_signal,
        governance_decision_id: mint("governance_decision"),
        kernel_result_id: mint("kernel_result"),
        allowed_influence,
        next_phase: trace.current_phase,
        next_influence: trace.allowed_influence,
        trace,
        transition,
        obstruction,
        repair_plan,
        coordination_state: coordination,
        profile_artifacts: artifacts,
    }
}

fn poisoning_gap(risk: f64, threshold: f64) -> Gap {
    Gap {
        kind: ObstructionType::PoisoningRisk,
        severity: if risk >= 0.9 { Severity::Critical } else { Severity::High },
        explanation: format!("The payload carries instructions or obfuscation aimed at models (poisoning risk {risk:.2} >= {threshold:.2}); it is kept away from retrieval."),
        repair: RepairClass::Quarantine,
        candidates: vec![RepairClass::Quarantine, RepairClass::ManualReview, RepairClass::Tombstone],
        approvals: vec!["security_reviewer".into()],
        steps: vec![step("review-content", "A reviewer inspects the held record and releases or rejects it.".into(), "the record is released deliberately or discarded")],
        expected: ExpectedOutcome::ManualResolutionRequired,
    }
}

fn dedup(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(x.clone()));
}

#[cfg(test)]
mod tests;
