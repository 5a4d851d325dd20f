//! The records of one proxied request judged as one batch: the state basis read in bulk
//! (one query for the traces, one for the source's record), the cached kernel per record, and
//! every receipt committed in one transaction with the rows that say what the gate did with
//! the records (journal and quarantine). The kernel decides; nothing here is policy.

use crate::engine::receipt_content;
use crate::kernel::policy::CompiledPolicy;
use crate::kernel::types::*;
use crate::kernel::{KernelInput, KernelOutput, NormalizedSignal, StateBasis};
use crate::state::AppState;
use crate::store::{
    CommittedReceipt, EventWrite, Finish, LifecycleWrite, ReceiptWrite, Stmt, StoreError,
    TraceWrite,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

/// How many recent receipts of a source make up its record (as the API's evaluations use).
const SOURCE_WINDOW: i64 = 20;

/// Records are judged this many at a time, the task yielding between chunks, so one large
/// batch shares the proxy's threads with the small writes beside it instead of holding one for
/// its whole length.
const JUDGE_CHUNK: usize = 32;

/// Records being judged at once, over every request of the process. Tokio's semaphore serves
/// waiters in order, so a small write waits for at most one chunk of each batch ahead of it.
const RECORDS_IN_FLIGHT: usize = 256;

static JUDGING: std::sync::LazyLock<tokio::sync::Semaphore> =
    std::sync::LazyLock::new(|| tokio::sync::Semaphore::new(RECORDS_IN_FLIGHT));

/// One record's decision, before its receipt is committed.
pub struct Judged {
    pub input: KernelInput,
    pub output: Arc<KernelOutput>,
    /// Chosen now, so journal and quarantine rows can name it in the same transaction.
    pub receipt_id: Uuid,
    /// The record's trace as stored before this write (a tombstoned one included, which the
    /// kernel's basis reads as no trace).
    pub stored: Option<(TracePhase, AllowedInfluence)>,
}

#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("storage unavailable: {0}")]
    Storage(#[from] StoreError),
    #[error("kernel unavailable: {0}")]
    Kernel(String),
}

/// Evaluates every signal of a request. All signals share the source record read at the start
/// of the request (it is bound into each receipt as its basis, so replay sees the same). A
/// trace that is `tombstoned` (its record was deleted through the gate) is judged as new: the
/// id now names a new record.
pub async fn judge(
    state: &AppState,
    policy: &Arc<CompiledPolicy>,
    signals: Vec<NormalizedSignal>,
    mode: EvaluationMode,
) -> Result<Vec<Judged>, JudgeError> {
    let Some(first) = signals.first() else {
        return Ok(Vec::new());
    };
    let tenant = first.tenant_id;
    let mut trace_ids: Vec<Uuid> = signals.iter().map(|s| s.trace_id).collect();
    trace_ids.sort_unstable();
    trace_ids.dedup();
    // The first source's record comes with the traces, in one query; others (a batch from
    // several sources is rare) are read apart.
    let (traces, first_history) = state
        .store
        .basis_of(tenant, &trace_ids, &first.source_id, SOURCE_WINDOW)
        .await?;
    let mut history: HashMap<String, (u32, u32)> = HashMap::new();
    history.insert(first.source_id.clone(), first_history);
    for s in &signals {
        if !history.contains_key(&s.source_id) {
            let h = state
                .store
                .source_history(tenant, &s.source_id, SOURCE_WINDOW)
                .await?;
            history.insert(s.source_id.clone(), h);
        }
    }
    let mut out = Vec::with_capacity(signals.len());
    let mut signals = signals.into_iter().peekable();
    while signals.peek().is_some() {
        let chunk: Vec<NormalizedSignal> = signals.by_ref().take(JUDGE_CHUNK).collect();
        // The semaphore is never closed; JUDGE_CHUNK is below its permits.
        let permit = JUDGING
            .acquire_many(chunk.len() as u32)
            .await
            .map_err(|_| JudgeError::Kernel("judging stopped".into()))?;
        for signal in chunk {
            out.push(judge_one(state, policy, mode, &traces, &history, signal)?);
        }
        drop(permit);
        tokio::task::yield_now().await;
    }
    Ok(out)
}

/// One record through the cached kernel.
fn judge_one(
    state: &AppState,
    policy: &Arc<CompiledPolicy>,
    mode: EvaluationMode,
    traces: &HashMap<Uuid, (TracePhase, AllowedInfluence)>,
    history: &HashMap<String, (u32, u32)>,
    signal: NormalizedSignal,
) -> Result<Judged, JudgeError> {
    let stored = traces.get(&signal.trace_id).copied();
    let (phase, influence) = match traces.get(&signal.trace_id) {
        Some((TracePhase::Tombstoned, _)) | None => (None, AllowedInfluence::None),
        Some((p, i)) => (Some(*p), *i),
    };
    let (recent, refused) = history.get(&signal.source_id).copied().unwrap_or((0, 0));
    let input = KernelInput {
        basis: StateBasis {
            trace_id: signal.trace_id,
            phase,
            influence,
            source_recent: recent,
            source_refused: refused,
        },
        signal,
        profile: policy.profile,
        mode,
        equation_bundles: Vec::new(),
    };
    // The kernel is pure and total; a panic in it is a fault of this build, and the write
    // it was judging must not go through unjudged.
    let output = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state.cache.evaluate(&input, policy)
    }))
    .map_err(|p| {
        JudgeError::Kernel(
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "kernel panicked".into()),
        )
    })?;
    crate::metrics::DECISIONS
        .with_label_values(&[
            output.decision.as_str(),
            input.signal.target_substrate.as_str(),
        ])
        .inc();
    Ok(Judged {
        input,
        output,
        receipt_id: crate::store::new_id(),
        stored,
    })
}

