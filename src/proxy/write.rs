//! A governed write (a `write` or `delete` route), from `request_filter`: read the body whole,
//! turn each record into one signal, judge the batch, commit every receipt with the journal
//! rows of the admitted records and the quarantine rows of the held ones (journal before
//! dispatch), then forward only the admitted records (annotated where the pack says) and
//! answer: the upstream's answer with `x-integrity-*` headers, 202 when everything was held,
//! 403 when nothing was admitted and something was refused.

use super::answer::{self, Action, Outcome};
use super::body::{self, BodyError};
use super::identity::{self, Source, TenantError};
use super::judge::{self, JudgeError};
use super::problem::{write_json, write_problem};
use super::upstream::{self, SendError};
use super::{held, GateProxy, INSTANCE_ID};
use crate::filters::{Record, RouteKind, RouteMatch};
use crate::kernel::types::*;
use crate::kernel::NormalizedSignal;
use crate::state::Runtime;
use crate::store::{dispatch_rows, quarantine_rows, DispatchWrite, QuarantineWrite};
use bytes::Bytes;
use pingora_core::Result;
use pingora_proxy::Session;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The trace of a stored record: deterministic in (collection, record id), so a
/// later read of the record, or the retrieval-filter API naming it by id, finds
/// it again. One definition for the proxy and the API:
/// [`crate::kernel::operations::retrieval::record_trace_id`]. Traces are
/// already scoped by tenant in storage; one gate fronts one upstream.
pub fn record_trace_id(
    _tenant: Uuid,
    route: &crate::filters::CompiledRoute,
    collection: Option<&str>,
    record_id: &str,
) -> Uuid {
    crate::kernel::operations::retrieval::record_trace_id_of(collection, record_id, route.uuid_ids)
}

fn fail_open_route(rt: &Runtime, m: &RouteMatch<'_>) -> bool {
    m.route.fail_open
        || rt
            .config
            .proxy
            .fail_open_routes
            .iter()
            .any(|r| r.split_once('/') == Some((m.route.pack.as_str(), m.route.name.as_str())))
}

/// Whether a record carries metadata members named like the gate's annotations (a client may
/// not write them: they are removed before forwarding).
fn has_annotation(rec: &Record, key: &str) -> bool {
    rec.metadata
        .as_ref()
        .and_then(Value::as_object)
        .is_some_and(|m| m.keys().any(|k| k.starts_with(key)))
}

