//! Group commit of proxied receipts.
//!
//! On SQLite every write goes through one connection, and every transaction costs at least one
//! round trip to sqlx's connection thread: one transaction per proxied request caps the proxy's
//! writes at a few hundred per second whatever the CPU. So batches queue here, and one task
//! commits them: it takes every batch that is waiting (up to
//! [`MAX_GROUP_RECEIPTS`] receipts), appends them to their tenant's chain in arrival order in ONE
//! transaction (same statements, more rows), and answers each caller with its own receipts.
//! While one group commits the next one gathers, so a lone write waits for nothing and a
//! crowd shares the cost. Nothing is acknowledged before its group has committed: durability
//! is exactly that of [`Store::commit_receipts`]. A group holds only batches whose statements
//! insert fresh rows (see [`Store::commit_receipts_grouped`]), so a group fails only as a
//! whole, on a storage error every member would have hit alone. The committer keeps each
//! tenant's chain tip between groups, so that on SQLite a group is one round trip (see
//! [`Store::commit_rows_at`]).

use super::receipts::{Bind, ChainTip, CommittedReceipt, ReceiptWrite, Stmt};
use super::{Result, Store, StoreError};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Receipts per group: a 2,000-record batch still commits on its own, in one transaction.
const MAX_GROUP_RECEIPTS: usize = 512;
/// Batches waiting at most; a caller beyond waits to enqueue (backpressure).
const QUEUE_DEPTH: usize = 4096;

pub(super) type Queue = mpsc::Sender<Work>;

pub(super) enum Work {
    Receipts(Job),
    /// The upstream's answer to a journaled dispatch (see [`Store::settle_dispatch`]): settles
    /// waiting together become one UPDATE per distinct outcome.
    Settle(Settle),
    /// Answered once everything queued before it is committed (graceful shutdown).
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub(super) struct Settle {
    pub request_id: Uuid,
    pub status: &'static str,
    pub upstream_status: Option<u16>,
    pub detail: Option<String>,
}

pub(super) struct Job {
    tenant: Uuid,
    signal_rows: Vec<Vec<Bind>>,
    writes: Vec<ReceiptWrite>,
    extra: Vec<Stmt>,
    reply: oneshot::Sender<Result<Vec<CommittedReceipt>>>,
}

pub(super) type Inbox = mpsc::Receiver<Work>;

/// The committer's queue; [`start`] runs the committer on it.
pub(super) fn channel() -> (Queue, Inbox) {
    mpsc::channel(QUEUE_DEPTH)
}

/// Starts the committer on the current runtime; it ends when the last [`Queue`] is dropped.
pub(super) fn start(store: Store, inbox: Inbox) {
    tokio::spawn(run(store, inbox));
}

/// Queues one batch and waits for its group to commit. If the committer is gone (its runtime
/// is shutting down), the batch commits on its own.
pub(super) async fn commit(
    store: &Store,
    queue: &Queue,
    tenant: Uuid,
    signal_rows: Vec<Vec<Bind>>,
    writes: Vec<ReceiptWrite>,
    extra: Vec<Stmt>,
) -> Result<Vec<CommittedReceipt>> {
    let (reply, answer) = oneshot::channel();
    let job = Job {
        tenant,
        signal_rows,
        writes,
        extra,
        reply,
    };
    match queue.send(Work::Receipts(job)).await {
        Ok(()) => answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the group committer stopped before answering".into(),
            ))
        }),
        // The committer is gone (its runtime is stopping): commit this batch on its own.
        Err(mpsc::error::SendError(Work::Receipts(job))) => {
            store
                .commit_rows(job.tenant, job.signal_rows, job.writes, job.extra)
                .await
        }
        Err(_) => Err(StoreError::Unavailable(
            "the group committer is gone".into(),
        )),
    }
}

/// Waits until everything queued so far is committed (or the committer is gone).
pub(super) async fn flush(queue: &Queue) {
    let (done, wait) = oneshot::channel();
    if queue.send(Work::Flush(done)).await.is_ok() {
        let _ = wait.await;
    }
}

/// Queues a settle without waiting: when this returns the settle is in the queue, or a task
/// holds it (the queue is full: it waits for room; no committer runs: it commits alone).
pub(super) fn settle(store: &Arc<Store>, queue: Option<&Queue>, s: Settle) {
    use mpsc::error::TrySendError;
    let Some(q) = queue else {
        return settle_alone(store, s);
    };
    match q.try_send(Work::Settle(s)) {
        Ok(()) => {}
        Err(TrySendError::Full(work)) => {
            let q = q.clone();
            tokio::spawn(async move {
                if q.send(work).await.is_err() {
                    tracing::error!(
                        "journal: the group committer stopped; an upstream answer was not recorded"
                    );
                }
            });
        }
        Err(TrySendError::Closed(Work::Settle(s))) => settle_alone(store, s),
        Err(TrySendError::Closed(_)) => {}
    }
}

fn settle_alone(store: &Arc<Store>, s: Settle) {
    let store = store.clone();
    tokio::spawn(async move {
        if let Err(e) = store.settle_all(vec![s]).await {
            tracing::error!(error = %e, "journal: could not record the upstream's answer");
        }
    });
}

