//! `serve`: load and validate the config, open storage (migrating it), start
//! the api, proxy and metrics listeners and the workers, and shut down in
//! order on SIGTERM / SIGINT: stop accepting, let in-flight requests finish
//! (bounded), stop the workers claiming, close storage.

use crate::config::{self, Loaded};
use crate::state::{AppState, Runtime};
use crate::store::Store;
use axum::routing::get;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Installs the tracing subscriber: JSON or text, with a reloadable level filter.
pub fn init_logging(cfg: &config::LoggingConfig) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let result = if cfg.format == "text" {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    if result.is_ok() {
        let _ = config::reload::LOG_FILTER.set(handle);
    }
}

/// Loads a config or returns its problems as printable lines.
pub fn load_or_report(path: &Path) -> Result<Loaded, Vec<String>> {
    config::load(path).map_err(|ps| ps.iter().map(|p| p.to_string()).collect())
}

/// Builds the whole application state (used by `serve` and by tests).
pub async fn build_state(path: &Path) -> Result<Arc<AppState>, String> {
    let loaded = load_or_report(path).map_err(|p| p.join("\n"))?;
    let store = Store::connect(&loaded.config.storage)
        .await
        .map_err(|e| e.to_string())?;
    let runtime = Runtime::build(loaded, None)?;
    let state = AppState::new(runtime, Arc::new(store), Some(path.to_path_buf()));
    state
        .record_coefficient_versions()
        .await
        .map_err(|e| e.to_string())?;
    Ok(state)
}

pub async fn serve(path: &Path) -> Result<(), String> {
    let loaded = load_or_report(path).map_err(|p| format!("invalid config:\n{}", p.join("\n")))?;
    init_logging(&loaded.config.logging);
    crate::metrics::init();
    let state = build_state(path).await?;
    let rt = state.runtime();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);

    let api = TcpListener::bind(&rt.config.listeners.api)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", rt.config.listeners.api))?;
    let metrics = TcpListener::bind(&rt.config.listeners.metrics)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", rt.config.listeners.metrics))?;
    // Pingora binds inside its thread and exits the process when it cannot:
    // check the proxy address first so the error is ours and readable.
    drop(
        std::net::TcpListener::bind(&rt.config.listeners.proxy)
            .map_err(|e| format!("cannot listen on {}: {e}", rt.config.listeners.proxy))?,
    );

    let api_task = tokio::spawn(serve_bounded(
        "api",
        api,
        crate::api::router(state.clone()),
        state.clone(),
        shutdown_rx.clone(),
    ));
    let metrics_router = axum::Router::new().route(
        "/metrics",
        get(|| async {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                crate::metrics::render(),
            )
        }),
    );
    tokio::spawn(serve_bounded(
        "metrics",
        metrics,
        metrics_router,
        state.clone(),
        shutdown_rx.clone(),
    ));

    crate::proxy::release::register_repair_hook();
    let proxy_thread = crate::proxy::run(state.clone(), shutdown_rx.clone());
    crate::workers::spawn(state.clone(), shutdown_rx.clone());
    config::reload::spawn(state.clone(), shutdown_rx.clone());
    if !rt.sealer.seals() {
        tracing::warn!("held writes keep the store credentials they were sent with unsealed in the database; set storage.credentials_key_file to seal them");
    }
    tracing::info!(api = %rt.config.listeners.api, proxy = %rt.config.listeners.proxy, metrics = %rt.config.listeners.metrics, storage = state.store.dialect().name, version = %rt.version, "substrate-gate serving");

    wait_for_stop_signal().await;
    tracing::info!("shutting down: no new connections; finishing in-flight requests");
    let bound = Duration::from_secs(state.runtime().config.service.shutdown_timeout_secs);
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(bound, api_task).await;
    let _ = tokio::time::timeout(
        bound + Duration::from_secs(1),
        tokio::task::spawn_blocking(move || proxy_thread.join()),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), state.store.flush()).await;
    state.store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Serves a listener (api, metrics) as `axum::serve` does, plus what it leaves unset: a bound on the time
/// a client may take to send a whole request head (`limits.head_timeout_ms`, read per
/// connection so a reload applies to new ones) and the connection shares of [`crate::admission`]. Without it a client trickling header bytes (slowloris), or an
/// idle keep-alive connection, held a connection and its file descriptor for ever. On shutdown
/// no connection is accepted any more, in-flight requests finish, and this returns when the last
/// connection has closed.
async fn serve_bounded(
    name: &'static str,
    listener: TcpListener,
    router: axum::Router,
    state: Arc<AppState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    let (open_tx, _) = tokio::sync::watch::channel(());
    let admission = crate::admission::Admission::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "api accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        };
        let _ = stream.set_nodelay(true);
        let (head_timeout, max, per_client) = {
            let rt = state.runtime();
            let l = &rt.config.limits;
            (
                Duration::from_millis(l.head_timeout_ms),
                l.max_client_connections,
                l.max_connections_per_client,
            )
        };
        let admitted = match admission.admit(Some(peer.ip()), max, per_client) {
            Ok(a) => a,
            Err(why) => {
                crate::metrics::CONNECTIONS_REFUSED
                    .with_label_values(&[name, why.label()])
                    .inc();
                drop(stream);
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let mut conn_stop = stop.clone();
        let open = open_tx.subscribe();
        tokio::spawn(async move {
            // HTTP/1 only, and without protocol sniffing: the auto builder's first read (looking
            // for an HTTP/2 preface) has no time bound of its own.
            let mut builder = Builder::new(TokioExecutor::new()).http1_only();
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(head_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let mut draining = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = async { let _ = conn_stop.wait_for(|s| *s).await; }, if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open);
            drop(admitted);
        });
    }
    drop(listener);
    open_tx.closed().await;
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    tokio::select! {
        _ = async { if let Some(s) = term.as_mut() { s.recv().await; } else { std::future::pending::<()>().await } } => {}
        _ = async { if let Some(s) = int.as_mut() { s.recv().await; } else { std::future::pending::<()>().await } } => {}
    }
}
