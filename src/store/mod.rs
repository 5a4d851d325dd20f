//! Storage: the one repository layer the rest of the code calls. SQLite (the
//! embedded default: WAL, one writer connection so writes never fight over
//! the lock, a pool of readers) or PostgreSQL (a fleet sharing one database).
//! The SQL text is the same for both; where a dialect differs, `Dialect` says so.

#[macro_use]
mod receipts;
mod basis;
mod group;
mod memory;
mod operations;
mod proxy;
#[cfg(test)]
pub(crate) mod testing;
pub use operations::*;
pub use proxy::*;
pub use receipts::*;

use crate::config::StorageConfig;
use crate::kernel::types::{AllowedInfluence, TracePhase};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or answered with an error: writes fail closed (503).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A uniqueness rule was hit (e.g. two writers raced for the same key).
    #[error("storage conflict: {0}")]
    Conflict(String),
    /// Stored data could not be read back as expected.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            if db.is_unique_violation() {
                return StoreError::Conflict(db.message().to_string());
            }
        }
        StoreError::Unavailable(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// SQL that differs between the backends.
pub struct Dialect {
    pub name: &'static str,
    /// Appended to a SELECT that must lock the rows it reads (PostgreSQL);
    /// SQLite has one writer, so it needs none.
    pub for_update: &'static str,
    pub skip_locked: &'static str,
}

pub const SQLITE: Dialect = Dialect {
    name: "sqlite",
    for_update: "",
    skip_locked: "",
};
pub const POSTGRES: Dialect = Dialect {
    name: "postgres",
    for_update: " FOR UPDATE",
    skip_locked: " FOR UPDATE SKIP LOCKED",
};

#[derive(Clone)]
pub enum Backend {
    Sqlite { write: SqlitePool, read: SqlitePool },
    Postgres(PgPool),
}

#[derive(Clone)]
pub struct Store {
    pub backend: Backend,
    /// The group committer of proxied receipts and the coalescing reader of their bases.
    batchers: Option<Arc<Batchers>>,
    /// The state basis kept in memory (SQLite; see [`memory`]).
    memory: Option<Arc<memory::MemoryBasis>>,
}

/// The group committer (see [`group`]) and the basis reader (see [`basis`]): their queues, and
/// until [`Store::start_batchers`] runs them on the caller's runtime, their inboxes. Before
/// that, every caller reads and commits on its own (same results, no batching).
struct Batchers {
    group: group::Queue,
    basis: basis::Queue,
    idle: std::sync::Mutex<Option<(Store, group::Inbox, basis::Inbox)>>,
    started: std::sync::atomic::AtomicBool,
}

/// Runs `$body` with `$p` bound to the pool for reads (or writes) and `$d` to
/// the backend's [`Dialect`]. The body is type-checked once per backend, so
/// the same query code serves both.
#[macro_export]
macro_rules! with_pool {
    ($store:expr, read, |$p:ident, $d:ident| $body:expr) => {
        match &$store.backend {
            $crate::store::Backend::Sqlite { read, .. } => {
                let $p = read;
                let $d = &$crate::store::SQLITE;
                let _ = $d;
                $body
            }
            $crate::store::Backend::Postgres(pool) => {
                let $p = pool;
                let $d = &$crate::store::POSTGRES;
                let _ = $d;
                $body
            }
        }
    };
    ($store:expr, write, |$p:ident, $d:ident| $body:expr) => {
        match &$store.backend {
            $crate::store::Backend::Sqlite { write, .. } => {
                let $p = write;
                let $d = &$crate::store::SQLITE;
                let _ = $d;
                $body
            }
            $crate::store::Backend::Postgres(pool) => {
                let $p = pool;
                let $d = &$crate::store::POSTGRES;
                let _ = $d;
                $body
            }
        }
    };
}

/// A new id for a row written on the hot path (signals, receipts, journal rows, requests):
/// UUIDv7, time-ordered, so each insert lands at the right edge of its indexes instead of on a
/// random page of them (a write then dirties a page or two per index per group commit, not
/// one per row). Still unguessable (random bits follow the timestamp); the millisecond it
/// carries is already in the row.
pub fn new_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

/// Current time as fixed-width RFC 3339 UTC (sorts as text in both backends).
pub fn now() -> String {
    ts(chrono::Utc::now())
}

pub fn ts(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl Store {
    /// Connects (creating a SQLite file and its directory on first start) and applies migrations.
    pub async fn connect(cfg: &StorageConfig) -> Result<Store> {
        let url = cfg.resolved_url().map_err(StoreError::Unavailable)?;
        let acquire = Duration::from_secs(3);
        let mut memory = None;
        let backend = if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(&url)
                .map_err(|e| StoreError::Unavailable(format!("bad sqlite url: {e}")))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(if cfg.sqlite_synchronous == "full" {
                    SqliteSynchronous::Full
                } else {
                    SqliteSynchronous::Normal
                })
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
                // SQLite's default page cache is 2 MiB per connection: the indexes of a busy
                // journal outgrow it at once, and every miss is a read() of a page the OS already
                // holds. 16 MiB per connection (it fills only as pages are used), and the file
                // mapped for reads (page cache shared with the OS, not copied).
                .pragma("cache_size", "-16384")
                .pragma("mmap_size", "0")
                .pragma("temp_store", "memory")
                // Checkpoints run beside the writer (see `checkpointer`), not inside the commit
                // that happens to cross the threshold; this is the backstop if they fall behind
                // (64 MiB of log), and the log file is cut back to that size once checkpointed.
                .pragma("wal_autocheckpoint", "16384")
                .pragma("journal_size_limit", "67108864")
                // Group commits insert 1..512 rows per statement: each row count is its own
                // prepared statement, and evicting them means parsing a 1,000-bind INSERT again.
                .statement_cache_capacity(1024);
            let path = opts.get_filename().to_path_buf();
            if let Some(dir) = path.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
            // An embedded connection has no network to fail: sqlx's ping before every acquire
            // is a round trip to the connection's thread for nothing.
            let write = SqlitePoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .acquire_timeout(acquire)
                .connect_with(opts.clone())
                .await?;
            SQLITE_MIGRATOR
                .run(&write)
                .await
                .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
            let checkpoint_opts = opts.clone();
            let read = SqlitePoolOptions::new()
                .max_connections(cfg.max_connections.max(2))
                .test_before_acquire(false)
                .acquire_timeout(acquire)
                .connect_with(opts)
                .await?;
            tokio::spawn(checkpointer(read.clone(), checkpoint_opts));
            memory = memory::MemoryBasis::load(&write, cfg.memory_basis_traces)
                .await?
                .map(Arc::new);
            Backend::Sqlite { write, read }
        } else {
            let opts = PgConnectOptions::from_str(&url)
                .map_err(|e| StoreError::Unavailable(format!("bad postgres url: {e}")))?;
            // Several gates may start at once against one database: migrations
            // take sqlx's advisory lock, so exactly one applies them (and the others
            // wait for it as long as it takes: this connection has no lock timeout).
            let migrating = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(acquire)
                .connect_with(opts.clone())
                .await?;
            POSTGRES_MIGRATOR
                .run(&migrating)
                .await
                .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
            migrating.close().await;
            // A write waits at most 5 s for a lock (as SQLite's busy timeout): a row held by
            // another session (a gate of the fleet frozen mid-transaction, a manual `SELECT ...
            // FOR UPDATE`) fails the write closed (503) instead of holding its client without
            // bound and landing long after the client gave up. A transaction left idle for
            // 30 s (its gate frozen or partitioned away) is ended by the server, releasing
            // what it held for the rest of the fleet.
            let opts = opts.options([
                ("lock_timeout", "5s"),
                ("idle_in_transaction_session_timeout", "30s"),
            ]);
            let pool = PgPoolOptions::new()
                .max_connections(cfg.max_connections)
                .acquire_timeout(acquire)
                .connect_with(opts)
                .await?;
            Backend::Postgres(pool)
        };
        let (group, group_inbox) = group::channel();
        let (basis, basis_inbox) = basis::channel();
        let unbatched = Store {
            backend: backend.clone(),
            batchers: None,
            memory: memory.clone(),
        };
        Ok(Store {
            backend,
            memory,
            batchers: Some(Arc::new(Batchers {
                group,
                basis,
                idle: std::sync::Mutex::new(Some((unbatched, group_inbox, basis_inbox))),
                started: std::sync::atomic::AtomicBool::new(false),
            })),
        })
    }

    /// Runs the group committer and the basis reader on the current runtime (the first call
    /// does; later ones return at once). The proxy calls this from its own threads: a batch
    /// is then a task wake-up away from the writes that fill it, not a thread wake-up (~10%
    /// more proxied writes per second, measured), and the proxy drains the queue before its
    /// runtime ends (see `proxy::run`). Until then everyone reads and commits unbatched.
    pub fn start_batchers(&self) {
        let Some(b) = &self.batchers else { return };
        if b.started.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut idle = b.idle.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((store, group_inbox, basis_inbox)) = idle.take() {
            let again = Store {
                backend: store.backend.clone(),
                batchers: None,
                memory: store.memory.clone(),
            };
            group::start(store, group_inbox);
            basis::start(again, basis_inbox);
            b.started.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// For a commit that writes traces or receipts: held from before it takes the writer
    /// connection until [`Store::applied`], so the memory basis moves in commit order.
    async fn basis_order(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.memory {
            Some(m) => Some(m.order.lock().await),
            None => None,
        }
    }

    /// Runs a commit that moves the memory basis in a task of its own, so that it runs to its
    /// end (its change applied in memory) even if the caller's future is dropped: a client that
    /// goes away while its commit is at the connection thread must not leave memory behind the
    /// database. Without a memory basis the commit runs in the caller's future.
    async fn to_completion<T, F>(&self, commit: impl FnOnce(Store) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        if self.memory.is_none() {
            return commit(self.clone()).await;
        }
        tokio::spawn(commit(self.clone()))
            .await
            .map_err(|e| StoreError::Unavailable(format!("a commit task failed: {e}")))?
    }

    /// A commit's changes, applied to the memory basis (under [`Store::basis_order`]).
    fn applied(&self, c: &memory::Changes) {
        if let Some(m) = &self.memory {
            if !c.is_empty() {
                m.apply(c);
            }
        }
    }

    /// The phase and influence of traces, from memory when it holds them.
    fn traces_in_memory(
        &self,
        tenant: uuid::Uuid,
        ids: &[uuid::Uuid],
    ) -> Option<std::collections::HashMap<uuid::Uuid, (TracePhase, AllowedInfluence)>> {
        self.memory.as_ref().and_then(|m| m.traces(tenant, ids))
    }

    /// A source's record over the last [`memory::SOURCE_WINDOW`] receipts from memory, read
    /// once from the database (under the commit order, so no commit falls between the read and
    /// its keeping). `None`: no memory basis, or another window.
    async fn source_in_memory(
        &self,
        tenant: uuid::Uuid,
        source: &str,
        window: i64,
    ) -> Result<Option<(u32, u32)>> {
        let Some(m) = &self.memory else {
            return Ok(None);
        };
        if window != memory::SOURCE_WINDOW as i64 || !m.enabled() {
            return Ok(None);
        }
        if let Some(h) = m.source(tenant, source) {
            return Ok(Some(h));
        }
        let _order = m.order.lock().await;
        if let Some(h) = m.source(tenant, source) {
            return Ok(Some(h));
        }
        let flags = self.source_flags(tenant, source, window).await?;
        m.keep_source(tenant, source, &flags);
        Ok(Some(receipts::source_record(&flags)))
    }

    /// The batchers, once started.
    fn batchers(&self) -> Option<&Batchers> {
        self.batchers
            .as_deref()
            .filter(|b| b.started.load(std::sync::atomic::Ordering::Acquire))
    }

    pub fn dialect(&self) -> &'static Dialect {
        match self.backend {
            Backend::Sqlite { .. } => &SQLITE,
            Backend::Postgres(_) => &POSTGRES,
        }
    }

    /// Readiness: can we run a query now?
    pub async fn ping(&self) -> bool {
        let fut = async {
            with_pool!(self, write, |p, _d| sqlx::query("SELECT 1")
                .execute(p)
                .await
                .is_ok())
        };
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .unwrap_or(false)
    }

    /// Commits what the group committer holds (graceful shutdown: journal settles queued by
    /// the last requests are written before the pools close).
    pub async fn flush(&self) {
        if let Some(b) = self.batchers() {
            group::flush(&b.group).await;
        }
    }

    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite { write, read } => {
                read.close().await;
                write.close().await;
            }
            Backend::Postgres(p) => p.close().await,
        }
    }
}

