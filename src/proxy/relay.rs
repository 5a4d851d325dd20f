//! Streaming an upstream answer back to the downstream: the upstream's status and headers
//! (hop-by-hop ones dropped; Pingora sets its own `Connection`), the gate's headers, and the
//! body chunk by chunk as it arrives.

use super::upstream::Answer;
use pingora_core::{Error, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// Removes headers that belong to the upstream connection, not to the answer. For an HTTP/2
/// downstream the framing headers go too (HTTP/2 frames the body itself).
pub fn strip_hop_headers(resp: &mut ResponseHeader, downstream_h2: bool) {
    for h in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "trailer",
    ] {
        resp.remove_header(h);
    }
    if downstream_h2 {
        resp.remove_header("transfer-encoding");
    }
}

/// Writes the answer's header with `headers` added, then its body. Returns the error that
/// broke off the upstream body, if any (the downstream answer is then incomplete and the
/// caller must not reuse either connection); downstream write errors are returned as errors.
pub async fn relay(
    session: &mut Session,
    answer: &mut Answer,
    headers: &[(&str, String)],
) -> Result<Option<Box<Error>>> {
    let mut resp = answer.header.clone();
    strip_hop_headers(&mut resp, session.is_http2());
    for (k, v) in headers {
        resp.append_header(k.to_string(), v.as_str())?;
    }
    if super::write::draining() {
        session.set_keepalive(None);
    }
    session.write_response_header(Box::new(resp), false).await?;
    loop {
        match answer.session.read_body_bytes().await {
            Ok(Some(chunk)) => session.write_response_body(Some(chunk), false).await?,
            Ok(None) => return Ok(None),
            Err(e) => return Ok(Some(e)),
        }
    }
}
