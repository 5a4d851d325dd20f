//! Audit: walking a tenant's receipt chain in the store, exporting it as
//! JSON Lines, and verifying an export offline (no database needed).

use crate::receipts::{verify_links, BrokenLink, ChainLink, GENESIS_HASH};
use crate::store::{ReceiptRow, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, IsTerminal, Write};
use uuid::Uuid;

const PAGE: i64 = 1000;

/// One line of an export: a receipt with its chain links.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportLine {
    pub tenant_id: String,
    pub id: String,
    pub sequence: i64,
    pub replay_hash: String,
    pub previous_hash: String,
    pub decision: String,
    pub created_at: String,
    pub payload: Value,
}

impl ExportLine {
    fn from_row(r: &ReceiptRow) -> ExportLine {
        ExportLine {
            tenant_id: r.tenant_id.clone(),
            id: r.id.clone(),
            sequence: r.seq,
            replay_hash: r.replay_hash.clone(),
            previous_hash: r.prev_hash.clone(),
            decision: r.decision.clone(),
            created_at: r.created_at.clone(),
            payload: serde_json::from_str(&r.payload).unwrap_or(Value::String(r.payload.clone())),
        }
    }
}

/// Result of walking one chain.
#[derive(Debug)]
pub struct ChainReport {
    pub tenant: String,
    pub receipts: i64,
    pub broken: Option<BrokenLink>,
}

/// Walks a tenant's whole chain in the store, page by page.
pub async fn verify_tenant(store: &Store, tenant: Uuid) -> Result<ChainReport, String> {
    let (mut seq, mut hash) = (0i64, GENESIS_HASH.to_string());
    loop {
        let rows = store
            .receipt_page(tenant, seq, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        if rows.is_empty() {
            return Ok(ChainReport {
                tenant: tenant.to_string(),
                receipts: seq,
                broken: None,
            });
        }
        let links: Vec<ChainLink> = rows.iter().map(ReceiptRow::link).collect();
        match verify_links(seq, &hash, &links) {
            Ok((s, h)) => {
                seq = s;
                hash = h;
            }
            Err(b) => {
                // Sequences start at 1 and verified ones are contiguous: the last good
                // sequence is how many receipts verified, wherever in a page the break is.
                return Ok(ChainReport {
                    tenant: tenant.to_string(),
                    receipts: b.last_good,
                    broken: Some(b),
                });
            }
        }
    }
}

/// Exports a tenant's receipts created at or after `since` (RFC 3339) as JSON Lines.
pub async fn export(
    store: &Store,
    tenant: Uuid,
    since: Option<&str>,
    out: &mut dyn Write,
) -> Result<u64, String> {
    let mut after = match since {
        Some(t) => match store
            .first_seq_since(tenant, t)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(s) => s - 1,
            None => return Ok(0),
        },
        None => 0,
    };
    let progress = std::io::stderr().is_terminal();
    let mut n = 0u64;
    loop {
        let rows = store
            .receipt_page(tenant, after, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            serde_json::to_writer(&mut *out, &ExportLine::from_row(r))
                .map_err(|e| e.to_string())?;
            out.write_all(b"\n").map_err(|e| e.to_string())?;
            n += 1;
        }
        after = rows.last().map(|r| r.seq).unwrap_or(after);
        if progress {
            eprint!("\rexported {n} receipts");
        }
    }
    if progress {
        eprintln!();
    }
    Ok(n)
}

/// Verifies an export offline: every line's hash, and the links between
/// consecutive lines of a tenant. The first line of a tenant anchors its
/// chain (an export `--since` starts mid-chain).
pub fn verify_file(input: impl BufRead) -> Result<Vec<ChainReport>, String> {
    let mut chains: std::collections::BTreeMap<String, (i64, String, i64, Option<BrokenLink>)> =
        Default::default();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: ExportLine = serde_json::from_str(&line)
            .map_err(|e| format!("line {}: not an export line: {e}", i + 1))?;
        let entry = chains
            .entry(l.tenant_id.clone())
            .or_insert_with(|| (l.sequence - 1, l.previous_hash.clone(), 0, None));
        if entry.3.is_some() {
            continue;
        }
        if l.payload.get("decision").and_then(Value::as_str) != Some(l.decision.as_str()) {
            entry.3 = Some(BrokenLink {
                seq: l.sequence,
                last_good: entry.0,
                receipt_id: l.id.clone(),
                reason: "the line's decision differs from the hashed content".into(),
            });
            continue;
        }
        let link = ChainLink {
            id: l.id.clone(),
            seq: l.sequence,
            replay_hash: l.replay_hash.clone(),
            prev_hash: l.previous_hash.clone(),
            payload: l.payload.to_string(),
        };
        match verify_links(entry.0, &entry.1, std::slice::from_ref(&link)) {
            Ok((s, h)) => {
                entry.0 = s;
                entry.1 = h;
                entry.2 += 1;
            }
            Err(b) => entry.3 = Some(b),
        }
    }
    Ok(chains
        .into_iter()
        .map(|(tenant, (_, _, n, broken))| ChainReport {
            tenant,
            receipts: n,
            broken,
        })
        .collect())
}
