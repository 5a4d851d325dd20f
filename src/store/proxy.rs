//! The sidecar's rows: trace state read in bulk (the basis of a batch, retrieval treatment),
//! the dispatch journal (admitted records, written with their receipts before the upstream is
//! contacted) and the quarantine (held records and their review). Rows that must commit with
//! receipts are built here as [`Stmt`]s and handed to [`Store::commit_receipts`].

use super::{now, Bind, Result, Stmt, Store, StoreError};
use crate::kernel::types::{AllowedInfluence, TracePhase};
use crate::with_pool;
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

/// The journal keeps the credential headers a write presented upstream only while its outcome
/// is open (`pending`, `dispatch_unknown`: start-up reconciliation reads the record back with
/// them); the statement that settles a row clears them (`$1` is the new status).
const KEEP_CREDENTIALS_WHILE_UNSETTLED: &str =
    "CASE WHEN $1 IN ('pending', 'dispatch_unknown') THEN upstream_headers ELSE NULL END";
/// Likewise a held write's request headers: kept while it is held or being released (a release
/// replays them), cleared once it is released or rejected (`$1` is the new status).
const HELD_HEADERS_WHILE_UNSETTLED: &str =
    "CASE WHEN $1 IN ('held', 'releasing') THEN headers ELSE '[]' END";

/// A trace moved by a write the store then refused, and what it was before (see
/// [`Store::restore_traces`]).
#[derive(Debug, Clone)]
pub struct TraceRestore {
    pub trace: Uuid,
    /// The refused write's receipt (the trace's last receipt if nothing moved it since).
    pub receipt: Uuid,
    pub prior: Option<(TracePhase, AllowedInfluence)>,
}

/// The trace of a record the store confirmed deleted (see [`Store::tombstone_traces`]).
#[derive(Debug, Clone, Copy)]
pub struct Tombstone {
    pub trace: Uuid,
    /// The delete's receipt, when that receipt moved the trace: the trace is then tombstoned
    /// only while it is still the trace's last receipt (a write judged after the delete, a
    /// re-add of the id, has moved it since and describes what the store holds now).
    pub receipt: Option<Uuid>,
}

/// Ids per `IN (...)` list.
const IN_CHUNK: usize = 500;

fn placeholders(from: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("${}", from + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A stored trace row's id, phase and influence, parsed.
fn trace_state(
    id: &str,
    phase: &str,
    influence: &str,
) -> Result<(Uuid, (TracePhase, AllowedInfluence))> {
    let id = Uuid::parse_str(id).map_err(|_| StoreError::Corrupt(format!("trace id {id:?}")))?;
    let ph = TracePhase::parse(phase)
        .ok_or_else(|| StoreError::Corrupt(format!("trace phase {phase:?}")))?;
    let inf = AllowedInfluence::parse(influence)
        .ok_or_else(|| StoreError::Corrupt(format!("trace influence {influence:?}")))?;
    Ok((id, (ph, inf)))
}

/// One admitted record of a proxied write, as journaled before dispatch.
#[derive(Debug, Clone)]
pub struct DispatchWrite {
    pub id: Uuid,
    pub tenant: Uuid,
    pub request_id: Uuid,
    pub instance_id: Uuid,
    pub receipt_id: Uuid,
    pub trace_id: Uuid,
    pub pack: String,
    pub route: String,
    pub kind: String,
    pub params: Vec<(String, String)>,
    pub collection: Option<String>,
    pub record_id: Option<String>,
    pub upstream_headers: Option<String>,
}

const DISPATCH_COLUMNS: &[&str] = &[
    "id",
    "tenant_id",
    "request_id",
    "instance_id",
    "receipt_id",
    "trace_id",
    "pack",
    "route",
    "kind",
    "params",
    "collection",
    "record_id",
    "upstream_headers",
    "status",
    "created_at",
    "updated_at",
];

/// The journal rows of admitted records, status `pending`.
pub fn dispatch_rows(rows: &[DispatchWrite]) -> Stmt {
    let created = now();
    Stmt::Insert {
        table: "proxy_dispatches",
        columns: DISPATCH_COLUMNS,
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    Bind::text(r.id.to_string()),
                    Bind::text(r.tenant.to_string()),
                    Bind::text(r.request_id.to_string()),
                    Bind::text(r.instance_id.to_string()),
                    Bind::text(r.receipt_id.to_string()),
                    Bind::text(r.trace_id.to_string()),
                    Bind::text(&r.pack),
                    Bind::text(&r.route),
                    Bind::text(&r.kind),
                    Bind::text(serde_json::to_string(&r.params).unwrap_or_else(|_| "[]".into())),
                    Bind::opt(r.collection.clone()),
                    Bind::opt(r.record_id.clone()),
                    Bind::opt(r.upstream_headers.clone()),
                    Bind::text("pending"),
                    Bind::text(&created),
                    Bind::text(&created),
                ]
            })
            .collect(),
        suffix: "",
    }
}

