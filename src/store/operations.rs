//! Storage of the canonical operations and the governance lifecycle: the
//! dependency graph, protected actions, plan effects, lifecycle rows, and
//! `commit_operation`, which appends one receipt to the tenant's chain and
//! commits everything it proves (trace moves, new and moved obstructions and
//! plans, edges, actions, events) in one transaction. Moves carry the state
//! they expect: a concurrent change makes the commit a conflict (409), never
//! a lost update.

use super::{now, Finish, Result, Sealed, Store, StoreError};
use crate::kernel::operations::NodeKind;
use crate::kernel::operations::NodeRef;
use crate::kernel::types::{AllowedInfluence, TracePhase};
use crate::kernel::NormalizedSignal;
use crate::receipts::GENESIS_HASH;
use crate::with_pool;
use serde_json::{Map, Value};
use uuid::Uuid;

/// An edge of the dependency graph: `child` was derived from (or is based on) `parent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeWrite {
    pub child_kind: NodeKind,
    pub child_id: Uuid,
    pub parent_kind: NodeKind,
    pub parent_id: Uuid,
    pub relation: &'static str,
}

/// The trace phase a move expects to find.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    Any,
    /// `None`: the trace has no row yet.
    Phase(Option<TracePhase>),
}

pub struct TraceMove {
    pub id: Uuid,
    pub expect: Expect,
    pub phase: TracePhase,
    pub influence: AllowedInfluence,
    pub trace_type: Option<String>,
}

pub struct NewObstruction {
    pub id: Uuid,
    pub signal_id: Option<Uuid>,
    pub status: String,
    pub body: Value,
}

pub struct NewPlan {
    pub id: Uuid,
    pub obstruction_id: Uuid,
    pub status: String,
    pub body: Value,
    /// (group, effect JSON) stored beside the plan.
    pub effect: Option<(Option<Uuid>, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleTable {
    Obstructions,
    RepairPlans,
}

impl LifecycleTable {
    fn name(self) -> &'static str {
        match self {
            LifecycleTable::Obstructions => "obstructions",
            LifecycleTable::RepairPlans => "repair_plans",
        }
    }
}

/// A status move of a stored obstruction or plan, from the status read.
pub struct StatusMove {
    pub table: LifecycleTable,
    pub id: Uuid,
    pub from: String,
    pub to: String,
    pub body: Value,
}

pub struct ActionWrite {
    pub id: Uuid,
    pub kind: String,
    pub target: String,
    pub status: String,
    pub body: String,
}

pub struct OperationWrite {
    pub tenant: Uuid,
    pub id: Uuid,
    pub kind: String,
    pub signal_id: Option<Uuid>,
    pub refused: bool,
    pub decision: String,
    pub outcome: String,
    /// Bound content without `sequence` / `previousHash`.
    pub content: Map<String, Value>,
    pub traces: Vec<TraceMove>,
    pub obstructions: Vec<NewObstruction>,
    pub repair_plans: Vec<NewPlan>,
    pub status_moves: Vec<StatusMove>,
    pub edges: Vec<EdgeWrite>,
    pub actions: Vec<ActionWrite>,
    pub finish: Box<dyn FnOnce(Sealed<'_>) -> Finish + Send>,
}

impl OperationWrite {
    pub fn new(tenant: Uuid, id: Uuid, kind: &str, content: Map<String, Value>) -> Self {
        OperationWrite {
            tenant,
            id,
            kind: kind.into(),
            signal_id: None,
            refused: false,
            decision: String::new(),
            outcome: String::new(),
            content,
            traces: vec![],
            obstructions: vec![],
            repair_plans: vec![],
            status_moves: vec![],
            edges: vec![],
            actions: vec![],
            finish: Box::new(|_| Finish {
                result: None,
                events: vec![],
            }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Committed {
    pub id: Uuid,
    pub seq: i64,
    pub replay_hash: String,
    pub result: Option<String>,
}

/// A trace row.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow {
    pub id: Uuid,
    pub phase: TracePhase,
    pub influence: AllowedInfluence,
    pub trace_type: Option<String>,
    pub last_receipt_id: Option<String>,
    pub updated_at: String,
}

/// A stored signal with the time the gate stored it.
#[derive(Debug, Clone)]
pub struct SignalRow {
    pub signal: NormalizedSignal,
    pub created_at: String,
}

/// An obstruction or repair-plan row.
#[derive(Debug, Clone)]
pub struct LifecycleRow {
    pub id: String,
    pub parent: Option<String>,
    pub receipt_id: Option<String>,
    pub status: String,
    pub body: String,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone)]
pub struct ActionRow {
    pub id: String,
    pub kind: String,
    pub target: String,
    pub status: String,
    pub receipt_id: String,
    pub body: String,
}

#[derive(Debug, Clone)]
pub struct EdgeRow {
    pub child_kind: String,
    pub child_id: String,
    pub parent_kind: String,
    pub parent_id: String,
}

/// (id, phase, influence, trace_type, last_receipt_id, updated_at)
type TraceTuple = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);
/// (id, parent, receipt_id, status, body, created_at, updated_at)
type LifecycleTuple = (
    String,
    Option<String>,
    Option<String>,
    String,
    String,
    String,
    String,
);

fn corrupt(what: &str) -> impl Fn(serde_json::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("{what}: {e}"))
}

fn parse_trace((id, ph, inf, tt, last, at): TraceTuple) -> Result<TraceRow> {
    Ok(TraceRow {
        id: Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("trace id {id:?}")))?,
        phase: TracePhase::parse(&ph)
            .ok_or_else(|| StoreError::Corrupt(format!("trace phase {ph:?}")))?,
        influence: AllowedInfluence::parse(&inf)
            .ok_or_else(|| StoreError::Corrupt(format!("trace influence {inf:?}")))?,
        trace_type: tt,
        last_receipt_id: last,
        updated_at: at,
    })
}