/// How often the SQLite write-ahead log is copied back into the database while it grows, and
/// while it does not.
const CHECKPOINT_BUSY: Duration = Duration::from_millis(10);
const CHECKPOINT_IDLE: Duration = Duration::from_millis(100);

/// Checkpoints the SQLite WAL on a connection of its own, beside the writer: a PASSIVE
/// checkpoint copies what it can without blocking anyone, so the commit that crosses the
/// auto-checkpoint threshold no longer pays for copying and syncing the whole log.
///
/// Often, while the log grows: a checkpoint ends with an fsync of the log and of the database,
/// and while a big one runs the writer's appends to the log wait behind it (pages under
/// writeback). Under 32 connections of proxied writes, every 100 ms gave a p99 of 31–35 ms;
/// every 10 ms, 16–17 ms and ~10% more writes per second (see docs/performance.md). At
/// rest (the log did not change since the last one) every 100 ms. Its own connection, not one
/// of the read pool's: a hundred checkpoints a second would take a reader from the API, and
/// sqlx pings a pooled connection at every release. Ends when the read pool closes.
async fn checkpointer(read: SqlitePool, opts: SqliteConnectOptions) {
    use sqlx::Connection;
    let mut conn: Option<sqlx::SqliteConnection> = None;
    let mut last_log = -1i64;
    let mut wait = CHECKPOINT_IDLE;
    loop {
        tokio::time::sleep(wait).await;
        wait = CHECKPOINT_IDLE;
        if read.is_closed() {
            if let Some(c) = conn.take() {
                let _ = c.close().await;
            }
            return;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match sqlx::SqliteConnection::connect_with(&opts).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    tracing::warn!(error = %e, "WAL checkpointer cannot connect; the writer's auto-checkpoint remains");
                    continue;
                }
            },
        };
        let done: std::result::Result<(i64, i64, i64), sqlx::Error> =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(&mut *c)
                .await;
        match done {
            Ok((_, log, _)) => {
                if log != last_log {
                    wait = CHECKPOINT_BUSY;
                }
                last_log = log;
            }
            Err(e) => {
                tracing::warn!(error = %e, "WAL checkpoint failed; the writer's auto-checkpoint remains");
                conn = None;
            }
        }
    }
}