/// A journaled dispatch whose outcome is not settled (start-up reconciliation).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DispatchRow {
    pub id: String,
    pub tenant_id: String,
    pub request_id: String,
    pub instance_id: String,
    pub receipt_id: String,
    pub trace_id: String,
    pub pack: String,
    pub route: String,
    pub kind: String,
    pub params: String,
    pub collection: Option<String>,
    pub record_id: Option<String>,
    pub upstream_headers: Option<String>,
    pub status: String,
    pub upstream_status: Option<i64>,
    pub created_at: String,
}

/// One held record. `body` is the exact single-record request that a release forwards.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QuarantineRow {
    pub id: String,
    pub tenant_id: String,
    pub status: String,
    pub decision: String,
    pub reason_codes: String,
    pub receipt_id: String,
    pub signal_id: String,
    pub trace_id: String,
    pub obstruction_id: Option<String>,
    pub source_id: String,
    pub pack: String,
    pub route: String,
    pub params: String,
    pub collection: Option<String>,
    pub record_id: Option<String>,
    pub record_index: i64,
    pub method: String,
    pub path: String,
    pub headers: String,
    pub body: String,
    pub created_at: String,
    pub updated_at: String,
    pub reviewed_at: Option<String>,
    pub reviewed_by: Option<String>,
    pub review_receipt_id: Option<String>,
    pub upstream_status: Option<i64>,
}

const QUARANTINE_COLUMNS: &str = "id, tenant_id, status, decision, reason_codes, receipt_id, signal_id, trace_id, obstruction_id, source_id, pack, route, params, collection, record_id, record_index, method, path, headers, body, created_at, updated_at, reviewed_at, reviewed_by, review_receipt_id, upstream_status";

