//! `GET /substrate/coordination/{subjectType}/{subjectId}`: coordination
//! state of a subject from its recent receipts. The subject id is matched
//! against the `sourceId` of the signals the gate decided (a source, an
//! agent, a proxied caller); the window is the same 20 decisions the kernel
//! reads when it decays a source's trust.

use super::*;
use crate::kernel::operations::coordination::{self, CoordinationInput, ReceiptFacts};

/// The kernel's window (engine::SOURCE_WINDOW).
pub const WINDOW: i64 = 20;

pub async fn state_of(
    state: &AppState,
    principal: &Principal,
    subject_type: CoordinationSubjectType,
    subject_id: &str,
) -> Result<CoordinationState, ApiError> {
    let policy = policy_of(state, principal)?;
    let rows = state
        .store
        .source_receipts(principal.tenant, subject_id, WINDOW)
        .await?;
    if rows.is_empty() {
        return Err(ApiError::not_found(
            "coordination subject (no recorded decisions)",
        ));
    }
    let window = rows
        .into_iter()
        .filter_map(|(id, decision, refused, payload, created_at)| {
            let risk = serde_json::from_str::<Value>(&payload)
                .ok()
                .and_then(|v| v.pointer("/scores/risk").and_then(Value::as_f64));
            Some(ReceiptFacts {
                id: Uuid::parse_str(&id).ok()?,
                decision: RuntimeDecision::parse(&decision)?,
                refused: refused != 0,
                risk,
                created_at,
            })
        })
        .collect();
    Ok(coordination::evaluate(&CoordinationInput {
        tenant: principal.tenant,
        subject_type,
        subject_id: subject_id.to_string(),
        now: crate::store::now(),
        window,
        trust_decay_ratio: policy.trust_decay_ratio,
    }))
}
