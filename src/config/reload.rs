//! Hot reload: on SIGHUP or a change in the config's directory (or an
//! included file's / filter pack's), build and validate the whole new
//! runtime first, then swap it in with one atomic store. A bad config
//! changes nothing: the error is logged with its path and counted.
//! Directories are watched, not files, so a Kubernetes ConfigMap's symlink
//! swap (`..data` → new dir) is seen.

use crate::state::{AppState, Runtime};
use crate::store::EventWrite;
use notify::{RecursiveMode, Watcher};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

type FilterHandle =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set once at start-up so reloads can change the log level.
pub static LOG_FILTER: OnceLock<FilterHandle> = OnceLock::new();

/// Outcome of one reload attempt.
#[derive(Debug)]
pub enum Reloaded {
    Swapped { version: String },
    Unchanged,
    Refused(Vec<String>),
}

/// Reloads from the config path now. Safe to call concurrently: each call
/// builds its own runtime and the last successful store wins.
pub async fn reload(state: &AppState) -> Reloaded {
    let Some(path) = state.config_path.clone() else {
        return Reloaded::Unchanged;
    };
    let old = state.runtime();
    let built = tokio::task::spawn_blocking(move || {
        let mut loaded = crate::config::load(&path)
            .map_err(|ps| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>())?;
        if let Some(problem) = drops_governance(&old.config, &loaded.config) {
            return Err(vec![problem]);
        }
        for key in keep_restart_only(&old.config, &mut loaded.config) {
            tracing::warn!(
                key,
                "config reload: this setting only changes at a restart; the running value stays"
            );
        }
        Runtime::build(loaded, Some(&old)).map_err(|e| vec![e])
    })
    .await
    .unwrap_or_else(|e| Err(vec![format!("reload task failed: {e}")]));
    match built {
        Err(problems) => {
            crate::metrics::RELOADS.with_label_values(&["failed"]).inc();
            for p in &problems {
                tracing::error!(problem = %p, "config reload refused; the running config stays");
            }
            emit(state, "config.reload_failed", json!({"problems": problems})).await;
            Reloaded::Refused(problems)
        }
        Ok(rt) => {
            let version = rt.version.clone();
            if version == state.runtime().version {
                return Reloaded::Unchanged;
            }
            if let Some(h) = LOG_FILTER.get() {
                if let Ok(f) = tracing_subscriber::EnvFilter::try_new(&rt.config.logging.level) {
                    let _ = h.reload(f);
                }
            }
            state.runtime.store(Arc::new(rt));
            crate::metrics::RELOADS.with_label_values(&["ok"]).inc();
            crate::metrics::set_config_version(&version);
            if let Err(e) = state.record_coefficient_versions().await {
                tracing::warn!(error = %e, "could not record coefficient versions after reload");
            }
            tracing::info!(version = %version, "config reloaded");
            emit(state, "config.reloaded", json!({"version": version})).await;
            Reloaded::Swapped { version }
        }
    }
}

/// A reload may not turn governance off: a file that lost every tenant, every API key or every
/// filter pack (an editor's half-written save, an empty ConfigMap key, a broken template) is
/// refused, not applied. Running without them takes a restart, where the operator sees what
/// starts.
fn drops_governance(
    running: &crate::config::Config,
    new: &crate::config::Config,
) -> Option<String> {
    if !running.tenants.is_empty() && new.tenants.is_empty() {
        return Some(
            "the new config names no tenant (the running one has some): a reload may not remove \
             every tenant; restart the gate to run without any"
                .into(),
        );
    }
    let keys =
        |c: &crate::config::Config| c.tenants.iter().map(|t| t.api_keys.len()).sum::<usize>();
    if keys(running) > 0 && keys(new) == 0 {
        return Some(
            "the new config names no API key (the running one has some): a reload may not lock \
             every caller out of the API; restart the gate to run without keys"
                .into(),
        );
    }
    if !running.proxy.packs.is_empty() && new.proxy.packs.is_empty() {
        return Some(
            "the new config names no filter pack (the running one has some): a reload may not \
             stop governing every proxied write; restart the gate to run without packs"
                .into(),
        );
    }
    None
}

/// Settings that only take effect at start-up (the listeners' addresses and threads, the
/// database): the new config keeps the running values, so the runtime, its version and the
/// `config_info` metric describe what runs. Returns the keys that differed.
fn keep_restart_only(
    running: &crate::config::Config,
    new: &mut crate::config::Config,
) -> Vec<&'static str> {
    let mut kept = Vec::new();
    let l = (&running.listeners, &mut new.listeners);
    if l.0.api != l.1.api {
        kept.push("listeners.api");
    }
    if l.0.proxy != l.1.proxy {
        kept.push("listeners.proxy");
    }
    if l.0.metrics != l.1.metrics {
        kept.push("listeners.metrics");
    }
    if l.0.proxy_threads != l.1.proxy_threads {
        kept.push("listeners.proxy_threads");
    }
    *l.1 = l.0.clone();
    if running.storage != new.storage {
        kept.push("storage");
        new.storage = running.storage.clone();
    }
    // The log format is the subscriber's, set up once; the level reloads.
    if running.logging.format != new.logging.format {
        kept.push("logging.format");
        new.logging.format = running.logging.format.clone();
    }
    kept
}

