//! Coordination state of a subject (a source, an agent, a collection) from
//! its recent decisions: coherence (how clean its content was), friction
//! (how much of it was refused), load (how fast it writes), and the regime
//! those put it in. The kernel's evaluation reads the same record
//! (`StateBasis.source_recent/source_refused`): a source in `trust_decay`
//! has its trust scaled down on every later decision.

use super::super::types::*;
use super::{mint, round, seconds_between};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Writes per minute at which load is 1.
pub const LOAD_SATURATION_PER_MINUTE: f64 = 30.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReceiptFacts {
    pub id: Uuid,
    pub decision: RuntimeDecision,
    pub refused: bool,
    #[serde(default)]
    pub risk: Option<f64>,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinationInput {
    pub tenant: Uuid,
    pub subject_type: CoordinationSubjectType,
    pub subject_id: String,
    pub now: String,
    /// Newest first.
    pub window: Vec<ReceiptFacts>,
    pub trust_decay_ratio: f64,
}

/// What a regime does to later decisions.
pub fn effect(regime: CoordinationRegime) -> &'static str {
    match regime {
        CoordinationRegime::TrustDecay => "the source's trust is scaled by (1 - refused share) on every later evaluation",
        CoordinationRegime::Unsafe => "the last decision blocked a write; later writes are evaluated with the source's refusals counted",
        CoordinationRegime::LoadRisk => "the subject writes fast; its refusals weigh quickly toward trust decay",
        CoordinationRegime::FrictionSpike => "half or more of recent writes were refused; trust decay follows if it persists",
        CoordinationRegime::Recovery => "recent writes were admitted after earlier refusals; trust recovers as refusals leave the window",
        _ => "no effect on later decisions",
    }
}

pub fn evaluate(i: &CoordinationInput) -> CoordinationState {
    let recent = i.window.len();
    let refused = i.window.iter().filter(|r| r.refused).count();
    let friction = if recent == 0 {
        0.0
    } else {
        refused as f64 / recent as f64
    };
    let risks: Vec<f64> = i.window.iter().filter_map(|r| r.risk).collect();
    let coherence = if risks.is_empty() {
        1.0 - friction
    } else {
        1.0 - risks.iter().sum::<f64>() / risks.len() as f64
    };
    let last_minute = i
        .window
        .iter()
        .filter(|r| seconds_between(&r.created_at, &i.now).is_some_and(|s| s <= 60))
        .count();
    let load = (last_minute as f64 / LOAD_SATURATION_PER_MINUTE).min(1.0);
    let newest_refused_free = i.window.iter().take(5).all(|r| !r.refused);
    let older_refused = i.window.iter().skip(5).any(|r| r.refused);
    let regime = if recent >= 4 && friction >= i.trust_decay_ratio {
        CoordinationRegime::TrustDecay
    } else if i
        .window
        .first()
        .is_some_and(|r| r.decision == RuntimeDecision::Block)
    {
        CoordinationRegime::Unsafe
    } else if load >= 0.8 {
        CoordinationRegime::LoadRisk
    } else if friction >= 0.5 {
        CoordinationRegime::FrictionSpike
    } else if recent >= 6 && newest_refused_free && older_refused {
        CoordinationRegime::Recovery
    } else {
        CoordinationRegime::Stable
    };
    let newest = i.window.first().map(|r| r.id);
    CoordinationState {
        id: mint(
            "coordination",
            &format!("{}:{}:{}", i.tenant, i.subject_type.as_str(), i.subject_id),
            &newest.map(|u| u.to_string()).unwrap_or_default(),
        ),
        subject_type: i.subject_type,
        subject_id: i.subject_id.clone(),
        regime,
        coherence_score: round(coherence),
        friction: round(friction),
        load: round(load),
        source_receipt_id: newest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u128, refused: bool, decision: RuntimeDecision, at: &str) -> ReceiptFacts {
        ReceiptFacts {
            id: Uuid::from_u128(n),
            decision,
            refused,
            risk: Some(if refused { 0.8 } else { 0.1 }),
            created_at: at.into(),
        }
    }

    fn input(window: Vec<ReceiptFacts>) -> CoordinationInput {
        CoordinationInput {
            tenant: Uuid::nil(),
            subject_type: CoordinationSubjectType::Agent,
            subject_id: "agent-7".into(),
            now: "2024-01-01T01:00:00Z".into(),
            window,
            trust_decay_ratio: 0.5,
        }
    }

    const OLD: &str = "2024-01-01T00:00:00Z";

    #[test]
    fn a_source_that_keeps_being_refused_decays() {
        let w = (0..6)
            .map(|n| r(n, n % 3 != 0, RuntimeDecision::Quarantine, OLD))
            .collect();
        let s = evaluate(&input(w));
        assert_eq!(s.regime, CoordinationRegime::TrustDecay);
        assert!(s.friction > 0.6);
        assert!(s.coherence_score < 0.5);
        assert_eq!(s.source_receipt_id, Some(Uuid::from_u128(0)));
    }

    #[test]
    fn clean_sources_are_stable_and_recovery_is_seen() {
        let w: Vec<_> = (0..5)
            .map(|n| r(n, false, RuntimeDecision::Allow, OLD))
            .collect();
        assert_eq!(
            evaluate(&input(w.clone())).regime,
            CoordinationRegime::Stable
        );
        let mut w2 = w;
        w2.push(r(9, true, RuntimeDecision::Block, OLD));
        assert_eq!(evaluate(&input(w2)).regime, CoordinationRegime::Recovery);
    }

    #[test]
    fn block_is_unsafe_and_bursts_are_load() {
        let s = evaluate(&input(vec![
            r(1, true, RuntimeDecision::Block, OLD),
            r(2, false, RuntimeDecision::Allow, OLD),
        ]));
        assert_eq!(s.regime, CoordinationRegime::Unsafe);
        let burst = (0..25)
            .map(|n| r(n, false, RuntimeDecision::Allow, "2024-01-01T00:59:30Z"))
            .collect();
        let s = evaluate(&input(burst));
        assert_eq!(s.regime, CoordinationRegime::LoadRisk);
        assert!(s.load >= 0.8);
    }
}
