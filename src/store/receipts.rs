//! Signals, traces, coefficient versions, the receipt chain, obstructions and
//! repair plans, and the event outbox. A receipt and everything it proves
//! (trace move, obstruction, plan, events) commit in one transaction.

use super::{now, Result, Store, StoreError};
use crate::kernel::types::{AllowedInfluence, TracePhase};
use crate::kernel::NormalizedSignal;
use crate::receipts::{CanonicalContent, ChainLink, GENESIS_HASH};
use crate::with_pool;
use serde_json::Value;
use uuid::Uuid;

/// Inserts one pending delivery per active subscription of the tenant to the
/// event, inside the caller's transaction (the outbox). Exported so the
/// webhook worker can put `delivery.dead_lettered` in the same transaction
/// that dead-letters a delivery.
#[macro_export]
macro_rules! enqueue_event {
    ($tx:ident, $tenant:expr, $event:expr, $created:expr) => {{
        let tenant_s = $tenant.to_string();
        let subs: Vec<(String,)> = sqlx::query_as("SELECT id FROM webhook_subscriptions WHERE tenant_id = $1 AND event_name = $2 AND status = 'active'")
            .bind(&tenant_s)
            .bind(&$event.name)
            .fetch_all(&mut *$tx)
            .await?;
        if !subs.is_empty() {
            let event_id = uuid::Uuid::new_v4();
            let body = $crate::store::event_body(event_id, $tenant, &$event.name, &$event.data, $created);
            for (sub,) in subs {
                sqlx::query(
                    "INSERT INTO webhook_deliveries (id, tenant_id, subscription_id, event_id, event_name, payload, delivery_status, attempt_count, redrive_count, next_retry_at, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, 0, $7, $7, $7)",
                )
                .bind(uuid::Uuid::new_v4().to_string())
                .bind(&tenant_s)
                .bind(&sub)
                .bind(event_id.to_string())
                .bind(&$event.name)
                .bind(&body)
                .bind($created)
                .execute(&mut *$tx)
                .await?;
            }
        }
    }};
}

/// A state change to commit with a receipt.
pub struct TraceWrite {
    pub id: Uuid,
    pub phase: TracePhase,
    pub influence: AllowedInfluence,
    pub trace_type: Option<String>,
}

/// An event to put in the outbox; one delivery per matching active subscription.
#[derive(Debug, Clone)]
pub struct EventWrite {
    pub name: String,
    pub data: Value,
}

/// Rows stored beside a receipt: obstruction / repair plan (id, status, JSON body).
pub struct LifecycleWrite {
    pub id: Uuid,
    pub status: String,
    pub body: Value,
    /// For a repair plan: its obstruction.
    pub parent: Option<Uuid>,
}

/// What is known once the chain position is fixed, inside the transaction.
pub struct Sealed<'a> {
    pub receipt_id: Uuid,
    pub replay_hash: &'a str,
    pub seq: i64,
    /// Whether the tenant has any active subscription: without one, events would be dropped
    /// unread, and need not be built.
    pub events_wanted: bool,
}

/// Built by the caller once the hash is known: the stored answer (for
/// idempotent repeats) and the events the receipt causes.
pub struct Finish {
    pub result: Option<String>,
    pub events: Vec<EventWrite>,
}

pub struct ReceiptWrite {
    pub tenant: Uuid,
    pub id: Uuid,
    pub kind: String,
    pub signal_id: Option<Uuid>,
    pub source_id: Option<String>,
    /// The decision refused the write (counts against the source's record).
    pub refused: bool,
    pub decision: String,
    pub outcome: String,
    /// Same key, same receipt: a repeated evaluation answers from the store.
    pub idem_key: Option<String>,
    /// The bound content without `sequence` / `previousHash` (added when sealed), already
    /// canonicalized by the caller: the chain's serial step only splices and hashes.
    pub content: CanonicalContent,
    pub trace: Option<TraceWrite>,
    pub obstruction: Option<LifecycleWrite>,
    pub repair_plan: Option<LifecycleWrite>,
    /// May be called more than once (a group commit that finds the chain moved seals again).
    pub finish: Box<dyn Fn(Sealed<'_>) -> Finish + Send>,
}

#[derive(Debug, Clone)]
pub struct CommittedReceipt {
    pub id: Uuid,
    pub seq: i64,
    pub replay_hash: String,
    pub result: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReceiptRow {
    pub id: String,
    pub tenant_id: String,
    pub seq: i64,
    pub kind: String,
    pub signal_id: Option<String>,
    pub decision: String,
    pub outcome: String,
    pub replay_hash: String,
    pub prev_hash: String,
    pub payload: String,
    pub field_digests: String,
    pub result: Option<String>,
    pub created_at: String,
}

const RECEIPT_COLUMNS: &str = "id, tenant_id, seq, kind, signal_id, decision, outcome, replay_hash, prev_hash, payload, field_digests, result, created_at";

impl ReceiptRow {
    pub fn link(&self) -> ChainLink {
        ChainLink {
            id: self.id.clone(),
            seq: self.seq,
            replay_hash: self.replay_hash.clone(),
            prev_hash: self.prev_hash.clone(),
            payload: self.payload.clone(),
        }
    }
}

fn corrupt(what: &str) -> impl Fn(serde_json::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("{what}: {e}"))
}

impl Store {
    /// Stores a normalized signal (immutable from then on), with its events.
    pub async fn insert_signal(&self, s: &NormalizedSignal, events: &[EventWrite]) -> Result<()> {
        let body = serde_json::to_string(s).map_err(corrupt("signal"))?;
        // Evidence naming stored receipts/signals/traces: edges of the dependency graph.
        let edges = self.evidence_edges(s).await?;
        let created = now();
        with_pool!(self, write, |p, _d| {
            let mut tx = p.begin().await?;
            sqlx::query("INSERT INTO signals (id, tenant_id, trace_id, source_id, payload_digest, body, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                .bind(s.id.to_string())
                .bind(s.tenant_id.to_string())
                .bind(s.trace_id.to_string())
                .bind(&s.source_id)
                .bind(&s.payload_digest)
                .bind(&body)
                .bind(&created)
                .execute(&mut *tx)
                .await?;
            for e in &edges {
                sqlx::query("INSERT INTO dependency_edges (tenant_id, child_kind, child_id, parent_kind, parent_id, relation, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING")
                    .bind(s.tenant_id.to_string())
                    .bind(e.child_kind.as_str())
                    .bind(e.child_id.to_string())
                    .bind(e.parent_kind.as_str())
                    .bind(e.parent_id.to_string())
                    .bind(e.relation)
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
            }
            for e in events {
                enqueue_event!(tx, s.tenant_id, e, &created);
            }
            tx.commit().await?;
            Ok(())
        })
    }

    pub async fn get_signal(&self, tenant: Uuid, id: Uuid) -> Result<Option<NormalizedSignal>> {
        let row: Option<(String,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT body FROM signals WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        row.map(|(b,)| serde_json::from_str(&b).map_err(corrupt("signal")))
            .transpose()
    }

    /// The stored signal text exactly as kept (replay checks it byte for byte).
    pub async fn get_signal_body(
        &self,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<(String, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(
                "SELECT payload_digest, body FROM signals WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.to_string())
            .bind(id.to_string())
            .fetch_optional(p)
            .await?
        }))
    }

    pub async fn get_trace(
        &self,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<(TracePhase, AllowedInfluence)>> {
        if let Some(t) = self.traces_in_memory(tenant, &[id]) {
            return Ok(t.get(&id).copied());
        }
        let row: Option<(String, String)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT phase, influence FROM traces WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        Ok(match row {
            None => None,
            Some((ph, inf)) => Some((
                TracePhase::parse(&ph)
                    .ok_or_else(|| StoreError::Corrupt(format!("trace phase {ph:?}")))?,
                AllowedInfluence::parse(&inf)
                    .ok_or_else(|| StoreError::Corrupt(format!("trace influence {inf:?}")))?,
            )),
        })
    }

    /// When a trace last moved (RFC 3339, as stored) and by which receipt; `None` for a trace
    /// never written.
    pub async fn trace_last_move(
        &self,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<(String, Option<String>)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as::<_, (String, Option<String>)>(
                "SELECT updated_at, last_receipt_id FROM traces WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant.to_string())
            .bind(id.to_string())
            .fetch_optional(p)
            .await?
        }))
    }

