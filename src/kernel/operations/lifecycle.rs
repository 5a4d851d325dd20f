//! The governance lifecycle: which status moves obstructions and repair plans
//! may make, what each route action asks for (authority) and what it decides.
//! docs/operations.md prints the same tables; a test keeps them honest.

use super::super::types::{
    GovernanceOutcome, ObstructionStatus as O, RepairPlan, RepairStatus as R, RuntimeDecision,
};
use serde::{Deserialize, Serialize};

/// Allowed obstruction moves `from → to`.
pub const OBSTRUCTION_MOVES: &[(O, &[O])] = &[
    (
        O::Open,
        &[
            O::RepairPlanned,
            O::AwaitingAuthority,
            O::AwaitingEvidence,
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Quarantined,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (
        O::RepairPlanned,
        &[
            O::Open,
            O::AwaitingAuthority,
            O::AwaitingEvidence,
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Quarantined,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (
        O::AwaitingAuthority,
        &[
            O::Open,
            O::RepairPlanned,
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (
        O::AwaitingEvidence,
        &[
            O::Open,
            O::RepairPlanned,
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (
        O::Repairing,
        &[
            O::Open,
            O::RepairPlanned,
            O::Resolved,
            O::Rejected,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (
        O::Escalated,
        &[
            O::AwaitingAuthority,
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Tombstoned,
        ],
    ),
    (
        O::Quarantined,
        &[
            O::Repairing,
            O::Resolved,
            O::Rejected,
            O::Tombstoned,
            O::Escalated,
        ],
    ),
    (O::Resolved, &[]),
    (O::Rejected, &[]),
    (O::Tombstoned, &[]),
];

/// Allowed repair-plan moves `from → to`.
pub const PLAN_MOVES: &[(R, &[R])] = &[
    (R::Draft, &[R::Proposed, R::Rejected, R::Superseded]),
    (R::Proposed, &[R::Approved, R::Rejected, R::Superseded]),
    (
        R::Approved,
        &[R::Executing, R::Completed, R::Failed, R::Superseded],
    ),
    (R::Executing, &[R::Completed, R::Failed]),
    (R::Failed, &[R::Proposed, R::Superseded]),
    (R::Rejected, &[]),
    (R::Completed, &[]),
    (R::Superseded, &[]),
];

pub fn obstruction_move_allowed(from: O, to: O) -> bool {
    OBSTRUCTION_MOVES
        .iter()
        .any(|(f, tos)| *f == from && tos.contains(&to))
}

pub fn plan_move_allowed(from: R, to: R) -> bool {
    PLAN_MOVES
        .iter()
        .any(|(f, tos)| *f == from && tos.contains(&to))
}

pub fn obstruction_is_closed(s: O) -> bool {
    matches!(s, O::Resolved | O::Rejected | O::Tombstoned)
}

/// Plans that still may do something (superseded when their obstruction closes).
pub fn plan_is_live(s: R) -> bool {
    matches!(s, R::Draft | R::Proposed | R::Approved | R::Executing)
}

/// A route action of the lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Obstruction: its cause no longer holds (authority required).
    Resolve,
    /// Obstruction: the obstructed change is refused for good. Plan: not this repair.
    Reject,
    /// Obstruction: hand it to a higher authority.
    Escalate,
    /// Plan: carry it out (authority required).
    Approve,
    /// Plan: its steps are done (authority required).
    Complete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Resolve => "resolve",
            Action::Reject => "reject",
            Action::Escalate => "escalate",
            Action::Approve => "approve",
            Action::Complete => "complete",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Object {
    Obstruction,
    RepairPlan,
}

/// Everything a lifecycle decision rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleInput {
    pub object: Object,
    pub action: Action,
    /// Current status (an ObstructionStatus or RepairStatus value).
    pub from_status: String,
    /// Authority the action needs (0 when none).
    pub required_authority: f64,
    /// The API key's authority ceiling (1 when the key has none).
    pub principal_ceiling: f64,
}

/// Replay material of a lifecycle receipt: the move, and the operation an
/// approval carried out, if any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleMaterial {
    pub lifecycle: LifecycleInput,
    #[serde(default)]
    pub canonicalization: Option<super::canonicalization::CanonicalizationInput>,
    #[serde(default)]
    pub reversal: Option<super::reversal::ReversalInput>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleDecision {
    pub to_status: String,
    pub decision: RuntimeDecision,
    pub outcome: GovernanceOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The action does not apply to this object at all (e.g. approve an obstruction).
    NotApplicable,
    /// The object's status does not allow the move; `allowed_from` lists where it would.
    Conflict {
        from: String,
        to: String,
        allowed_from: Vec<String>,
    },
    /// The key's ceiling is below what the action needs.
    Forbidden { needed: f64, have: f64 },
}

fn target(object: Object, action: Action) -> Option<String> {
    Some(
        match (object, action) {
            (Object::Obstruction, Action::Resolve) => O::Resolved.as_str(),
            (Object::Obstruction, Action::Reject) => O::Rejected.as_str(),
            (Object::Obstruction, Action::Escalate) => O::Escalated.as_str(),
            (Object::RepairPlan, Action::Approve) => R::Approved.as_str(),
            (Object::RepairPlan, Action::Reject) => R::Rejected.as_str(),
            (Object::RepairPlan, Action::Complete) => R::Completed.as_str(),
            _ => return None,
        }
        .to_string(),
    )
}

/// Authority an action needs: resolving an obstruction, approving or
/// completing a plan need the policy's release authority and whatever a
/// step of the plan names; rejecting and escalating are conservative and
/// need none.
pub fn required_authority(
    object: Object,
    action: Action,
    plan: Option<&RepairPlan>,
    release_authority: f64,
) -> f64 {
    match (object, action) {
        (Object::Obstruction, Action::Resolve)
        | (Object::RepairPlan, Action::Approve)
        | (Object::RepairPlan, Action::Complete) => plan
            .into_iter()
            .flat_map(|p| p.proposed_steps.iter())
            .filter_map(|s| s.required_authority.as_deref())
            .filter_map(|a| a.parse::<f64>().ok())
            .fold(release_authority, f64::max),
        _ => 0.0,
    }
}

/// Decides a lifecycle action: the status it moves to, or why it may not.
pub fn decide(i: &LifecycleInput) -> Result<LifecycleDecision, Refusal> {
    let to = target(i.object, i.action).ok_or(Refusal::NotApplicable)?;
    let allowed = match i.object {
        Object::Obstruction => match (O::parse(&i.from_status), O::parse(&to)) {
            (Some(f), Some(t)) => obstruction_move_allowed(f, t),
            _ => false,
        },
        Object::RepairPlan => match (R::parse(&i.from_status), R::parse(&to)) {
            (Some(f), Some(t)) => plan_move_allowed(f, t),
            _ => false,
        },
    };
    if !allowed {
        let allowed_from = match i.object {
            Object::Obstruction => OBSTRUCTION_MOVES
                .iter()
                .filter(|(_, tos)| tos.iter().any(|t| t.as_str() == to))
                .map(|(f, _)| f.as_str().to_string())
                .collect(),
            Object::RepairPlan => PLAN_MOVES
                .iter()
                .filter(|(_, tos)| tos.iter().any(|t| t.as_str() == to))
                .map(|(f, _)| f.as_str().to_string())
                .collect(),
        };
        return Err(Refusal::Conflict {
            from: i.from_status.clone(),
            to,
            allowed_from,
        });
    }
    if i.principal_ceiling + 1e-9 < i.required_authority {
        return Err(Refusal::Forbidden {
            needed: i.required_authority,
            have: i.principal_ceiling,
        });
    }
    let (decision, outcome) = match i.action {
        Action::Resolve | Action::Approve | Action::Complete => {
            (RuntimeDecision::Allow, GovernanceOutcome::Allow)
        }
        Action::Reject => (RuntimeDecision::Block, GovernanceOutcome::Deny),
        Action::Escalate => (RuntimeDecision::Escalate, GovernanceOutcome::Escalate),
    };
    Ok(LifecycleDecision {
        to_status: to,
        decision,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(object: Object, action: Action, from: &str, need: f64, have: f64) -> LifecycleInput {
        LifecycleInput {
            object,
            action,
            from_status: from.into(),
            required_authority: need,
            principal_ceiling: have,
        }
    }

    #[test]
    fn every_status_has_a_row_and_closed_states_are_terminal() {
        for s in O::ALL {
            assert!(
                OBSTRUCTION_MOVES.iter().any(|(f, _)| f == s),
                "{s} has no row"
            );
        }
        for s in R::ALL {
            assert!(PLAN_MOVES.iter().any(|(f, _)| f == s), "{s} has no row");
        }
        for closed in [O::Resolved, O::Rejected, O::Tombstoned] {
            for to in O::ALL {
                assert!(!obstruction_move_allowed(closed, *to));
            }
        }
        for done in [R::Rejected, R::Completed, R::Superseded] {
            for to in R::ALL {
                assert!(!plan_move_allowed(done, *to));
            }
        }
        // No self-loops: a move always changes something.
        for (f, tos) in OBSTRUCTION_MOVES {
            assert!(!tos.contains(f));
        }
        for (f, tos) in PLAN_MOVES {
            assert!(!tos.contains(f));
        }
    }

    /// docs/operations.md prints both tables; they must say what the code does.
    #[test]
    fn the_documented_tables_are_the_tables() {
        let doc = include_str!("../../../docs/operations.md");
        for (from, tos) in OBSTRUCTION_MOVES.iter().filter(|(_, t)| !t.is_empty()) {
            let row = format!(
                "| {} | {} |",
                from.as_str(),
                tos.iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            assert!(doc.contains(&row), "docs lack {row}");
        }
        for (from, tos) in PLAN_MOVES.iter().filter(|(_, t)| !t.is_empty()) {
            let row = format!(
                "| {} | {} |",
                from.as_str(),
                tos.iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            assert!(doc.contains(&row), "docs lack {row}");
        }
        assert!(doc.contains("| resolved, rejected, tombstoned | (terminal) |"));
        assert!(doc.contains("| rejected, completed, superseded | (terminal) |"));
    }

    #[test]
    fn approving_needs_a_proposed_plan_and_authority() {
        let ok = decide(&input(
            Object::RepairPlan,
            Action::Approve,
            "proposed",
            0.7,
            0.9,
        ))
        .unwrap();
        assert_eq!(ok.to_status, "approved");
        assert_eq!(ok.decision, RuntimeDecision::Allow);
        match decide(&input(
            Object::RepairPlan,
            Action::Approve,
            "proposed",
            0.7,
            0.5,
        )) {
            Err(Refusal::Forbidden { needed, have }) => {
                assert_eq!((needed, have), (0.7, 0.5))
            }
            other => panic!("{other:?}"),
        }
        match decide(&input(
            Object::RepairPlan,
            Action::Approve,
            "completed",
            0.7,
            0.9,
        )) {
            Err(Refusal::Conflict { allowed_from, .. }) => {
                assert_eq!(allowed_from, vec!["proposed".to_string()])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn status_is_checked_before_authority() {
        // A closed obstruction answers conflict whoever asks.
        assert!(matches!(
            decide(&input(
                Object::Obstruction,
                Action::Resolve,
                "rejected",
                0.7,
                0.1
            )),
            Err(Refusal::Conflict { .. })
        ));
    }

    #[test]
    fn obstruction_actions() {
        let r = decide(&input(
            Object::Obstruction,
            Action::Reject,
            "open",
            0.0,
            0.0,
        ))
        .unwrap();
        assert_eq!(
            (r.to_status.as_str(), r.decision),
            ("rejected", RuntimeDecision::Block)
        );
        let e = decide(&input(
            Object::Obstruction,
            Action::Escalate,
            "awaiting_authority",
            0.0,
            0.0,
        ))
        .unwrap();
        assert_eq!(e.outcome, GovernanceOutcome::Escalate);
        assert!(decide(&input(
            Object::Obstruction,
            Action::Escalate,
            "escalated",
            0.0,
            1.0
        ))
        .is_err());
        assert_eq!(
            decide(&input(
                Object::Obstruction,
                Action::Approve,
                "open",
                0.0,
                1.0
            )),
            Err(Refusal::NotApplicable)
        );
    }

    #[test]
    fn required_authority_takes_the_strictest_step() {
        let mut plan = RepairPlan {
            id: uuid::Uuid::nil(),
            obstruction_id: uuid::Uuid::nil(),
            repair_class: crate::kernel::types::RepairClass::AuthorityRerouting,
            status: R::Proposed,
            expected_outcome: crate::kernel::types::ExpectedOutcome::AllowAfterRepair,
            proposed_steps: vec![super::super::authority_step("a", "x", "y", "owner", 0.8)],
            required_approvals: vec![],
            completion_receipt_id: None,
        };
        assert_eq!(
            required_authority(Object::RepairPlan, Action::Approve, Some(&plan), 0.7),
            0.8
        );
        plan.proposed_steps.clear();
        assert_eq!(
            required_authority(Object::RepairPlan, Action::Approve, Some(&plan), 0.7),
            0.7
        );
        assert_eq!(
            required_authority(Object::RepairPlan, Action::Reject, Some(&plan), 0.7),
            0.0
        );
    }
}
