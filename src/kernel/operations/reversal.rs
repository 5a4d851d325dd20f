//! Reversal and residue: what undoing a signal or receipt takes, following
//! the dependency graph. The root trace and every trace derived from it (at
//! any depth) are revoked (or the root tombstoned); what cannot be undone by
//! the gate (actions already released on that basis, events already
//! delivered, records already forwarded to the upstream store) is residue,
//! and each residue item opens an obstruction with a rollback plan.

use super::super::transitions;
use super::super::types::*;
use super::{authority_step, step, verdict, Gap, PlanEffect, Verdict};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReversalMode {
    /// Revoke the target and its dependents (content stays, influence none).
    #[default]
    Revoke,
    /// Tombstone the target (terminal); dependents are revoked.
    Tombstone,
}

impl ReversalMode {
    pub fn phase(self) -> TracePhase {
        match self {
            ReversalMode::Revoke => TracePhase::Revoked,
            ReversalMode::Tombstone => TracePhase::Tombstoned,
        }
    }
    pub fn outcome(self) -> GovernanceOutcome {
        match self {
            ReversalMode::Revoke => GovernanceOutcome::Revoke,
            ReversalMode::Tombstone => GovernanceOutcome::Tombstone,
        }
    }
}

/// A trace reached by the traversal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphTrace {
    pub trace_id: Uuid,
    #[serde(default)]
    pub phase: Option<TracePhase>,
    pub influence: AllowedInfluence,
    #[serde(default)]
    pub substrate: Option<TargetSubstrate>,
    #[serde(default)]
    pub signal_ids: Vec<Uuid>,
    /// 0 for the target itself.
    pub depth: u32,
    /// The edge that reached it (`signal:<id> derived_from receipt:<id>`).
    #[serde(default)]
    pub via: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionFacts {
    pub id: Uuid,
    pub kind: String,
    pub target: String,
    /// `released` or `obstructed`.
    pub status: String,
    #[serde(default)]
    pub receipt_id: Option<Uuid>,
    pub basis: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryFacts {
    pub id: Uuid,
    pub event_name: String,
    pub subscription_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamFacts {
    pub receipt_id: Uuid,
    pub signal_id: Uuid,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReversalInput {
    pub key: String,
    /// The target as the caller named it.
    pub target: String,
    pub root_trace: Uuid,
    pub mode: ReversalMode,
    pub apply: bool,
    pub principal_ceiling: f64,
    pub release_authority: f64,
    /// Root first, then dependents in traversal order.
    pub traces: Vec<GraphTrace>,
    #[serde(default)]
    pub actions: Vec<ActionFacts>,
    #[serde(default)]
    pub deliveries: Vec<DeliveryFacts>,
    #[serde(default)]
    pub upstream: Vec<UpstreamFacts>,
    /// The traversal stopped at its bound; the dependents listed are a prefix.
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResidueKind {
    ActionReleased,
    WebhookDelivered,
    UpstreamRecord,
}

/// An effect that survives the reversal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Residue {
    pub kind: ResidueKind,
    /// Action, delivery or receipt id.
    pub id: String,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<Uuid>,
    pub mitigation: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReversalOutput {
    pub verdict: Verdict,
    /// One per trace that moves (enforced when applied).
    pub transitions: Vec<Transition>,
    pub residue: Vec<Residue>,
    /// Actions on the revoked basis that were not released: they stay blocked.
    pub blocked_actions: Vec<Uuid>,
    pub applied: bool,
}

pub fn evaluate(input: &ReversalInput) -> ReversalOutput {
    let revoked: Vec<Uuid> = input.traces.iter().map(|t| t.trace_id).collect();
    let mut transitions_out = Vec::new();
    let mut reasons = Vec::new();
    let authorized = input.principal_ceiling + 1e-9 >= input.release_authority;
    let applied = input.apply && authorized;
    for t in &input.traces {
        let from = t.phase.unwrap_or(TracePhase::Observed);
        if matches!(from, TracePhase::Revoked | TracePhase::Tombstoned) {
            continue;
        }
        let wanted = if t.depth == 0 {
            input.mode.phase()
        } else {
            TracePhase::Revoked
        };
        let to = if transitions::allowed(from, wanted) {
            wanted
        } else if transitions::allowed(from, TracePhase::Revoked) {
            reasons.push("tombstone_requires_revocation_first".into());
            TracePhase::Revoked
        } else {
            continue;
        };
        transitions_out.push(Transition {
            trace_id: t.trace_id,
            from_phase: from,
            to_phase: to,
            from_influence: t.influence,
            to_influence: AllowedInfluence::None,
            transition_name: Some(transitions::name(from, to)),
            enforced: applied,
            reason_codes: vec![if t.depth == 0 {
                "reversal_target".to_string()
            } else {
                "dependency_revoked".to_string()
            }],
        });
    }

    let mut residue = Vec::new();
    let mut blocked_actions = Vec::new();
    for a in &input.actions {
        let Some(on) = a.basis.iter().find(|b| revoked.contains(b)) else {
            continue;
        };
        if a.status == "released" {
            residue.push(Residue {
                kind: ResidueKind::ActionReleased,
                id: a.id.to_string(),
                description: format!(
                    "Action {} of {:?} was released on basis trace {}; what it did outside the gate survives the reversal.",
                    a.kind, a.target, on
                ),
                receipt_id: a.receipt_id,
                mitigation: "Roll the action back in the system it acted on; later releases on this basis are blocked.".into(),
            });
        } else {
            blocked_actions.push(a.id);
        }
    }
    for d in &input.deliveries {
        residue.push(Residue {
            kind: ResidueKind::WebhookDelivered,
            id: d.id.to_string(),
            description: format!(
                "Event {} about the reversed content was delivered to subscription {}; the receiver keeps it.",
                d.event_name, d.subscription_id
            ),
            receipt_id: None,
            mitigation: "Tell the receiver; the signal.blocked events of this reversal announce the revocation.".into(),
        });
    }
    for u in &input.upstream {
        residue.push(Residue {
            kind: ResidueKind::UpstreamRecord,
            id: u.receipt_id.to_string(),
            description: format!(
                "Signal {} was forwarded to the upstream store (receipt {}); the record stays there.",
                u.signal_id, u.receipt_id
            ),
            receipt_id: Some(u.receipt_id),
            mitigation: "Retrieval treatment excludes it from now on; delete it upstream to remove it.".into(),
        });
    }
    if input.truncated {
        reasons.push("dependency_traversal_truncated".into());
    }

    let target = (ObstructionTargetType::Signal, input.target.clone());
    let effect = PlanEffect::Reverse {
        target: input.target.clone(),
        mode: input.mode,
    };
    let nothing = transitions_out.is_empty() && residue.is_empty() && blocked_actions.is_empty();
    let mut gaps = Vec::new();
    let (decision, outcome) = if nothing {
        reasons.push("nothing_to_reverse".into());
        (RuntimeDecision::Allow, GovernanceOutcome::Allow)
    } else if applied {
        reasons.push("reversal_applied".into());
        for r in &residue {
            gaps.push(
                Gap::new(
                    ObstructionType::RevocationRequired,
                    Severity::High,
                    match r.kind {
                        ResidueKind::ActionReleased => {
                            (ObstructionTargetType::Action, r.id.clone())
                        }
                        ResidueKind::WebhookDelivered => {
                            (ObstructionTargetType::Receipt, r.id.clone())
                        }
                        ResidueKind::UpstreamRecord => {
                            (ObstructionTargetType::Receipt, r.id.clone())
                        }
                    },
                    format!(
                        "Residue of the reversal of {}: {}",
                        input.target, r.description
                    ),
                    RepairClass::Rollback,
                )
                .candidates(&[RepairClass::Rollback, RepairClass::ManualReview])
                .expected(ExpectedOutcome::ManualResolutionRequired)
                .step(step(
                    "roll-back",
                    r.mitigation.clone(),
                    "the effect no longer survives",
                )),
            );
        }
        (RuntimeDecision::Block, input.mode.outcome())
    } else if input.apply {
        reasons.push("principal_authority_below_release_authority".into());
        gaps.push(
            Gap::new(
                ObstructionType::AuthorityGap,
                Severity::High,
                target,
                format!(
                    "Applying a reversal requires authority {:.2}; the requesting key has {:.2}.",
                    input.release_authority, input.principal_ceiling
                ),
                RepairClass::AuthorityRerouting,
            )
            .candidates(&[RepairClass::AuthorityRerouting, RepairClass::Escalation])
            .approvals(&["security_reviewer"])
            .expected(ExpectedOutcome::Revoke)
            .effect(effect)
            .step(authority_step(
                "approve-reversal",
                "A principal with the release authority approves this plan, which applies the reversal.",
                "the content and its dependents are revoked",
                "security_reviewer",
                input.release_authority,
            )),
        );
        (RuntimeDecision::Escalate, GovernanceOutcome::Escalate)
    } else {
        reasons.push("reversal_evaluated".into());
        gaps.push(
            Gap::new(
                ObstructionType::RevocationRequired,
                Severity::High,
                target,
                format!(
                    "Reversing {} would {} {} trace(s) ({} dependent(s)) and leaves {} residue item(s).",
                    input.target,
                    match input.mode { ReversalMode::Revoke => "revoke", ReversalMode::Tombstone => "tombstone or revoke" },
                    transitions_out.len(),
                    transitions_out.len().saturating_sub(1),
                    residue.len()
                ),
                RepairClass::DependencyInvalidation,
            )
            .candidates(&[RepairClass::DependencyInvalidation, RepairClass::Tombstone, RepairClass::ManualReview])
            .approvals(&["security_reviewer"])
            .expected(if input.mode == ReversalMode::Tombstone { ExpectedOutcome::Tombstone } else { ExpectedOutcome::Revoke })
            .effect(effect)
            .step(authority_step(
                "apply-reversal",
                "Approve this plan (or evaluate again with apply) to revoke the target and every dependent.",
                "the content and its dependents are revoked",
                "security_reviewer",
                input.release_authority,
            )),
        );
        (RuntimeDecision::Defer, input.mode.outcome())
    };
    let key = format!("{}:{}:{}", input.key, applied, input.mode.phase().as_str());
    ReversalOutput {
        verdict: verdict("reversal", &key, decision, outcome, reasons, gaps),
        transitions: transitions_out,
        residue,
        blocked_actions,
        // Nothing to reverse: nothing was carried out, whatever `apply` asked.
        applied: applied && !nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gt(n: u128, phase: Option<TracePhase>, depth: u32) -> GraphTrace {
        GraphTrace {
            trace_id: Uuid::from_u128(n),
            phase,
            influence: AllowedInfluence::AcceptedContext,
            substrate: Some(TargetSubstrate::AgentMemory),
            signal_ids: vec![Uuid::from_u128(100 + n)],
            depth,
            via: None,
        }
    }

    fn input(apply: bool, ceiling: f64) -> ReversalInput {
        ReversalInput {
            key: "k".into(),
            target: "signal:x".into(),
            root_trace: Uuid::from_u128(1),
            mode: ReversalMode::Revoke,
            apply,
            principal_ceiling: ceiling,
            release_authority: 0.7,
            traces: vec![
                gt(1, Some(TracePhase::Accepted), 0),
                gt(2, Some(TracePhase::Accepted), 1),
                gt(3, Some(TracePhase::Revoked), 2),
            ],
            actions: vec![
                ActionFacts {
                    id: Uuid::from_u128(50),
                    kind: "execute_tool".into(),
                    target: "t".into(),
                    status: "released".into(),
                    receipt_id: Some(Uuid::from_u128(60)),
                    basis: vec![Uuid::from_u128(2)],
                },
                ActionFacts {
                    id: Uuid::from_u128(51),
                    kind: "execute_tool".into(),
                    target: "t".into(),
                    status: "obstructed".into(),
                    receipt_id: None,
                    basis: vec![Uuid::from_u128(1)],
                },
                ActionFacts {
                    id: Uuid::from_u128(52),
                    kind: "execute_tool".into(),
                    target: "t".into(),
                    status: "released".into(),
                    receipt_id: None,
                    basis: vec![Uuid::from_u128(9)],
                },
            ],
            deliveries: vec![],
            upstream: vec![],
            truncated: false,
        }
    }

    #[test]
    fn evaluation_lists_dependents_and_residue_and_proposes_the_reversal() {
        let out = evaluate(&input(false, 0.9));
        assert!(!out.applied);
        assert_eq!(out.verdict.decision, RuntimeDecision::Defer);
        assert_eq!(out.transitions.len(), 2, "already revoked trace is skipped");
        assert!(out
            .transitions
            .iter()
            .all(|t| !t.enforced && t.to_phase == TracePhase::Revoked));
        assert_eq!(out.residue.len(), 1);
        assert_eq!(out.residue[0].kind, ResidueKind::ActionReleased);
        assert_eq!(out.blocked_actions, vec![Uuid::from_u128(51)]);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::RevocationRequired
        );
        assert!(matches!(
            out.verdict.effects[0].effect,
            PlanEffect::Reverse { .. }
        ));
    }

    #[test]
    fn apply_with_authority_revokes_and_opens_residue_obstructions() {
        let out = evaluate(&input(true, 0.9));
        assert!(out.applied);
        assert_eq!(out.verdict.decision, RuntimeDecision::Block);
        assert_eq!(out.verdict.outcome, GovernanceOutcome::Revoke);
        assert!(out.transitions.iter().all(|t| t.enforced));
        assert_eq!(out.verdict.obstructions.len(), 1);
        assert_eq!(
            out.verdict.repair_plans[0].repair_class,
            RepairClass::Rollback
        );
    }

    #[test]
    fn apply_without_authority_escalates() {
        let out = evaluate(&input(true, 0.5));
        assert!(!out.applied);
        assert_eq!(out.verdict.decision, RuntimeDecision::Escalate);
        assert_eq!(
            out.verdict.obstructions[0].obstruction_type,
            ObstructionType::AuthorityGap
        );
    }

    #[test]
    fn tombstoning_canonical_content_revokes_it() {
        let mut i = input(true, 0.9);
        i.mode = ReversalMode::Tombstone;
        i.traces[0].phase = Some(TracePhase::Canonical);
        let out = evaluate(&i);
        assert_eq!(out.transitions[0].to_phase, TracePhase::Revoked);
        i.traces[0].phase = Some(TracePhase::Accepted);
        assert_eq!(evaluate(&i).transitions[0].to_phase, TracePhase::Tombstoned);
    }

    #[test]
    fn nothing_to_reverse() {
        let mut i = input(true, 0.9);
        i.traces = vec![gt(1, Some(TracePhase::Revoked), 0)];
        i.actions.clear();
        let out = evaluate(&i);
        assert_eq!(out.verdict.decision, RuntimeDecision::Allow);
        assert!(out.verdict.obstructions.is_empty());
    }
}
