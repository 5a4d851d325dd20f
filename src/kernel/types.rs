//! The specification's vocabulary: every enumeration and typed object of
//! `signal-integrity-service.md`, with exactly the fields its tables list.
//! These types are what the kernel returns and what the API serializes; the
//! OpenAPI document is generated from them, so spec, code and docs read alike.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

/// Declares a spec enumeration: snake_case on the wire, an `as_str`, the list
/// of all values (for validation messages) and a parser.
/// `$wire` is a `tt`, not a `literal`: a `literal` fragment reaches derive macros wrapped in an
/// invisible group, which serde reads but utoipa's `ToSchema` silently skipped, so the OpenAPI
/// document listed the Rust variant names (`Generic`) instead of the wire values (`generic`).
macro_rules! spec_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $wire:tt),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
        pub enum $name { $(#[serde(rename = $wire)] $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire),+ }
            }
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($wire => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spec_enum!(ProductSurface { Generic => "generic", ProductA => "product_a", ProductB => "product_b", ProductC => "product_c" });

spec_enum!(SourceType {
    UserInput => "user_input", AgentOutput => "agent_output", RetrievedDocument => "retrieved_document",
    ToolOutput => "tool_output", ExternalApi => "external_api", WorkflowEvent => "workflow_event",
    ReviewComment => "review_comment", DocumentEdit => "document_edit", ManualAdmin => "manual_admin",
    SystemEvent => "system_event",
});

spec_enum!(TargetSubstrate {
    AgentMemory => "agent_memory", RagStore => "rag_store", PolicyCorpus => "policy_corpus",
    Document => "document", KnowledgeBase => "knowledge_base", WorkflowState => "workflow_state",
    ReviewRoom => "review_room", PaperSection => "paper_section", ExecutionBoundary => "execution_boundary",
    CoordinationField => "coordination_field", CodeSubstrate => "code_substrate",
});

spec_enum!(ProposedMutation {
    CreateTrace => "create_trace", UpdateTrace => "update_trace", PromoteTrace => "promote_trace",
    CanonicalizeTrace => "canonicalize_trace", WriteMemory => "write_memory", UpdatePolicy => "update_policy",
    UpdateEmbedding => "update_embedding", LockDocumentSection => "lock_document_section",
    ChangeWorkflowState => "change_workflow_state", ReleaseAction => "release_action",
    ExecuteTool => "execute_tool", SubmitReview => "submit_review", FinalizeSection => "finalize_section",
    DeployCode => "deploy_code",
});

spec_enum!(EventType {
    Decision => "decision", Consensus => "consensus", Conflict => "conflict",
    InformationExchange => "information_exchange", MemoryWrite => "memory_write",
    AuthorityClaim => "authority_claim", PolicyClaim => "policy_claim",
    ExecutionRequest => "execution_request", DisclosureRelease => "disclosure_release",
    CodeMutation => "code_mutation",
});

spec_enum!(Intent {
    Observe => "observe", Suggest => "suggest", WriteMemory => "write_memory", UpdateDocument => "update_document",
    Canonicalize => "canonicalize", Commit => "commit", Approve => "approve", Disclose => "disclose",
    ExecuteTool => "execute_tool", MutateExternalSystem => "mutate_external_system", Repair => "repair",
    Revoke => "revoke", Archive => "archive", Quarantine => "quarantine",
    ResolveContradiction => "resolve_contradiction", PromoteTrace => "promote_trace",
    CreateCandidate => "create_candidate", ActualizeCandidate => "actualize_candidate",
    LockSection => "lock_section", FinalizeDocument => "finalize_document", DeployCode => "deploy_code",
});

spec_enum!(GovernedTargetType {
    Memory => "memory", Document => "document", DocumentSection => "document_section", Room => "room",
    Workflow => "workflow", Policy => "policy", Agent => "agent", Customer => "customer", Project => "project",
    Organization => "organization", ExternalSystem => "external_system", Trace => "trace", Receipt => "receipt",
    CodeRepository => "code_repository", Deployment => "deployment", ProofEdge => "proof_edge",
    CoordinationState => "coordination_state", Retrieval => "retrieval",
});

spec_enum!(
    /// RiskClass and Severity share their values.
    RiskClass { Low => "low", Moderate => "moderate", High => "high", Critical => "critical" }
);
pub type Severity = RiskClass;

spec_enum!(RuntimeDecision {
    Allow => "allow", AllowWithWarning => "allow_with_warning", MarkUntrusted => "mark_untrusted",
    Quarantine => "quarantine", RequireReview => "require_review", Defer => "defer", Harden => "harden",
    Repair => "repair", Block => "block", Escalate => "escalate",
});

spec_enum!(GovernanceOutcome {
    Allow => "allow", AllowWithConstraints => "allow_with_constraints", Defer => "defer", Escalate => "escalate",
    Deny => "deny", Quarantine => "quarantine", SimulateOnly => "simulate_only", RepairRequired => "repair_required",
    RewriteRequired => "rewrite_required", Revoke => "revoke", Tombstone => "tombstone",
});

spec_enum!(EvaluationProfile {
    Lightweight => "lightweight", Standard => "standard", HighAssurance => "high_assurance",
    FullGeometric => "full_geometric", ProductDeep => "product_deep",
});

spec_enum!(EvaluationMode {
    Shadow => "shadow", Advisory => "advisory", Approval => "approval", Enforcement => "enforcement",
    HighAssurance => "high_assurance",
});

spec_enum!(KernelStatus {
    Executed => "executed", Denied => "denied", Deferred => "deferred", Escalated => "escalated",
    Quarantined => "quarantined", Simulated => "simulated", RepairRequired => "repair_required",
    RewriteRequired => "rewrite_required", Revoked => "revoked", Tombstoned => "tombstoned",
});

spec_enum!(TracePhase {
    Observed => "observed", Ephemeral => "ephemeral", Untrusted => "untrusted", Quarantined => "quarantined",
    Working => "working", Accepted => "accepted", Locked => "locked", Canonical => "canonical",
    Crystallized => "crystallized", Superseded => "superseded", Revoked => "revoked", Tombstoned => "tombstoned",
});

spec_enum!(
    /// Ordered from least to most influence: `Ord` follows declaration order.
    AllowedInfluence {
        None => "none", LocalOnly => "local_only", RetrievalWithWarning => "retrieval_with_warning",
        WorkingContext => "working_context", AcceptedContext => "accepted_context",
        CanonicalMemory => "canonical_memory", PolicyAuthority => "policy_authority",
        ExecutionBasis => "execution_basis",
    }
);

spec_enum!(ObstructionType {
    AuthorityGap => "authority_gap", PolicyConflict => "policy_conflict", EvidenceGap => "evidence_gap",
    CoherenceDeficit => "coherence_deficit", MemoryConflict => "memory_conflict",
    SensitivityViolation => "sensitivity_violation", WorkflowBlock => "workflow_block",
    ExternalDrift => "external_drift", ReceiptFailure => "receipt_failure",
    ContradictionUnresolved => "contradiction_unresolved", StaleBasis => "stale_basis",
    PoisoningRisk => "poisoning_risk", AgentOverreach => "agent_overreach",
    InvalidRealitySurface => "invalid_reality_surface", UnsafeActionBasis => "unsafe_action_basis",
    ScopeViolation => "scope_violation", SourceLaundering => "source_laundering",
    GeneratedAsObserved => "generated_as_observed", CanonicalizationFailure => "canonicalization_failure",
    DisclosureBasisFailure => "disclosure_basis_failure", TemporalMaturityFailure => "temporal_maturity_failure",
    PredictionMissing => "prediction_missing", RevocationRequired => "revocation_required",
    TombstoneRequired => "tombstone_required",
});

spec_enum!(ObstructionStatus {
    Open => "open", RepairPlanned => "repair_planned", AwaitingAuthority => "awaiting_authority",
    AwaitingEvidence => "awaiting_evidence", Repairing => "repairing", Resolved => "resolved",
    Rejected => "rejected", Quarantined => "quarantined", Tombstoned => "tombstoned", Escalated => "escalated",
});

spec_enum!(ObstructionTargetType {
    Signal => "signal", Trace => "trace", Memory => "memory", Policy => "policy", Document => "document",
    DocumentSection => "document_section", Workflow => "workflow", Disclosure => "disclosure",
    Action => "action", Agent => "agent", CodeChange => "code_change", Receipt => "receipt",
    CoordinationState => "coordination_state",
});

spec_enum!(RepairClass {
    ScopeReduction => "scope_reduction", PrerequisiteInsertion => "prerequisite_insertion",
    Substitution => "substitution", Reordering => "reordering", Downgrade => "downgrade", Rollback => "rollback",
    Quarantine => "quarantine", Escalation => "escalation", Recertification => "recertification",
    PolicyClarification => "policy_clarification", MemoryCorrection => "memory_correction",
    AuthorityRerouting => "authority_rerouting", DisclosureRewrite => "disclosure_rewrite",
    EvidenceInsertion => "evidence_insertion", ContradictionResolution => "contradiction_resolution",
    Tombstone => "tombstone", Recanonicalization => "recanonicalization",
    DependencyInvalidation => "dependency_invalidation", ManualReview => "manual_review",
    SimulationOnly => "simulation_only",
});

spec_enum!(RepairStatus {
    Draft => "draft", Proposed => "proposed", Approved => "approved", Rejected => "rejected",
    Executing => "executing", Completed => "completed", Failed => "failed", Superseded => "superseded",
});

spec_enum!(ExpectedOutcome {
    AllowAfterRepair => "allow_after_repair", AllowWithConstraints => "allow_with_constraints",
    Downgrade => "downgrade", Route => "route", Quarantine => "quarantine", Revoke => "revoke",
    Tombstone => "tombstone", ManualResolutionRequired => "manual_resolution_required",
});

spec_enum!(CoordinationSubjectType {
    Person => "person", Team => "team", Project => "project", Document => "document", Room => "room",
    Workflow => "workflow", Agent => "agent", Customer => "customer", Organization => "organization",
    Edge => "edge", Policy => "policy", Codebase => "codebase",
});

spec_enum!(CoordinationRegime {
    Stable => "stable", AttentionDrift => "attention_drift", MemoryFragmentation => "memory_fragmentation",
    RecursiveCollapse => "recursive_collapse", TrustDecay => "trust_decay", LoadRisk => "load_risk",
    FrictionSpike => "friction_spike", AuthorityAmbiguous => "authority_ambiguous",
    PolicyConflict => "policy_conflict", Unsafe => "unsafe", Recovery => "recovery",
});

spec_enum!(ReplayStatus { Matched => "matched", Mismatch => "mismatch", Partial => "partial", Failed => "failed" });

spec_enum!(SubscriptionStatus { Active => "active", Paused => "paused", Revoked => "revoked" });

/// Free-form JSON object (`object with free-form values` in the spec).
pub type FreeForm = Map<String, Value>;

// ---------------------------------------------------------------- ingest

/// The longest `sourceId` the gate takes, in characters (see [`IngestRequest::source_id`]).
pub const SOURCE_ID_MAX_CHARS: usize = 512;

/// The ingest request, exactly the spec's table. Defaults are applied by
/// [`crate::api::signals`] during validation, not here, so that the stored
/// normalized signal always carries explicit values.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    pub product_surface: ProductSurface,
    pub source_type: SourceType,
    /// Length at least 1 (the spec) and at most [`SOURCE_ID_MAX_CHARS`] (the gate: a source's
    /// receipts are indexed by it, and PostgreSQL indexes no entry over ~2.7 KB).
    #[schema(min_length = 1, max_length = 512)]
    pub source_id: String,
    /// 0 to 1; default 0.5.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub source_trust_level: Option<f64>,
    /// 0 to 1; default 0. Clamped to the API key's authority ceiling.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub source_authority_level: Option<f64>,
    pub target_substrate: TargetSubstrate,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub target_region_id: Option<Uuid>,
    pub proposed_mutation: ProposedMutation,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub event_type: Option<EventType>,
    /// Length at least 1.
    #[schema(min_length = 1)]
    pub payload: String,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub payload_summary: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub raw_payload_ref: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub authority_claim: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub evidence_refs: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    #[schema(format = DateTime)]
    pub observed_at: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<FreeForm>,
}

/// `signal` inside the ingest response: snake_case, as the spec's table says.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignalRecord {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub product_surface: ProductSurface,
    pub source_type: SourceType,
    pub target_substrate: TargetSubstrate,
    pub proposed_mutation: ProposedMutation,
    pub payload_digest: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestResponse {
    pub signal: SignalRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub governed_signal: Option<GovernedSignal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GovernedSignal {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    pub tenant_id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub substrate_signal_id: Option<Uuid>,
    pub source_type: String,
    pub source_id: String,
    pub intent: Intent,
    pub target_type: GovernedTargetType,
    pub target_id: String,
    pub risk_class: RiskClass,
    pub sensitivity: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub proposed_effect: Option<FreeForm>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GovernanceDecision {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    pub signal_id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<Uuid>,
    pub outcome: GovernanceOutcome,
    #[serde(default)]
    pub reason_codes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_decision: Option<RuntimeDecision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub allowed_influence: Option<FreeForm>,
    /// Only in the top-level evaluate response.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub risk_score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub authority_score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub evidence_score: Option<f64>,
}

// ---------------------------------------------------------------- evaluate

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvaluateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    pub signal_id: Uuid,
    /// Default `standard`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub evaluation_profile: Option<EvaluationProfile>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub evaluation_mode: Option<EvaluationMode>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub equation_bundles: Option<Vec<String>>,
}

/// Receipt reference at the top level of the evaluate response (snake_case `replay_hash`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReceiptRef {
    pub id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<RuntimeDecision>,
}

/// Receipt reference inside a kernel result (camelCase `replayHash`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelReceiptRef {
    pub id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<RuntimeDecision>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignalIdRef {
    pub id: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvaluateResponse {
    pub decision: RuntimeDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation_profile: Option<EvaluationProfile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub profile_artifacts: Option<FreeForm>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub governed_signal: Option<GovernedSignal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub governance_decision: Option<GovernanceDecision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_result: Option<KernelResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt: Option<ReceiptRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<SignalIdRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_codes: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    pub tenant_id: Uuid,
    pub signal_id: Uuid,
    pub status: KernelStatus,
    /// Its `status` is a GovernedSignalStatus.
    pub governed_signal: GovernedSignal,
    /// Without the three score fields.
    pub governance_decision: GovernanceDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
    pub receipt: KernelReceiptRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transition: Option<Transition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub obstruction: Option<Obstruction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_plan: Option<RepairPlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_receipt_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordination_state: Option<CoordinationState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<FreeForm>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Trace {
    pub id: Uuid,
    pub current_phase: TracePhase,
    pub allowed_influence: AllowedInfluence,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_type: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Transition {
    pub trace_id: Uuid,
    pub from_phase: TracePhase,
    pub to_phase: TracePhase,
    pub from_influence: AllowedInfluence,
    pub to_influence: AllowedInfluence,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transition_name: Option<String>,
    #[serde(default)]
    pub enforced: bool,
    #[serde(default)]
    pub reason_codes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Obstruction {
    pub id: Uuid,
    pub obstruction_type: ObstructionType,
    pub severity: Severity,
    pub status: ObstructionStatus,
    pub target_type: ObstructionTargetType,
    pub target_id: String,
    pub explanation: String,
    #[serde(default)]
    pub candidate_repair_classes: Vec<RepairClass>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairPlan {
    pub id: Uuid,
    pub obstruction_id: Uuid,
    pub repair_class: RepairClass,
    pub status: RepairStatus,
    pub expected_outcome: ExpectedOutcome,
    #[serde(default)]
    pub proposed_steps: Vec<RepairStep>,
    #[serde(default)]
    pub required_approvals: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_receipt_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairStep {
    pub step_id: String,
    pub description: String,
    pub expected_effect: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_actor_role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_authority: Option<String>,
    #[serde(default)]
    pub required_evidence: Vec<String>,
    #[serde(default)]
    pub automatable: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CoordinationState {
    pub id: Uuid,
    pub subject_type: CoordinationSubjectType,
    pub subject_id: String,
    pub regime: CoordinationRegime,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub coherence_score: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub friction: f64,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub load: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_receipt_id: Option<Uuid>,
}

// ---------------------------------------------------------------- receipts and replay

/// `receipt` inside the fetch response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptBody {
    pub id: Uuid,
    pub replay_hash: String,
    pub decision: RuntimeDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt_payload: Option<FreeForm>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiptResponse {
    pub receipt: ReceiptBody,
    pub replay_available: bool,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayRequest {
    /// Default true.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub reexecute: Option<bool>,
    /// Any string, as the spec types it (at most 128 characters). A profile name
    /// (`lightweight`, `standard`, `high_assurance`, `full_geometric`, `product_deep`)
    /// re-executes under that profile; another string is not re-executed (the replay is
    /// `partial` and its `audit.evaluationProfile` says why).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, max_length = 128)]
    pub evaluation_profile: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub coefficient_version_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelArtifact {
    pub binding_type: String,
    pub binding_id: Uuid,
    pub verified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reexecution {
    #[serde(default)]
    pub attempted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_matched: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_decision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_decision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub governance_outcome_matched: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_outcome: Option<String>,
    #[serde(default = "default_true")]
    pub replay_mode: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coefficient_version_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coefficient_version_pinned: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coefficient_version_matched: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_coefficient_version_id: Option<Uuid>,
}

/// Optional request fields may be absent but not `null`: the spec types them
/// as strings, numbers or arrays, and a `null` is a type error (400).
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelReplayResponse {
    pub receipt_id: Uuid,
    pub replay_status: ReplayStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual_hash: Option<String>,
    #[serde(default)]
    pub mismatches: Vec<String>,
    #[serde(default)]
    pub kernel_artifacts: Vec<KernelArtifact>,
    #[serde(default)]
    #[schema(minimum = 0)]
    pub kernel_artifact_count: u64,
    #[serde(default)]
    #[schema(minimum = 0)]
    pub verified_kernel_artifact_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reexecution: Option<Reexecution>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub audit: Option<FreeForm>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthResponse {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}