pub async fn handle(
    proxy: &GateProxy,
    session: &mut Session,
    rt: Arc<Runtime>,
    m: RouteMatch<'_>,
) -> Result<bool> {
    let cfg = &rt.config;
    let route = m.route;
    let started = std::time::Instant::now();
    let _in_flight = InFlight::enter();
    if DRAINING.load(std::sync::atomic::Ordering::Acquire) {
        return fail_closed(
            session,
            "the gate is shutting down; nothing was sent to the store",
        )
        .await;
    }
    // The batchers run on the proxy's threads (see `Store::start_batchers`).
    proxy.state.store.start_batchers();

    let body = match body::read_whole(
        session,
        cfg.limits.proxy_body_bytes,
        Duration::from_millis(cfg.limits.body_timeout_ms),
    )
    .await
    {
        Ok(b) => b,
        Err(BodyError::TooLarge(limit)) => {
            let detail = format!(
                "request body exceeds the limit of {limit} bytes; nothing was sent to the store"
            );
            write_problem(session, 413, "payload_too_large", &detail, Value::Null, &[]).await?;
            return Ok(true);
        }
        Err(BodyError::Timeout) => {
            let detail = "the request body was not received in time; nothing was sent to the store";
            write_problem(session, 408, "request_timeout", detail, Value::Null, &[]).await?;
            return Ok(true);
        }
        Err(BodyError::Read(e)) => return body::refuse_unreadable(session, &e).await,
    };

    let fail_open = fail_open_route(&rt, &m);
    let tenant = match identity::tenant_of(&cfg.proxy, &rt, &session.req_header().headers) {
        Ok(t) => t,
        Err(TenantError::Unknown(t)) => {
            let detail = format!("no configured tenant {t:?} governs this request");
            write_problem(session, 403, "tenant_unknown", &detail, Value::Null, &[]).await?;
            return Ok(true);
        }
        Err(TenantError::NotConfigured) => {
            return unavailable(
                session,
                &rt,
                body,
                fail_open,
                "no tenant governs proxied writes (set proxy.tenant or proxy.tenant_header)",
            )
            .await;
        }
    };
    let Some(tenant_rt) = rt.tenant(tenant) else {
        return unavailable(
            session,
            &rt,
            body,
            fail_open,
            "the tenant is not configured",
        )
        .await;
    };
    let policy = tenant_rt.policy.clone();
    let mode = policy.mode;
    let (Some(substrate), Some(mutation)) = (
        TargetSubstrate::parse(&route.substrate),
        route.mutation.as_deref().and_then(ProposedMutation::parse),
    ) else {
        return unavailable(
            session,
            &rt,
            body,
            fail_open,
            "the route's substrate or mutation is unknown to the kernel",
        )
        .await;
    };

    // The body, as the pack describes it. A body that does not have that shape is the
    // client's mistake; nothing is forwarded unread.
    if crate::api::extract::json_depth(&body) > cfg.limits.json_max_depth {
        let detail = format!(
            "JSON nesting is deeper than {} levels",
            cfg.limits.json_max_depth
        );
        write_problem(session, 400, "invalid_body", &detail, Value::Null, &[]).await?;
        return Ok(true);
    }
    // The record cap (the store's own batch limit, at most the gate's), counted before any
    // record is built or judged: an oversized batch costs one JSON parse and nothing else.
    let cap = route.max_records.map_or(cfg.limits.proxy_max_records, |r| {
        r.min(cfg.limits.proxy_max_records)
    });
    let parsed = route
        .parse_body(&body)
        .and_then(|v| route.record_count(&v).map(|n| (v, n)));
    if let Ok((_, n)) = &parsed {
        if *n > cap {
            let detail = format!(
                "the request carries {n} records; this route takes at most {cap} per request \
                 (split the batch); nothing was sent to the store"
            );
            let extra = serde_json::json!({ "records": n, "max_records": cap });
            write_problem(session, 413, "payload_too_large", &detail, extra, &[]).await?;
            return Ok(true);
        }
    }
    // The request's share of the records in flight, held to its answer: what bounds the memory
    // of concurrent batches. Counted before any record is built.
    let _records = match &parsed {
        Ok((_, n)) => match records_in_flight(cfg, *n).await {
            Some(p) => Some(p),
            None => {
                let detail = format!(
                    "the gate is handling as many batched records as it may at once ({}); nothing was sent to the store",
                    cfg.limits.records_in_flight()
                );
                let retry = [("retry-after", "1".to_string())];
                write_problem(session, 503, "overloaded", &detail, Value::Null, &retry).await?;
                return Ok(true);
            }
        },
        Err(_) => None,
    };
    let parsed = parsed.and_then(|(v, _)| m.extract_records(&v).map(|r| (v, r)));
    let (mut value, records) = match parsed {
        Ok(x) => x,
        Err(e) => {
            let detail = format!("{e}; nothing was sent to the store");
            write_problem(session, 400, "invalid_body", &detail, Value::Null, &[]).await?;
            return Ok(true);
        }
    };
    // A write under a nested path of the metadata (Qdrant's set-payload `key`) may not land in
    // the gate's annotation namespace: the annotations are the gate's word, not the client's.
    let nested = route.metadata_path.as_ref().and_then(|p| p.get(&value));
    if let Some(path) = nested.and_then(Value::as_str) {
        let first = path.split(['.', '[']).next().unwrap_or("");
        if first.starts_with(route.annotation_key.as_str()) {
            let detail = format!(
                "writes under `{}` are the gate's annotations, not the client's; nothing was sent to the store",
                route.annotation_key
            );
            write_problem(session, 400, "invalid_body", &detail, Value::Null, &[]).await?;
            return Ok(true);
        }
    }
    let collection = m.collection(&value);
    // Ids and collection names are stored as they are (journal, quarantine), and PostgreSQL
    // stores no NUL in text: refused on both backends alike, before anything is recorded.
    if collection.as_deref().is_some_and(|c| c.contains('\0'))
        || records
            .iter()
            .any(|r| r.id.as_deref().is_some_and(|id| id.contains('\0')))
    {
        let detail = "record ids and collection names may not contain the NUL character (U+0000); nothing was sent to the store";
        write_problem(session, 400, "invalid_body", detail, Value::Null, &[]).await?;
        return Ok(true);
    }
    let source = identity::source_of(&cfg.proxy, &session.req_header().headers);
    let request_id = crate::store::new_id();
    let observed = crate::store::now();
    let deleting = route.kind == RouteKind::Delete;
    // A delete that names ids and also a filter deletes only the named records that match it.
    let conditions = deleting.then(|| route.delete_conditions(&value)).flatten();
    let signals: Vec<NormalizedSignal> = records
        .iter()
        .map(|r| {
            record_signal(
                tenant,
                route,
                collection.as_deref(),
                substrate,
                mutation,
                &source,
                r,
                deleting,
                &observed,
            )
        })
        .collect();

    let judged = match judge::judge(&proxy.state, &policy, signals, mode).await {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(error = %e, route = %format!("{}/{}", route.pack, route.name), "proxied write not judged");
            return unavailable(
                session,
                &rt,
                body,
                fail_open,
                match e {
                    JudgeError::Storage(_) => {
                        "storage is unavailable; nothing was sent to the store"
                    }
                    JudgeError::Kernel(_) => {
                        "the integrity kernel is unavailable; nothing was sent to the store"
                    }
                },
            )
            .await;
        }
    };

    // Decisions to actions; the admitted records with the annotation they carry.
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(judged.len());
    let mut admitted: Vec<(usize, Option<Map<String, Value>>)> = Vec::new();
    let mut held_idx: Vec<usize> = Vec::new();
    // Records whose trace this write leaves as stored (see `keeps_trace`).
    let mut keeps: Vec<bool> = Vec::with_capacity(judged.len());
    for (rec, j) in records.iter().zip(&judged) {
        let out = &j.output;
        let action = answer::action_for(out.decision, mode);
        let kept = !deleting && keeps_trace(route, rec, j.stored);
        keeps.push(kept);
        let quarantine = (action == Action::Held).then(Uuid::new_v4);
        let note = || {
            let mut note = Map::new();
            note.insert("decision".into(), json!(out.decision));
            note.insert("receipt".into(), json!(j.receipt_id));
            note
        };
        match action {
            // Where the store merges metadata, a plain allow is written too: it replaces what
            // an earlier annotated write of the record left there.
            // A record whose marked trace stays as it was keeps the annotation the store holds.
            Action::Forwarded => admitted.push((rec.index, (route.merges && !kept).then(note))),
            Action::Annotated => admitted.push((rec.index, Some(note()))),
            Action::Held => held_idx.push(rec.index),
            Action::Blocked => {}
        }
        outcomes.push(Outcome {
            index: rec.index,
            id: rec.id.clone(),
            decision: out.decision,
            action,
            receipt: j.receipt_id,
            obstruction: out.obstruction.as_ref().map(|o| o.id),
            reasons: out.reason_codes.clone(),
            quarantine,
        });
    }

    // The exact requests of the held records, then the admitted request, both before anything
    // is committed: a body the rewrite refuses is a 400 with nothing recorded as done.
    let held_bodies = match held::single_record_bodies(route, &mut value, &held_idx) {
        Ok(b) => b,
        Err(e) => {
            write_problem(
                session,
                400,
                "invalid_body",
                &e.to_string(),
                Value::Null,
                &[],
            )
            .await?;
            return Ok(true);
        }
    };
    let forward_all_as_sent = mode == EvaluationMode::Shadow
        || (admitted.len() == records.len()
            && admitted.iter().all(|(_, n)| n.is_none() || !route.annotate)
            && !(route.annotate
                && records
                    .iter()
                    .any(|r| has_annotation(r, &route.annotation_key))));
    // A body with no records at all (an empty batch) is the store's to answer: forwarded as sent.
    let forward_body: Option<Bytes> = if admitted.is_empty() && !records.is_empty() {
        None
    } else if forward_all_as_sent {
        Some(body.clone())
    } else {
        match route.rewrite_admitted_in_place(&mut value, &admitted) {
            Ok(()) => Some(Bytes::from(route.serialize_body(&value))),
            Err(e) => {
                write_problem(
                    session,
                    400,
                    "invalid_body",
                    &e.to_string(),
                    Value::Null,
                    &[],
                )
                .await?;
                return Ok(true);
            }
        }
    };

    let req = session.req_header();
    let path = req
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| req.uri.path().to_string());
    let params: Vec<(String, String)> = m
        .params
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let mut extra = Vec::new();
    if forward_body.is_some() {
        let creds = identity::credential_headers(&req.headers);
        let rows: Vec<DispatchWrite> = outcomes
            .iter()
            .zip(&judged)
            .filter(|(o, _)| o.action.forwards())
            .map(|(o, j)| {
                let id = crate::store::new_id();
                DispatchWrite {
                    id,
                    tenant,
                    request_id,
                    instance_id: *INSTANCE_ID,
                    receipt_id: o.receipt,
                    trace_id: j.input.signal.trace_id,
                    pack: route.pack.clone(),
                    route: route.name.clone(),
                    kind: route.kind.as_str().to_string(),
                    params: params.clone(),
                    collection: collection.clone(),
                    record_id: o.id.clone(),
                    upstream_headers: identity::journal_credentials(&rt.sealer, &creds, id),
                }
            })
            .collect();
        if !rows.is_empty() {
            extra.push(dispatch_rows(&rows));
        }
    }
    if !held_idx.is_empty() {
        let headers: Vec<(String, String)> = upstream::end_to_end_headers(&req.headers)
            .into_iter()
            .filter_map(|(n, v)| v.to_str().ok().map(|v| (n.to_string(), v.to_string())))
            .collect();
        let rows: Vec<QuarantineWrite> = outcomes
            .iter()
            .zip(&judged)
            .filter(|(o, _)| o.action == Action::Held)
            .zip(held_bodies)
            .map(|((o, j), b)| {
                let id = o.quarantine.unwrap_or_else(Uuid::new_v4);
                QuarantineWrite {
                    id,
                    tenant,
                    decision: o.decision.as_str().into(),
                    reason_codes: o.reasons.clone(),
                    receipt_id: o.receipt,
                    signal_id: j.input.signal.id,
                    trace_id: j.input.signal.trace_id,
                    obstruction_id: o.obstruction,
                    source_id: source.source_id.clone(),
                    pack: route.pack.clone(),
                    route: route.name.clone(),
                    params: params.clone(),
                    collection: collection.clone(),
                    record_id: o.id.clone(),
                    record_index: o.index,
                    method: req.method.as_str().to_string(),
                    path: path.clone(),
                    headers: rt.sealer.seal_credentials(&headers, &id.to_string()),
                    body: String::from_utf8_lossy(&route.serialize_body(&b)).into_owned(),
                }
            })
            .collect();
        extra.push(quarantine_rows(&rows));
    }
    let contexts: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            // A delete's filter is not judged as content (see `record_signal`); the receipt
            // still binds it.
            let filter = if deleting {
                records
                    .iter()
                    .find(|r| r.index == o.index && r.id.is_none())
                    .and_then(|r| r.metadata.clone())
                    .or_else(|| conditions.clone())
            } else {
                None
            };
            json!({
                "proxy": {
                    "requestId": request_id,
                    "pack": route.pack,
                    "route": route.name,
                    "method": req.method.as_str(),
                    "collection": collection,
                    "recordId": o.id,
                    "recordIndex": o.index,
                    "action": o.action.as_str(),
                    "source": {"matchedBy": source.matched_by},
                    "deleteFilter": filter,
                }
            })
        })
        .collect();

    // Journal before dispatch: receipts, journal and quarantine rows are durable first.
    let reaches_store: Vec<bool> = outcomes
        .iter()
        .zip(&keeps)
        .map(|(o, kept)| o.action.forwards() && !kept)
        .collect();
    if let Err(e) = judge::commit(
        &proxy.state,
        &policy,
        &judged,
        &reaches_store,
        "proxy_write",
        contexts,
        extra,
    )
    .await
    {
        tracing::error!(error = %e, "proxied write not journaled");
        return unavailable(
            session,
            &rt,
            body,
            fail_open,
            "storage is unavailable; nothing was sent to the store",
        )
        .await;
    }
    let headers = answer::headers(&outcomes, mode);
    tracing::debug!(
        route = %format!("{}/{}", route.pack, route.name),
        records = outcomes.len(),
        forwarded = admitted.len(),
        held = held_idx.len(),
        judged_in_us = started.elapsed().as_micros() as u64,
        "proxied write judged"
    );
    let refused = outcomes.iter().filter(|o| !o.action.forwards()).count() as u64;
    crate::metrics::PROXY_RECORDS
        .with_label_values(&["forwarded"])
        .inc_by(admitted.len() as u64);
    crate::metrics::PROXY_RECORDS
        .with_label_values(&["held"])
        .inc_by(held_idx.len() as u64);
    crate::metrics::PROXY_RECORDS
        .with_label_values(&["blocked"])
        .inc_by(refused - held_idx.len() as u64);

    let Some(forward_body) = forward_body else {
        if outcomes.iter().any(|o| o.action == Action::Blocked) {
            let (detail, extra) = answer::blocked_problem(&outcomes);
            write_problem(session, 403, "integrity_blocked", &detail, extra, &headers).await?;
        } else {
            write_json(
                session,
                202,
                "application/json",
                answer::held_body(&outcomes),
                &headers,
            )
            .await?;
        }
        return Ok(true);
    };

    // Tombstoned: the records a delete certainly removed (not the candidates of a filtered one).
    let tombstones: Vec<crate::store::Tombstone> = if deleting
        && conditions.is_none()
        && !matches!(mode, EvaluationMode::Shadow | EvaluationMode::Advisory)
    {
        outcomes
            .iter()
            .zip(&judged)
            .zip(&reaches_store)
            .filter(|((o, _), _)| o.action.forwards() && o.id.is_some())
            .map(|((o, j), moved)| crate::store::Tombstone {
                trace: j.input.signal.trace_id,
                // Guarded by the delete's receipt where it moved the trace.
                receipt: (*moved && j.output.transition.enforced).then_some(o.receipt),
            })
            .collect()
    } else {
        Vec::new()
    };
    // The traces this write moved (see `judge::commit`), put back if the store refuses it.
    let restores: Vec<crate::store::TraceRestore> = outcomes
        .iter()
        .zip(&judged)
        .zip(&reaches_store)
        .filter(|((_, j), moved)| **moved && j.output.transition.enforced)
        .map(|((o, j), _)| crate::store::TraceRestore {
            trace: j.input.signal.trace_id,
            receipt: o.receipt,
            // As stored, a tombstoned trace included (the kernel's basis reads it as none).
            prior: j.stored,
        })
        .collect();
    let settle = Settle {
        request_id: Some(request_id),
        tenant,
        tombstones,
        restores,
    };
    let store = Some(proxy.state.store.clone());
    forward(session, &rt, store, forward_body, &headers, settle).await
}

