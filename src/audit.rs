//! Audit: walking a tenant's receipt chain in the store, exporting it as
//! JSON Lines, and verifying an export offline (no database needed).

use crate::checkpoint::{Checkpoint, Signer, Verifier};
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

/// Walks a tenant's whole chain in the store, page by page: every link, the columns served
/// beside each receipt's content, and that the chain reaches the recorded head (read first, so
/// receipts written during the walk extend the chain past it and are verified as well).
pub async fn verify_tenant(store: &Store, tenant: Uuid) -> Result<ChainReport, String> {
    let head = store
        .receipt_head(tenant)
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or((0, GENESIS_HASH.to_string()));
    let (mut seq, mut hash) = (0i64, GENESIS_HASH.to_string());
    // Whether the receipt at the head's sequence carries the head's hash (the genesis: yes).
    let mut head_found = head.0 == 0;
    loop {
        let rows = store
            .receipt_page(tenant, seq, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        if rows.is_empty() {
            let broken = (!head_found).then(|| BrokenLink {
                seq: head.0,
                last_good: seq,
                receipt_id: format!("(head of tenant {tenant})"),
                reason: format!(
                    "the chain ends at sequence {seq}, but the recorded head is sequence {} with hash {}",
                    head.0, head.1
                ),
            });
            return Ok(ChainReport {
                tenant: tenant.to_string(),
                receipts: seq,
                broken,
            });
        }
        let links: Vec<ChainLink> = rows.iter().map(ReceiptRow::link).collect();
        let checked = verify_links(seq, &hash, &links).and_then(|tip| {
            // The hash binds the content; the columns the API serves beside it must say
            // what the content says.
            match rows.iter().find_map(|r| column_mismatch(r).map(|c| (r, c))) {
                Some((r, column)) => Err(BrokenLink {
                    seq: r.seq,
                    last_good: r.seq - 1,
                    receipt_id: r.id.clone(),
                    reason: format!("the stored {column} differs from the hashed content"),
                }),
                None => Ok(tip),
            }
        });
        match checked {
            Ok((s, h)) => {
                if let Some(r) = rows.iter().find(|r| r.seq == head.0) {
                    head_found = r.replay_hash == head.1;
                }
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

/// Signs the chain head of `tenant` now and keeps the checkpoint; `None` when the tenant has no
/// receipt yet. A head already checkpointed gives the same checkpoint back.
pub async fn checkpoint_now(
    store: &Store,
    signer: &Signer,
    tenant: Uuid,
) -> Result<Option<String>, String> {
    let Some((seq, hash)) = store
        .receipt_head(tenant)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    if let Some((last, note)) = store
        .latest_checkpoint(tenant)
        .await
        .map_err(|e| e.to_string())?
    {
        if last == seq {
            return Ok(Some(note));
        }
    }
    let note = signer.sign(&Checkpoint { tenant, seq, hash });
    store
        .insert_checkpoint(tenant, seq, &note)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(note))
}

/// Checks the store's chain against a checkpoint kept elsewhere: signed by `verifier`, its
/// tenant's chain must hold the checkpoint's hash at its sequence and verify from the genesis
/// through it to the head (so a rewrite or a truncation of what it covers is caught).
pub async fn verify_checkpoint(
    store: &Store,
    verifier: &Verifier,
    note: &str,
) -> Result<ChainReport, String> {
    let c = verifier.open(note)?;
    let mut report = verify_tenant(store, c.tenant).await?;
    if report.broken.is_some() {
        return Ok(report);
    }
    let held = store
        .receipt_hash_at(c.tenant, c.seq)
        .await
        .map_err(|e| e.to_string())?;
    let extends = match (c.seq, held) {
        (0, _) => c.hash == GENESIS_HASH,
        (_, Some(h)) => h == c.hash,
        (_, None) => false,
    };
    if !extends {
        report.broken = Some(BrokenLink {
            seq: c.seq,
            last_good: report.receipts.min(c.seq.saturating_sub(1)),
            receipt_id: format!("(checkpoint of tenant {})", c.tenant),
            reason: format!(
                "the chain does not extend the signed checkpoint: sequence {} should have hash {}",
                c.seq, c.hash
            ),
        });
    }
    Ok(report)
}

/// The first stored column of a receipt that the API serves and its hashed content contradicts
/// (every receipt the gate writes states its decision, kind and ids in its content).
fn column_mismatch(r: &ReceiptRow) -> Option<&'static str> {
    let content: Value = serde_json::from_str(&r.payload).ok()?;
    let says = |member: &str| content.get(member).and_then(Value::as_str);
    let pairs = [
        ("decision", "decision", r.decision.as_str()),
        ("id", "receiptId", r.id.as_str()),
        ("tenant_id", "tenantId", r.tenant_id.as_str()),
        ("kind", "kind", r.kind.as_str()),
        ("outcome", "governanceOutcome", r.outcome.as_str()),
    ];
    for (column, member, stored) in pairs {
        if says(member).is_some_and(|v| v != stored) {
            return Some(column);
        }
    }
    let signal = content
        .get("signal")
        .and_then(|s| s.get("id"))
        .and_then(Value::as_str);
    if signal.is_some() && signal != r.signal_id.as_deref() {
        return Some("signal_id");
    }
    None
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