/// A held record to store with its receipt.
#[derive(Debug, Clone)]
pub struct QuarantineWrite {
    pub id: Uuid,
    pub tenant: Uuid,
    pub decision: String,
    pub reason_codes: Vec<String>,
    pub receipt_id: Uuid,
    pub signal_id: Uuid,
    pub trace_id: Uuid,
    pub obstruction_id: Option<Uuid>,
    pub source_id: String,
    pub pack: String,
    pub route: String,
    pub params: Vec<(String, String)>,
    pub collection: Option<String>,
    pub record_id: Option<String>,
    pub record_index: usize,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Quarantine rows (status `held`).
pub fn quarantine_rows(rows: &[QuarantineWrite]) -> Stmt {
    let created = now();
    Stmt::Insert {
        table: "quarantine",
        columns: &[
            "id",
            "tenant_id",
            "status",
            "decision",
            "reason_codes",
            "receipt_id",
            "signal_id",
            "trace_id",
            "obstruction_id",
            "source_id",
            "pack",
            "route",
            "params",
            "collection",
            "record_id",
            "record_index",
            "method",
            "path",
            "headers",
            "body",
            "created_at",
            "updated_at",
        ],
        rows: rows
            .iter()
            .map(|q| {
                vec![
                    Bind::text(q.id.to_string()),
                    Bind::text(q.tenant.to_string()),
                    Bind::text("held"),
                    Bind::text(&q.decision),
                    Bind::text(serde_json::to_string(&q.reason_codes).unwrap_or_default()),
                    Bind::text(q.receipt_id.to_string()),
                    Bind::text(q.signal_id.to_string()),
                    Bind::text(q.trace_id.to_string()),
                    Bind::opt(q.obstruction_id.map(|o| o.to_string())),
                    Bind::text(&q.source_id),
                    Bind::text(&q.pack),
                    Bind::text(&q.route),
                    Bind::text(serde_json::to_string(&q.params).unwrap_or_else(|_| "[]".into())),
                    Bind::opt(q.collection.clone()),
                    Bind::opt(q.record_id.clone()),
                    Bind::int(q.record_index as i64),
                    Bind::text(&q.method),
                    Bind::text(&q.path),
                    Bind::text(serde_json::to_string(&q.headers).unwrap_or_else(|_| "[]".into())),
                    Bind::text(&q.body),
                    Bind::text(&created),
                    Bind::text(&created),
                ]
            })
            .collect(),
        suffix: "",
    }
}

/// Moves a quarantine entry from `from` to `to` inside a receipt's transaction; the batch
/// fails with a conflict (and commits nothing) when the entry is not in `from` any more.
pub fn quarantine_transition(
    tenant: Uuid,
    id: Uuid,
    from: &str,
    to: &str,
    reviewer: &str,
    review_receipt: Uuid,
) -> Stmt {
    let at = now();
    Stmt::Exec {
        sql: format!("UPDATE quarantine SET status = $1, reviewed_at = $2, reviewed_by = $3, review_receipt_id = $4, updated_at = $2, headers = {HELD_HEADERS_WHILE_UNSETTLED} WHERE tenant_id = $5 AND id = $6 AND status = $7"),
        binds: vec![
            Bind::text(to),
            Bind::text(at),
            Bind::text(reviewer),
            Bind::text(review_receipt.to_string()),
            Bind::text(tenant.to_string()),
            Bind::text(id.to_string()),
            Bind::text(from),
        ],
        expect_rows: Some(1),
    }
}

impl Store {
    /// Phase and influence of many traces at once (the basis of a batch); unknown ids are absent.
    pub async fn traces_of(
        &self,
        tenant: Uuid,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, (TracePhase, AllowedInfluence)>> {
        if let Some(t) = self.traces_in_memory(tenant, ids) {
            return Ok(t);
        }
        let mut out = HashMap::with_capacity(ids.len());
        let tenant_s = tenant.to_string();
        for chunk in ids.chunks(IN_CHUNK) {
            let sql = format!(
                "SELECT id, phase, influence FROM traces WHERE tenant_id = $1 AND id IN ({})",
                placeholders(2, chunk.len())
            );
            let rows: Vec<(String, String, String)> = with_pool!(self, read, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(&tenant_s);
                for id in chunk {
                    q = q.bind(id.to_string());
                }
                q.fetch_all(p).await?
            });
            for (id, ph, inf) in rows {
                let (id, state) = trace_state(&id, &ph, &inf)?;
                out.insert(id, state);
            }
        }
        Ok(out)
    }

    /// The state basis of a proxied batch: the phase and influence of the traces (as
    /// [`Store::traces_of`]) and the source's record over its last `window` receipts (as
    /// [`Store::source_history`]). Reads of concurrent writes are batched into one query (see
    /// `store::basis`); a batch with more traces than one `IN` list reads them apart.
    pub async fn basis_of(
        &self,
        tenant: Uuid,
        ids: &[Uuid],
        source_id: &str,
        window: i64,
    ) -> Result<super::basis::Basis> {
        if let Some(traces) = self.traces_in_memory(tenant, ids) {
            if let Some(history) = self.source_in_memory(tenant, source_id, window).await? {
                return Ok((traces, history));
            }
        }
        if ids.len() > super::basis::MAX_BATCH_IDS {
            let traces = self.traces_of(tenant, ids).await?;
            let history = self.source_history(tenant, source_id, window).await?;
            return Ok((traces, history));
        }
        match self.batchers().map(|b| &b.basis) {
            Some(q) => super::basis::read(self, q, tenant, ids, source_id, window).await,
            None => {
                let (traces, mut h) = self
                    .bases_of(tenant, ids, &[(source_id.to_string(), window)])
                    .await?;
                Ok((traces, h.pop().unwrap_or((0, 0))))
            }
        }
    }

