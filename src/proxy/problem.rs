//! Problem answers on the proxy listener: the same problem+json shape as the API
//! (`{type, title, status, detail, code, requestId, errors}`), written straight to the
//! downstream session, and the `fail_to_proxy` hook for Pingora's own forwarding.

use pingora_core::Result;
use pingora_proxy::{FailToProxy, Session};

/// Writes a problem+json answer to the downstream. `extra` members are merged into the
/// problem object (RFC 9457 extension members); `headers` are added to the answer.
pub async fn write_problem(
    session: &mut Session,
    status: u16,
    code: &str,
    detail: &str,
    extra: serde_json::Value,
    headers: &[(&str, String)],
) -> Result<()> {
    let sc = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let mut body = serde_json::json!({
        "type": format!("https://substrate-gate.dev/problems/{}", code.replace('_', "-")),
        "title": sc.canonical_reason().unwrap_or("Error"),
        "status": status,
        "detail": detail,
        "code": code,
        "requestId": uuid::Uuid::new_v4().to_string(),
        "errors": [],
    });
    if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            b.insert(k.clone(), v.clone());
        }
    }
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    write_json(session, status, "application/problem+json", bytes, headers).await
}

/// Writes a whole JSON answer with its `Content-Length`.
pub async fn write_json(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, String)],
) -> Result<()> {
    let mut resp = pingora_http::ResponseHeader::build(status, Some(4 + headers.len()))?;
    resp.insert_header("content-type", content_type)?;
    resp.insert_header("content-length", body.len().to_string())?;
    for (k, v) in headers {
        resp.append_header(k.to_string(), v.as_str())?;
    }
    if super::write::draining() {
        session.set_keepalive(None);
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(bytes::Bytes::from(body)), true)
        .await?;
    Ok(())
}

/// Answers a failure of Pingora's own forwarding (reads and other pass-through requests) as
/// problem+json: 504 on timeouts, 502 when the upstream cannot be reached, 400 when the
/// request could not be read.
pub async fn fail_to_proxy(session: &mut Session, e: &pingora_core::Error) -> FailToProxy {
    use pingora_core::ErrorType::*;
    let (status, code, detail) = match e.etype() {
        HTTPStatus(c) => (
            *c,
            "upstream_error",
            format!("request failed with status {c}"),
        ),
        ConnectTimedout | ReadTimedout | WriteTimedout => (
            504,
            "upstream_timeout",
            "the upstream store did not answer in time".to_string(),
        ),
        _ => match e.esource() {
            pingora_core::ErrorSource::Downstream => match e.etype() {
                // The client is gone: nobody to answer.
                WriteError | ReadError | ConnectionClosed => (0, "", String::new()),
                _ => (
                    400,
                    "bad_request",
                    "the request could not be read".to_string(),
                ),
            },
            _ => (
                502,
                "upstream_unavailable",
                "the upstream store could not be reached".to_string(),
            ),
        },
    };
    if status > 0 && session.response_written().is_none() {
        // The connection is not reused after a failure: say so in the answer.
        session.set_keepalive(None);
        let _ = write_problem(session, status, code, &detail, serde_json::Value::Null, &[]).await;
    }
    FailToProxy {
        error_code: status,
        can_reuse_downstream: false,
    }
}
