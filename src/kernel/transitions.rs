//! The trace state machine: which phase moves are allowed, and the most
//! influence each phase can carry. The README prints the same table; a test
//! keeps them honest (every phase has a row, terminal phases go nowhere).

use super::types::{AllowedInfluence as I, TargetSubstrate, TracePhase as P};

/// Allowed moves `from → to`. Staying in the same phase is always allowed.
pub const MOVES: &[(P, &[P])] = &[
    (
        P::Observed,
        &[
            P::Ephemeral,
            P::Untrusted,
            P::Quarantined,
            P::Working,
            P::Accepted,
            P::Canonical,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Ephemeral,
        &[
            P::Untrusted,
            P::Quarantined,
            P::Working,
            P::Accepted,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Untrusted,
        &[
            P::Quarantined,
            P::Working,
            P::Accepted,
            P::Superseded,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Quarantined,
        &[
            P::Untrusted,
            P::Working,
            P::Accepted,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Working,
        &[
            P::Untrusted,
            P::Quarantined,
            P::Accepted,
            P::Superseded,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Accepted,
        &[
            P::Untrusted,
            P::Quarantined,
            P::Working,
            P::Locked,
            P::Canonical,
            P::Superseded,
            P::Revoked,
            P::Tombstoned,
        ],
    ),
    (
        P::Locked,
        &[P::Accepted, P::Canonical, P::Superseded, P::Revoked],
    ),
    (P::Canonical, &[P::Crystallized, P::Superseded, P::Revoked]),
    (P::Crystallized, &[P::Superseded, P::Revoked]),
    (P::Superseded, &[P::Revoked, P::Tombstoned]),
    (P::Revoked, &[P::Tombstoned]),
    (P::Tombstoned, &[]),
];

pub fn allowed(from: P, to: P) -> bool {
    from == to || MOVES.iter().any(|(f, tos)| *f == from && tos.contains(&to))
}

/// The most influence a trace in `phase` may have on `substrate`. Canonical
/// content of a policy corpus is policy; of an execution boundary or code, an
/// action basis; elsewhere canonical memory.
pub fn phase_ceiling(phase: P, substrate: TargetSubstrate) -> I {
    match phase {
        P::Observed | P::Ephemeral => I::LocalOnly,
        P::Untrusted => I::RetrievalWithWarning,
        P::Quarantined | P::Revoked | P::Tombstoned => I::None,
        P::Superseded => I::LocalOnly,
        P::Working => I::WorkingContext,
        P::Accepted | P::Locked => I::AcceptedContext,
        P::Canonical | P::Crystallized => match substrate {
            TargetSubstrate::PolicyCorpus => I::PolicyAuthority,
            TargetSubstrate::ExecutionBoundary | TargetSubstrate::CodeSubstrate => {
                I::ExecutionBasis
            }
            _ => I::CanonicalMemory,
        },
    }
}

/// Conventional name of a move, for `transition.transitionName`.
pub fn name(from: P, to: P) -> String {
    if from == to {
        format!("hold_{}", from.as_str())
    } else {
        format!("{}_to_{}", from.as_str(), to.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_has_a_row_and_terminal_phases_are_terminal() {
        for p in P::ALL {
            assert!(MOVES.iter().any(|(f, _)| f == p), "{p} has no row");
        }
        for to in P::ALL {
            if *to != P::Tombstoned {
                assert!(!allowed(P::Tombstoned, *to), "tombstoned must be terminal");
            }
        }
    }

    #[test]
    fn canonical_content_cannot_be_silently_downgraded() {
        assert!(!allowed(P::Canonical, P::Untrusted));
        assert!(!allowed(P::Canonical, P::Working));
        assert!(allowed(P::Canonical, P::Revoked));
        assert!(allowed(P::Quarantined, P::Working));
    }

    #[test]
    fn influence_ceilings_follow_substrate() {
        assert_eq!(
            phase_ceiling(P::Canonical, TargetSubstrate::PolicyCorpus),
            I::PolicyAuthority
        );
        assert_eq!(
            phase_ceiling(P::Canonical, TargetSubstrate::CodeSubstrate),
            I::ExecutionBasis
        );
        assert_eq!(
            phase_ceiling(P::Untrusted, TargetSubstrate::PolicyCorpus),
            I::RetrievalWithWarning
        );
        assert_eq!(
            phase_ceiling(P::Quarantined, TargetSubstrate::AgentMemory),
            I::None
        );
    }
}
