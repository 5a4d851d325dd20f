//! The exact single-record request of each held record: what the quarantine keeps and what a
//! release forwards. For a batch (columnar or rows), the records' arrays are lifted out of the
//! body once and each held record is put back into a copy of the small remainder, so holding
//! many records of a large batch costs one pass, not one copy of the batch per record.

use crate::filters::{CompiledRoute, ExtractError, Layout, Pointer};
use serde_json::{Map, Value};

/// The single-record bodies of the records at `held` (in that order), each as
/// `rewrite_admitted(body, &[(i, None)])` would give it (client-sent `_integrity` members
/// removed where the route annotates). `body` is unchanged afterwards.
pub fn single_record_bodies(
    route: &CompiledRoute,
    body: &mut Value,
    held: &[usize],
) -> Result<Vec<Value>, ExtractError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    if held.len() == 1 {
        return Ok(vec![route.rewrite_admitted(body, &[(held[0], None)])?]);
    }
    let shape = route.shape_for(body).clone();
    let lifted: Vec<Pointer> = match shape.layout {
        Layout::Columnar
            if shape
                .id
                .as_ref()
                .is_some_and(|p| matches!(p.get(body), Some(Value::Array(_)))) =>
        {
            shape.lockstep.clone()
        }
        Layout::Rows | Layout::Ndjson
            if matches!(shape.records.get(body), Some(Value::Array(_))) =>
        {
            vec![shape.records.clone()]
        }
        _ => {
            return held
                .iter()
                .map(|&i| route.rewrite_admitted(body, &[(i, None)]))
                .collect()
        }
    };
    let mut taken: Vec<(Pointer, Value)> = Vec::new();
    for p in lifted {
        if let Some(slot) = p.get_mut(body) {
            if matches!(slot, Value::Array(_) | Value::Object(_)) {
                let v = std::mem::take(slot);
                taken.push((p, v));
            }
        }
    }
    let skeleton = body.clone();
    let result: Result<Vec<Value>, ExtractError> = held
        .iter()
        .map(|&i| {
            let mut one = skeleton.clone();
            for (p, col) in &taken {
                if let Some(slot) = p.get_mut(&mut one) {
                    *slot = element(col, i);
                }
            }
            route.rewrite_admitted(&one, &[(0, None)])
        })
        .collect();
    for (p, col) in taken {
        if let Some(slot) = p.get_mut(body) {
            *slot = col;
        }
    }
    result
}

/// `[a[i]]` of an array; of an object of arrays (Qdrant's named vectors), each member cut alike.
fn element(col: &Value, i: usize) -> Value {
    match col {
        Value::Array(a) => Value::Array(a.get(i).cloned().into_iter().collect()),
        Value::Object(m) => {
            let mut out = Map::with_capacity(m.len());
            for (k, v) in m {
                out.insert(k.clone(), element(v, i));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}