/// `$first, $first+1, ...` for an IN list.
fn placeholders(first: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    // ------------------------------------------------------------ graph

    /// Resolves a reference to a stored object of the tenant: an explicit
    /// kind is checked; a bare UUID is tried as a receipt, a signal, a trace.
    pub async fn resolve_ref(&self, tenant: Uuid, r: NodeRef) -> Result<Option<(NodeKind, Uuid)>> {
        let order: &[NodeKind] = match r.kind {
            Some(NodeKind::Receipt) => &[NodeKind::Receipt],
            Some(NodeKind::Signal) => &[NodeKind::Signal],
            Some(NodeKind::Trace) => &[NodeKind::Trace],
            Some(NodeKind::Action) => &[NodeKind::Action],
            None => &[NodeKind::Receipt, NodeKind::Signal, NodeKind::Trace],
        };
        for k in order {
            let sql = match k {
                NodeKind::Receipt => {
                    "SELECT COUNT(*) FROM receipts WHERE tenant_id = $1 AND id = $2"
                }
                NodeKind::Signal => "SELECT COUNT(*) FROM signals WHERE tenant_id = $1 AND id = $2",
                NodeKind::Trace => "SELECT COUNT(*) FROM traces WHERE tenant_id = $1 AND id = $2",
                NodeKind::Action => "SELECT COUNT(*) FROM actions WHERE tenant_id = $1 AND id = $2",
            };
            let (n,): (i64,) = with_pool!(self, read, |p, _d| {
                sqlx::query_as(sql)
                    .bind(tenant.to_string())
                    .bind(r.id.to_string())
                    .fetch_one(p)
                    .await?
            });
            if n > 0 {
                return Ok(Some((*k, r.id)));
            }
        }
        Ok(None)
    }

    /// Edges a new signal's evidence references make: each reference that
    /// names a stored receipt, signal or trace of the same tenant. External
    /// evidence (URLs, ticket ids) and unknown ids make none.
    pub async fn evidence_edges(&self, s: &NormalizedSignal) -> Result<Vec<EdgeWrite>> {
        let mut out: Vec<EdgeWrite> = Vec::new();
        for raw in s.evidence_refs.iter().take(64) {
            let Some(r) = crate::kernel::operations::parse_ref(raw) else {
                continue;
            };
            if let Some((kind, id)) = self.resolve_ref(s.tenant_id, r).await? {
                let e = EdgeWrite {
                    child_kind: NodeKind::Signal,
                    child_id: s.id,
                    parent_kind: kind,
                    parent_id: id,
                    relation: "derived_from",
                };
                if !out.contains(&e) {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }

    /// Edges whose parent is one of `parents`.
    pub async fn children_of(
        &self,
        tenant: Uuid,
        parents: &[(NodeKind, Uuid)],
    ) -> Result<Vec<EdgeRow>> {
        let mut out = Vec::new();
        for chunk in parents.chunks(200) {
            let conds: Vec<String> = (0..chunk.len())
                .map(|i| {
                    format!(
                        "(parent_kind = ${} AND parent_id = ${})",
                        2 + 2 * i,
                        3 + 2 * i
                    )
                })
                .collect();
            let sql = format!(
                "SELECT child_kind, child_id, parent_kind, parent_id FROM dependency_edges WHERE tenant_id = $1 AND ({}) ORDER BY created_at, child_id",
                conds.join(" OR ")
            );
            let rows: Vec<(String, String, String, String)> = with_pool!(self, read, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(tenant.to_string());
                for (k, id) in chunk {
                    q = q.bind(k.as_str()).bind(id.to_string());
                }
                q.fetch_all(p).await?
            });
            out.extend(rows.into_iter().map(|(ck, ci, pk, pi)| EdgeRow {
                child_kind: ck,
                child_id: ci,
                parent_kind: pk,
                parent_id: pi,
            }));
        }
        Ok(out)
    }

    /// Edges whose child is `child`.
    pub async fn parents_of(&self, tenant: Uuid, child: (NodeKind, Uuid)) -> Result<Vec<EdgeRow>> {
        let rows: Vec<(String, String, String, String)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT child_kind, child_id, parent_kind, parent_id FROM dependency_edges WHERE tenant_id = $1 AND child_kind = $2 AND child_id = $3 ORDER BY created_at, parent_id")
                .bind(tenant.to_string())
                .bind(child.0.as_str())
                .bind(child.1.to_string())
                .fetch_all(p)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(|(ck, ci, pk, pi)| EdgeRow {
                child_kind: ck,
                child_id: ci,
                parent_kind: pk,
                parent_id: pi,
            })
            .collect())
    }

    pub async fn trace_row(&self, tenant: Uuid, id: Uuid) -> Result<Option<TraceRow>> {
        let row: Option<TraceTuple> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT id, phase, influence, trace_type, last_receipt_id, updated_at FROM traces WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.to_string())
                    .bind(id.to_string())
                    .fetch_optional(p)
                    .await?
        });
        row.map(parse_trace).transpose()
    }

    /// Traces of a substrate in the given phases (at most `limit`, newest first).
    pub async fn traces_in_phases(
        &self,
        tenant: Uuid,
        trace_type: &str,
        phases: &[TracePhase],
        limit: i64,
    ) -> Result<Vec<TraceRow>> {
        let sql = format!(
            "SELECT id, phase, influence, trace_type, last_receipt_id, updated_at FROM traces WHERE tenant_id = $1 AND trace_type = $2 AND phase IN ({}) ORDER BY updated_at DESC LIMIT ${}",
            placeholders(3, phases.len()),
            3 + phases.len()
        );
        let rows: Vec<TraceTuple> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(trace_type);
            for ph in phases {
                q = q.bind(ph.as_str());
            }
            q.bind(limit).fetch_all(p).await?
        });
        rows.into_iter().map(parse_trace).collect()
    }

    /// Signals that wrote a trace, newest first.
    pub async fn signals_of_trace(
        &self,
        tenant: Uuid,
        trace: Uuid,
        limit: i64,
    ) -> Result<Vec<SignalRow>> {
        let rows: Vec<(String, String)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT body, created_at FROM signals WHERE tenant_id = $1 AND trace_id = $2 ORDER BY created_at DESC, id LIMIT $3")
                .bind(tenant.to_string())
                .bind(trace.to_string())
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter()
            .map(|(b, at)| {
                Ok(SignalRow {
                    signal: serde_json::from_str(&b).map_err(corrupt("signal"))?,
                    created_at: at,
                })
            })
            .collect()
    }

    pub async fn signal_row(&self, tenant: Uuid, id: Uuid) -> Result<Option<SignalRow>> {
        let row: Option<(String, String)> = with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT body, created_at FROM signals WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        row.map(|(b, at)| {
            Ok(SignalRow {
                signal: serde_json::from_str(&b).map_err(corrupt("signal"))?,
                created_at: at,
            })
        })
        .transpose()
    }

    /// Ids of the receipts of some signals.
    pub async fn receipts_of_signals(&self, tenant: Uuid, signals: &[Uuid]) -> Result<Vec<Uuid>> {
        let mut out = Vec::new();
        for chunk in signals.chunks(400) {
            let sql = format!(
                "SELECT id FROM receipts WHERE tenant_id = $1 AND signal_id IN ({}) ORDER BY seq",
                placeholders(2, chunk.len())
            );
            let rows: Vec<(String,)> = with_pool!(self, read, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(tenant.to_string());
                for s in chunk {
                    q = q.bind(s.to_string());
                }
                q.fetch_all(p).await?
            });
            out.extend(
                rows.into_iter()
                    .filter_map(|(id,)| Uuid::parse_str(&id).ok()),
            );
        }
        Ok(out)
    }

    /// Receipts of some signals that admitted a write through the proxy
    /// (kind `proxy...`, not refused): the record reached the upstream store.
    pub async fn forwarded_receipts(
        &self,
        tenant: Uuid,
        signals: &[Uuid],
    ) -> Result<Vec<(Uuid, Uuid, String)>> {
        let mut out = Vec::new();
        for chunk in signals.chunks(400) {
            let sql = format!(
                "SELECT id, signal_id, kind FROM receipts WHERE tenant_id = $1 AND refused = 0 AND kind LIKE 'proxy%' AND signal_id IN ({}) ORDER BY seq",
                placeholders(2, chunk.len())
            );
            let rows: Vec<(String, Option<String>, String)> = with_pool!(self, read, |p, _d| {
                let mut q = sqlx::query_as(&sql).bind(tenant.to_string());
                for s in chunk {
                    q = q.bind(s.to_string());
                }
                q.fetch_all(p).await?
            });
            for (id, sig, kind) in rows {
                if let (Ok(id), Some(Ok(sig))) =
                    (Uuid::parse_str(&id), sig.map(|s| Uuid::parse_str(&s)))
                {
                    out.push((id, sig, kind));
                }
            }
        }
        Ok(out)
    }

    /// Deliveries the receiver acknowledged (2xx) whose event names `needle`
    /// (a signal or receipt id): at most `limit`.
    pub async fn delivered_mentioning(
        &self,
        tenant: Uuid,
        needle: &str,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>> {
        let pattern = format!("%{needle}%");
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT id, event_name, subscription_id FROM webhook_deliveries WHERE tenant_id = $1 AND http_status >= 200 AND http_status < 300 AND payload LIKE $2 ORDER BY created_at LIMIT $3")
                .bind(tenant.to_string())
                .bind(&pattern)
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    pub async fn action_row(&self, tenant: Uuid, id: Uuid) -> Result<Option<ActionRow>> {
        let row: Option<(String, String, String, String, String, String)> = with_pool!(
            self,
            read,
            |p, _d| {
                sqlx::query_as("SELECT id, kind, target, status, receipt_id, body FROM actions WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
            }
        );
        Ok(
            row.map(|(id, kind, target, status, receipt_id, body)| ActionRow {
                id,
                kind,
                target,
                status,
                receipt_id,
                body,
            }),
        )
    }

    /// Recent receipts of a source (newest first): id, decision, refused, payload.
    pub async fn source_receipts(
        &self,
        tenant: Uuid,
        source_id: &str,
        limit: i64,
    ) -> Result<Vec<(String, String, i64, String, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT id, decision, refused, payload, created_at FROM receipts WHERE tenant_id = $1 AND source_id = $2 ORDER BY seq DESC LIMIT $3")
                .bind(tenant.to_string())
                .bind(source_id)
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    // ------------------------------------------------------------ lifecycle rows

    pub async fn get_lifecycle(
        &self,
        table: LifecycleTable,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<LifecycleRow>> {
        let parent = match table {
            LifecycleTable::Obstructions => "signal_id",
            LifecycleTable::RepairPlans => "obstruction_id",
        };
        let receipt = match table {
            LifecycleTable::Obstructions => "receipt_id",
            LifecycleTable::RepairPlans => "NULL",
        };
        let sql = format!(
            "SELECT id, {parent}, {receipt}, status, body, created_at, updated_at FROM {} WHERE tenant_id = $1 AND id = $2",
            table.name()
        );
        let row: Option<LifecycleTuple> = with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        Ok(row.map(
            |(id, parent, receipt_id, status, body, created_at, updated_at)| LifecycleRow {
                id,
                parent,
                receipt_id,
                status,
                body,
                created_at,
                updated_at,
            },
        ))
    }

    /// Obstructions or plans of a tenant, newest first, filtered by status and
    /// (for plans) obstruction or (for obstructions) target id.
    pub async fn list_lifecycle(
        &self,
        table: LifecycleTable,
        tenant: Uuid,
        status: Option<&str>,
        parent: Option<&str>,
        limit: i64,
    ) -> Result<Vec<LifecycleRow>> {
        let (parent_col, receipt) = match table {
            LifecycleTable::Obstructions => ("signal_id", "receipt_id"),
            LifecycleTable::RepairPlans => ("obstruction_id", "NULL"),
        };
        let mut sql = format!(
            "SELECT id, {parent_col}, {receipt}, status, body, created_at, updated_at FROM {} WHERE tenant_id = $1",
            table.name()
        );
        let mut n = 2;
        if status.is_some() {
            sql.push_str(&format!(" AND status = ${n}"));
            n += 1;
        }
        if parent.is_some() {
            match table {
                // Obstructions are filtered by their target id inside the body.
                LifecycleTable::Obstructions => {
                    sql.push_str(&format!(" AND body LIKE ${n} ESCAPE '\\'"))
                }
                LifecycleTable::RepairPlans => sql.push_str(&format!(" AND obstruction_id = ${n}")),
            }
            n += 1;
        }
        sql.push_str(&format!(" ORDER BY created_at DESC, id LIMIT ${n}"));
        let parent_bind = parent.map(|p| match table {
            LifecycleTable::Obstructions => {
                // LIKE wildcards in the id match themselves only.
                let quoted = Value::String(p.to_string()).to_string();
                let escaped = quoted
                    .replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_");
                format!("%\"targetId\":{escaped}%")
            }
            LifecycleTable::RepairPlans => p.to_string(),
        });
        let rows: Vec<LifecycleTuple> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql).bind(tenant.to_string());
            if let Some(s) = status {
                q = q.bind(s);
            }
            if let Some(pb) = &parent_bind {
                q = q.bind(pb);
            }
            q.bind(limit).fetch_all(p).await?
        });
        Ok(rows
            .into_iter()
            .map(
                |(id, parent, receipt_id, status, body, created_at, updated_at)| LifecycleRow {
                    id,
                    parent,
                    receipt_id,
                    status,
                    body,
                    created_at,
                    updated_at,
                },
            )
            .collect())
    }

    /// (group, effect JSON) of a plan.
    pub async fn plan_effect(
        &self,
        tenant: Uuid,
        plan: Uuid,
    ) -> Result<Option<(Option<String>, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as(
                "SELECT group_id, effect FROM repair_effects WHERE tenant_id = $1 AND plan_id = $2",
            )
            .bind(tenant.to_string())
            .bind(plan.to_string())
            .fetch_optional(p)
            .await?
        }))
    }

    /// Plans of a group: (plan id, plan status, plan body, obstruction id).
    pub async fn plans_in_group(
        &self,
        tenant: Uuid,
        group: &str,
    ) -> Result<Vec<(String, String, String, String)>> {
        Ok(with_pool!(self, read, |p, _d| {
            sqlx::query_as("SELECT r.id, r.status, r.body, r.obstruction_id FROM repair_effects e JOIN repair_plans r ON r.tenant_id = e.tenant_id AND r.id = e.plan_id WHERE e.tenant_id = $1 AND e.group_id = $2 ORDER BY r.created_at, r.id")
                .bind(tenant.to_string())
                .bind(group)
                .fetch_all(p)
                .await?
        }))
    }

    // ------------------------------------------------------------ commit

    /// Appends a receipt to the tenant's chain with everything it proves.
    pub async fn commit_operation(&self, w: OperationWrite) -> Result<Committed> {
        self.to_completion(|store| async move { store.commit_operation_now(w).await })
            .await
    }

    async fn commit_operation_now(&self, w: OperationWrite) -> Result<Committed> {
        let tenant = w.tenant.to_string();
        let created = now();
        let timer = std::time::Instant::now();
        // An operation's receipt names no source: only its traces move the memory basis.
        let changes = super::memory::Changes {
            traces: w
                .traces
                .iter()
                .map(|t| (w.tenant, t.id, t.phase, t.influence))
                .collect(),
            ..Default::default()
        };
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

            // Expected states first: a concurrent change aborts before anything is written.
            for t in &w.traces {
                if let Expect::Phase(want) = t.expect {
                    let cur: Option<(String,)> = sqlx::query_as(&format!(
                        "SELECT phase FROM traces WHERE tenant_id = $1 AND id = $2{}",
                        d.for_update
                    ))
                    .bind(&tenant)
                    .bind(t.id.to_string())
                    .fetch_optional(&mut *tx)
                    .await?;
                    let cur = cur.map(|(ph,)| ph);
                    if cur.as_deref() != want.map(|p| p.as_str()) {
                        return Err(StoreError::Conflict(format!(
                            "trace {} changed concurrently (now {})",
                            t.id,
                            cur.as_deref().unwrap_or("absent")
                        )));
                    }
                }
            }
            for m in &w.status_moves {
                let n = sqlx::query(&format!(
                    "UPDATE {} SET status = $1, body = $2, updated_at = $3 WHERE tenant_id = $4 AND id = $5 AND status = $6",
                    m.table.name()
                ))
                .bind(&m.to)
                .bind(m.body.to_string())
                .bind(&created)
                .bind(&tenant)
                .bind(m.id.to_string())
                .bind(&m.from)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n != 1 {
                    return Err(StoreError::Conflict(format!(
                        "{} {} is no longer {}",
                        m.table.name().trim_end_matches('s'),
                        m.id,
                        m.from
                    )));
                }
            }
            // An action id is released once: a release that raced another (both read no
            // released row before either committed) aborts here, under the chain's lock, and
            // the caller answers with the release that won.
            for a in &w.actions {
                let cur: Option<(String, String, String)> = sqlx::query_as(&format!(
                    "SELECT kind, target, status FROM actions WHERE tenant_id = $1 AND id = $2{}",
                    d.for_update
                ))
                .bind(&tenant)
                .bind(a.id.to_string())
                .fetch_optional(&mut *tx)
                .await?;
                if let Some((kind, target, status)) = cur {
                    if kind != a.kind || target != a.target || status == "released" {
                        return Err(StoreError::Conflict(format!(
                            "action {} was {status} concurrently",
                            a.id
                        )));
                    }
                }
            }

            let seq = head_seq + 1;
            let sealed = crate::receipts::CanonicalContent::new(w.content).seal(seq, &head_hash);
            let replay_hash = sealed.replay_hash;
            let finish = (w.finish)(Sealed {
                receipt_id: w.id,
                replay_hash: &replay_hash,
                seq,
                events_wanted: true,
            });
            sqlx::query(
                "INSERT INTO receipts (id, tenant_id, seq, kind, signal_id, source_id, refused, decision, outcome, replay_hash, prev_hash, payload, field_digests, idem_key, result, created_at) \
                 VALUES ($1, $2, $3, $4, $5, NULL, $6, $7, $8, $9, $10, $11, $12, NULL, $13, $14)",
            )
            .bind(w.id.to_string())
            .bind(&tenant)
            .bind(seq)
            .bind(&w.kind)
            .bind(w.signal_id.map(|s| s.to_string()))
            .bind(w.refused as i64)
            .bind(&w.decision)
            .bind(&w.outcome)
            .bind(&replay_hash)
            .bind(&head_hash)
            .bind(&sealed.payload)
            .bind(&sealed.field_digests)
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
            for t in &w.traces {
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
            for o in &w.obstructions {
                sqlx::query("INSERT INTO obstructions (id, tenant_id, signal_id, receipt_id, status, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (id) DO NOTHING")
                    .bind(o.id.to_string())
                    .bind(&tenant)
                    .bind(o.signal_id.map(|s| s.to_string()))
                    .bind(w.id.to_string())
                    .bind(&o.status)
                    .bind(o.body.to_string())
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
            }
            for r in &w.repair_plans {
                sqlx::query("INSERT INTO repair_plans (id, tenant_id, obstruction_id, status, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING")
                    .bind(r.id.to_string())
                    .bind(&tenant)
                    .bind(r.obstruction_id.to_string())
                    .bind(&r.status)
                    .bind(r.body.to_string())
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
                if let Some((group, effect)) = &r.effect {
                    sqlx::query("INSERT INTO repair_effects (tenant_id, plan_id, group_id, effect) VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, plan_id) DO NOTHING")
                        .bind(&tenant)
                        .bind(r.id.to_string())
                        .bind(group.map(|g| g.to_string()))
                        .bind(effect)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            for e in &w.edges {
                sqlx::query("INSERT INTO dependency_edges (tenant_id, child_kind, child_id, parent_kind, parent_id, relation, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING")
                    .bind(&tenant)
                    .bind(e.child_kind.as_str())
                    .bind(e.child_id.to_string())
                    .bind(e.parent_kind.as_str())
                    .bind(e.parent_id.to_string())
                    .bind(e.relation)
                    .bind(&created)
                    .execute(&mut *tx)
                    .await?;
            }
            for a in &w.actions {
                sqlx::query(
                    "INSERT INTO actions (tenant_id, id, kind, target, status, receipt_id, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
                     ON CONFLICT (tenant_id, id) DO UPDATE SET status = excluded.status, receipt_id = excluded.receipt_id, body = excluded.body, updated_at = excluded.updated_at",
                )
                .bind(&tenant)
                .bind(a.id.to_string())
                .bind(&a.kind)
                .bind(&a.target)
                .bind(&a.status)
                .bind(w.id.to_string())
                .bind(&a.body)
                .bind(&created)
                .execute(&mut *tx)
                .await?;
            }
            for e in &finish.events {
                enqueue_event!(tx, w.tenant, e, &created);
            }
            tx.commit().await?;
            Ok::<_, StoreError>(Committed {
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
}
