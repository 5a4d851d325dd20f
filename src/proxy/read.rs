//! Retrieval treatment of a read route's answer: records whose trace is quarantined, revoked
//! or tombstoned are dropped, untrusted ones are marked where the pack says. The answer is
//! needed whole to do that, so these reads are sent by the gate itself (like writes) and
//! answered with an exact `Content-Length`; a `single` record that is dropped becomes a 404.
//! Reads never wait on the kernel: the only lookup is the traces' phases, bounded in time,
//! and when storage cannot answer the read passes untreated (`x-integrity-treatment:
//! unavailable`). Answers that are not 2xx JSON pass through as they are.

use super::body::{self, BodyError};
use super::identity;
use super::problem::write_problem;
use super::upstream::{self, SendError};
use super::write::record_trace_id;
use super::GateProxy;
use crate::filters::{CollectionRef, Layout, RouteMatch, Treatment};
use crate::kernel::types::TracePhase;
use crate::state::Runtime;
use bytes::Bytes;
use pingora_core::Result;
use pingora_proxy::Session;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Bound on the trace lookup of a read: past it, the read passes untreated.
const LOOKUP_BOUND: Duration = Duration::from_secs(1);

/// One mapping from phase to treatment for the proxy and the retrieval-filter API.
pub fn treatment_of(phase: TracePhase) -> Treatment {
    crate::kernel::operations::retrieval::treatment_for_phase(Some(phase)).into()
}

pub async fn handle(
    proxy: &GateProxy,
    session: &mut Session,
    rt: Arc<Runtime>,
    m: RouteMatch<'_>,
) -> Result<bool> {
    let cfg = &rt.config;
    let route = m.route;
    let body = match body::read_whole(
        session,
        cfg.limits.proxy_body_bytes,
        Duration::from_millis(cfg.limits.body_timeout_ms),
    )
    .await
    {
        Ok(b) => b,
        Err(BodyError::TooLarge(limit)) => {
            let detail = format!("request body exceeds the limit of {limit} bytes");
            write_problem(session, 413, "payload_too_large", &detail, Value::Null, &[]).await?;
            return Ok(true);
        }
        Err(BodyError::Timeout) => {
            let detail = "the request body was not received in time";
            write_problem(session, 408, "request_timeout", detail, Value::Null, &[]).await?;
            return Ok(true);
        }
        Err(BodyError::Read(e)) => return super::body::refuse_unreadable(session, &e).await,
    };
    let req = session.req_header();
    let tenant = identity::tenant_of(&cfg.proxy, &rt, &req.headers).ok();
    let path = req
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    // The answer must be readable: no compression.
    let headers: Vec<_> = upstream::end_to_end_headers(&req.headers)
        .into_iter()
        .filter(|(n, _)| *n != http::header::ACCEPT_ENCODING)
        .collect();
    let method = req.method.clone();
    let entry = match upstream::peer(&cfg.upstream) {
        Ok(e) => e,
        Err(e) => return fail(session, &e).await,
    };
    let request = upstream::build_request(&method, &path, &headers, body.len(), &cfg.upstream)?;
    let mut answer = match upstream::send(&upstream::PROXY, &entry.1, &request, &body).await {
        Ok(a) => a,
        Err(SendError { error, .. }) => return fail(session, &error).await,
    };
    let status = answer.status();
    let encoded = answer
        .header
        .headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let Some(tenant) = tenant.filter(|_| (200..300).contains(&status) && !encoded) else {
        // Nothing to treat (an error answer, or no tenant to look traces up for).
        if let Some(e) = super::relay::relay(session, &mut answer, &[]).await? {
            return Err(e.into_up());
        }
        session.write_response_body(None, true).await?;
        answer.release(&upstream::PROXY, &entry.1).await;
        return Ok(true);
    };
    let bytes = match answer.read_body(cfg.limits.proxy_response_bytes).await {
        Ok(b) => b,
        Err(e) => return fail(session, &e).await,
    };
    let header = answer.header.clone();
    answer.release(&upstream::PROXY, &entry.1).await;

    let (out, extra, gone) = treat(proxy, tenant, &m, &body, bytes).await;
    if gone {
        let detail =
            "the record is withheld by the integrity gate (quarantined, revoked or deleted)";
        write_problem(session, 404, "not_found", detail, Value::Null, &extra).await?;
        return Ok(true);
    }
    let mut resp = header;
    super::relay::strip_hop_headers(&mut resp, session.is_http2());
    resp.remove_header("transfer-encoding");
    resp.insert_header("content-length", out.len().to_string())?;
    for (k, v) in &extra {
        resp.append_header(k.to_string(), v.as_str())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(out), true).await?;
    let _ = route;
    Ok(true)
}