    /// Phases of many traces at once (retrieval treatment); unknown ids are absent.
    pub async fn trace_phases(
        &self,
        tenant: Uuid,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, TracePhase)>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let placeholders: Vec<String> =
                (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!(
                "SELECT id, phase FROM traces WHERE tenant_id = $1 AND id IN ({})",
                placeholders.join(", ")
            );
            let rows: Vec<(String, String)> = with_pool!(self, read, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(tenant.to_string());
                for id in chunk {
                    q = q.bind(id.to_string());
                }
                q.fetch_all(p).await?
            });
            for (id, ph) in rows {
                if let (Ok(id), Some(ph)) = (Uuid::parse_str(&id), TracePhase::parse(&ph)) {
                    out.push((id, ph));
                }
            }
        }
        Ok(out)
    }

    /// How many of the source's last `window` receipts there are, and how many refused a write.
    pub async fn source_history(
        &self,
        tenant: Uuid,
        source_id: &str,
        window: i64,
    ) -> Result<(u32, u32)> {
        if let Some(h) = self.source_in_memory(tenant, source_id, window).await? {
            return Ok(h);
        }
        Ok(source_record(
            &self.source_flags(tenant, source_id, window).await?,
        ))
    }

    /// Whether each of the source's last `window` receipts refused a write, newest first.
    pub(super) async fn source_flags(
        &self,
        tenant: Uuid,
        source_id: &str,
        window: i64,
    ) -> Result<Vec<bool>> {
        let rows: Vec<(i64,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT refused FROM receipts WHERE tenant_id = $1 AND source_id = $2 ORDER BY seq DESC LIMIT $3")
                .bind(tenant.to_string())
                .bind(source_id)
                .bind(window)
                .fetch_all(p)
                .await?
        });
        Ok(rows.iter().map(|(r,)| *r != 0).collect())
    }

    /// Records a coefficient version (idempotent: same content, same id).
    pub async fn ensure_coefficient_version(
        &self,
        tenant: Uuid,
        id: Uuid,
        content_hash: &str,
        content: &str,
    ) -> Result<()> {
        with_pool!(self, write, |p, _d| {
            sqlx::query("INSERT INTO coefficient_versions (tenant_id, id, content_hash, content, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, id) DO NOTHING")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .bind(content_hash)
                .bind(content)
                .bind(now())
                .execute(p)
                .await?;
            Ok(())
        })
    }

    /// (content_hash, content) of a tenant's coefficient version.
    pub async fn get_coefficient_version(
        &self,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<(String, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT content_hash, content FROM coefficient_versions WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        }))
    }

    pub async fn find_receipt_by_idem(
        &self,
        tenant: Uuid,
        key: &str,
    ) -> Result<Option<ReceiptRow>> {
        let sql = format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE tenant_id = $1 AND idem_key = $2"
        );
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(key)
                .fetch_optional(p)
                .await?
        }))
    }

    pub async fn get_receipt(&self, tenant: Uuid, id: Uuid) -> Result<Option<ReceiptRow>> {
        let sql =
            format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE tenant_id = $1 AND id = $2");
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        }))
    }

    pub async fn get_receipt_by_seq(&self, tenant: Uuid, seq: i64) -> Result<Option<ReceiptRow>> {
        let sql =
            format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE tenant_id = $1 AND seq = $2");
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(seq)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Receipts of a tenant after `after_seq`, in chain order.
    pub async fn receipt_page(
        &self,
        tenant: Uuid,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<ReceiptRow>> {
        let sql = format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE tenant_id = $1 AND seq > $2 ORDER BY seq LIMIT $3");
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(after_seq)
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    /// The recorded head of a tenant's chain: the sequence and hash of its newest receipt
    /// (`None`: the tenant never had a receipt).
    pub async fn receipt_head(&self, tenant: Uuid) -> Result<Option<(i64, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT seq, hash FROM receipt_heads WHERE tenant_id = $1")
                .bind(tenant.to_string())
                .fetch_optional(p)
                .await?
        }))
    }

    /// First sequence number of a tenant's receipts created at or after `since`.
    pub async fn first_seq_since(&self, tenant: Uuid, since: &str) -> Result<Option<i64>> {
        let row: Option<(Option<i64>,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as(
                "SELECT MIN(seq) FROM receipts WHERE tenant_id = $1 AND created_at >= $2",
            )
            .bind(tenant.to_string())
            .bind(since)
            .fetch_optional(p)
            .await?
        });
        Ok(row.and_then(|(s,)| s))
    }

    /// Keeps a signed checkpoint of a tenant's chain at `seq` (one per sequence).
    pub async fn insert_checkpoint(&self, tenant: Uuid, seq: i64, note: &str) -> Result<()> {
        let at = now();
        with_pool!(self, write, |p, _d| {
            sqlx::query(
                "INSERT INTO receipt_checkpoints (tenant_id, seq, note, created_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, seq) DO NOTHING",
            )
            .bind(tenant.to_string())
            .bind(seq)
            .bind(note)
            .bind(&at)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// The latest signed checkpoint of a tenant's chain: its sequence and note.
    pub async fn latest_checkpoint(&self, tenant: Uuid) -> Result<Option<(i64, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(
                "SELECT seq, note FROM receipt_checkpoints WHERE tenant_id = $1 \
                 ORDER BY seq DESC LIMIT 1",
            )
            .bind(tenant.to_string())
            .fetch_optional(p)
            .await?
        }))
    }

    /// The hash of a tenant's receipt at `seq`, if there is one.
    pub async fn receipt_hash_at(&self, tenant: Uuid, seq: i64) -> Result<Option<String>> {
        let row: Option<(String,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT replay_hash FROM receipts WHERE tenant_id = $1 AND seq = $2")
                .bind(tenant.to_string())
                .bind(seq)
                .fetch_optional(p)
                .await?
        });
        Ok(row.map(|(h,)| h))
    }

    pub async fn receipt_tenants(&self) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT tenant_id FROM receipt_heads ORDER BY tenant_id")
                .fetch_all(p)
                .await?
        });
        Ok(rows.into_iter().map(|(t,)| t).collect())
    }

    /// Appends a receipt to its tenant's chain and commits everything it proves
    /// in the same transaction. On PostgreSQL the chain head row is locked, so
    /// concurrent gates append one after another: no fork, no duplicate sequence.
    pub async fn commit_receipt(&self, w: ReceiptWrite) -> Result<CommittedReceipt> {
        self.to_completion(|store| async move { store.commit_receipt_now(w).await })
            .await
    }

    async fn commit_receipt_now(&self, w: ReceiptWrite) -> Result<CommittedReceipt> {
        let tenant = w.tenant.to_string();
        let created = now();
        let timer = std::time::Instant::now();
        let changes = changes_of(std::slice::from_ref(&w));
        let _order = self.basis_order().await;
        let out = with_pool!(self, write, |p, d| {
            let mut tx = p.begin().await?;
            sqlx::query("INSERT INTO receipt_heads (tenant_id, seq, hash) VALUES ($1, 0, $2) ON CONFLICT (tenant_id) DO NOTHING")
                .bind(&tenant)
                .bind(GENESIS_HASH)
                .execute(&mut *tx)
                .await?;
            let (head_seq, head_hash): (i64, String) = sqlx::query_as(&format!(
                "SELECT seq, hash FROM receipt_heads WHERE tenant_id = $1{}",
                d.for_update
            ))
            .bind(&tenant)
            .fetch_one(&mut *tx)
            .await?;
            let seq = head_seq + 1;
            let sealed = w.content.seal(seq, &head_hash);
            let replay_hash = sealed.replay_hash;
            let finish = (w.finish)(Sealed {
                receipt_id: w.id,
                replay_hash: &replay_hash,
                seq,
                events_wanted: true,
            });
            sqlx::query(
                "INSERT INTO receipts (id, tenant_id, seq, kind, signal_id, source_id, refused, decision, outcome, replay_hash, prev_hash, payload, field_digests, idem_key, result, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            )
            .bind(w.id.to_string())
            .bind(&tenant)
            .bind(seq)
            .bind(&w.kind)
            .bind(w.signal_id.map(|s| s.to_string()))
            .bind(&w.source_id)
            .bind(w.refused as i64)
            .bind(&w.decision)
            .bind(&w.outcome)
            .bind(&replay_hash)
            .bind(&head_hash)
            .bind(&sealed.payload)
            .bind(&sealed.field_digests)
            .bind(&w.idem_key)
            .bind(&finish.result)
            .bind(&created)
            .execute(&mut *tx)
            .await?;
            sqlx::query("UPDATE receipt_heads SET seq = $1, hash = $2 WHERE tenant_id = $3")
                .bind(seq)
                .bind(&replay_hash)
                .bind(&tenant)
                .execute(&mut *tx)
                .await?;
            if let Some(t) = &w.trace {
                sqlx::query(
                    "INSERT INTO traces (tenant_id, id, phase, influence, trace_type, last_receipt_id, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (tenant_id, id) DO UPDATE SET phase = excluded.phase, influence = excluded.influence, last_receipt_id = excluded.last_receipt_id, updated_at = excluded.updated_at",
                )
                .bind(&tenant)
                .bind(t.id.to_string())
                .bind(t.phase.as_str())
                .bind(t.influence.as_str())
                .bind(&t.trace_type)
                .bind(w.id.to_string())
                .bind(&created)
                .execute(&mut *tx)
                .await?;
            }
            if let Some(o) = &w.obstruction {
                sqlx::query("INSERT INTO obstructions (id, tenant_id, signal_id, receipt_id, status, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (id) DO NOTHING")
                    .bind(o.id.to_string())
                    .bind(&tenant)
                    .bind(w.signal_id.map(|s| s.to_string()))
                    .bind(w.id.to_string())
                    .bind(&o.status)
                    .bind(o.body.to_string())
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(r) = &w.repair_plan {
                sqlx::query("INSERT INTO repair_plans (id, tenant_id, obstruction_id, status, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING")
                    .bind(r.id.to_string())
                    .bind(&tenant)
                    .bind(r.parent.map(|x| x.to_string()))
                    .bind(&r.status)
                    .bind(r.body.to_string())
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
            }
            for e in &finish.events {
                enqueue_event!(tx, w.tenant, e, &created);
            }
            tx.commit().await?;
            Ok::<_, StoreError>(CommittedReceipt {
                id: w.id,
                seq,
                replay_hash,
                result: finish.result,
            })
        })?;
        self.applied(&changes);
        crate::metrics::JOURNAL_COMMIT.observe(timer.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Puts events in the outbox on their own (events not tied to a receipt,
    /// e.g. `config.reloaded`), for every tenant named.
    pub async fn enqueue_events(&self, tenant: Uuid, events: &[EventWrite]) -> Result<()> {
        let created = now();
        with_pool!(self, write, |p, _d| {
            let mut tx = p.begin().await?;
            for e in events {
                enqueue_event!(tx, tenant, e, &created);
            }
            tx.commit().await?;
            Ok(())
        })
    }
}

/// Event envelope of the contract: `{type, id, timestamp, tenantId, data}`.
pub fn event_body(
    event_id: Uuid,
    tenant: Uuid,
    name: &str,
    data: &Value,
    timestamp: &str,
) -> String {
    serde_json::json!({"type": name, "id": event_id, "timestamp": timestamp, "tenantId": tenant, "data": data}).to_string()
}

/// The `signals` rows of a batch (serialized by the caller, off the writer).
fn signal_rows(tenant: Uuid, signals: &[NormalizedSignal]) -> Result<Vec<Vec<Bind>>> {
    let tenant_s = tenant.to_string();
    let created = now();
    let mut rows = Vec::with_capacity(signals.len());
    for s in signals {
        let body = serde_json::to_string(s).map_err(corrupt("signal"))?;
        rows.push(vec![
            Bind::text(s.id.to_string()),
            Bind::text(&tenant_s),
            Bind::text(s.trace_id.to_string()),
            Bind::text(&s.source_id),
            Bind::text(&s.payload_digest),
            Bind::text(body),
            Bind::text(&created),
        ]);
    }
    Ok(rows)
}

/// A value bound into a statement committed with a batch of receipts.
#[derive(Debug, Clone, PartialEq)]
pub enum Bind {
    Text(Option<String>),
    Int(Option<i64>),
}

impl Bind {
    pub fn text(s: impl Into<String>) -> Bind {
        Bind::Text(Some(s.into()))
    }
    pub fn opt(s: Option<impl Into<String>>) -> Bind {
        Bind::Text(s.map(Into::into))
    }
    pub fn int(i: i64) -> Bind {
        Bind::Int(Some(i))
    }
}

/// Further rows written in the same transaction as a batch of receipts (the proxy's journal
/// and quarantine rows), so that what the receipts prove and what the gate did commit together.
#[derive(Debug, Clone)]
pub enum Stmt {
    /// One statement; with `expect_rows`, any other number of affected rows is a
    /// [`StoreError::Conflict`] and nothing of the batch is committed.
    Exec {
        sql: String,
        binds: Vec<Bind>,
        expect_rows: Option<u64>,
    },
    /// `INSERT INTO table (columns) VALUES (...), (...) suffix`, chunked to stay under the
    /// backends' bind-parameter limits.
    Insert {
        table: &'static str,
        columns: &'static [&'static str],
        rows: Vec<Vec<Bind>>,
        suffix: &'static str,
    },
}

/// Rows per multi-row INSERT: big enough to amortize a statement, small enough for the bind
/// limits (SQLite 32766, PostgreSQL 65535) and for the statement cache.
const INSERT_CHUNK_ROWS: usize = 256;
const MAX_BINDS: usize = 30_000;

/// One statement a [`Stmt`] runs as: an insert is cut into as many as the bind limits need.
struct Part<'a> {
    sql: String,
    binds: Vec<&'a Bind>,
    expect_rows: Option<u64>,
}

impl Stmt {
    /// The statements this runs, in order: with `$N` placeholders (PostgreSQL), or with
    /// `anonymous` `?` ones in bind order (SQLite, see [`anonymize`]). The one expansion of a
    /// [`Stmt`] both backends run.
    fn parts(&self, anonymous: bool) -> Vec<Part<'_>> {
        match self {
            Stmt::Exec {
                sql,
                binds,
                expect_rows,
            } => {
                let (sql, binds) = if anonymous {
                    anonymize(sql, binds)
                } else {
                    (sql.clone(), binds.iter().collect())
                };
                vec![Part {
                    sql,
                    binds,
                    expect_rows: *expect_rows,
                }]
            }
            Stmt::Insert {
                table,
                columns,
                rows,
                suffix,
            } => rows
                .chunks(rows_per_insert(columns.len()))
                .map(|part| {
                    let mut sql = String::new();
                    push_insert_sql(&mut sql, table, columns, part.len(), suffix, anonymous);
                    Part {
                        sql,
                        binds: part.iter().flatten().collect(),
                        expect_rows: None,
                    }
                })
                .collect(),
        }
    }
}

/// Appends `INSERT INTO table (columns) VALUES ($1, ...), ... suffix` to `sql`, or with
/// anonymous `?` placeholders.
fn push_insert_sql(
    sql: &mut String,
    table: &str,
    columns: &[&str],
    rows: usize,
    suffix: &str,
    anonymous: bool,
) {
    use std::fmt::Write;
    let _ = write!(sql, "INSERT INTO {table} ({}) VALUES ", columns.join(", "));
    let mut n = 0;
    for r in 0..rows {
        sql.push_str(if r > 0 { ", (" } else { "(" });
        for c in 0..columns.len() {
            n += 1;
            sql.push_str(if c > 0 { ", " } else { "" });
            if anonymous {
                sql.push('?');
            } else {
                let _ = write!(sql, "${n}");
            }
        }
        sql.push(')');
    }
    if !suffix.is_empty() {
        sql.push(' ');
        sql.push_str(suffix);
    }
}

/// A bind no statement names: SQLite reads an unbound parameter as NULL.
static UNBOUND: Bind = Bind::Text(None);

/// `sql` with each `$N` placeholder made an anonymous `?`, and the binds in the order the
/// placeholders appear (a placeholder used twice is bound twice). SQLite looks a named
/// parameter up by a linear scan of the statement's names, for every bind: on a 16-column,
/// many-row INSERT that scan was a tenth of the writer thread. (Our statements hold no `$` in
/// literals or names.)
fn anonymize<'a>(sql: &str, binds: &'a [Bind]) -> (String, Vec<&'a Bind>) {
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::with_capacity(binds.len());
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<usize>() {
            Ok(n) => {
                out.push('?');
                order.push(binds.get(n.wrapping_sub(1)).unwrap_or(&UNBOUND));
            }
            Err(_) => out.push('$'),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    (out, order)
}

/// Rows of one multi-row INSERT: as many as the bind limits allow, at most [`INSERT_CHUNK_ROWS`].
fn rows_per_insert(columns: usize) -> usize {
    (MAX_BINDS / columns.max(1)).clamp(1, INSERT_CHUNK_ROWS)
}

/// One query of several statements (SQLite), its binds in order, and the statements whose
/// changed-row count is checked: each such statement is followed by `SELECT i, changes()`, so
/// the counts come back as rows `(i, changed)` in the same hand-off.
struct MultiStatement<'a> {
    sql: String,
    binds: Vec<&'a Bind>,
    expect: Vec<u64>,
}

