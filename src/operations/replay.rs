//! Re-execution of operation receipts for `POST /substrate/receipts/{id}/replay`:
//! the replay material is the pure decision function's input; re-running it
//! under the pinned coefficient version must give the recorded decision,
//! outcome and (for lifecycle receipts) the decisions of the operations an
//! approval carried out. Hash and chain checks stay in `receipts::replay`.

use super::KINDS;
use crate::kernel::operations::{reexecute as rerun, OperationMaterial};
use crate::kernel::policy::CompiledPolicy;
use crate::kernel::types::KernelArtifact;
use serde_json::Value;
use uuid::Uuid;

pub fn handles(kind: &str) -> bool {
    KINDS.contains(&kind)
}

pub struct Replayed {
    pub decision: String,
    pub outcome: String,
    /// Nested decisions that differ from the recorded ones.
    pub nested_mismatches: Vec<String>,
}

pub fn reexecute(content: &Value, policy: &CompiledPolicy) -> Result<Replayed, String> {
    let material: OperationMaterial = serde_json::from_value(
        content
            .get("replayMaterial")
            .cloned()
            .unwrap_or(Value::Null),
    )
    .map_err(|e| format!("replay material does not parse: {e}"))?;
    let r = rerun(&material, policy);
    let recorded: Vec<(String, String)> = content
        .get("effects")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    Some((
                        e.get("operation")?.as_str()?.to_string(),
                        e.get("decision")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut nested_mismatches = Vec::new();
    for (op, d) in &r.nested {
        if !recorded.iter().any(|(o, rd)| o == op && rd == d.as_str()) {
            nested_mismatches.push(format!("reexecution.effects.{op}"));
        }
    }
    Ok(Replayed {
        decision: r.decision.as_str().into(),
        outcome: r.outcome.as_str().into(),
        nested_mismatches,
    })
}

/// Obstructions and plans an operation receipt binds, as artifacts.
pub fn artifacts(content: &Value, verified: bool) -> Vec<KernelArtifact> {
    let mut out = Vec::new();
    for (kind, key) in [
        ("obstruction", "obstructionIds"),
        ("repair_plan", "repairPlanIds"),
    ] {
        for id in content
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|s| Uuid::parse_str(s).ok())
        {
            out.push(KernelArtifact {
                binding_type: kind.into(),
                binding_id: id,
                verified,
                detail: Some("bound by id".into()),
            });
        }
    }
    out
}
