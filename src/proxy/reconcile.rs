//! Start-up reconciliation of the dispatch journal. A row still `pending` belongs to a write
//! whose receipt is durable but whose upstream answer was never recorded (the process stopped
//! in between): it is marked `dispatch_unknown`, then re-checked by reading the record back
//! where its pack says how (`readback`): `landed` or `not_landed` (for a delete: whether the
//! record is gone). Rows the pack cannot read back stay `dispatch_unknown` for a person to
//! check. A quarantine release caught half-way is settled the same way (released or held
//! again). Counts go to the log.
//!
//! Only rows of other processes are judged. On SQLite (one process per database file) that is
//! every row older than this process. On PostgreSQL (a fleet sharing one database) every gate
//! writes a heartbeat (`gate_instances`) every few seconds, and only rows of gates whose
//! heartbeat went stale are judged, however long a live gate's write takes; the live gates
//! look again every half minute, so the rows of a gate that never comes back are settled too.

use super::upstream::{self, SendError};
use super::INSTANCE_ID;
use crate::filters::RouteKind;
use crate::state::AppState;
use crate::store::DispatchRow;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Counts of one reconciliation pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub examined: usize,
    pub landed: usize,
    pub not_landed: usize,
    pub unknown: usize,
}

const PAGE: i64 = 500;

/// How often a gate of a fleet says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// A gate whose heartbeat is older than this is gone: its unsettled rows are judged.
const GONE_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(30);
/// How often the live gates of a fleet look for the rows of gone ones.
const SWEEP: Duration = Duration::from_secs(30);

/// Runs reconciliation once at start-up. On PostgreSQL, also keeps this gate's heartbeat and
/// looks again every [`SWEEP`] for rows of gates that are gone. Logs its reports.
pub async fn run_at_startup(
    state: Arc<AppState>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let started = chrono::Utc::now();
    if state.store.dialect().name != "postgres" {
        let r = reconcile(&state, &crate::store::ts(started), None).await;
        log_report(&r, "start-up");
        return;
    }
    let started_s = crate::store::ts(started);
    let beat = |state: Arc<AppState>, started: String| async move {
        if let Err(e) = state.store.heartbeat(*INSTANCE_ID, &started).await {
            tracing::warn!(error = %e, "could not record this gate's heartbeat");
        }
    };
    beat(state.clone(), started_s.clone()).await;
    {
        let (state, started_s, mut shutdown) = (state.clone(), started_s.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HEARTBEAT) => beat(state.clone(), started_s.clone()).await,
                    _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
                }
            }
        });
    }
    let mut pass = "start-up";
    loop {
        let now = chrono::Utc::now();
        // A row younger than a heartbeat period may be a gate's that has not beaten yet.
        let cutoff =
            crate::store::ts(now - chrono::TimeDelta::from_std(HEARTBEAT).unwrap_or_default());
        let alive_since = crate::store::ts(now - GONE_AFTER);
        let r = reconcile(&state, &cutoff, Some(&alive_since)).await;
        if pass == "start-up" || r.examined > 0 {
            log_report(&r, pass);
        }
        pass = "sweep";
        tokio::select! {
            _ = tokio::time::sleep(SWEEP) => {}
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        }
    }
}

fn log_report(r: &Report, pass: &str) {
    if r.examined == 0 {
        tracing::info!(pass, "journal reconciliation: no write left unsettled");
    } else {
        tracing::warn!(
            pass,
            examined = r.examined,
            landed = r.landed,
            not_landed = r.not_landed,
            dispatch_unknown = r.unknown,
            "journal reconciliation: writes journaled but never completed were re-checked"
        );
    }
}