/// [`Stmt`]s as multi-statement queries (SQLite), each holding at most [`MAX_BINDS`] binds.
/// Every placeholder is an anonymous `?` (see [`anonymize`]): sqlx binds those in order across
/// the statements of a query.
fn multi_statement<'a>(stmts: impl IntoIterator<Item = &'a Stmt>) -> Vec<MultiStatement<'a>> {
    let mut out: Vec<MultiStatement<'a>> = Vec::new();
    let next = |out: &mut Vec<MultiStatement<'a>>, n: usize| {
        let full = out
            .last()
            .is_none_or(|q| !q.sql.is_empty() && q.binds.len() + n > MAX_BINDS);
        if full {
            out.push(MultiStatement {
                sql: String::new(),
                binds: Vec::new(),
                expect: Vec::new(),
            });
        }
    };
    for s in stmts {
        for p in s.parts(true) {
            next(&mut out, p.binds.len());
            let q = out.last_mut().expect("a query was started");
            q.sql.push_str(&p.sql);
            q.sql.push_str(";\n");
            q.binds.extend(p.binds);
            if let Some(n) = p.expect_rows {
                use std::fmt::Write;
                let _ = writeln!(q.sql, "SELECT {}, changes();", q.expect.len());
                q.expect.push(n);
            }
        }
    }
    out
}

