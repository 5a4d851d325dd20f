//! The state basis served from memory (SQLite only).
//!
//! Every write the kernel judges first reads its basis: the phase and influence of its
//! records' traces and its source's record over its last [`SOURCE_WINDOW`] receipts. On
//! SQLite this process is the database's only writer, so it can know that basis without
//! asking: the traces are read once at start-up, and every commit that moves a trace or
//! appends a receipt of a source applies the same change here before the next commit can
//! begin (the commit and its application run under one lock, [`MemoryBasis::order`], so
//! memory moves in the database's commit order). A source's record is read from the database
//! the first time it is asked for, under that lock, then kept.
//!
//! What a read gets is exactly what the database holds at that moment, without the hand-off
//! to a connection thread that made the basis read a fifth of a proxied write's cost. The
//! trace map is bounded (`storage.memory_basis_traces`): past the bound, or set to 0, the
//! basis is read from the database as before, and a fleet on PostgreSQL always reads it
//! there (other gates write to the same tables).

use super::Result;
use crate::kernel::types::{AllowedInfluence, TracePhase};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use uuid::Uuid;

/// The receipts of a source that make up its record (the API's evaluations and the proxy
/// both use this window).
pub const SOURCE_WINDOW: usize = 20;
/// Sources kept at most; past it the kept records are dropped and read again when asked for.
const MAX_SOURCES: usize = 65_536;

/// What one commit changed, in commit (sequence) order.
#[derive(Default)]
pub(super) struct Changes {
    /// A trace written with this phase and influence (inserted or updated).
    pub traces: Vec<(Uuid, Uuid, TracePhase, AllowedInfluence)>,
    /// Traces set tombstoned where they exist (a confirmed delete).
    pub tombstoned: Vec<(Uuid, Uuid)>,
    /// Traces removed (a write that created them was refused by the store).
    pub removed: Vec<(Uuid, Uuid)>,
    /// A receipt appended for a source: (tenant, source, refused).
    pub receipts: Vec<(Uuid, String, bool)>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.traces.is_empty()
            && self.tombstoned.is_empty()
            && self.removed.is_empty()
            && self.receipts.is_empty()
    }
}

