//! Coalesced basis reads of proxied writes.
//!
//! Every proxied write reads its basis (the phase of its records' traces and its source's
//! record) before the kernel judges it. On SQLite each read is a hand-off to one of sqlx's
//! connection threads, and under load the hand-offs (two thread wake-ups each, on two cores
//! shared with everything else) cost several times the query. So reads queue here and one task
//! answers them in batches: it takes every request waiting, asks ONE query for all their
//! traces and sources (per tenant), and answers each caller with its own part. While a batch is
//! read the next one gathers; a lone write waits for nothing. What a caller gets is exactly
//! what [`Store::basis_of`] reads alone: the same rows, read after the request arrived.

use super::{Result, Store, StoreError};
use crate::kernel::types::{AllowedInfluence, TracePhase};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};
use uuid::Uuid;

/// Trace ids per batch (they share one `IN` list).
pub(super) const MAX_BATCH_IDS: usize = 400;
/// Distinct sources per batch (each is a sub-select of the query).
const MAX_BATCH_SOURCES: usize = 16;
/// Batches read at once (each on its own read connection).
const IN_FLIGHT: usize = 2;
const QUEUE_DEPTH: usize = 4096;

/// The phase and influence of the traces asked for (unknown ids are absent) and the source's
/// record over its last `window` receipts: (receipts, refused).
pub type Basis = (HashMap<Uuid, (TracePhase, AllowedInfluence)>, (u32, u32));

pub(super) type Queue = mpsc::Sender<Job>;

pub(super) struct Job {
    tenant: Uuid,
    ids: Vec<Uuid>,
    source: String,
    window: i64,
    reply: oneshot::Sender<Result<Basis>>,
}

pub(super) type Inbox = mpsc::Receiver<Job>;

/// The reader's queue; [`start`] runs the reader on it.
pub(super) fn channel() -> (Queue, Inbox) {
    mpsc::channel(QUEUE_DEPTH)
}

/// Starts the reader on the current runtime; it ends when the last [`Queue`] is dropped.
pub(super) fn start(store: Store, inbox: Inbox) {
    tokio::spawn(run(Arc::new(store), inbox));
}

/// Queues one read and waits for its batch. Without a running reader (its runtime is
/// stopping) the read runs alone.
pub(super) async fn read(
    store: &Store,
    queue: &Queue,
    tenant: Uuid,
    ids: &[Uuid],
    source: &str,
    window: i64,
) -> Result<Basis> {
    let (reply, answer) = oneshot::channel();
    let job = Job {
        tenant,
        ids: ids.to_vec(),
        source: source.to_string(),
        window,
        reply,
    };
    match queue.send(job).await {
        Ok(()) => answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the basis reader stopped before answering".into(),
            ))
        }),
        Err(_) => {
            let (traces, mut histories) = store
                .bases_of(tenant, ids, &[(source.to_string(), window)])
                .await?;
            Ok((traces, histories.pop().unwrap_or((0, 0))))
        }
    }
}

async fn run(store: Arc<Store>, mut rx: Inbox) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Wait for a free read slot first: while both are busy, the next batch grows.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut ids = first.ids.len();
        let mut jobs = vec![first];
        while ids < MAX_BATCH_IDS && jobs.len() < MAX_BATCH_SOURCES {
            match rx.try_recv() {
                Ok(job) => {
                    ids += job.ids.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            answer(&store, jobs).await;
            drop(slot);
        });
    }
}

/// One query per tenant of the batch; each job is answered with its traces and its source's
/// record.
async fn answer(store: &Store, jobs: Vec<Job>) {
    let mut by_tenant: Vec<(Uuid, Vec<Job>)> = Vec::new();
    for job in jobs {
        match by_tenant.iter_mut().find(|(t, _)| *t == job.tenant) {
            Some((_, group)) => group.push(job),
            None => by_tenant.push((job.tenant, vec![job])),
        }
    }
    for (tenant, jobs) in by_tenant {
        let mut ids: Vec<Uuid> = jobs.iter().flat_map(|j| j.ids.iter().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut sources: Vec<(String, i64)> = Vec::new();
        for j in &jobs {
            if !sources
                .iter()
                .any(|(s, w)| *s == j.source && *w == j.window)
            {
                sources.push((j.source.clone(), j.window));
            }
        }
        match store.bases_of(tenant, &ids, &sources).await {
            Ok((traces, histories)) => {
                for j in jobs {
                    let mine = j
                        .ids
                        .iter()
                        .filter_map(|id| traces.get(id).map(|t| (*id, *t)))
                        .collect();
                    let at = sources
                        .iter()
                        .position(|(s, w)| *s == j.source && *w == j.window);
                    let history = at.and_then(|i| histories.get(i).copied());
                    let _ = j.reply.send(Ok((mine, history.unwrap_or((0, 0)))));
                }
            }
            Err(e) => {
                for j in jobs {
                    let _ = j.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