async fn emit(state: &AppState, name: &str, data: serde_json::Value) {
    let rt = state.runtime();
    for t in rt.tenants.keys() {
        if let Err(e) = state
            .store
            .enqueue_events(
                *t,
                &[EventWrite {
                    name: name.into(),
                    data: data.clone(),
                }],
            )
            .await
        {
            tracing::warn!(error = %e, event = name, "could not queue config event");
        }
    }
}

/// Fingerprint of every file the config was built from (content, not mtime).
fn fingerprint(files: &[PathBuf]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update(f.to_string_lossy().as_bytes());
        h.update(std::fs::read(f).unwrap_or_default());
    }
    hex::encode(h.finalize())
}

/// The files a runtime was built from, as absolute paths (the watcher's events name absolute
/// paths), and the directories holding them.
fn watched(files: &[PathBuf]) -> (BTreeSet<PathBuf>, BTreeSet<PathBuf>) {
    let files: BTreeSet<PathBuf> = files
        .iter()
        .filter_map(|f| std::path::absolute(f).ok())
        .collect();
    let dirs = files
        .iter()
        .filter_map(|f| f.parent().map(PathBuf::from))
        .collect();
    (files, dirs)
}

/// Whether a watcher event concerns the config: one of its files, or a Kubernetes ConfigMap's
/// atomic swap (its `..data` link and `..<timestamp>` directories) in a watched directory.
/// Other files there (a database, a log) change all the time and are not the config's.
fn concerns_config(event: &notify::Event, files: &BTreeSet<PathBuf>) -> bool {
    event.paths.iter().any(|p| {
        files.contains(p)
            || p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".."))
    })
}

/// How long the config's files must stay unchanged before a reload reads them: an editor or a
/// tool that writes a file in pieces is read once it has finished, not half-way.
const QUIET: Duration = Duration::from_millis(300);
/// The longest a stream of changes delays a reload.
const QUIET_AT_MOST: Duration = Duration::from_secs(3);

/// Spawns the SIGHUP handler and the directory watcher. Both funnel into one
/// debounced reload loop. The watched files and directories follow the running config: a pack
/// a reload adds (in a directory of its own, too) is watched from then on.
pub fn spawn(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let tx = tx.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = tx.try_send(());
            }
        });
    }
    let watch_enabled = state.runtime().config.service.watch && state.config_path.is_some();
    let (files, mut dirs) = watched(&state.runtime().files);
    let files = Arc::new(std::sync::RwLock::new(files));
    let mut watcher = None;
    if watch_enabled {
        let tx = tx.clone();
        let of_config = files.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            let files = of_config.read().unwrap_or_else(|e| e.into_inner());
            if concerns_config(&event, &files) {
                let _ = tx.try_send(());
            }
        };
        match notify::recommended_watcher(handler) {
            Ok(mut w) => {
                for d in &dirs {
                    if let Err(e) = w.watch(d, RecursiveMode::NonRecursive) {
                        tracing::warn!(dir = %d.display(), error = %e, "cannot watch config directory; SIGHUP still reloads");
                    }
                }
                watcher = Some(w);
            }
            Err(e) => tracing::warn!(error = %e, "file watching unavailable; SIGHUP still reloads"),
        }
    }
    tokio::spawn(async move {
        // A config that was refused is not re-validated until its files change.
        let mut last_refused: Option<String> = None;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                got = rx.recv() => if got.is_none() { break },
            }
            // Debounce: editors and ConfigMap swaps touch several files at once, and a file
            // written in pieces is read once it has been quiet for a moment.
            let until = tokio::time::Instant::now() + QUIET_AT_MOST;
            loop {
                tokio::time::sleep(QUIET).await;
                let mut more = false;
                while rx.try_recv().is_ok() {
                    more = true;
                }
                if !more || tokio::time::Instant::now() >= until {
                    break;
                }
            }
            let fp = fingerprint(&state.runtime().files);
            if last_refused.as_deref() == Some(fp.as_str()) {
                continue;
            }
            last_refused = match reload(&state).await {
                Reloaded::Refused(_) => Some(fp),
                Reloaded::Swapped { .. } => {
                    // Follow the new config's files: watch the directories it added.
                    let (now_files, now_dirs) = watched(&state.runtime().files);
                    if let Some(w) = watcher.as_mut() {
                        for d in now_dirs.difference(&dirs) {
                            if let Err(e) = w.watch(d, RecursiveMode::NonRecursive) {
                                tracing::warn!(dir = %d.display(), error = %e, "cannot watch config directory; SIGHUP still reloads");
                            }
                        }
                    }
                    *files.write().unwrap_or_else(|e| e.into_inner()) = now_files;
                    dirs.extend(now_dirs);
                    None
                }
                Reloaded::Unchanged => {
                    tracing::info!("config reload: nothing changed");
                    None
                }
            };
        }
    });
}
