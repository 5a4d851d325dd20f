//! The dependency graph per tenant. Edges (`dependency_edges`) say that a
//! signal was derived from a receipt, a signal or a trace (its evidenceRefs,
//! recorded at ingest), or that an action is based on a trace (recorded at
//! release). A trace stands for every signal that wrote it and every receipt
//! of those signals: what was derived from any of them was derived from it.
//! Traversals are breadth-first and bounded.

use super::trace_facts;
use crate::api::error::ApiError;
use crate::kernel::operations::configuration::AncestorFacts;
use crate::kernel::operations::{NodeKind, TraceFacts};
use crate::state::AppState;
use crate::store::TraceRow;
use std::collections::{HashSet, VecDeque};
use uuid::Uuid;

/// Most traces a reversal follows.
pub const MAX_DEPENDENTS: usize = 500;
/// Most ancestors a configuration member's lineage lists, and how deep.
pub const MAX_ANCESTORS: usize = 50;
pub const MAX_ANCESTOR_DEPTH: u32 = 6;

/// A trace reached by following edges from the root.
#[derive(Debug, Clone)]
pub struct Reached {
    pub trace_id: Uuid,
    pub depth: u32,
    pub via: Option<String>,
    pub signal_ids: Vec<Uuid>,
    pub row: Option<TraceRow>,
    pub substrate: Option<crate::kernel::types::TargetSubstrate>,
}

#[derive(Debug, Clone, Default)]
pub struct Dependents {
    pub traces: Vec<Reached>,
    pub actions: Vec<Uuid>,
    pub truncated: bool,
}

/// Graph nodes a trace stands for: itself, its signals, their receipts.
async fn nodes_of(
    state: &AppState,
    tenant: Uuid,
    trace: Uuid,
) -> Result<
    (
        Vec<(NodeKind, Uuid)>,
        Vec<Uuid>,
        Option<crate::kernel::types::TargetSubstrate>,
    ),
    ApiError,
> {
    let signals = state.store.signals_of_trace(tenant, trace, 200).await?;
    let ids: Vec<Uuid> = signals.iter().map(|s| s.signal.id).collect();
    let receipts = state.store.receipts_of_signals(tenant, &ids).await?;
    let mut nodes = vec![(NodeKind::Trace, trace)];
    nodes.extend(ids.iter().map(|s| (NodeKind::Signal, *s)));
    nodes.extend(receipts.into_iter().map(|r| (NodeKind::Receipt, r)));
    Ok((
        nodes,
        ids,
        signals.first().map(|s| s.signal.target_substrate),
    ))
}

/// Every trace derived (transitively) from `root`, root first, and the actions based on any of them.
pub async fn dependents(
    state: &AppState,
    tenant: Uuid,
    root: Uuid,
) -> Result<Dependents, ApiError> {
    let mut out = Dependents::default();
    let mut visited: HashSet<Uuid> = HashSet::from([root]);
    let mut actions: Vec<Uuid> = Vec::new();
    let mut queue: VecDeque<(Uuid, u32, Option<String>)> = VecDeque::from([(root, 0, None)]);
    while let Some((trace, depth, via)) = queue.pop_front() {
        let (nodes, signal_ids, substrate) = nodes_of(state, tenant, trace).await?;
        let row = state.store.trace_row(tenant, trace).await?;
        out.traces.push(Reached {
            trace_id: trace,
            depth,
            via,
            signal_ids,
            substrate: row
                .as_ref()
                .and_then(|r| r.trace_type.as_deref())
                .and_then(crate::kernel::types::TargetSubstrate::parse)
                .or(substrate),
            row,
        });
        for e in state.store.children_of(tenant, &nodes).await? {
            let Ok(child) = Uuid::parse_str(&e.child_id) else {
                continue;
            };
            match NodeKind::parse(&e.child_kind) {
                Some(NodeKind::Signal) => {
                    let Some(s) = state.store.signal_row(tenant, child).await? else {
                        continue;
                    };
                    let t = s.signal.trace_id;
                    if visited.contains(&t) {
                        continue;
                    }
                    if visited.len() >= MAX_DEPENDENTS {
                        out.truncated = true;
                        continue;
                    }
                    visited.insert(t);
                    queue.push_back((
                        t,
                        depth + 1,
                        Some(format!(
                            "signal:{} derived_from {}:{}",
                            e.child_id, e.parent_kind, e.parent_id
                        )),
                    ));
                }
                Some(NodeKind::Action) if !actions.contains(&child) => actions.push(child),
                _ => {}
            }
        }
    }
    out.actions = actions;
    Ok(out)
}

/// The trace a graph node belongs to.
async fn trace_of_node(
    state: &AppState,
    tenant: Uuid,
    kind: &str,
    id: &str,
) -> Result<Option<Uuid>, ApiError> {
    let Ok(id) = Uuid::parse_str(id) else {
        return Ok(None);
    };
    Ok(match NodeKind::parse(kind) {
        Some(NodeKind::Trace) => Some(id),
        Some(NodeKind::Signal) => state
            .store
            .signal_row(tenant, id)
            .await?
            .map(|s| s.signal.trace_id),
        Some(NodeKind::Receipt) => {
            let sid = state
                .store
                .get_receipt(tenant, id)
                .await?
                .and_then(|r| r.signal_id)
                .and_then(|s| Uuid::parse_str(&s).ok());
            match sid {
                Some(s) => state
                    .store
                    .signal_row(tenant, s)
                    .await?
                    .map(|s| s.signal.trace_id),
                None => None,
            }
        }
        _ => None,
    })
}

/// What a trace was derived from, transitively (bounded), nearest first.
pub async fn lineage(
    state: &AppState,
    tenant: Uuid,
    trace: &TraceFacts,
) -> Result<Vec<AncestorFacts>, ApiError> {
    let mut out = Vec::new();
    let mut visited: HashSet<Uuid> = HashSet::from([trace.trace_id]);
    let mut queue: VecDeque<(Vec<Uuid>, u32)> =
        VecDeque::from([(trace.signals.iter().map(|s| s.id).collect(), 0)]);
    while let Some((signals, depth)) = queue.pop_front() {
        if depth >= MAX_ANCESTOR_DEPTH {
            continue;
        }
        for s in signals {
            for e in state
                .store
                .parents_of(tenant, (NodeKind::Signal, s))
                .await?
            {
                let Some(t) = trace_of_node(state, tenant, &e.parent_kind, &e.parent_id).await?
                else {
                    continue;
                };
                if !visited.insert(t) || out.len() >= MAX_ANCESTORS {
                    continue;
                }
                let Some((facts, _)) = trace_facts(state, tenant, t).await? else {
                    continue;
                };
                out.push(AncestorFacts {
                    trace_id: t,
                    phase: facts.phase,
                    authority: crate::kernel::operations::round(facts.authority()),
                    depth: depth + 1,
                });
                queue.push_back((facts.signals.iter().map(|s| s.id).collect(), depth + 1));
            }
        }
    }
    Ok(out)
}

/// Traces an action was based on.
pub async fn action_basis(
    state: &AppState,
    tenant: Uuid,
    action: Uuid,
) -> Result<Vec<Uuid>, ApiError> {
    Ok(state
        .store
        .parents_of(tenant, (NodeKind::Action, action))
        .await?
        .into_iter()
        .filter(|e| e.parent_kind == NodeKind::Trace.as_str())
        .filter_map(|e| Uuid::parse_str(&e.parent_id).ok())
        .collect())
}
