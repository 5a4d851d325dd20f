//! Request and response shapes of the five canonical operations, the
//! lifecycle routes and coordination state. camelCase, exhaustive fields
//! (`deny_unknown_fields`), optional fields absent rather than null; built
//! from the specification's objects (GovernanceDecision, Trace, Transition,
//! Obstruction, RepairPlan, CoordinationState, ReceiptRef).

use crate::kernel::operations::action::{ActionKind, BasisView};
use crate::kernel::operations::canonicalization::Assessment;
use crate::kernel::operations::configuration::{Boundary, Conflict, MemberView, WeakestLink};
use crate::kernel::operations::retrieval::RetrievalTreatment;
use crate::kernel::operations::reversal::{Residue, ReversalMode};
use crate::kernel::types::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

// ---------------------------------------------------------------- documentation-only schemas

/// A reference to a trace, a signal or a receipt of the tenant: `trace:<uuid>`,
/// `signal:<uuid>`, `receipt:<uuid>` or a bare (hyphenated) UUID. Documents the request
/// fields that hold one; the handlers parse them with `parse_subject_ref`, whose pattern this is.
#[derive(ToSchema)]
#[schema(
    pattern = "^((trace|signal|receipt):)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)]
#[allow(dead_code)]
pub struct SubjectRef(String);

/// The phases a trace can be promoted to.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum PromotionTarget {
    Accepted,
    Canonical,
    Crystallized,
}

// ---------------------------------------------------------------- configurations

/// One member of a candidate configuration.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigurationMember {
    /// `trace:<uuid>`, `signal:<uuid>`, `receipt:<uuid>` or a bare UUID (a trace, a signal or a receipt).
    #[serde(rename = "ref")]
    #[schema(value_type = SubjectRef)]
    pub reference: String,
    /// Free text: what the member does in the configuration (`memory`, `policy`, ...).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub role: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigurationEvaluateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    /// 1 to 100 members, each named once.
    #[schema(min_items = 1, max_items = 100)]
    pub members: Vec<ConfigurationMember>,
    /// Where the configuration will act; default: the strictest member's substrate.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub target_substrate: Option<TargetSubstrate>,
    /// What it will do there (default `update_trace`); selects the policy requirement.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub proposed_mutation: Option<ProposedMutation>,
    /// Influence every member must carry; default `accepted_context`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub required_influence: Option<AllowedInfluence>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigurationEvaluateResponse {
    pub configuration_id: Uuid,
    pub decision: RuntimeDecision,
    pub governance_decision: GovernanceDecision,
    pub target_substrate: TargetSubstrate,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub required_authority: f64,
    pub required_influence: AllowedInfluence,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weakest_authority: Option<WeakestLink>,
    pub boundaries: Vec<Boundary>,
    pub conflicts: Vec<Conflict>,
    pub members: Vec<MemberView>,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}

// ---------------------------------------------------------------- canonicalization

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanonicalizationEvaluateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    pub trace_id: Uuid,
    /// `accepted`, `canonical` or `crystallized`.
    #[schema(value_type = PromotionTarget)]
    pub target_phase: TracePhase,
    /// Promote now if nothing is missing; the API key's authority ceiling
    /// counts as the promotion's authority and must meet the policy's requirement.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub apply: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanonicalizationEvaluateResponse {
    pub decision: RuntimeDecision,
    pub governance_decision: GovernanceDecision,
    /// The trace after this answer (moved only when `promoted`).
    pub trace: Trace,
    /// The move it would make (`enforced` when made).
    pub transition: Transition,
    pub promoted: bool,
    pub assessment: Assessment,
    /// Canonical traces the promotion superseded.
    pub superseded_traces: Vec<Uuid>,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}