/// Whether an admitted write leaves the record's stored trace as it is, because the stored
/// content it describes does not change:
/// - an insert the store ignores for an id it holds (`keeps_existing`, Chroma `add`), when the
///   gate has seen the id stored (a tombstoned id was deleted: the insert creates it again);
/// - a write that carries no record text (a metadata-only or vector-only update) to a record
///   whose trace is marked (untrusted, quarantined, revoked, tombstoned): the flagged text stays
///   in the store, so the mark stays too. Such a write can still make a trace worse (its own
///   decision applies where the trace was not marked).
fn keeps_trace(
    route: &crate::filters::CompiledRoute,
    rec: &Record,
    stored: Option<(TracePhase, AllowedInfluence)>,
) -> bool {
    let Some((phase, _)) = stored else {
        return false;
    };
    (route.keeps_existing && phase != TracePhase::Tombstoned)
        || (rec.text.is_none()
            && matches!(
                phase,
                TracePhase::Untrusted
                    | TracePhase::Quarantined
                    | TracePhase::Revoked
                    | TracePhase::Tombstoned
            ))
}

/// One record's signal: its text (or metadata), the route's substrate and mutation, and the
/// caller's identity from config. The trace is the record's (by id) or a new one.
#[allow(clippy::too_many_arguments)]
pub fn record_signal(
    tenant: Uuid,
    route: &crate::filters::CompiledRoute,
    collection: Option<&str>,
    substrate: TargetSubstrate,
    mutation: ProposedMutation,
    source: &Source,
    rec: &Record,
    deleting: bool,
    observed_at: &str,
) -> NormalizedSignal {
    let id = crate::store::new_id();
    let region = rec
        .id
        .as_deref()
        .map(|rid| record_trace_id(tenant, route, collection, rid));
    // A delete removes content and adds none: its filter (a `where` naming the very text being
    // cleaned up, say) is never stored nor retrieved, so it is not read as content. The signal
    // says what is deleted; the receipt's context binds the filter.
    let payload = match (deleting, rec.id.as_deref()) {
        (false, _) => {
            let mut text = rec.signal_text().into_owned();
            // An id that reads as words (it has white space in it) is read with the record: a
            // store answers ids in every read, and the agent reads them too.
            if let Some(rid) = rec
                .id
                .as_deref()
                .filter(|r| r.contains(char::is_whitespace))
            {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(rid);
            }
            text
        }
        (true, Some(_)) => "delete one record by its id".to_string(),
        (true, None) => "delete the records a filter or the request path selects".to_string(),
    };
    let payload_digest = crate::receipts::sha256_hex(payload.as_bytes());
    NormalizedSignal {
        id,
        tenant_id: tenant,
        product_surface: ProductSurface::Generic,
        source_type: source.source_type,
        source_id: source.source_id.clone(),
        source_trust_level: source.trust,
        source_authority_level: source.authority,
        authority_ceiling_applied: false,
        target_substrate: substrate,
        target_region_id: region,
        trace_id: region.unwrap_or(id),
        proposed_mutation: mutation,
        event_type: None,
        payload,
        payload_digest,
        payload_summary: None,
        raw_payload_ref: None,
        authority_claim: None,
        evidence_refs: Vec::new(),
        observed_at: Some(observed_at.to_string()),
        metadata: rec
            .metadata
            .as_ref()
            .filter(|_| !deleting)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    }
}