fn expect_changed(expected: Option<u64>, changed: u64) -> Result<()> {
    match expected {
        Some(n) if n != changed => Err(StoreError::Conflict(format!(
            "expected {n} row(s) to change, {changed} did"
        ))),
        _ => Ok(()),
    }
}

macro_rules! bind_all {
    ($q:expr, $binds:expr) => {{
        let mut q = $q;
        for b in $binds {
            q = match b {
                Bind::Text(v) => q.bind(v.clone()),
                Bind::Int(v) => q.bind(*v),
            };
        }
        q
    }};
}

/// Runs [`Stmt`]s inside the caller's transaction one by one (PostgreSQL; SQLite runs them as
/// one query through [`SqliteTx::commit_with`]).
macro_rules! run_stmts {
    ($tx:ident, $stmts:expr) => {{
        for s in $stmts {
            for p in s.parts(false) {
                let done = bind_all!(sqlx::query(&p.sql), p.binds)
                    .execute(&mut *$tx)
                    .await?;
                expect_changed(p.expect_rows, done.rows_affected())?;
            }
        }
    }};
}

/// `writes` appended to a chain: the statements, what each caller is answered once they commit,
/// and the chain's new head.
struct Chained {
    stmts: Vec<Stmt>,
    committed: Vec<CommittedReceipt>,
    head: (i64, String),
}