pub(super) struct MemoryBasis {
    /// Held by every commit that writes traces or receipts, from before it takes the writer
    /// connection until its changes are applied here, and by a source's first read.
    pub order: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

struct State {
    /// False once the trace map outgrew its bound: reads go to the database from then on.
    enabled: bool,
    max_traces: usize,
    traces: HashMap<(Uuid, Uuid), (TracePhase, AllowedInfluence)>,
    /// The refused flags of a source's last receipts, oldest first, by tenant and source.
    sources: HashMap<Uuid, HashMap<String, VecDeque<bool>>>,
    /// Sources kept, over all tenants.
    kept: usize,
}

impl MemoryBasis {
    /// Reads every trace (`None` when there are more than `max_traces`: the basis is then read
    /// from the database).
    pub async fn load(pool: &sqlx::SqlitePool, max_traces: usize) -> Result<Option<MemoryBasis>> {
        if max_traces == 0 {
            return Ok(None);
        }
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM traces")
            .fetch_one(pool)
            .await?;
        if count as usize > max_traces {
            tracing::info!(
                traces = count,
                bound = max_traces,
                "more traces than storage.memory_basis_traces: the state basis is read from the database"
            );
            return Ok(None);
        }
        let rows: Vec<(String, String, String, String)> =
            sqlx::query_as("SELECT tenant_id, id, phase, influence FROM traces")
                .fetch_all(pool)
                .await?;
        let mut traces = HashMap::with_capacity(rows.len());
        for (tenant, id, phase, influence) in rows {
            let parsed = (
                Uuid::parse_str(&tenant),
                Uuid::parse_str(&id),
                TracePhase::parse(&phase),
                AllowedInfluence::parse(&influence),
            );
            let (Ok(tenant), Ok(id), Some(phase), Some(influence)) = parsed else {
                // The database answers for such a row (with an error where it is read); the
                // gate still starts.
                tracing::warn!(
                    trace = %id,
                    "a trace row does not parse: the state basis is read from the database"
                );
                return Ok(None);
            };
            traces.insert((tenant, id), (phase, influence));
        }
        Ok(Some(MemoryBasis {
            order: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                enabled: true,
                max_traces,
                traces,
                sources: HashMap::new(),
                kept: 0,
            }),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it answers (not past its bound).
    pub fn enabled(&self) -> bool {
        self.state().enabled
    }

    /// The phase and influence of the traces `ids` that exist (`None`: read the database).
    pub fn traces(
        &self,
        tenant: Uuid,
        ids: &[Uuid],
    ) -> Option<HashMap<Uuid, (TracePhase, AllowedInfluence)>> {
        let st = self.state();
        if !st.enabled {
            return None;
        }
        Some(
            ids.iter()
                .filter_map(|id| st.traces.get(&(tenant, *id)).map(|s| (*id, *s)))
                .collect(),
        )
    }

    /// A source's record (receipts, refused) if it is kept here.
    pub fn source(&self, tenant: Uuid, source: &str) -> Option<(u32, u32)> {
        let st = self.state();
        if !st.enabled {
            return None;
        }
        st.sources
            .get(&tenant)
            .and_then(|s| s.get(source))
            .map(super::receipts::source_record)
    }

    /// Keeps a source's record as read from the database (newest receipt first), for a caller
    /// holding [`MemoryBasis::order`].
    pub fn keep_source(&self, tenant: Uuid, source: &str, newest_first: &[bool]) {
        let mut st = self.state();
        if !st.enabled {
            return;
        }
        if st.kept >= MAX_SOURCES {
            st.sources.clear();
            st.kept = 0;
        }
        let flags: VecDeque<bool> = newest_first
            .iter()
            .take(SOURCE_WINDOW)
            .rev()
            .copied()
            .collect();
        if st
            .sources
            .entry(tenant)
            .or_default()
            .insert(source.to_string(), flags)
            .is_none()
        {
            st.kept += 1;
        }
    }

    /// Applies a committed change, for a caller holding [`MemoryBasis::order`].
    pub fn apply(&self, c: &Changes) {
        let mut st = self.state();
        if !st.enabled {
            return;
        }
        for (tenant, id, phase, influence) in &c.traces {
            st.traces.insert((*tenant, *id), (*phase, *influence));
        }
        for key in &c.tombstoned {
            if let Some(s) = st.traces.get_mut(key) {
                *s = (TracePhase::Tombstoned, AllowedInfluence::None);
            }
        }
        for key in &c.removed {
            st.traces.remove(key);
        }
        for (tenant, source, refused) in &c.receipts {
            let kept = st.sources.get_mut(tenant).and_then(|s| s.get_mut(source));
            if let Some(flags) = kept {
                flags.push_back(*refused);
                if flags.len() > SOURCE_WINDOW {
                    flags.pop_front();
                }
            }
        }
        if st.traces.len() > st.max_traces {
            tracing::warn!(
                bound = st.max_traces,
                "more traces than storage.memory_basis_traces: the state basis is read from the database from now on"
            );
            st.enabled = false;
            st.traces = HashMap::new();
            st.sources = HashMap::new();
            st.kept = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::operations::{Expect, OperationWrite, TraceMove};
    use crate::store::receipts::TraceWrite;
    use crate::store::testing::receipt;
    use crate::store::Store;

    /// The same store read without memory: what the database holds.
    fn database_only(store: &Store) -> Store {
        Store {
            backend: store.backend.clone(),
            batchers: None,
            memory: None,
        }
    }

    /// After commits through every path that moves traces or appends a source's receipts (the
    /// group committer, a lone batch, the API's single receipt, an operation, a confirmed
    /// delete), the basis served from memory is the basis the database holds.
    #[tokio::test]
    async fn the_memory_basis_is_what_the_database_holds() {
        for (store, _dir) in crate::store::testing::stores().await {
            let db = database_only(&store);
            let tenant = Uuid::new_v4();
            let other = Uuid::new_v4();
            let t: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
            // Asked for before anything was written: kept from here on.
            assert_eq!(
                store.source_history(tenant, "s1", 20).await.unwrap(),
                (0, 0)
            );

            let traced = |n: i64, trace: Uuid, phase: TracePhase, source: &str, refused: bool| {
                let mut w = receipt(tenant, n);
                w.source_id = Some(source.into());
                w.refused = refused;
                w.trace = Some(TraceWrite {
                    id: trace,
                    phase,
                    influence: AllowedInfluence::None,
                    trace_type: None,
                });
                w
            };
            for n in 0..25 {
                let phase = [TracePhase::Accepted, TracePhase::Quarantined][n as usize % 2];
                let w = traced(
                    n,
                    t[n as usize % 4],
                    phase,
                    ["s1", "s2"][n as usize % 2],
                    n % 3 == 0,
                );
                store
                    .commit_receipts_grouped(tenant, &[], vec![w], Vec::new())
                    .await
                    .unwrap();
            }
            let batch = vec![
                traced(30, t[4], TracePhase::Accepted, "s1", true),
                traced(31, t[4], TracePhase::Revoked, "s1", false),
            ];
            store
                .commit_receipts(tenant, &[], batch, Vec::new())
                .await
                .unwrap();
            store
                .commit_receipt(traced(32, t[5], TracePhase::Accepted, "s2", true))
                .await
                .unwrap();
            let mut op =
                OperationWrite::new(tenant, crate::store::new_id(), "test", Default::default());
            op.traces.push(TraceMove {
                id: t[0],
                expect: Expect::Any,
                phase: TracePhase::Revoked,
                influence: AllowedInfluence::None,
                trace_type: None,
            });
            store.commit_operation(op).await.unwrap();
            store
                .tombstone_traces(
                    tenant,
                    &[t[1], t[7]].map(|trace| crate::store::Tombstone {
                        trace,
                        receipt: None,
                    }),
                )
                .await
                .unwrap();
            // Another tenant's trace of the same id is its own.
            let mut w = receipt(other, 0);
            w.trace = Some(TraceWrite {
                id: t[2],
                phase: TracePhase::Revoked,
                influence: AllowedInfluence::None,
                trace_type: None,
            });
            store.commit_receipt(w).await.unwrap();

            for tenant in [tenant, other] {
                let from_db = db.traces_of(tenant, &t).await.unwrap();
                assert_eq!(store.traces_of(tenant, &t).await.unwrap(), from_db);
                for id in &t {
                    assert_eq!(
                        store.get_trace(tenant, *id).await.unwrap(),
                        from_db.get(id).copied()
                    );
                }
                for s in ["s1", "s2", "nobody"] {
                    let want = db.source_history(tenant, s, 20).await.unwrap();
                    assert_eq!(
                        store.source_history(tenant, s, 20).await.unwrap(),
                        want,
                        "{s}"
                    );
                    let (traces, history) = store.basis_of(tenant, &t, s, 20).await.unwrap();
                    assert_eq!((traces, history), (from_db.clone(), want));
                }
            }
            let phases = db.traces_of(tenant, &t).await.unwrap();
            assert_eq!(
                phases[&t[0]].0,
                TracePhase::Revoked,
                "the operation moved it"
            );
            assert_eq!(phases[&t[1]].0, TracePhase::Tombstoned);
            assert!(!phases.contains_key(&t[7]), "a delete creates no trace");
            assert_eq!(db.source_history(tenant, "s1", 20).await.unwrap().0, 15);
        }
    }

    /// A confirmed delete tombstones its record's trace only while the delete's receipt is still
    /// the trace's last: a write of the id judged after the delete (the record written again)
    /// keeps the trace it left. Memory follows the database either way.
    #[tokio::test]
    async fn a_tombstone_does_not_undo_a_later_write_of_the_record() {
        for (store, _dir) in crate::store::testing::stores().await {
            let db = database_only(&store);
            let tenant = Uuid::new_v4();
            let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
            let moved = |n: i64, trace: Uuid| {
                let mut w = receipt(tenant, n);
                w.trace = Some(TraceWrite {
                    id: trace,
                    phase: TracePhase::Accepted,
                    influence: AllowedInfluence::AcceptedContext,
                    trace_type: None,
                });
                w
            };
            // The deletes of a and b, each moving its trace.
            let del_a = store.commit_receipt(moved(1, a)).await.unwrap().id;
            let del_b = store.commit_receipt(moved(2, b)).await.unwrap().id;
            // a is written again before its delete's tombstone arrives.
            store.commit_receipt(moved(3, a)).await.unwrap();
            let tombstones = [(a, del_a), (b, del_b)].map(|(trace, r)| crate::store::Tombstone {
                trace,
                receipt: Some(r),
            });
            store.tombstone_traces(tenant, &tombstones).await.unwrap();
            let phases = db.traces_of(tenant, &[a, b]).await.unwrap();
            assert_eq!(phases[&a].0, TracePhase::Accepted, "the later write stands");
            assert_eq!(phases[&b].0, TracePhase::Tombstoned);
            assert_eq!(store.traces_of(tenant, &[a, b]).await.unwrap(), phases);
        }
    }

    /// Past its bound the memory basis stops answering (reads go to the database), rather than
    /// answer for traces it no longer holds.
    #[tokio::test]
    async fn past_its_bound_the_memory_basis_stops_answering() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::connect(&crate::config::StorageConfig {
            url,
            memory_basis_traces: 3,
            ..Default::default()
        })
        .await
        .unwrap();
        let tenant = Uuid::new_v4();
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        assert!(store.traces_in_memory(tenant, &ids).is_some());
        for (n, id) in ids.iter().enumerate() {
            let mut w = receipt(tenant, n as i64);
            w.trace = Some(TraceWrite {
                id: *id,
                phase: TracePhase::Accepted,
                influence: AllowedInfluence::None,
                trace_type: None,
            });
            store.commit_receipt(w).await.unwrap();
        }
        assert!(store.traces_in_memory(tenant, &ids).is_none());
        assert_eq!(store.traces_of(tenant, &ids).await.unwrap().len(), 4);
        // A database with more traces than the bound starts without one.
        let again = Store::connect(&crate::config::StorageConfig {
            url: format!("sqlite://{}", dir.path().join("t.db").display()),
            memory_basis_traces: 3,
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(again.memory.is_none());
    }

    /// A trace row that does not parse does not keep the gate from starting: the basis is then
    /// read from the database.
    #[tokio::test]
    async fn a_trace_row_that_does_not_parse_leaves_the_basis_to_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::StorageConfig {
            url: format!("sqlite://{}", dir.path().join("t.db").display()),
            ..Default::default()
        };
        let store = Store::connect(&cfg).await.unwrap();
        assert!(store.memory.is_some());
        crate::with_pool!(store, write, |p, _d| {
            sqlx::query("INSERT INTO traces (tenant_id, id, phase, influence, updated_at) VALUES ('t', 'not-a-uuid', 'accepted', 'none', '')")
                .execute(p)
                .await
                .unwrap();
        });
        drop(store);
        let again = Store::connect(&cfg).await.unwrap();
        assert!(again.memory.is_none());
        assert!(again
            .traces_of(Uuid::new_v4(), &[Uuid::new_v4()])
            .await
            .unwrap()
            .is_empty());
    }
}