/// Storage or the kernel is down (or the gate cannot name a tenant): fail closed with 503,
/// unless the route is configured to fail open, then forward the request as it came,
/// unjudged and unjournaled, saying so in `x-integrity-decision: unevaluated`.
async fn unavailable(
    session: &mut Session,
    rt: &Arc<Runtime>,
    body: Bytes,
    fail_open: bool,
    detail: &str,
) -> Result<bool> {
    if !fail_open {
        return fail_closed(session, detail).await;
    }
    tracing::warn!(
        detail,
        "forwarding a write unevaluated: its route fails open"
    );
    crate::metrics::PROXY_RECORDS
        .with_label_values(&["failed_open"])
        .inc();
    let headers = [("x-integrity-decision", "unevaluated".to_string())];
    let settle = Settle {
        request_id: None,
        tenant: Uuid::nil(),
        tombstones: Vec::new(),
        restores: Vec::new(),
    };
    forward(session, rt, None, body, &headers, settle).await
}

/// A write of at most this many records is a small one: it takes its room from a lane of its
/// own, so small writes never queue behind a batch waiting for room.
const SMALL_WRITE: usize = 64;
/// Records of small writes handled at once.
const SMALL_LANE: usize = 1024;

/// The records being handled at once, over the process: batches
/// (`limits.proxy_records_in_flight`, sized at the first governed write, with that size) and
/// small writes. Tokio's semaphore serves waiters in order, so a batch waiting for room is not
/// overtaken by the batches behind it.
static LANES: std::sync::OnceLock<([Arc<tokio::sync::Semaphore>; 2], usize)> =
    std::sync::OnceLock::new();

