//! Storage: the one repository layer the rest of the code calls. SQLite (the
//! embedded default: WAL, one writer connection so writes never fight over
//! the lock, a pool of readers) or PostgreSQL (a fleet sharing one database).
//! The SQL text is the same for both; where a dialect differs, `Dialect` says so.

#[macro_use]
mod receipts;
mod group;
mod operations;
mod proxy;
pub use operations::*;
pub use proxy::*;
pub use receipts::*;

use crate::config::StorageConfig;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
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

pub struct Store {
    pub backend: Backend,
    /// The group committer of proxied receipts (see [`group`]).
    group: Option<group::Queue>,
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
                .foreign_keys(true);
            let path = opts.get_filename().to_path_buf();
            if let Some(dir) = path.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
            let write = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(acquire)
                .connect_with(opts.clone())
                .await?;
            SQLITE_MIGRATOR
                .run(&write)
                .await
                .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
            let read = SqlitePoolOptions::new()
                .max_connections(cfg.max_connections.max(2))
                .acquire_timeout(acquire)
                .connect_with(opts)
                .await?;
            Backend::Sqlite { write, read }
        } else {
            let opts = PgConnectOptions::from_str(&url)
                .map_err(|e| StoreError::Unavailable(format!("bad postgres url: {e}")))?;
            let pool = PgPoolOptions::new()
                .max_connections(cfg.max_connections)
                .acquire_timeout(acquire)
                .connect_with(opts)
                .await?;
            // Several gates may start at once against one database: migrations
            // take sqlx's advisory lock, so exactly one applies them.
            POSTGRES_MIGRATOR
                .run(&pool)
                .await
                .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
            Backend::Postgres(pool)
        };
        let group = group::spawn(Store {
            backend: backend.clone(),
            group: None,
        });
        Ok(Store {
            backend,
            group: Some(group),
        })
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
        if let Some(q) = &self.group {
            group::flush(q).await;
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