/// The statements that append `writes` to a tenant's chain after `head` (sequence, hash): the
/// receipts (sealed in order), trace moves, obstructions, repair plans, the new head, and one
/// outbox delivery per event and matching subscription in `subs` (event name, subscription id).
fn chain_statements(
    tenant: Uuid,
    (head_seq, head_hash): (i64, String),
    subs: &[(String, String)],
    writes: &[ReceiptWrite],
    created: &str,
) -> Result<Chained> {
    let tenant_s = tenant.to_string();
    let created = created.to_string();
    let mut seq = head_seq;
    let mut prev = head_hash;
    let mut committed = Vec::with_capacity(writes.len());
    let mut receipt_rows = Vec::with_capacity(writes.len());
    let mut traces: Vec<Vec<Bind>> = Vec::new();
    let mut trace_pos: std::collections::HashMap<Uuid, usize> = Default::default();
    let mut obstructions = Vec::new();
    let mut plans = Vec::new();
    let mut deliveries = Vec::new();
    for w in writes {
        if w.tenant != tenant {
            return Err(StoreError::Corrupt("a receipt batch spans tenants".into()));
        }
        seq += 1;
        let sealed = w.content.seal(seq, &prev);
        let replay_hash = sealed.replay_hash;
        let finish = (w.finish)(Sealed {
            receipt_id: w.id,
            replay_hash: &replay_hash,
            seq,
            events_wanted: !subs.is_empty(),
        });
        let rid = w.id.to_string();
        receipt_rows.push(vec![
            Bind::text(&rid),
            Bind::text(&tenant_s),
            Bind::int(seq),
            Bind::text(&w.kind),
            Bind::opt(w.signal_id.map(|s| s.to_string())),
            Bind::opt(w.source_id.clone()),
            Bind::int(w.refused as i64),
            Bind::text(&w.decision),
            Bind::text(&w.outcome),
            Bind::text(&replay_hash),
            Bind::text(&prev),
            Bind::text(sealed.payload),
            Bind::text(sealed.field_digests),
            Bind::opt(w.idem_key.clone()),
            Bind::opt(finish.result.clone()),
            Bind::text(&created),
        ]);
        if let Some(t) = &w.trace {
            let row = vec![
                Bind::text(&tenant_s),
                Bind::text(t.id.to_string()),
                Bind::text(t.phase.as_str()),
                Bind::text(t.influence.as_str()),
                Bind::opt(t.trace_type.clone()),
                Bind::text(&rid),
                Bind::text(&created),
            ];
            // One row per trace: a multi-row upsert may not touch a row twice (PostgreSQL).
            match trace_pos.get(&t.id) {
                Some(&i) => traces[i] = row,
                None => {
                    trace_pos.insert(t.id, traces.len());
                    traces.push(row);
                }
            }
        }
        if let Some(o) = &w.obstruction {
            obstructions.push(vec![
                Bind::text(o.id.to_string()),
                Bind::text(&tenant_s),
                Bind::opt(w.signal_id.map(|s| s.to_string())),
                Bind::text(&rid),
                Bind::text(&o.status),
                Bind::text(o.body.to_string()),
                Bind::text(&created),
                Bind::text(&created),
            ]);
        }
        if let Some(r) = &w.repair_plan {
            plans.push(vec![
                Bind::text(r.id.to_string()),
                Bind::text(&tenant_s),
                Bind::opt(r.parent.map(|x| x.to_string())),
                Bind::text(&r.status),
                Bind::text(r.body.to_string()),
                Bind::text(&created),
                Bind::text(&created),
            ]);
        }
        // The outbox: one delivery per active subscription to the event.
        for e in &finish.events {
            let mut body = None;
            for (_, sub) in subs.iter().filter(|(name, _)| *name == e.name) {
                let (event_id, body) = body.get_or_insert_with(|| {
                    let event_id = Uuid::new_v4();
                    (
                        event_id,
                        event_body(event_id, tenant, &e.name, &e.data, &created),
                    )
                });
                deliveries.push(vec![
                    Bind::text(Uuid::new_v4().to_string()),
                    Bind::text(&tenant_s),
                    Bind::text(sub),
                    Bind::text(event_id.to_string()),
                    Bind::text(&e.name),
                    Bind::text(body.as_str()),
                    Bind::text("pending"),
                    Bind::int(0),
                    Bind::int(0),
                    Bind::text(&created),
                    Bind::text(&created),
                    Bind::text(&created),
                ]);
            }
        }
        committed.push(CommittedReceipt {
            id: w.id,
            seq,
            replay_hash: replay_hash.clone(),
            result: finish.result,
        });
        prev = replay_hash;
    }
    let mut stmts = vec![
            Stmt::Insert {
                table: "receipts",
                columns: &["id", "tenant_id", "seq", "kind", "signal_id", "source_id", "refused", "decision", "outcome", "replay_hash", "prev_hash", "payload", "field_digests", "idem_key", "result", "created_at"],
                rows: receipt_rows,
                suffix: "",
            },
            Stmt::Insert {
                table: "traces",
                columns: &["tenant_id", "id", "phase", "influence", "trace_type", "last_receipt_id", "updated_at"],
                rows: traces,
                suffix: "ON CONFLICT (tenant_id, id) DO UPDATE SET phase = excluded.phase, influence = excluded.influence, last_receipt_id = excluded.last_receipt_id, updated_at = excluded.updated_at",
            },
            Stmt::Insert {
                table: "obstructions",
                columns: &["id", "tenant_id", "signal_id", "receipt_id", "status", "body", "created_at", "updated_at"],
                rows: obstructions,
                suffix: "ON CONFLICT (id) DO NOTHING",
            },
            Stmt::Insert {
                table: "repair_plans",
                columns: &["id", "tenant_id", "obstruction_id", "status", "body", "created_at", "updated_at"],
                rows: plans,
                suffix: "ON CONFLICT (id) DO NOTHING",
            },
        ];
    if seq != head_seq {
        stmts.push(Stmt::Exec {
            sql: "UPDATE receipt_heads SET seq = $1, hash = $2 WHERE tenant_id = $3".into(),
            binds: vec![Bind::int(seq), Bind::text(&prev), Bind::text(&tenant_s)],
            // The row was read (and created if new) in this transaction, locked on
            // PostgreSQL, under SQLite's one writer: it is there.
            expect_rows: None,
        });
    }
    stmts.push(Stmt::Insert {
        table: "webhook_deliveries",
        columns: &[
            "id",
            "tenant_id",
            "subscription_id",
            "event_id",
            "event_name",
            "payload",
            "delivery_status",
            "attempt_count",
            "redrive_count",
            "next_retry_at",
            "created_at",
            "updated_at",
        ],
        rows: deliveries,
        suffix: "",
    });
    Ok(Chained {
        stmts,
        committed,
        head: (seq, prev),
    })
}

