//! Talking to the upstream store ourselves, for the requests Pingora's own forwarding cannot
//! carry: a write read whole in `request_filter` (Pingora 0.9.1 does not re-inject a body
//! consumed there), a treated read whose answer is rewritten, a quarantine release and a
//! start-up readback. HTTP/1.1 over Pingora's transport connector, with its keep-alive pool,
//! the configured timeouts, one retry when a pooled connection turns out to be stale, and
//! a fresh `Content-Length` on every request body.

use crate::config::UpstreamConfig;
use arc_swap::ArcSwapOption;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use pingora_core::connectors::{ConnectorOptions, TransportConnector};
use pingora_core::protocols::http::v1::client::HttpSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_core::RetryType;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use std::net::ToSocketAddrs;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Idle upstream connections kept per connector.
const POOL_SIZE: usize = 256;

/// The proxy's connector (used from Pingora's threads).
pub static PROXY: LazyLock<TransportConnector> =
    LazyLock::new(|| TransportConnector::new(Some(ConnectorOptions::new(POOL_SIZE))));
/// The connector of the API listener and the workers (their own runtime, their own pool).
pub static SERVICE: LazyLock<TransportConnector> =
    LazyLock::new(|| TransportConnector::new(Some(ConnectorOptions::new(32))));

static PEER: ArcSwapOption<(UpstreamConfig, HttpPeer)> = ArcSwapOption::const_empty();

/// The configured upstream as a Pingora peer, with its timeouts. The address is resolved once
/// per configuration (not per request); a name that does not resolve is an upstream error.
pub fn peer(u: &UpstreamConfig) -> Result<Arc<(UpstreamConfig, HttpPeer)>> {
    if let Some(p) = PEER.load_full() {
        if p.0 == *u {
            return Ok(p);
        }
    }
    let addr = u
        .address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::explain(
                ErrorType::ConnectNoRoute,
                format!("upstream address {} does not resolve", u.address),
            )
            .into_up()
        })?;
    let mut p = HttpPeer::new(addr, false, u.host_header.clone().unwrap_or_default());
    p.options.connection_timeout = Some(Duration::from_millis(u.connect_timeout_ms));
    p.options.read_timeout = Some(Duration::from_millis(u.read_timeout_ms));
    p.options.write_timeout = Some(Duration::from_millis(u.write_timeout_ms));
    p.options.idle_timeout = Some(Duration::from_millis(u.idle_timeout_ms));
    let entry = Arc::new((u.clone(), p));
    PEER.store(Some(entry.clone()));
    Ok(entry)
}

/// Hop-by-hop headers (RFC 9110 7.6.1) and the framing we always recompute.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "expect"
            | "content-length"
            | "proxy-authorization"
            | "proxy-authenticate"
    )
}

/// The end-to-end headers of a request: what a forwarded (or held, then released) request
/// carries upstream. Hop-by-hop headers, those the `Connection` header names, and framing are
/// left out; the body's `Content-Length` is set when the request is built.
pub fn end_to_end_headers(h: &http::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let listed: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    h.iter()
        .filter(|(n, _)| !is_hop_by_hop(n) && !listed.iter().any(|l| l == n.as_str()))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect()
}

/// Builds the request to send upstream: `method` and `path_and_query`, the given end-to-end
/// headers, `Host` from config (else kept, else the upstream address), and a fresh
/// `Content-Length` for methods that carry a body.
pub fn build_request(
    method: &http::Method,
    path_and_query: &str,
    headers: &[(HeaderName, HeaderValue)],
    body_len: usize,
    upstream: &UpstreamConfig,
) -> Result<RequestHeader> {
    let mut req = RequestHeader::build_no_case(
        method.clone(),
        path_and_query.as_bytes(),
        Some(headers.len() + 2),
    )?;
    for (n, v) in headers {
        req.append_header(n.clone(), v.clone())?;
    }
    if let Some(h) = &upstream.host_header {
        req.insert_header(header::HOST, h.as_str())?;
    } else if req.headers.get(header::HOST).is_none() {
        req.insert_header(header::HOST, upstream.address.as_str())?;
    }
    let has_body = body_len > 0
        || matches!(
            *method,
            http::Method::POST | http::Method::PUT | http::Method::PATCH
        );
    if has_body {
        req.insert_header(header::CONTENT_LENGTH, body_len.to_string())?;
    }
    Ok(req)
}

/// Why a request did not get an answer, and whether the upstream may have acted on it.
#[derive(Debug)]
pub struct SendError {
    pub error: Box<Error>,
    /// The whole request was written before the failure: the upstream may have applied it.
    pub maybe_applied: bool,
}

/// An upstream answer whose header has been read; the body is still on the connection.
pub struct Answer {
    pub session: HttpSession,
    pub header: ResponseHeader,
    pub started: std::time::Instant,
}

fn stale_pooled(e: &Error, reused: bool) -> bool {
    reused
        && matches!(e.retry, RetryType::ReusedOnly | RetryType::Decided(true))
        && matches!(
            e.etype(),
            ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
        )
}