async fn run(store: Store, mut rx: Inbox) {
    // Each tenant's chain tip as the last group left it (see [`Store::commit_rows_at`]).
    let mut tips: HashMap<Uuid, ChainTip> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let (mut jobs, mut settles, mut flushes, mut receipts) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        let mut next = Some(first);
        while let Some(work) = next.take() {
            match work {
                Work::Receipts(job) => {
                    receipts += job.writes.len();
                    jobs.push(job);
                }
                Work::Settle(s) => settles.push(s),
                Work::Flush(done) => flushes.push(done),
            }
            // A flush ends the group: it is answered after what came before it.
            if flushes.is_empty()
                && receipts < MAX_GROUP_RECEIPTS
                && settles.len() < MAX_GROUP_RECEIPTS
            {
                next = rx.try_recv().ok();
            }
        }
        // One transaction per tenant (each has its own chain), tenants in arrival order.
        let mut by_tenant: Vec<(Uuid, Vec<Job>)> = Vec::new();
        for job in jobs {
            match by_tenant.iter_mut().find(|(t, _)| *t == job.tenant) {
                Some((_, group)) => group.push(job),
                None => by_tenant.push((job.tenant, vec![job])),
            }
        }
        // The settles ride in the first group's transaction (a commit saved); without a group,
        // or if that group fails, they commit on their own.
        let mut settles = Some(settles).filter(|s| !s.is_empty());
        for (tenant, group) in by_tenant {
            let mut tip = tips.remove(&tenant);
            let left = commit_group(&store, tenant, group, settles.take(), &mut tip).await;
            if let Some(tip) = tip {
                tips.insert(tenant, tip);
            }
            if let Some(left) = left {
                settles = Some(left);
            }
        }
        if let Some(settles) = settles {
            if let Err(e) = store.settle_all(settles).await {
                tracing::error!(error = %e, "journal: could not record upstream answers");
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// Commits one tenant's group, with `settles` in the same transaction; gives the settles back
/// if the transaction failed.
async fn commit_group(
    store: &Store,
    tenant: Uuid,
    group: Vec<Job>,
    settles: Option<Vec<Settle>>,
    tip: &mut Option<ChainTip>,
) -> Option<Vec<Settle>> {
    crate::metrics::GROUP_COMMIT_BATCHES.observe(group.len() as f64);
    let mut counts = Vec::with_capacity(group.len());
    let mut replies = Vec::with_capacity(group.len());
    let (mut signal_rows, mut writes, mut extra) = (Vec::new(), Vec::new(), Vec::new());
    for job in group {
        counts.push(job.writes.len());
        replies.push(job.reply);
        signal_rows.extend(job.signal_rows);
        writes.extend(job.writes);
        merge_inserts(&mut extra, job.extra);
    }
    // Settles only update rows committed by earlier groups: they cannot make this one fail.
    let kept = settles.clone();
    if let Some(s) = settles {
        extra.extend(super::proxy::settle_statements(s));
    }
    match store
        .commit_rows_at(tenant, signal_rows, writes, extra, tip)
        .await
    {
        Ok(all) => {
            let mut all = all.into_iter();
            for (n, reply) in counts.into_iter().zip(replies) {
                let _ = reply.send(Ok(all.by_ref().take(n).collect()));
            }
            None
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
            kept
        }
    }
}

/// Appends `more` to `into`, folding each insert into an earlier one of the same table, columns
/// and suffix: a group runs as many statements as one batch, however many batches it holds.
fn merge_inserts(into: &mut Vec<Stmt>, more: Vec<Stmt>) {
    for stmt in more {
        let Stmt::Insert {
            table,
            columns,
            rows,
            suffix,
        } = stmt
        else {
            into.push(stmt);
            continue;
        };
        let same = into.iter_mut().find_map(|s| match s {
            Stmt::Insert {
                table: t,
                columns: c,
                rows: r,
                suffix: x,
            } if *t == table && *c == columns && *x == suffix => Some(r),
            _ => None,
        });
        match same {
            Some(r) => r.extend(rows),
            None => into.push(Stmt::Insert {
                table,
                columns,
                rows,
                suffix,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::receipt;

    async fn deliveries(store: &Store, tenant: Uuid) -> i64 {
        crate::with_pool!(store, read, |p, _d| {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE tenant_id = $1",
            )
            .bind(tenant.to_string())
            .fetch_one(p)
            .await
            .unwrap()
        })
    }

    /// The group committer keeps each chain's tip between groups (on SQLite it then commits in
    /// one hand-off). Another path appending to the chain (the API's commit), and a
    /// subscription created between two groups, must both be seen: the next group lands after
    /// the API's receipt and its events reach the new subscription; the chain verifies.
    #[tokio::test]
    async fn group_commits_follow_the_chain_and_the_subscriptions_they_did_not_write() {
        for (store, _dir) in crate::store::testing::stores().await {
            let tenant = Uuid::new_v4();
            let grouped = |n| {
                store.commit_receipts_grouped(tenant, &[], vec![receipt(tenant, n)], Vec::new())
            };
            assert_eq!(grouped(1).await.unwrap()[0].seq, 1);
            assert_eq!(grouped(2).await.unwrap()[0].seq, 2);
            // The chain moves under the committer's tip.
            assert_eq!(
                store.commit_receipt(receipt(tenant, 3)).await.unwrap().seq,
                3
            );
            assert_eq!(grouped(4).await.unwrap()[0].seq, 4);
            assert_eq!(deliveries(&store, tenant).await, 0);
            // A subscription appears between two groups.
            crate::store::testing::subscribe(&store, tenant, "receipt.created").await;
            assert_eq!(grouped(5).await.unwrap()[0].seq, 5);
            assert_eq!(deliveries(&store, tenant).await, 1);
            // Several batches in flight at once share groups and keep their order.
            let many = futures::future::join_all((6..26).map(grouped)).await;
            let mut seqs: Vec<i64> = many.into_iter().map(|r| r.unwrap()[0].seq).collect();
            seqs.sort_unstable();
            assert_eq!(seqs, (6..26).collect::<Vec<_>>());
            assert_eq!(deliveries(&store, tenant).await, 21);
            let report = crate::audit::verify_tenant(&store, tenant).await.unwrap();
            assert_eq!(report.receipts, 25);
            assert!(report.broken.is_none(), "{:?}", report.broken);
        }
    }

    /// The WAL checkpointer (its own connection, every 10 ms while the log grows) copies the
    /// log back into the database beside the writer: shortly after a burst of group commits
    /// the database file holds their pages, though no commit came near the writer's own
    /// auto-checkpoint threshold (64 MiB of log) and nobody else asked for a checkpoint.
    #[tokio::test]
    async fn the_checkpointer_copies_the_log_into_the_database() {
        let (store, dir) = crate::store::testing::stores().await.swap_remove(0);
        let db = dir.path().join("t.db");
        let size = || std::fs::metadata(&db).unwrap().len();
        // Let the start-up's checkpoints settle, then measure.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let before = size();
        let tenant = Uuid::new_v4();
        let many = (0..300).map(|n| {
            store.commit_receipts_grouped(tenant, &[], vec![receipt(tenant, n)], Vec::new())
        });
        for r in futures::future::join_all(many).await {
            r.unwrap();
        }
        let mut after = before;
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(40)).await;
            after = size();
            if after > before {
                break;
            }
        }
        assert!(after > before, "database file {before} -> {after} bytes");
    }

    /// A source's record as the proxy's basis reads it (counted by the database, several
    /// sources in one query) is the record `source_history` reads row by row: the last
    /// `window` receipts of the source and how many of them refused.
    #[tokio::test]
    async fn the_batched_source_record_counts_what_source_history_counts() {
        for (store, _dir) in crate::store::testing::stores().await {
            let tenant = Uuid::new_v4();
            let mut writes = Vec::new();
            for n in 0..30 {
                let mut w = receipt(tenant, n);
                w.source_id = Some(if n % 3 == 0 { "s2" } else { "s1" }.into());
                w.refused = n % 4 == 1 || n >= 25;
                writes.push(w);
            }
            store
                .commit_receipts(tenant, &[], writes, Vec::new())
                .await
                .unwrap();
            let sources: Vec<(String, i64)> = [("s1", 20), ("s2", 20), ("s1", 3), ("nobody", 20)]
                .iter()
                .map(|(s, w)| (s.to_string(), *w))
                .collect();
            let (_, batched) = store.bases_of(tenant, &[], &sources).await.unwrap();
            let mut alone = Vec::new();
            for (s, w) in &sources {
                alone.push(store.source_history(tenant, s, *w).await.unwrap());
            }
            assert_eq!(batched, alone);
            assert_eq!(alone[3], (0, 0));
            assert_eq!(alone[2], (3, 3), "the last three of s1 all refused");
            assert_eq!(alone[1].0, 10);
        }
    }

    fn insert(table: &'static str, n: i64) -> Stmt {
        Stmt::Insert {
            table,
            columns: &["id"],
            rows: vec![vec![Bind::int(n)]],
            suffix: "",
        }
    }

    #[test]
    fn inserts_of_one_table_fold_in_first_seen_order() {
        let mut all = Vec::new();
        merge_inserts(
            &mut all,
            vec![insert("dispatches", 1), insert("quarantine", 2)],
        );
        merge_inserts(&mut all, vec![insert("dispatches", 3)]);
        merge_inserts(
            &mut all,
            vec![insert("quarantine", 4), insert("dispatches", 5)],
        );
        let shape: Vec<(&str, Vec<Vec<Bind>>)> = all
            .into_iter()
            .map(|s| match s {
                Stmt::Insert { table, rows, .. } => (table, rows),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (
                    "dispatches",
                    vec![vec![Bind::int(1)], vec![Bind::int(3)], vec![Bind::int(5)]]
                ),
                ("quarantine", vec![vec![Bind::int(2)], vec![Bind::int(4)]]),
            ]
        );
    }
}