/// One pass over the unsettled rows of other processes created before `cutoff` (with
/// `alive_since`: only of processes whose heartbeat is older, see
/// [`crate::store::Store::unsettled_dispatches`]).
pub async fn reconcile(state: &AppState, cutoff: &str, alive_since: Option<&str>) -> Report {
    let mut report = Report::default();
    let mut cursor = (String::new(), String::new());
    loop {
        let rows = match state
            .store
            .unsettled_dispatches(
                *INSTANCE_ID,
                cutoff,
                alive_since,
                (&cursor.0, &cursor.1),
                PAGE,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "journal reconciliation: storage unavailable");
                return report;
            }
        };
        let Some(last) = rows.last() else {
            return report;
        };
        cursor = (last.created_at.clone(), last.id.clone());
        let fresh: Vec<DispatchRow> = rows;
        let pending: Vec<String> = fresh
            .iter()
            .filter(|r| r.status == "pending")
            .map(|r| r.id.clone())
            .collect();
        if let Err(e) = state
            .store
            .set_dispatch_status(
                &pending,
                "dispatch_unknown",
                Some("the gate stopped before the upstream answered"),
            )
            .await
        {
            tracing::error!(error = %e, "journal reconciliation: storage unavailable");
            return report;
        }
        for row in fresh {
            report.examined += 1;
            let verdict = check(state, &row).await;
            let status = match verdict {
                Some(true) => {
                    report.landed += 1;
                    "landed"
                }
                Some(false) => {
                    report.not_landed += 1;
                    "not_landed"
                }
                None => {
                    report.unknown += 1;
                    continue;
                }
            };
            let _ = state
                .store
                .set_dispatch_status(
                    std::slice::from_ref(&row.id),
                    status,
                    Some("read back at start-up"),
                )
                .await;
            settle_side_effects(state, &row, verdict == Some(true)).await;
        }
    }
}

/// What a settled row implies beyond the journal: a release caught half-way is released or
/// held again; a delete that landed tombstones its record's trace.
async fn settle_side_effects(state: &AppState, row: &DispatchRow, landed: bool) {
    let (Ok(tenant), Ok(request)) = (
        Uuid::parse_str(&row.tenant_id),
        Uuid::parse_str(&row.request_id),
    ) else {
        return;
    };
    let _ = state
        .store
        .settle_release(
            tenant,
            request,
            if landed { "released" } else { "held" },
            None,
        )
        .await;
    if landed && row.kind == RouteKind::Delete.as_str() {
        if let Ok(trace) = Uuid::parse_str(&row.trace_id) {
            // Not over a write judged after the delete (see `Tombstone::receipt`).
            let receipt = Uuid::parse_str(&row.receipt_id).ok();
            let _ = state
                .store
                .tombstone_traces(tenant, &[crate::store::Tombstone { trace, receipt }])
                .await;
        }
    }
}

/// Whether the journaled record is in the store (for a delete: whether it is gone). `None`
/// when the pack gives no way to tell or the upstream cannot say now.
async fn check(state: &AppState, row: &DispatchRow) -> Option<bool> {
    let record_id = row.record_id.as_deref()?;
    let rt = state.runtime();
    let params: Vec<(String, String)> = serde_json::from_str(&row.params).unwrap_or_default();
    let rb = rt.routes.readback(
        &row.pack,
        &row.route,
        &params,
        row.collection.as_deref(),
        record_id,
    )?;
    let creds: Vec<(String, String)> = row
        .upstream_headers
        .as_deref()
        .and_then(|h| serde_json::from_str(h).ok())
        .unwrap_or_default();
    // Credentials that do not open (another key) are not sent: the read-back goes without
    // them, and a store that needs them leaves the write's outcome unknown.
    let creds = rt
        .sealer
        .open_credentials(creds, &row.id)
        .unwrap_or_else(|e| {
            tracing::warn!(dispatch = %row.id, error = %e, "journaled credentials do not open");
            Vec::new()
        });
    let mut headers: Vec<(http::HeaderName, http::HeaderValue)> = creds
        .iter()
        .filter_map(|(n, v)| {
            Some((
                http::HeaderName::from_bytes(n.as_bytes()).ok()?,
                http::HeaderValue::from_str(v).ok()?,
            ))
        })
        .collect();
    let body = match &rb.body {
        Some(b) => {
            headers.push((
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            ));
            b.to_string().into_bytes()
        }
        None => Vec::new(),
    };
    let method = http::Method::from_bytes(rb.method.as_bytes()).ok()?;
    let cfg = &rt.config;
    let sent = upstream::exchange(
        &cfg.upstream,
        &method,
        &rb.path_and_query,
        &headers,
        &body,
        cfg.limits.proxy_response_bytes,
    )
    .await;
    let present = match sent {
        Ok((h, bytes)) if h.status.is_success() => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
            rb.read_route
                .response_record_ids(&v)
                .iter()
                .any(|id| id == record_id)
        }
        Ok((h, _)) if h.status == http::StatusCode::NOT_FOUND => false,
        Ok((h, _)) => {
            tracing::warn!(
                status = h.status.as_u16(),
                record = record_id,
                "readback: upstream answered an error"
            );
            return None;
        }
        Err(SendError { error, .. }) => {
            tracing::warn!(error = %error, record = record_id, "readback: upstream unreachable");
            return None;
        }
    };
    Some(if row.kind == RouteKind::Delete.as_str() {
        !present
    } else {
        present
    })
}