/// Sends one request and reads the answer's header (informational answers skipped). A pooled
/// connection that the upstream had already closed is retried once on a new connection: the
/// upstream closed it before reading anything of ours, so nothing was applied.
pub async fn send(
    connector: &TransportConnector,
    peer: &HttpPeer,
    req: &RequestHeader,
    body: &[u8],
) -> std::result::Result<Answer, SendError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = std::time::Instant::now();
        let (stream, reused) = if attempt == 1 {
            connector.get_stream(peer).await
        } else {
            connector.new_stream(peer).await.map(|s| (s, false))
        }
        .map_err(|e| SendError {
            error: e.into_up(),
            maybe_applied: false,
        })?;
        let mut s = HttpSession::new_with_options(stream, peer);
        s.read_timeout = peer.options.read_timeout;
        s.write_timeout = peer.options.write_timeout;
        let mut written = false;
        let result: Result<ResponseHeader> = async {
            s.write_request_header(Box::new(req.clone())).await?;
            if !body.is_empty() {
                s.write_body(body).await?;
            }
            s.finish_body().await?;
            written = true;
            loop {
                s.read_response().await?;
                let h = s.resp_header().ok_or_else(|| {
                    Error::explain(ErrorType::InvalidHTTPHeader, "no response header")
                })?;
                if !h.status.is_informational() || h.status == http::StatusCode::SWITCHING_PROTOCOLS
                {
                    return Ok(h.clone());
                }
            }
        }
        .await;
        match result {
            Ok(header) => {
                return Ok(Answer {
                    session: s,
                    header,
                    started,
                })
            }
            Err(e) if attempt == 1 && stale_pooled(&e, reused) => {
                tracing::debug!(error = %e, "pooled upstream connection was stale; retrying on a new one");
                continue;
            }
            Err(e) => {
                return Err(SendError {
                    error: e.into_up(),
                    maybe_applied: written,
                })
            }
        }
    }
}

impl Answer {
    pub fn status(&self) -> u16 {
        self.header.status.as_u16()
    }

    /// Reads the whole body, up to `cap` bytes (an error above).
    pub async fn read_body(&mut self, cap: usize) -> Result<Bytes> {
        let mut buf = BytesMut::new();
        while let Some(chunk) = self
            .session
            .read_body_ref()
            .await
            .map_err(|e| e.into_up())?
        {
            if buf.len() + chunk.len() > cap {
                return Error::e_explain(
                    ErrorType::Custom("upstream answer too large"),
                    format!("the upstream answer exceeds {cap} bytes"),
                );
            }
            buf.extend_from_slice(chunk);
        }
        Ok(buf.freeze())
    }

    /// Returns the connection to the pool when the answer was read to its end.
    pub async fn release(self, connector: &TransportConnector, peer: &HttpPeer) {
        let mut s = self.session;
        s.respect_keepalive();
        if let Some(stream) = s.reuse().await {
            connector.release_stream(stream, peer.reuse_hash(), peer.options.idle_timeout);
        }
        crate::metrics::UPSTREAM
            .with_label_values(&[status_class(self.header.status.as_u16())])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

/// The gate's answer to an upstream failure: 504 on timeouts, 502 otherwise.
pub fn failure_status(e: &Error) -> (u16, &'static str, String) {
    use ErrorType::*;
    match e.etype() {
        ConnectTimedout | ReadTimedout | WriteTimedout => (
            504,
            "upstream_timeout",
            "the upstream store did not answer in time".to_string(),
        ),
        Custom("upstream answer too large") => (
            502,
            "upstream_answer_too_large",
            e.context
                .as_ref()
                .map(|c| c.as_str().to_string())
                .unwrap_or_else(|| "the upstream answer is too large".into()),
        ),
        _ => (
            502,
            "upstream_unavailable",
            "the upstream store could not be reached or broke off its answer".to_string(),
        ),
    }
}

/// A whole request/answer exchange (quarantine release, readback), on the service connector.
pub async fn exchange(
    upstream: &UpstreamConfig,
    method: &http::Method,
    path_and_query: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: &[u8],
    cap: usize,
) -> std::result::Result<(ResponseHeader, Bytes), SendError> {
    let entry = peer(upstream).map_err(|e| SendError {
        error: e,
        maybe_applied: false,
    })?;
    let p = &entry.1;
    // The answer is read here, not relayed: no compression.
    let headers: Vec<(HeaderName, HeaderValue)> = headers
        .iter()
        .filter(|(n, _)| *n != header::ACCEPT_ENCODING)
        .cloned()
        .collect();
    let req =
        build_request(method, path_and_query, &headers, body.len(), upstream).map_err(|e| {
            SendError {
                error: e,
                maybe_applied: false,
            }
        })?;
    let mut answer = send(&SERVICE, p, &req, body).await?;
    let bytes = answer.read_body(cap).await.map_err(|e| SendError {
        error: e,
        maybe_applied: true,
    })?;
    let header = answer.header.clone();
    answer.release(&SERVICE, p).await;
    Ok((header, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_dropped() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("expect", HeaderValue::from_static("100-continue"));
        h.insert("content-length", HeaderValue::from_static("10"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        let kept: Vec<String> = end_to_end_headers(&h)
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(kept, vec!["content-type", "authorization"]);
    }

    #[test]
    fn request_gets_fresh_content_length_and_host() {
        let u = UpstreamConfig::default();
        let r = build_request(&http::Method::POST, "/a?b=1", &[], 42, &u).unwrap();
        assert_eq!(r.headers.get("content-length").unwrap(), "42");
        assert_eq!(r.headers.get("host").unwrap(), "127.0.0.1:8000");
        assert_eq!(r.uri.path_and_query().unwrap().as_str(), "/a?b=1");
        let r = build_request(&http::Method::GET, "/a", &[], 0, &u).unwrap();
        assert!(r.headers.get("content-length").is_none());
    }
}
