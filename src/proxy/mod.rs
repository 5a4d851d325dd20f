//! The sidecar listener on Pingora. The hooks match a request against the route table and
//! hand governed requests to their handlers; policy stays in the kernel. One file per hook or
//! concern:
//!
//! - [`request_filter`]: routing: pass-through, treated read ([`read`]) or governed write ([`write`])
//! - [`body`]: reading a request body whole (cap, time bound, `Expect: 100-continue`)
//! - [`head`]: the deadline for a whole request head, below Pingora's HTTP code
//! - [`identity`]: tenant and source from config and headers, never from the body
//! - [`judge`]: a request's records judged as one batch, receipts committed with journal rows
//! - [`held`]: the exact single-record requests of held records
//! - [`answer`]: the `x-integrity-*` headers, the 202 body and the 403 problem
//! - [`upstream`] and [`relay`]: sending requests ourselves and streaming answers back
//! - [`problem`]: problem+json answers and `fail_to_proxy`
//! - [`reconcile`]: start-up reconciliation of journaled writes
//! - [`release`]: forwarding a released quarantine entry (called by the review API)
//!
//! Reads that no pack treats go through Pingora's own forwarding (`upstream_peer`); the
//! route lookup is the only extra work they get.

pub mod answer;
pub mod body;
pub mod head;
pub mod held;
pub mod identity;
pub mod judge;
pub mod problem;
pub mod read;
pub mod reconcile;
pub mod relay;
pub mod release;
pub mod request_filter;
pub mod upstream;
pub mod write;

pub use problem::write_problem;
pub use write::record_trace_id;

use crate::state::AppState;
use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::Result;
use pingora_http::RequestHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::{Arc, LazyLock};
use uuid::Uuid;

/// `limits.body_timeout_ms` in whole seconds (at least one): Pingora counts keep-alive in
/// seconds, and 0 would mean for ever.
/// Read on every proxied request: a borrowed load of the config, not an `Arc` clone.
fn idle_secs(state: &AppState) -> u64 {
    state
        .runtime
        .load()
        .config
        .limits
        .body_timeout_ms
        .div_ceil(1000)
        .max(1)
}

/// The proxy listener's connections, before Pingora's HTTP handling: admitted by
/// [`crate::admission`] (a total and a per-client-address share), a connection that sends
/// nothing is closed after `limits.body_timeout_ms`, and each request head must arrive whole
/// within `limits.head_timeout_ms` ([`head::HeadDeadline`]). Pingora waits for a new
/// connection's first bytes (looking for an h2c preface) without a time bound and bounds each
/// read of a head rather than the head, so without this guard idle or trickling connections
/// were held for ever and enough of them took every file descriptor of the process.
pub struct Guarded {
    inner: Arc<pingora_proxy::HttpProxy<GateProxy>>,
    state: Arc<AppState>,
    admission: Arc<crate::admission::Admission>,
}

#[async_trait]
impl pingora_core::apps::ServerApp for Guarded {
    async fn process_new(
        self: &Arc<Self>,
        stream: pingora_core::protocols::Stream,
        shutdown: &pingora_core::server::ShutdownWatch,
    ) -> Option<pingora_core::protocols::Stream> {
        let (max, per_client, wait, head) = {
            let rt = self.state.runtime();
            let l = &rt.config.limits;
            (
                l.max_client_connections,
                l.max_connections_per_client,
                std::time::Duration::from_millis(l.body_timeout_ms),
                std::time::Duration::from_millis(l.head_timeout_ms),
            )
        };
        // Pingora calls this again for each request of a kept-alive connection, so the
        // connection is counted while it waits for each request and while it is served.
        let _admitted = match self
            .admission
            .admit(head::peer_ip(&stream), max, per_client)
        {
            Ok(a) => a,
            Err(why) => {
                crate::metrics::CONNECTIONS_REFUSED
                    .with_label_values(&["proxy", why.label()])
                    .inc();
                return None;
            }
        };
        let mut stream = stream;
        let mut first = [0u8; 1];
        let mut stop = shutdown.clone();
        tokio::select! {
            r = tokio::time::timeout(wait, stream.try_peek(&mut first)) => match r {
                Ok(Ok(_)) => {}
                // Nothing arrived in time, or the connection failed: close it.
                _ => return None,
            },
            _ = stop.changed() => return None,
        }
        // The head's time starts with its first byte: an idle kept-alive connection is
        // bounded by the wait above, not by the head's deadline.
        let stream = head::HeadDeadline::arm(stream, head);
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// This process, as the journal knows it: start-up reconciliation judges only the rows of
/// processes that are gone.
pub static INSTANCE_ID: LazyLock<Uuid> = LazyLock::new(Uuid::new_v4);

pub struct GateProxy {
    pub state: Arc<AppState>,
}

/// Per-request state.
pub struct Ctx {
    /// Set when Pingora's own forwarding picks the upstream (pass-through requests); the
    /// requests the gate sends itself record their upstream latency where they send.
    pub started: Option<std::time::Instant>,
    /// Counts the request as in flight until Pingora drops its context (its answer written).
    _in_flight: write::RequestInFlight,
}

#[async_trait]
impl ProxyHttp for GateProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Self::CTX {
        Ctx {
            started: None,
            _in_flight: write::RequestInFlight::enter(),
        }
    }

    /// HTTP/1.1 pipelining on (Pingora's default is off: a request sent before the answer to
    /// the previous one was dropped, and the connection closed after an answer that said
    /// `keep-alive`, so a client could not tell whether its pipelined write happened). Requests
    /// are served one after the other, answers in request order (RFC 9112 §9.3.2).
    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        session.downstream_session.set_pipelining_enabled(true);
        // Shutting down: this request is answered, then its connection closes.
        if write::draining() {
            session.downstream_session.set_keepalive(None);
            return Ok(());
        }
        // An HTTP/1.1 connection kept alive waits for its next request at most as long as a
        // body may take (Pingora's default after a request is to wait for ever).
        let idle = idle_secs(&self.state);
        match session.downstream_session.get_keepalive() {
            Some(t) if t == 0 || t > idle => session.downstream_session.set_keepalive(Some(idle)),
            _ => {}
        }
        Ok(())
    }