    /// ONE query (one hand-off to the database) for the phase and influence of the traces `ids`
    /// (at most one `IN` list) and the record of each `(source, window)`, in that order.
    pub(super) async fn bases_of(
        &self,
        tenant: Uuid,
        ids: &[Uuid],
        sources: &[(String, i64)],
    ) -> Result<(
        HashMap<Uuid, (TracePhase, AllowedInfluence)>,
        Vec<(u32, u32)>,
    )> {
        use std::fmt::Write;
        // Binds: $1 the tenant, then the sources, then the ids.
        let mut parts: Vec<String> = Vec::new();
        for (i, (_, window)) in sources.iter().enumerate() {
            // One row per source (receipts, refused), counted by the database: rows decoded
            // on the proxy's thread were a tenth of its work on a write.
            parts.push(format!(
                "SELECT CAST({k} AS BIGINT), NULL, CAST(COUNT(*) AS TEXT), \
                 CAST(COALESCE(SUM(CASE WHEN refused <> 0 THEN 1 ELSE 0 END), 0) AS TEXT) FROM \
                 (SELECT refused FROM receipts WHERE tenant_id = $1 AND source_id = ${b} ORDER BY seq DESC LIMIT {window}) AS h{k}",
                k = i + 1,
                b = i + 2,
            ));
        }
        if !ids.is_empty() {
            let mut list = String::new();
            for i in 0..ids.len() {
                let _ = write!(
                    list,
                    "{}${}",
                    if i > 0 { ", " } else { "" },
                    sources.len() + 2 + i
                );
            }
            parts.push(format!(
                "SELECT CAST(0 AS BIGINT), id, phase, influence FROM traces WHERE tenant_id = $1 AND id IN ({list})"
            ));
        }
        let mut histories = vec![(0u32, 0u32); sources.len()];
        let mut traces = HashMap::with_capacity(ids.len());
        if parts.is_empty() {
            return Ok((traces, histories));
        }
        let sql = parts.join(" UNION ALL ");
        let tenant_s = tenant.to_string();
        type Row = (i64, Option<String>, Option<String>, Option<String>);
        let rows: Vec<Row> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql).bind(&tenant_s);
            for (source, _) in sources {
                q = q.bind(source);
            }
            for id in ids {
                q = q.bind(id.to_string());
            }
            q.fetch_all(p).await?
        });
        for (kind, id, a, b) in rows {
            if kind > 0 {
                let count = |v: Option<String>| -> Result<u32> {
                    v.as_deref()
                        .unwrap_or("0")
                        .parse()
                        .map_err(|_| StoreError::Corrupt(format!("source record count {v:?}")))
                };
                if let Some(h) = histories.get_mut(kind as usize - 1) {
                    *h = (count(a)?, count(b)?);
                }
                continue;
            }
            let (id, state) = trace_state(
                &id.unwrap_or_default(),
                &a.unwrap_or_default(),
                &b.unwrap_or_default(),
            )?;
            traces.insert(id, state);
        }
        Ok((traces, histories))
    }

    /// Marks the traces of deleted records `tombstoned` (the upstream confirmed the delete),
    /// except those a later write has moved since (see [`Tombstone::receipt`]).
    pub async fn tombstone_traces(&self, tenant: Uuid, tombstones: &[Tombstone]) -> Result<()> {
        let tombstones = tombstones.to_vec();
        self.to_completion(
            |store| async move { store.tombstone_traces_now(tenant, &tombstones).await },
        )
        .await
    }

    /// Puts back the traces a refused write moved: the store did not take the write (it
    /// answered an error, or was never reached), so each record's trace goes back to what it
    /// was before (`None`: there was none, and it is removed). A trace a later write has moved
    /// since (its last receipt is no longer `receipt`) is left as that write left it.
    pub async fn restore_traces(&self, tenant: Uuid, restores: Vec<TraceRestore>) -> Result<()> {
        self.to_completion(|store| async move { store.restore_traces_now(tenant, &restores).await })
            .await
    }

    async fn restore_traces_now(&self, tenant: Uuid, restores: &[TraceRestore]) -> Result<()> {
        let tenant_s = tenant.to_string();
        let at = now();
        let _order = self.basis_order().await;
        let mut changes = super::memory::Changes::default();
        for r in restores {
            let done = with_pool!(self, write, |p, _d| {
                match r.prior {
                    Some((phase, influence)) => sqlx::query(
                        "UPDATE traces SET phase = $1, influence = $2, updated_at = $3 \
                         WHERE tenant_id = $4 AND id = $5 AND last_receipt_id = $6",
                    )
                    .bind(phase.as_str())
                    .bind(influence.as_str())
                    .bind(&at)
                    .bind(&tenant_s)
                    .bind(r.trace.to_string())
                    .bind(r.receipt.to_string())
                    .execute(p)
                    .await?
                    .rows_affected(),
                    None => sqlx::query(
                        "DELETE FROM traces WHERE tenant_id = $1 AND id = $2 AND last_receipt_id = $3",
                    )
                    .bind(&tenant_s)
                    .bind(r.trace.to_string())
                    .bind(r.receipt.to_string())
                    .execute(p)
                    .await?
                    .rows_affected(),
                }
            });
            if done > 0 {
                match r.prior {
                    Some((phase, influence)) => {
                        changes.traces.push((tenant, r.trace, phase, influence))
                    }
                    None => changes.removed.push((tenant, r.trace)),
                }
            }
        }
        self.applied(&changes);
        Ok(())
    }

    async fn tombstone_traces_now(&self, tenant: Uuid, tombstones: &[Tombstone]) -> Result<()> {
        let tenant_s = tenant.to_string();
        let at = now();
        let (guarded, unguarded): (Vec<&Tombstone>, Vec<&Tombstone>) =
            tombstones.iter().partition(|t| t.receipt.is_some());
        for (chunk, guard) in guarded
            .chunks(IN_CHUNK / 2)
            .map(|c| (c, true))
            .chain(unguarded.chunks(IN_CHUNK).map(|c| (c, false)))
        {
            // A guarded trace is tombstoned only while its last receipt is one of the deletes'
            // (each delete receipt moved only its own record's trace).
            let receipts = if guard {
                format!(
                    " AND last_receipt_id IN ({})",
                    placeholders(3 + chunk.len(), chunk.len())
                )
            } else {
                String::new()
            };
            let sql = format!(
                "UPDATE traces SET phase = 'tombstoned', influence = 'none', updated_at = $2 \
                 WHERE tenant_id = $1 AND id IN ({}){receipts} RETURNING id",
                placeholders(3, chunk.len())
            );
            let _order = self.basis_order().await;
            let done: Vec<(String,)> = with_pool!(self, write, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(&tenant_s).bind(&at);
                for t in chunk {
                    q = q.bind(t.trace.to_string());
                }
                for r in chunk.iter().filter_map(|t| t.receipt) {
                    q = q.bind(r.to_string());
                }
                q.fetch_all(p).await?
            });
            let tombstoned = done
                .iter()
                .filter_map(|(id,)| Uuid::parse_str(id).ok())
                .map(|id| (tenant, id))
                .collect();
            self.applied(&super::memory::Changes {
                tombstoned,
                ..Default::default()
            });
        }
        Ok(())
    }

    /// Records the upstream's answer for every still-pending row of a dispatched request:
    /// [`Store::settle_dispatch`] through the group committer, without waiting (the journal
    /// row is updated with the next group). The settle is in the committer's queue (or on its
    /// way to storage) when this returns, so a drain that flushes the queue after the last
    /// request has returned finds it there. A settle lost to a crash leaves the row `pending`,
    /// which start-up reconciliation resolves by reading the record back.
    pub fn settle_dispatch_soon(
        self: &Arc<Self>,
        request_id: Uuid,
        status: &'static str,
        upstream_status: Option<u16>,
        detail: Option<String>,
    ) {
        let s = super::group::Settle {
            request_id,
            status,
            upstream_status,
            detail,
        };
        super::group::settle(self, self.batchers().map(|b| &b.group), s);
    }

    /// Settles many dispatches in one transaction: one UPDATE per distinct outcome.
    pub(super) async fn settle_all(&self, settles: Vec<super::group::Settle>) -> Result<()> {
        self.run_statements(settle_statements(settles)).await
    }
}