// ---------------------------------------------------------------- retrieval

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrievalCandidate {
    /// A trace id, a signal id, or a record id of the store (with `collection`).
    #[schema(min_length = 1, max_length = 512)]
    pub id: String,
    /// The text about to be used; scanned by the detectors when given (never stored).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrievalFilterRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    /// 1 to 1000 candidates.
    #[schema(min_items = 1, max_items = 1000)]
    pub candidates: Vec<RetrievalCandidate>,
    /// Collection (or index) the candidates come from: record ids are looked up in it.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1, max_length = 512)]
    pub collection: Option<String>,
    /// Filter pack of the store, for the audit record.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, min_length = 1, max_length = 128)]
    pub pack: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrievalResult {
    pub id: String,
    pub treatment: RetrievalTreatment,
    pub reason_codes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TreatmentCounts {
    pub include: u64,
    pub include_with_warning: u64,
    pub exclude: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrievalFilterResponse {
    pub decision: RuntimeDecision,
    pub governance_decision: GovernanceDecision,
    pub results: Vec<RetrievalResult>,
    pub counts: TreatmentCounts,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}

// ---------------------------------------------------------------- actions

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProtectedAction {
    /// The caller's id for the action: a released action answers the same
    /// release again; minted when absent.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub id: Option<Uuid>,
    pub kind: ActionKind,
    /// The tool, the recipient of the disclosure, or the deployment target.
    #[schema(min_length = 1, max_length = 512)]
    pub target: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, value_type = Option<Object>)]
    pub parameters: Option<FreeForm>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, max_length = 2000)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionReleaseRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    pub action: ProtectedAction,
    /// The traces the action relies on (1 to 100): `trace:<uuid>`,
    /// `signal:<uuid>`, `receipt:<uuid>` or bare UUIDs.
    #[schema(value_type = Vec<SubjectRef>, min_items = 1, max_items = 100)]
    pub basis: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionReleaseResponse {
    pub action_id: Uuid,
    /// True only once the release is journaled.
    pub released: bool,
    pub decision: RuntimeDecision,
    pub governance_decision: GovernanceDecision,
    pub required_influence: AllowedInfluence,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub required_authority: f64,
    pub basis: Vec<BasisView>,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}

// ---------------------------------------------------------------- reversal

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReversalEvaluateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    /// `signal:<uuid>`, `receipt:<uuid>`, `trace:<uuid>` or a bare UUID.
    #[schema(value_type = SubjectRef)]
    pub target: String,
    /// Default `revoke`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub mode: Option<ReversalMode>,
    /// Revoke now (needs the policy's release authority); default false.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub apply: Option<bool>,
    /// Why; bound in the receipt (at most 2000 characters).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, max_length = 2000)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dependent {
    pub trace: Trace,
    pub signal_ids: Vec<Uuid>,
    /// 0 for the target itself.
    pub depth: u32,
    /// The edge that reached it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReversalEvaluateResponse {
    pub decision: RuntimeDecision,
    pub governance_decision: GovernanceDecision,
    pub applied: bool,
    pub target: String,
    pub root_trace_id: Uuid,
    /// The target's trace and every trace derived from it.
    pub dependents: Vec<Dependent>,
    /// The moves (enforced when applied).
    pub transitions: Vec<Transition>,
    pub residue: Vec<Residue>,
    /// Actions on the reversed basis that were never released; they stay blocked.
    pub blocked_actions: Vec<Uuid>,
    pub truncated: bool,
    pub obstructions: Vec<Obstruction>,
    pub repair_plans: Vec<RepairPlan>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}

// ---------------------------------------------------------------- lifecycle

/// Body of a lifecycle action (all optional; an empty body is fine).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LifecycleActionRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    /// Why; bound in the receipt (at most 2000 characters).
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, max_length = 2000)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObstructionDetail {
    pub obstruction: Obstruction,
    pub repair_plans: Vec<RepairPlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<Uuid>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepairPlanDetail {
    pub repair_plan: RepairPlan,
    pub obstruction: Obstruction,
    /// What approving the plan carries out, when it does more than record the approval.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub effect: Option<FreeForm>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LifecycleResponse {
    pub decision: RuntimeDecision,
    pub obstruction: Obstruction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_plan: Option<RepairPlan>,
    /// Live plans closed because their obstruction closed (or a sibling completed).
    pub superseded_plans: Vec<Uuid>,
    /// Trace moves the action made (release from quarantine, promotion, revocation).
    pub transitions: Vec<Transition>,
    /// A held (quarantined) trace was released.
    pub released: bool,
    /// What the plan's effect did, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub effect: Option<FreeForm>,
    /// What the registered `on_repair_approved` hook reported (the proxy forwards held records).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub hook: Option<FreeForm>,
    pub receipt: ReceiptRef,
    pub reason_codes: Vec<String>,
}