/// Whether a decision refuses the write (it counts against the source's record).
pub fn refuses(d: RuntimeDecision) -> bool {
    matches!(
        d,
        RuntimeDecision::Block
            | RuntimeDecision::Escalate
            | RuntimeDecision::Quarantine
            | RuntimeDecision::RequireReview
            | RuntimeDecision::Defer
            | RuntimeDecision::Repair
    )
}

/// Commits the receipts of a judged batch (kind `proxy_write`), their signals and `extra`
/// rows in one transaction. `contexts[i]` is bound into receipt `i` as its `context`.
///
/// A record's trace describes the record the store holds, so only a record that goes on to the
/// store (`reaches_store[i]`) moves it. A held or blocked write leaves the stored version, if
/// any, as it was: otherwise anyone could hide a stored record by sending a poisoned write
/// under its id. Its receipt still says what the kernel decided, and the quarantine row
/// carries the held write. A forwarded write that leaves the stored text as it was (see
/// `write::keeps_trace`) is not counted as reaching the store either.
pub async fn commit(
    state: &AppState,
    policy: &CompiledPolicy,
    judged: &[Judged],
    reaches_store: &[bool],
    kind: &'static str,
    contexts: Vec<Value>,
    extra: Vec<Stmt>,
) -> Result<Vec<CommittedReceipt>, StoreError> {
    let Some(first) = judged.first() else {
        if !extra.is_empty() {
            state.store.run_statements(extra).await?;
        }
        return Ok(Vec::new());
    };
    let tenant = first.input.signal.tenant_id;
    let mut signals = Vec::with_capacity(judged.len());
    let mut writes = Vec::with_capacity(judged.len());
    for ((j, ctx), stored) in judged.iter().zip(contexts).zip(reaches_store) {
        let out = &j.output;
        let content = receipt_content(j.receipt_id, &j.input, out, policy, kind, Some(ctx), &[]);
        let for_events = out.clone();
        // `signal.ingested` carries the kernel's own governed view of the signal: classifying
        // it again would scan the payload a second time on the proxy's path.
        let record = crate::engine::signal_record(&j.input.signal);
        writes.push(ReceiptWrite {
            tenant,
            id: j.receipt_id,
            kind: kind.into(),
            signal_id: Some(j.input.signal.id),
            source_id: Some(j.input.signal.source_id.clone()),
            refused: refuses(out.decision),
            decision: out.decision.as_str().into(),
            outcome: out.outcome.as_str().into(),
            idem_key: None,
            content: crate::receipts::CanonicalContent::new(content),
            trace: (out.transition.enforced && *stored).then(|| TraceWrite {
                id: out.trace.id,
                phase: out.next_phase,
                influence: out.next_influence,
                trace_type: out.trace.trace_type.clone(),
            }),
            obstruction: out.obstruction.as_ref().map(|o| LifecycleWrite {
                id: o.id,
                status: o.status.as_str().into(),
                body: json!(o),
                parent: None,
            }),
            repair_plan: out.repair_plan.as_ref().map(|r| LifecycleWrite {
                id: r.id,
                status: r.status.as_str().into(),
                body: json!(r),
                parent: Some(r.obstruction_id),
            }),
            finish: Box::new(move |sealed| Finish {
                result: None,
                events: if sealed.events_wanted {
                    let mut v = vec![crate::engine::ingested_event(
                        &record,
                        &for_events.governed_signal,
                    )];
                    v.extend(events_for(
                        &for_events,
                        sealed.receipt_id,
                        sealed.replay_hash,
                    ));
                    v
                } else {
                    Vec::new()
                },
            }),
        });
        signals.push(j.input.signal.clone());
    }
    state
        .store
        .commit_receipts_grouped(tenant, &signals, writes, extra)
        .await
}

/// The events a proxied decision causes: the same names and data as an API evaluation's.
fn events_for(out: &KernelOutput, receipt_id: Uuid, replay_hash: &str) -> Vec<EventWrite> {
    let receipt = json!(ReceiptRef {
        id: receipt_id,
        replay_hash: Some(replay_hash.to_string()),
        decision: Some(out.decision),
    });
    let signal_id = out.governed_signal.substrate_signal_id;
    let mut v = vec![
        EventWrite {
            name: "signal.evaluated".into(),
            data: json!({"signalId": signal_id, "decision": out.decision, "outcome": out.outcome, "receipt": receipt}),
        },
        EventWrite {
            name: "receipt.created".into(),
            data: receipt.clone(),
        },
    ];
    match out.decision {
        RuntimeDecision::Block | RuntimeDecision::Escalate => v.push(EventWrite {
            name: "signal.blocked".into(),
            data: json!({"signalId": signal_id, "decision": out.decision, "reasonCodes": out.reason_codes, "receipt": receipt}),
        }),
        RuntimeDecision::Quarantine
        | RuntimeDecision::RequireReview
        | RuntimeDecision::Defer
        | RuntimeDecision::Repair => v.push(EventWrite {
            name: "signal.quarantined".into(),
            data: json!({"signalId": signal_id, "decision": out.decision, "reasonCodes": out.reason_codes, "receipt": receipt}),
        }),
        _ => {}
    }
    if let Some(o) = &out.obstruction {
        v.push(EventWrite {
            name: "obstruction.opened".into(),
            data: json!({"obstruction": o, "receipt": receipt}),
        });
    }
    if let Some(p) = &out.repair_plan {
        v.push(EventWrite {
            name: "repair.proposed".into(),
            data: json!({"repairPlan": p, "receipt": receipt}),
        });
    }
    v
}