/// The UPDATEs that settle dispatches: one per distinct outcome (and `IN` list).
pub(super) fn settle_statements(settles: Vec<super::group::Settle>) -> Vec<Stmt> {
    // (status, upstream status, detail) → the request ids that ended so.
    type Outcome = (&'static str, Option<u16>, Option<String>);
    let mut outcomes: Vec<(Outcome, Vec<String>)> = Vec::new();
    for s in settles {
        let key = (s.status, s.upstream_status, s.detail);
        let id = s.request_id.to_string();
        match outcomes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(id),
            None => outcomes.push((key, vec![id])),
        }
    }
    let updated = now();
    let mut stmts = Vec::new();
    for ((status, upstream_status, detail), ids) in outcomes {
        for chunk in ids.chunks(IN_CHUNK) {
            let sql = format!("UPDATE proxy_dispatches SET status = $1, upstream_status = $2, detail = $3, updated_at = $4, upstream_headers = {KEEP_CREDENTIALS_WHILE_UNSETTLED} WHERE status = 'pending' AND request_id IN ({})", placeholders(5, chunk.len()));
            let mut binds = vec![
                Bind::text(status),
                Bind::Int(upstream_status.map(i64::from)),
                Bind::opt(detail.clone()),
                Bind::text(&updated),
            ];
            binds.extend(chunk.iter().map(Bind::text));
            stmts.push(Stmt::Exec {
                sql,
                binds,
                expect_rows: None,
            });
        }
    }
    stmts
}