/// A source's record from its receipts' refused flags: (receipts, refused).
pub(super) fn source_record<'a>(flags: impl IntoIterator<Item = &'a bool>) -> (u32, u32) {
    flags
        .into_iter()
        .fold((0, 0), |(n, refused), r| (n + 1, refused + u32::from(*r)))
}

/// What committed receipts change in the memory basis: their traces and their sources'
/// records, in sequence order.
fn changes_of(writes: &[ReceiptWrite]) -> super::memory::Changes {
    let mut c = super::memory::Changes::default();
    for w in writes {
        if let Some(t) = &w.trace {
            c.traces.push((w.tenant, t.id, t.phase, t.influence));
        }
        if let Some(s) = &w.source_id {
            c.receipts.push((w.tenant, s.clone(), w.refused));
        }
    }
    c
}

/// What the group committer keeps of a tenant's chain between groups on SQLite: the head it
/// left and the active subscriptions (event name, id) as of `subs_generation`.
pub(super) struct ChainTip {
    head: (i64, String),
    subs: Vec<(String, String)>,
    subs_generation: u64,
}

static SUBSCRIPTIONS_GENERATION: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Changes whenever a webhook subscription is created, changed or paused in this process (see
/// [`subscriptions_changed`]): a [`ChainTip`]'s subscriptions hold while it has not.
fn subscriptions_generation() -> u64 {
    SUBSCRIPTIONS_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Called after every committed change to `webhook_subscriptions`, before it is answered: the
/// group committer reads the subscriptions again before its next commit, so an event of any
/// write that arrives after the change finds it.
pub fn subscriptions_changed() {
    SUBSCRIPTIONS_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// A write transaction on SQLite's one write connection, begun and ended by the caller's own
/// statements so that they can share a hand-off with the work (sqlx's `Transaction` spends one
/// on `BEGIN` and one on `COMMIT`). Until it is committed or rolled back, dropping it closes
/// the connection (SQLite then rolls back) rather than pooling a connection in a transaction.
struct SqliteTx {
    conn: sqlx::pool::PoolConnection<sqlx::Sqlite>,
    open: bool,
}

impl SqliteTx {
    /// `conn` is in a transaction from the first query [`SqliteTx::run`] runs (which must begin one).
    fn begin(conn: sqlx::pool::PoolConnection<sqlx::Sqlite>) -> SqliteTx {
        SqliteTx { conn, open: true }
    }

    /// Runs a query in the transaction; on an error the transaction is rolled back.
    async fn run<'q, O>(
        &mut self,
        q: sqlx::query::QueryAs<'q, sqlx::Sqlite, O, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<Vec<O>>
    where
        O: Send + Unpin + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    {
        match q.fetch_all(&mut *self.conn).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                self.rollback().await;
                Err(e.into())
            }
        }
    }

    /// Runs `begin` (SQL that begins the transaction, if this query is to) and `stmts`, then
    /// commits: in one hand-off when no statement's changed-row count needs checking (`COMMIT`
    /// ends the same query), else in two. A statement that fails stops the query before the
    /// `COMMIT`; the transaction is then rolled back.
    async fn commit_with<'a>(
        mut self,
        begin: &str,
        stmts: impl IntoIterator<Item = &'a Stmt>,
    ) -> Result<()> {
        let mut queries = multi_statement(stmts);
        let checked = queries.iter().any(|q| !q.expect.is_empty());
        match queries.first_mut() {
            Some(q) => q.sql.insert_str(0, begin),
            None => queries.push(MultiStatement {
                sql: begin.to_string(),
                binds: Vec::new(),
                expect: Vec::new(),
            }),
        }
        if !checked {
            if let Some(q) = queries.last_mut() {
                q.sql.push_str("COMMIT");
            }
        }
        for q in queries {
            let query = bind_all!(sqlx::query_as(&q.sql), q.binds);
            let changed: Vec<(i64, i64)> = self.run(query).await?;
            for (i, n) in changed {
                if let Err(e) = expect_changed(q.expect.get(i as usize).copied(), n as u64) {
                    self.rollback().await;
                    return Err(e);
                }
            }
        }
        if checked {
            self.run::<(i64,)>(sqlx::query_as("COMMIT")).await?;
        }
        self.open = false;
        Ok(())
    }

    async fn rollback(&mut self) {
        if sqlx::query("ROLLBACK")
            .execute(&mut *self.conn)
            .await
            .is_ok()
        {
            self.open = false;
        }
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

impl Store {
    /// Appends many receipts of one tenant to its chain in ONE transaction, with the signals
    /// they bind and `extra` statements (journal and quarantine rows): the batched form of
    /// [`Store::commit_receipt`], with the same chain logic (head row locked on PostgreSQL,
    /// sequence and previous hash bound into each receipt in order). A proxied batch of 2,000
    /// records is one transaction, not 2,000. Events go to the outbox only for event names
    /// the tenant has an active subscription to (the rest would insert nothing anyway).
    pub async fn commit_receipts(
        &self,
        tenant: Uuid,
        signals: &[NormalizedSignal],
        writes: Vec<ReceiptWrite>,
        extra: Vec<Stmt>,
    ) -> Result<Vec<CommittedReceipt>> {
        let signal_rows = signal_rows(tenant, signals)?;
        self.commit_rows(tenant, signal_rows, writes, extra).await
    }

    /// [`Store::commit_receipts`] through the group committer: receipts of writes that arrive
    /// while another group commits share the next transaction (see `store::group`). Only for
    /// batches whose further statements are plain inserts of fresh rows (the proxy's journal and
    /// quarantine rows), so that nothing one batch carries can make another's fail; anything
    /// else, or no committer running, commits on its own.
    pub async fn commit_receipts_grouped(
        &self,
        tenant: Uuid,
        signals: &[NormalizedSignal],
        writes: Vec<ReceiptWrite>,
        extra: Vec<Stmt>,
    ) -> Result<Vec<CommittedReceipt>> {
        let signal_rows = signal_rows(tenant, signals)?;
        let groupable = extra.iter().all(|s| matches!(s, Stmt::Insert { .. }));
        match self.batchers().map(|b| &b.group) {
            Some(group) if groupable => {
                super::group::commit(self, group, tenant, signal_rows, writes, extra).await
            }
            _ => self.commit_rows(tenant, signal_rows, writes, extra).await,
        }
    }

    /// The transaction of [`Store::commit_receipts`], with the signals already as rows.
    pub(super) async fn commit_rows(
        &self,
        tenant: Uuid,
        signal_rows: Vec<Vec<Bind>>,
        writes: Vec<ReceiptWrite>,
        extra: Vec<Stmt>,
    ) -> Result<Vec<CommittedReceipt>> {
        self.to_completion(|store| async move {
            store
                .commit_rows_at(tenant, signal_rows, writes, extra, &mut None)
                .await
        })
        .await
    }

    /// [`Store::commit_rows`] for a caller that keeps the tenant's chain tip between commits
    /// (the group committer).
    ///
    /// On SQLite, with a tip known, the whole transaction is ONE hand-off to the connection's
    /// thread: `BEGIN IMMEDIATE`, every row, the new head and `COMMIT` in one query (see
    /// [`MultiStatement`]). The tip cannot be trusted blindly (the API's commits append to the
    /// same chain), and need not be: a receipt inserted at a sequence another commit already
    /// took breaks the `(tenant_id, seq)` unique key, the query stops before its `COMMIT`, and
    /// the batch is rolled back and committed again the long way. The subscriptions are
    /// trusted while no subscription changed since they were read
    /// ([`subscriptions_generation`]). Without a tip (or after a miss) it is two hand-offs: one
    /// begins and reads the head and the subscriptions, one writes and commits; the tip is kept
    /// from there. Each hand-off wakes two threads, and on two busy cores that costs more than
    /// the statements: eleven of them per group made the committer the proxy's bottleneck.
    /// PostgreSQL runs the statements one by one, the head row locked; it keeps no tip (other
    /// gates append to the same chains).
    pub(super) async fn commit_rows_at(
        &self,
        tenant: Uuid,
        signal_rows: Vec<Vec<Bind>>,
        writes: Vec<ReceiptWrite>,
        extra: Vec<Stmt>,
        tip: &mut Option<ChainTip>,
    ) -> Result<Vec<CommittedReceipt>> {
        let tenant_s = tenant.to_string();
        let created = now();
        let timer = std::time::Instant::now();
        let signals = Stmt::Insert {
            table: "signals",
            columns: &[
                "id",
                "tenant_id",
                "trace_id",
                "source_id",
                "payload_digest",
                "body",
                "created_at",
            ],
            rows: signal_rows,
            suffix: "",
        };
        let out = match &self.backend {
            super::Backend::Sqlite { write, .. } => {
                let _order = self.basis_order().await;
                let known = tip
                    .take()
                    .filter(|t| t.subs_generation == subscriptions_generation());
                let mut done = None;
                if let Some(t) = known {
                    let chained =
                        chain_statements(tenant, t.head.clone(), &t.subs, &writes, &created)?;
                    let tx = SqliteTx::begin(write.acquire().await?);
                    match tx
                        .commit_with(
                            "BEGIN IMMEDIATE;\n",
                            [&signals].into_iter().chain(&chained.stmts).chain(&extra),
                        )
                        .await
                    {
                        Ok(()) => {
                            *tip = Some(ChainTip {
                                head: chained.head,
                                ..t
                            });
                            done = Some(chained.committed);
                        }
                        // The chain moved under the tip: commit again, reading the head.
                        Err(StoreError::Conflict(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                let committed = match done {
                    Some(committed) => committed,
                    None => {
                        let generation = subscriptions_generation();
                        let mut tx = SqliteTx::begin(write.acquire().await?);
                        let head_and_subs = "BEGIN IMMEDIATE;\n\
                            INSERT INTO receipt_heads (tenant_id, seq, hash) VALUES ($1, 0, $2) ON CONFLICT (tenant_id) DO NOTHING;\n\
                            SELECT 'h', seq, hash FROM receipt_heads WHERE tenant_id = $1;\n\
                            SELECT 's', 0, event_name || ' ' || id FROM webhook_subscriptions WHERE tenant_id = $1 AND status = 'active'";
                        let rows: Vec<(String, i64, String)> = tx
                            .run(
                                sqlx::query_as(head_and_subs)
                                    .bind(&tenant_s)
                                    .bind(GENESIS_HASH),
                            )
                            .await?;
                        let mut head = None;
                        let mut subs = Vec::new();
                        for (tag, seq, text) in rows {
                            if tag == "h" {
                                head = Some((seq, text));
                            } else if let Some((name, id)) = text.rsplit_once(' ') {
                                subs.push((name.to_string(), id.to_string()));
                            }
                        }
                        let head =
                            head.ok_or_else(|| StoreError::Corrupt("no chain head".into()))?;
                        let chained = chain_statements(tenant, head, &subs, &writes, &created)?;
                        tx.commit_with(
                            "",
                            [&signals].into_iter().chain(&chained.stmts).chain(&extra),
                        )
                        .await?;
                        *tip = Some(ChainTip {
                            head: chained.head,
                            subs,
                            subs_generation: generation,
                        });
                        chained.committed
                    }
                };
                self.applied(&changes_of(&writes));
                committed
            }
            super::Backend::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("INSERT INTO receipt_heads (tenant_id, seq, hash) VALUES ($1, 0, $2) ON CONFLICT (tenant_id) DO NOTHING")
                    .bind(&tenant_s)
                    .bind(GENESIS_HASH)
                    .execute(&mut *tx)
                    .await?;
                let head: (i64, String) = sqlx::query_as(
                    "SELECT seq, hash FROM receipt_heads WHERE tenant_id = $1 FOR UPDATE",
                )
                .bind(&tenant_s)
                .fetch_one(&mut *tx)
                .await?;
                let subs: Vec<(String, String)> = if writes.is_empty() {
                    Vec::new()
                } else {
                    sqlx::query_as("SELECT event_name, id FROM webhook_subscriptions WHERE tenant_id = $1 AND status = 'active'")
                        .bind(&tenant_s)
                        .fetch_all(&mut *tx)
                        .await?
                };
                let chained = chain_statements(tenant, head, &subs, &writes, &created)?;
                let stmts: Vec<&Stmt> = [&signals]
                    .into_iter()
                    .chain(&chained.stmts)
                    .chain(&extra)
                    .collect();
                run_stmts!(tx, stmts);
                tx.commit().await?;
                chained.committed
            }
        };
        crate::metrics::JOURNAL_COMMIT.observe(timer.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Runs statements in one transaction (no receipt): journal updates and the like.
    pub async fn run_statements(&self, stmts: Vec<Stmt>) -> Result<()> {
        match &self.backend {
            super::Backend::Sqlite { write, .. } => {
                SqliteTx::begin(write.acquire().await?)
                    .commit_with("BEGIN IMMEDIATE;\n", &stmts)
                    .await
            }
            super::Backend::Postgres(p) => {
                let mut tx = p.begin().await?;
                run_stmts!(tx, &stmts);
                tx.commit().await?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn anonymized_statements_bind_in_placeholder_order() {
        let binds = vec![Bind::text("a"), Bind::text("b"), Bind::int(3)];
        let (sql, order) = anonymize(
            "UPDATE t SET x = $2, y = $1 WHERE z = $3 AND w = $2 AND v = $9",
            &binds,
        );
        assert_eq!(
            sql,
            "UPDATE t SET x = ?, y = ? WHERE z = ? AND w = ? AND v = ?"
        );
        assert_eq!(
            order,
            vec![&binds[1], &binds[0], &binds[2], &binds[1], &UNBOUND]
        );
    }

    /// Statements with repeated and reordered placeholders, several in one query, bind and
    /// check their changed rows as they would alone.
    #[tokio::test]
    async fn a_multi_statement_query_binds_and_checks_each_statement() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (k TEXT PRIMARY KEY, a TEXT, b INTEGER)")
            .execute(&pool)
            .await
            .unwrap();
        let stmts = vec![
            Stmt::Insert {
                table: "t",
                columns: &["k", "a", "b"],
                rows: vec![
                    vec![Bind::text("x"), Bind::text("1"), Bind::int(1)],
                    vec![Bind::text("y"), Bind::opt(None::<String>), Bind::int(2)],
                ],
                suffix: "",
            },
            Stmt::Exec {
                sql: "UPDATE t SET a = $2, b = $3 WHERE k = $1 AND b = $3 - 1".into(),
                binds: vec![Bind::text("y"), Bind::text("two"), Bind::int(3)],
                expect_rows: Some(1),
            },
        ];
        let tx = SqliteTx::begin(pool.acquire().await.unwrap());
        tx.commit_with("BEGIN IMMEDIATE;\n", &stmts).await.unwrap();
        let rows: Vec<(String, Option<String>, i64)> =
            sqlx::query_as("SELECT k, a, b FROM t ORDER BY k")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            rows,
            vec![
                ("x".into(), Some("1".into()), 1),
                ("y".into(), Some("two".into()), 3)
            ]
        );
        // A check that fails rolls the whole query back.
        let failing = vec![
            Stmt::Insert {
                table: "t",
                columns: &["k", "a", "b"],
                rows: vec![vec![Bind::text("z"), Bind::text("9"), Bind::int(9)]],
                suffix: "",
            },
            Stmt::Exec {
                sql: "UPDATE t SET b = 0 WHERE k = $1".into(),
                binds: vec![Bind::text("nobody")],
                expect_rows: Some(1),
            },
        ];
        let tx = SqliteTx::begin(pool.acquire().await.unwrap());
        let err = tx
            .commit_with("BEGIN IMMEDIATE;\n", &failing)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn insert_parts_number_every_bind() {
        let insert = |columns, rows: usize, suffix| Stmt::Insert {
            table: "t",
            columns,
            rows: vec![vec![Bind::int(1); columns.len()]; rows],
            suffix,
        };
        let sql = |s: Stmt, anonymous| -> Vec<String> {
            s.parts(anonymous).into_iter().map(|p| p.sql).collect()
        };
        assert_eq!(
            sql(insert(&["a", "b"], 2, "ON CONFLICT DO NOTHING"), false),
            ["INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) ON CONFLICT DO NOTHING"]
        );
        assert_eq!(
            sql(insert(&["a"], 1, ""), true),
            ["INSERT INTO t (a) VALUES (?)"]
        );
        // More rows than one statement takes: cut in chunks, each numbered from $1.
        let big = insert(&["a"], INSERT_CHUNK_ROWS + 1, "");
        let parts = big.parts(false);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].binds.len(), INSERT_CHUNK_ROWS);
        assert_eq!(parts[1].sql, "INSERT INTO t (a) VALUES ($1)");
    }
}