    /// Governed writes and treated reads are answered here (`Ok(true)`); everything else
    /// continues to `upstream_peer`.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        request_filter::request_filter(self, session, ctx).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        ctx.started = Some(std::time::Instant::now());
        let rt = self.state.runtime.load();
        let entry = upstream::peer(&rt.config.upstream)?;
        Ok(Box::new(entry.1.clone()))
    }

    /// Pass-through requests get the configured `Host`, when there is one.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        let rt = self.state.runtime.load();
        if let Some(h) = &rt.config.upstream.host_header {
            upstream_request.insert_header(http::header::HOST, h.as_str())?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora_core::Error,
        _ctx: &mut Self::CTX,
    ) -> FailToProxy {
        problem::fail_to_proxy(session, e).await
    }

    async fn logging(
        &self,
        session: &mut Session,
        _e: Option<&pingora_core::Error>,
        ctx: &mut Self::CTX,
    ) {
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let class = upstream::status_class(status);
        crate::metrics::HTTP_REQUESTS
            .with_label_values(&["proxy", class])
            .inc();
        if let Some(t) = ctx.started {
            crate::metrics::UPSTREAM
                .with_label_values(&[class])
                .observe(t.elapsed().as_secs_f64());
        }
    }
}

/// The configured upstream as a Pingora peer, with its timeouts (resolved once per config).
/// Panics never: an address that does not resolve gives a peer for `0.0.0.0:0`, which fails
/// to connect (a 502).
pub fn upstream_peer(u: &crate::config::UpstreamConfig) -> HttpPeer {
    match upstream::peer(u) {
        Ok(e) => e.1.clone(),
        Err(_) => HttpPeer::new(
            std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            false,
            String::new(),
        ),
    }
}

/// Pingora's shutdown is driven by our own signal handling (one place for SIGTERM). When it
/// fires, and before Pingora is told (it then drops its runtime and every task on it), the
/// requests in flight (governed writes, reads, pass-through requests) get up to the grace
/// period to be answered, and the group committer, which runs on this runtime, commits what
/// the writes queued (their journal settles).
struct WatchShutdown {
    signal: tokio::sync::watch::Receiver<bool>,
    state: Arc<AppState>,
    grace: std::time::Duration,
}

#[async_trait]
impl ShutdownSignalWatch for WatchShutdown {
    async fn recv(&self) -> ShutdownSignal {
        let mut rx = self.signal.clone();
        while !*rx.borrow() {
            if rx.changed().await.is_err() {
                break;
            }
        }
        write::requests_done(self.grace).await;
        let flushed =
            tokio::time::timeout(std::time::Duration::from_secs(5), self.state.store.flush()).await;
        if flushed.is_err() {
            tracing::error!("shutdown: the group committer did not finish within 5 s");
        }
        ShutdownSignal::GracefulTerminate
    }
}

/// Starts the proxy listener on its own threads; returns when it has stopped.
pub fn run(
    state: Arc<AppState>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::thread::JoinHandle<()> {
    let rt = state.runtime();
    let addr = rt.config.listeners.proxy.clone();
    let threads = rt.config.listeners.proxy_threads;
    let grace = rt.config.service.shutdown_timeout_secs;
    std::thread::Builder::new()
        .name("proxy".into())
        .spawn(move || {
            let conf = ServerConf {
                threads,
                grace_period_seconds: Some(0),
                graceful_shutdown_timeout_seconds: Some(grace),
                upstream_keepalive_pool_size: 256,
                ..ServerConf::default()
            };
            let mut server = Server::new_with_opt_and_conf(None, conf);
            server.bootstrap();
            let watch = WatchShutdown {
                signal: shutdown,
                state: state.clone(),
                grace: std::time::Duration::from_secs(grace),
            };
            let mut proxy = pingora_proxy::HttpProxy::new(
                GateProxy {
                    state: state.clone(),
                },
                server.configuration.clone(),
            );
            proxy.handle_init_modules();
            // non_exhaustive: start from the default and turn on h2c.
            let mut opts = pingora_core::apps::HttpServerOptions::default();
            opts.h2c = true;
            proxy.server_options = Some(opts);
            let app = Guarded {
                inner: Arc::new(proxy),
                state,
                admission: crate::admission::Admission::new(),
            };
            let mut svc = pingora_core::services::listening::Service::new(
                "Pingora HTTP Proxy Service".to_string(),
                app,
            );
            svc.add_tcp(&addr);
            server.add_service(svc);
            server.run(RunArgs {
                shutdown_signal: Box::new(watch),
            });
        })
        .expect("spawning the proxy thread")
}