/// Room for `n` records (one at least: a request without records still holds memory), waited
/// for at most the body deadline. `None`: no room in time. A batch larger than the lane (a
/// reload raised `proxy_max_records` past the size read at start) waits for the whole lane.
async fn records_in_flight(
    cfg: &crate::config::Config,
    n: usize,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let ([batches, small], budget) = LANES.get_or_init(|| {
        let budget = cfg.limits.records_in_flight();
        (
            [
                Arc::new(tokio::sync::Semaphore::new(budget)),
                Arc::new(tokio::sync::Semaphore::new(SMALL_LANE)),
            ],
            budget,
        )
    });
    let (lane, cap) = if n <= SMALL_WRITE {
        (small, SMALL_LANE)
    } else {
        (batches, *budget)
    };
    let want = u32::try_from(n.clamp(1, cap.max(1))).unwrap_or(u32::MAX);
    let wait = Duration::from_millis(cfg.limits.body_timeout_ms);
    match tokio::time::timeout(wait, lane.clone().acquire_many_owned(want)).await {
        Ok(Ok(p)) => Some(p),
        _ => {
            crate::metrics::PROXY_RECORDS
                .with_label_values(&["busy"])
                .inc();
            None
        }
    }
}

/// Governed writes being handled now: the shutdown drain waits for them before it flushes
/// the group committer (their journal settles are queued by then).
static WRITES_IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Proxied requests of any kind between their head and their answer: the drain waits for them
/// too (Pingora drops every task when it stops; a read in flight lost its answer).
static REQUESTS_IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        WRITES_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        WRITES_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// One proxied request in flight (held by its Pingora context).
pub(super) struct RequestInFlight(());