impl Store {
    pub async fn settle_dispatch(
        &self,
        request_id: Uuid,
        status: &str,
        upstream_status: Option<u16>,
        detail: Option<&str>,
    ) -> Result<u64> {
        Ok(with_pool!(self, write, |p, _d| {
            sqlx::query(&format!("UPDATE proxy_dispatches SET status = $1, upstream_status = $2, detail = $3, updated_at = $4, upstream_headers = {KEEP_CREDENTIALS_WHILE_UNSETTLED} WHERE request_id = $5 AND status = 'pending'"))
                .bind(status)
                .bind(upstream_status.map(i64::from))
                .bind(detail)
                .bind(now())
                .bind(request_id.to_string())
                .execute(p)
                .await?
                .rows_affected()
        }))
    }

    /// Journal rows of other gate processes (or of this one's predecessors) whose outcome is
    /// unknown: still `pending`, or already marked `dispatch_unknown`. In (created_at, id)
    /// order, after the cursor `after` (empty strings for the start).
    /// Unsettled journal rows of other gates created before `created_before`, in pages; with
    /// `alive_since`, only rows of gates whose heartbeat is older than that (or that never
    /// wrote one): a live gate's write in flight is never judged by another.
    pub async fn unsettled_dispatches(
        &self,
        not_instance: Uuid,
        created_before: &str,
        alive_since: Option<&str>,
        after: (&str, &str),
        limit: i64,
    ) -> Result<Vec<DispatchRow>> {
        let live = if alive_since.is_some() {
            " AND instance_id NOT IN (SELECT instance_id FROM gate_instances WHERE heartbeat_at > $6)"
        } else {
            ""
        };
        let sql = format!("SELECT id, tenant_id, request_id, instance_id, receipt_id, trace_id, pack, route, kind, params, collection, record_id, upstream_headers, status, upstream_status, created_at FROM proxy_dispatches WHERE status IN ('pending', 'dispatch_unknown') AND instance_id <> $1 AND created_at < $2 AND (created_at > $3 OR (created_at = $3 AND id > $4)){live} ORDER BY created_at, id LIMIT $5");
        Ok(with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql)
                .bind(not_instance.to_string())
                .bind(created_before)
                .bind(after.0)
                .bind(after.1)
                .bind(limit);
            if let Some(t) = alive_since {
                q = q.bind(t);
            }
            q.fetch_all(p).await?
        }))
    }

    /// Records that this gate is alive (see `gate_instances`); rows of gates gone for a day
    /// are dropped.
    pub async fn heartbeat(&self, instance: Uuid, started_at: &str) -> Result<()> {
        let at = now();
        let day_ago = super::ts(chrono::Utc::now() - chrono::Duration::days(1));
        with_pool!(self, write, |p, _d| {
            sqlx::query(
                "INSERT INTO gate_instances (instance_id, started_at, heartbeat_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            )
            .bind(instance.to_string())
            .bind(started_at)
            .bind(&at)
            .execute(p)
            .await?;
            sqlx::query("DELETE FROM gate_instances WHERE heartbeat_at < $1")
                .bind(&day_ago)
                .execute(p)
                .await?;
        });
        Ok(())
    }

    /// Sets the status of journal rows by id (reconciliation verdicts).
    pub async fn set_dispatch_status(
        &self,
        ids: &[String],
        status: &str,
        detail: Option<&str>,
    ) -> Result<()> {
        let at = now();
        for chunk in ids.chunks(IN_CHUNK) {
            let sql = format!(
                "UPDATE proxy_dispatches SET status = $1, detail = $2, updated_at = $3, upstream_headers = {KEEP_CREDENTIALS_WHILE_UNSETTLED} WHERE id IN ({})",
                placeholders(4, chunk.len())
            );
            with_pool!(self, write, |p, _d| {
                let mut q = sqlx::query(&sql).bind(status).bind(detail).bind(&at);
                for id in chunk {
                    q = q.bind(id);
                }
                q.execute(p).await?;
            });
        }
        Ok(())
    }

    /// Journal rows by request (tests and the quarantine release).
    pub async fn dispatches_of_request(&self, request_id: Uuid) -> Result<Vec<DispatchRow>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT id, tenant_id, request_id, instance_id, receipt_id, trace_id, pack, route, kind, params, collection, record_id, upstream_headers, status, upstream_status, created_at FROM proxy_dispatches WHERE request_id = $1 ORDER BY id")
                .bind(request_id.to_string())
                .fetch_all(p)
                .await?
        }))
    }

    pub async fn list_quarantine(
        &self,
        tenant: Uuid,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<QuarantineRow>> {
        let sql = format!(
            "SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 AND ($2 = '' OR status = $2) ORDER BY created_at DESC, id LIMIT $3"
        );
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(status.unwrap_or(""))
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    /// The held quarantine entry of a proxied record's signal, if there is one.
    pub async fn held_quarantine_of_signal(
        &self,
        tenant: Uuid,
        signal_id: Uuid,
    ) -> Result<Option<Uuid>> {
        let row: Option<(String,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT id FROM quarantine WHERE tenant_id = $1 AND signal_id = $2 AND status = 'held'")
                .bind(tenant.to_string())
                .bind(signal_id.to_string())
                .fetch_optional(p)
                .await?
        });
        Ok(row.and_then(|(id,)| Uuid::parse_str(&id).ok()))
    }

    pub async fn get_quarantine(&self, tenant: Uuid, id: Uuid) -> Result<Option<QuarantineRow>> {
        let sql =
            format!("SELECT {QUARANTINE_COLUMNS} FROM quarantine WHERE tenant_id = $1 AND id = $2");
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        }))
    }

    /// Moves a quarantine entry on after a release was attempted: `released` when the upstream
    /// took it, back to `held` (so it can be released again) when it did not.
    pub async fn settle_release(
        &self,
        tenant: Uuid,
        id: Uuid,
        status: &str,
        upstream_status: Option<u16>,
    ) -> Result<()> {
        with_pool!(self, write, |p, _d| {
            sqlx::query(&format!("UPDATE quarantine SET status = $1, upstream_status = $2, updated_at = $3, headers = {HELD_HEADERS_WHILE_UNSETTLED} WHERE tenant_id = $4 AND id = $5 AND status = 'releasing'"))
                .bind(status)
                .bind(upstream_status.map(i64::from))
                .bind(now())
                .bind(tenant.to_string())
                .bind(id.to_string())
                .execute(p)
                .await?;
            Ok(())
        })
    }
}