async fn fail(session: &mut Session, e: &pingora_core::Error) -> Result<bool> {
    let (status, code, detail) = upstream::failure_status(e);
    tracing::warn!(error = %e, "upstream failed a treated read");
    write_problem(session, status, code, &detail, Value::Null, &[]).await?;
    Ok(true)
}

/// Treats an answer. Returns the bytes to send (the original ones when nothing changed), the
/// headers saying what was done, and whether a `single` answer lost its record.
async fn treat(
    proxy: &GateProxy,
    tenant: Uuid,
    m: &RouteMatch<'_>,
    request_body: &[u8],
    answer: Bytes,
) -> (Bytes, Vec<(&'static str, String)>, bool) {
    let route = m.route;
    let Ok(mut value) = serde_json::from_slice::<Value>(&answer) else {
        return (answer, Vec::new(), false);
    };
    let ids = route.response_record_ids(&value);
    if ids.is_empty() {
        return (
            answer,
            vec![("x-integrity-treatment", "applied".into())],
            false,
        );
    }
    let request_value = match &route.collection {
        Some(CollectionRef::Body(_)) => {
            serde_json::from_slice::<Value>(request_body).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    };
    let collection = m.collection(&request_value);
    let by_id: HashMap<&str, Uuid> = ids
        .iter()
        .map(|id| {
            (
                id.as_str(),
                record_trace_id(tenant, route, collection.as_deref(), id),
            )
        })
        .collect();
    let mut traces: Vec<Uuid> = by_id.values().copied().collect();
    traces.sort_unstable();
    traces.dedup();
    let phases = match tokio::time::timeout(
        LOOKUP_BOUND,
        proxy.state.store.trace_phases(tenant, &traces),
    )
    .await
    {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "retrieval treatment skipped: storage unavailable");
            crate::metrics::RETRIEVAL
                .with_label_values(&["unavailable"])
                .inc();
            return (
                answer,
                vec![("x-integrity-treatment", "unavailable".into())],
                false,
            );
        }
        Err(_) => {
            tracing::warn!("retrieval treatment skipped: trace lookup timed out");
            crate::metrics::RETRIEVAL
                .with_label_values(&["unavailable"])
                .inc();
            return (
                answer,
                vec![("x-integrity-treatment", "unavailable".into())],
                false,
            );
        }
    };
    let phase_of: HashMap<Uuid, TracePhase> = phases.into_iter().collect();
    let verdicts: HashMap<&str, Treatment> = by_id
        .iter()
        .map(|(id, t)| {
            (
                *id,
                phase_of
                    .get(t)
                    .map(|p| treatment_of(*p))
                    .unwrap_or(Treatment::Include),
            )
        })
        .collect();
    let marked = if route.annotate {
        verdicts.values().filter(|t| **t == Treatment::Warn).count()
    } else {
        0
    };
    if verdicts.values().all(|t| *t == Treatment::Include)
        || (marked == 0 && !verdicts.values().any(|t| *t == Treatment::Exclude))
    {
        return (
            answer,
            vec![("x-integrity-treatment", "applied".into())],
            false,
        );
    }
    let dropped = route.filter_response(&mut value, &|id: &str| {
        verdicts.get(id).copied().unwrap_or(Treatment::Include)
    });
    crate::metrics::RETRIEVAL
        .with_label_values(&["dropped"])
        .inc_by(dropped as u64);
    crate::metrics::RETRIEVAL
        .with_label_values(&["marked"])
        .inc_by(marked as u64);
    let headers = vec![
        ("x-integrity-treatment", "applied".to_string()),
        ("x-integrity-dropped", dropped.to_string()),
        ("x-integrity-marked", marked.to_string()),
    ];
    let single_gone = dropped > 0 && route.shape_for(&value).layout == Layout::Single;
    (
        Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
        headers,
        single_gone,
    )
}