impl RequestInFlight {
    pub(super) fn enter() -> RequestInFlight {
        REQUESTS_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        RequestInFlight(())
    }
}

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        REQUESTS_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Set when shutdown begins: governed writes that arrive after it are refused (503, nothing
/// sent upstream), so the ones in flight can finish and their journal settles be flushed.
static DRAINING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether shutdown has begun: an answer written now says `Connection: close`, so a client
/// does not send its next request on a connection that is about to go.
pub(super) fn draining() -> bool {
    DRAINING.load(std::sync::atomic::Ordering::Acquire)
}

/// Refuses new governed writes, then waits (at most `bound`) until no request (a write, a
/// read, a pass-through) is being handled.
pub(super) async fn requests_done(bound: std::time::Duration) {
    DRAINING.store(true, std::sync::atomic::Ordering::Release);
    let until = std::time::Instant::now() + bound;
    let busy = || {
        WRITES_IN_FLIGHT.load(std::sync::atomic::Ordering::Acquire) > 0
            || REQUESTS_IN_FLIGHT.load(std::sync::atomic::Ordering::Acquire) > 0
    };
    while busy() && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// 503 with `Retry-After`: the write was not judged and nothing went upstream.
async fn fail_closed(session: &mut Session, detail: &str) -> Result<bool> {
    crate::metrics::PROXY_RECORDS
        .with_label_values(&["failed_closed"])
        .inc();
    write_problem(
        session,
        503,
        "unavailable",
        detail,
        Value::Null,
        &[("retry-after", "1".into())],
    )
    .await?;
    Ok(true)
}

/// What to record once the upstream has answered.
pub(super) struct Settle {
    request_id: Option<Uuid>,
    tenant: Uuid,
    tombstones: Vec<crate::store::Tombstone>,
    /// Traces the write moved before dispatch: put back when the store does not take it.
    restores: Vec<crate::store::TraceRestore>,
}

impl Settle {
    /// The store did not take the write: its records' traces go back to where they were (a
    /// record's trace describes what the store holds; a refused write must not clear the
    /// marks of what it still holds).
    async fn restore(self, store: &Arc<crate::store::Store>) {
        if self.restores.is_empty() {
            return;
        }
        let (store, tenant, restores) = (store.clone(), self.tenant, self.restores);
        settled_before_answer(async move {
            if let Err(e) = store.restore_traces(tenant, restores).await {
                tracing::error!(error = %e, "could not restore the traces of a refused write");
            }
        })
        .await;
    }

    /// The store confirmed the delete: its records' traces are tombstoned.
    async fn tombstone(self, store: Arc<crate::store::Store>) {
        if self.tombstones.is_empty() {
            return;
        }
        let (tenant, tombstones) = (self.tenant, self.tombstones);
        settled_before_answer(async move {
            if let Err(e) = store.tombstone_traces(tenant, &tombstones).await {
                tracing::error!(error = %e, "could not tombstone the traces of deleted records");
            }
        })
        .await;
    }
}

/// Runs a trace change the upstream's answer calls for to its end before the client is
/// answered: a client that writes the same record again as soon as it has its answer (a
/// delete, then an add of the id) must find the change made, or it would land after the new
/// write's own move and undo it. In a task of its own, so a client that goes away meanwhile
/// cannot cut it short.
async fn settled_before_answer(change: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Err(e) = tokio::spawn(change).await {
        tracing::error!(error = %e, "a trace change after the upstream's answer failed");
    }
}

/// Sends the (rewritten) request upstream and streams the answer back with the gate's headers;
/// then records the upstream's status in the journal (off the answer's path) and tombstones
/// the traces of confirmed deletes.
pub(super) async fn forward(
    session: &mut Session,
    rt: &Arc<Runtime>,
    state_store: Option<Arc<crate::store::Store>>,
    body: Bytes,
    headers: &[(&str, String)],
    settle: Settle,
) -> Result<bool> {
    let req = session.req_header();
    let path = req
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let up_headers = upstream::end_to_end_headers(&req.headers);
    let method = req.method.clone();
    let result = match upstream::peer(&rt.config.upstream) {
        Err(e) => Err(SendError {
            error: e,
            maybe_applied: false,
        }),
        Ok(entry) => {
            let request = upstream::build_request(
                &method,
                &path,
                &up_headers,
                body.len(),
                &rt.config.upstream,
            )?;
            upstream::send(&upstream::PROXY, &entry.1, &request, &body)
                .await
                .map(|a| (a, entry))
        }
    };
    match result {
        Err(SendError {
            error,
            maybe_applied,
        }) => {
            let (status, code, detail) = upstream::failure_status(&error);
            tracing::warn!(error = %error, maybe_applied, "upstream failed a proxied write");
            crate::metrics::UPSTREAM
                .with_label_values(&["none"])
                .observe(0.0);
            if let (Some(rid), Some(store)) = (settle.request_id, state_store) {
                let verdict = if maybe_applied {
                    "dispatch_unknown"
                } else {
                    "failed"
                };
                store.settle_dispatch_soon(rid, verdict, None, Some(error.to_string()));
                if !maybe_applied {
                    settle.restore(&store).await;
                }
            }
            write_problem(session, status, code, &detail, Value::Null, headers).await?;
            Ok(true)
        }
        Ok((mut answer, entry)) => {
            let status = answer.status();
            // The upstream has answered: that is recorded whether or not the client is still
            // there to read the answer.
            if let (Some(rid), Some(store)) = (settle.request_id, state_store.clone()) {
                let verdict = if (200..300).contains(&status) {
                    "completed"
                } else {
                    "rejected"
                };
                store.settle_dispatch_soon(rid, verdict, Some(status), None);
            }
            if let Some(store) = state_store {
                if (200..300).contains(&status) {
                    settle.tombstone(store).await;
                } else {
                    settle.restore(&store).await;
                }
            }
            let broken = super::relay::relay(session, &mut answer, headers).await?;
            if let Some(e) = broken {
                return Err(e.into_up());
            }
            session.write_response_body(None, true).await?;
            answer.release(&upstream::PROXY, &entry.1).await;
            Ok(true)
        }
    }
}
