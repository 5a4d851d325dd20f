//! Reading a request body whole, before a byte of the request reaches the upstream: under the
//! size cap (413 above: a declared `Content-Length` is refused before the body is even asked
//! for), within the body time bound (408 after), answering `Expect: 100-continue` ourselves.

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;
use std::time::Duration;

#[derive(Debug)]
pub enum BodyError {
    /// Declared or sent more than the cap.
    TooLarge(usize),
    /// The client did not send the whole body in time.
    Timeout,
    /// The client broke off (or sent a malformed body).
    Read(Box<pingora_core::Error>),
}

/// `Expect: 100-continue` from an HTTP/1.1 (or later) client; an HTTP/1.0 client's is ignored
/// (RFC 9110 §10.1.1: it cannot understand an interim answer).
fn expects_continue(session: &Session) -> bool {
    let req = session.req_header();
    req.version >= http::Version::HTTP_11
        && req
            .headers
            .get(http::header::EXPECT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
}

/// Reads the whole request body. After an error, the connection is not reused (the body was
/// not consumed to its end).
pub async fn read_whole(
    session: &mut Session,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        session.set_keepalive(None);
        return Err(BodyError::TooLarge(limit));
    }
    if expects_continue(session) {
        // Writing the interim answer counts as "answering before the body was read", which
        // would turn keep-alive off; it is not that, so suspend the rule around it.
        session.set_close_on_response_before_downstream_finish(false);
        let sent = session.write_continue_response().await;
        session.set_close_on_response_before_downstream_finish(true);
        sent.map_err(BodyError::Read)?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    // The whole body often arrives as one chunk: keep it without a copy until a second comes.
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut total = 0usize;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, session.read_request_body()).await {
            Err(_) => {
                session.set_keepalive(None);
                return Err(BodyError::Timeout);
            }
            Ok(Err(e)) => {
                session.set_keepalive(None);
                return Err(BodyError::Read(e));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        total += chunk.len();
        if total > limit {
            session.set_keepalive(None);
            return Err(BodyError::TooLarge(limit));
        }
        if first.is_none() && rest.is_empty() {
            first = Some(chunk);
        } else {
            if let Some(f) = first.take() {
                rest.reserve(declared.unwrap_or(total).min(limit));
                rest.extend_from_slice(&f);
            }
            rest.extend_from_slice(&chunk);
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}

/// A body that could not be read: malformed framing (a bad chunk size, a short
/// `Content-Length` body) or a client that broke off. The client's fault, not the upstream's:
/// answered 400 problem+json if the client is still there (nothing was sent upstream), the
/// connection closed, and nothing logged above debug (a 502 and an ERROR line, as Pingora
/// answers an error from `request_filter`, told operators the store was down).
pub async fn refuse_unreadable(
    session: &mut Session,
    e: &pingora_core::Error,
) -> pingora_core::Result<bool> {
    tracing::debug!(error = %e, "request body could not be read");
    session.set_keepalive(None);
    let detail = format!(
        "the request body could not be read ({}); nothing was sent to the store",
        e.etype().as_str()
    );
    let _ = super::problem::write_problem(
        session,
        400,
        "invalid_body",
        &detail,
        serde_json::Value::Null,
        &[],
    )
    .await;
    Ok(true)
}
