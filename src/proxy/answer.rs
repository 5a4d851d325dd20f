//! What the gate tells the caller about its records: the `x-integrity-*` headers on every
//! answer to a governed write, the 202 body of a held write, and the 403 problem of a refused
//! one. Every record is named with its index, id, decision, action and receipt.
//!
//! Headers (all ASCII; JSON values escape non-ASCII as `\uXXXX`):
//! - `x-integrity-decision`: the most severe decision among the request's records;
//! - `x-integrity-receipt`: the records' receipt ids in record order, comma-separated, when
//!   there are at most [`MAX_RECEIPTS_IN_HEADER`]; else the first one, with
//!   `x-integrity-receipt-count` giving how many there are;
//! - `x-integrity-summary`: `total=N, forwarded=N, annotated=N, held=N, blocked=N`;
//! - `x-integrity-records` (only when some record was not forwarded): a JSON array with one
//!   object per record `{index, id, decision, action, receipt}` (`quarantineId` for held
//!   ones). It is kept under [`RECORDS_HEADER_BUDGET`] bytes (clients cap response headers,
//!   httpx at 16 KiB): held and blocked records are listed first, forwarded ones while room
//!   remains, and `x-integrity-records-complete: false` says when some were left out;
//! - `x-integrity-mode`: `shadow` or `advisory` when the policy does not enforce.

use crate::kernel::types::{EvaluationMode, RuntimeDecision};
use serde_json::{json, Value};
use uuid::Uuid;

pub const MAX_RECEIPTS_IN_HEADER: usize = 16;
pub const RECORDS_HEADER_BUDGET: usize = 8 * 1024;

/// What the gate did with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Sent upstream as it came.
    Forwarded,
    /// Sent upstream with the gate's `_integrity` annotation.
    Annotated,
    /// Kept in the gate's quarantine; not sent.
    Held,
    /// Refused; not sent.
    Blocked,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Forwarded => "forwarded",
            Action::Annotated => "annotated",
            Action::Held => "held",
            Action::Blocked => "blocked",
        }
    }

    pub fn forwards(self) -> bool {
        matches!(self, Action::Forwarded | Action::Annotated)
    }
}

/// One record's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub index: usize,
    pub id: Option<String>,
    pub decision: RuntimeDecision,
    pub action: Action,
    pub receipt: Uuid,
    pub obstruction: Option<Uuid>,
    pub reasons: Vec<String>,
    pub quarantine: Option<Uuid>,
}

/// What to do with a decision under a mode. `shadow` forwards everything untouched (the
/// receipts say what would have happened); `advisory` forwards everything and annotates what
/// is not a plain allow; the enforcing modes act.
pub fn action_for(decision: RuntimeDecision, mode: EvaluationMode) -> Action {
    use RuntimeDecision as D;
    match mode {
        EvaluationMode::Shadow => Action::Forwarded,
        EvaluationMode::Advisory => {
            if decision == D::Allow {
                Action::Forwarded
            } else {
                Action::Annotated
            }
        }
        EvaluationMode::Approval | EvaluationMode::Enforcement | EvaluationMode::HighAssurance => {
            match decision {
                D::Allow => Action::Forwarded,
                D::AllowWithWarning | D::MarkUntrusted | D::Harden => Action::Annotated,
                D::Quarantine | D::RequireReview | D::Defer | D::Repair => Action::Held,
                D::Block | D::Escalate => Action::Blocked,
            }
        }
    }
}

/// Severity order of decisions, for the one decision a batch's header shows.
pub fn severity(d: RuntimeDecision) -> u8 {
    use RuntimeDecision as D;
    match d {
        D::Allow => 0,
        D::AllowWithWarning => 1,
        D::Harden => 2,
        D::MarkUntrusted => 3,
        D::Defer => 4,
        D::RequireReview => 5,
        D::Repair => 6,
        D::Quarantine => 7,
        D::Escalate => 8,
        D::Block => 9,
    }
}

/// JSON text with every non-ASCII character escaped, fit for a header value.
pub fn ascii_json(v: &Value) -> String {
    let s = v.to_string();
    // DEL (0x7f) is ASCII, and JSON leaves it unescaped, but no header value may hold it.
    if s.bytes().all(|b| b.is_ascii() && b != 0x7f) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c.is_ascii() && c != '\x7f' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Keeps a header value printable: ids with control characters are shown escaped.
fn header_safe(s: &str) -> String {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        s.to_string()
    } else {
        let j = ascii_json(&Value::String(s.to_string()));
        j[1..j.len() - 1].to_string()
    }
}

pub fn record_json(o: &Outcome) -> Value {
    let mut v = json!({
        "index": o.index,
        "decision": o.decision,
        "action": o.action.as_str(),
        "receipt": o.receipt,
    });
    if let Some(id) = &o.id {
        v["id"] = json!(id);
    }
    if let Some(q) = o.quarantine {
        v["quarantineId"] = json!(q);
    }
    v
}

/// The `x-integrity-*` headers of an answer (see the module documentation).
pub fn headers(outcomes: &[Outcome], mode: EvaluationMode) -> Vec<(&'static str, String)> {
    let mut h = Vec::with_capacity(6);
    let top = outcomes
        .iter()
        .map(|o| o.decision)
        .max_by_key(|d| severity(*d))
        .unwrap_or(RuntimeDecision::Allow);
    h.push(("x-integrity-decision", top.as_str().to_string()));
    if !outcomes.is_empty() {
        if outcomes.len() <= MAX_RECEIPTS_IN_HEADER {
            h.push((
                "x-integrity-receipt",
                outcomes
                    .iter()
                    .map(|o| o.receipt.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ));
        } else {
            h.push(("x-integrity-receipt", outcomes[0].receipt.to_string()));
            h.push(("x-integrity-receipt-count", outcomes.len().to_string()));
        }
    }
    let count = |a: Action| outcomes.iter().filter(|o| o.action == a).count();
    h.push((
        "x-integrity-summary",
        format!(
            "total={}, forwarded={}, annotated={}, held={}, blocked={}",
            outcomes.len(),
            count(Action::Forwarded),
            count(Action::Annotated),
            count(Action::Held),
            count(Action::Blocked)
        ),
    ));
    if outcomes.iter().any(|o| !o.action.forwards()) {
        let (json, complete) = records_header(outcomes);
        h.push(("x-integrity-records", json));
        if !complete {
            h.push(("x-integrity-records-complete", "false".into()));
        }
    }
    match mode {
        EvaluationMode::Shadow => h.push(("x-integrity-mode", "shadow".into())),
        EvaluationMode::Advisory => h.push(("x-integrity-mode", "advisory".into())),
        _ => {}
    }
    h
}

/// The per-record list for `x-integrity-records`, within the budget: refused and held records
/// first, then forwarded ones; shown in record order. Returns whether every record fit.
fn records_header(outcomes: &[Outcome]) -> (String, bool) {
    let mut order: Vec<&Outcome> = outcomes.iter().collect();
    order.sort_by_key(|o| (o.action.forwards(), o.index));
    let mut chosen: Vec<(usize, String)> = Vec::new();
    let mut used = 2;
    let mut complete = true;
    for o in order {
        let text = ascii_json(&record_json(o));
        if used + text.len() + 1 > RECORDS_HEADER_BUDGET {
            complete = false;
            continue;
        }
        used += text.len() + 1;
        chosen.push((o.index, text));
    }
    chosen.sort_by_key(|(i, _)| *i);
    let body: Vec<String> = chosen.into_iter().map(|(_, t)| t).collect();
    (format!("[{}]", body.join(",")), complete)
}

/// The 202 body of a write whose records were all held (a JSON body: the chromadb client
/// parses every 2xx answer).
pub fn held_body(outcomes: &[Outcome]) -> Vec<u8> {
    let top = outcomes
        .iter()
        .map(|o| o.decision)
        .max_by_key(|d| severity(*d))
        .unwrap_or(RuntimeDecision::Quarantine);
    let records: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            let mut v = record_json(o);
            v["reasonCodes"] = json!(o.reasons);
            if let Some(ob) = o.obstruction {
                v["obstruction"] = json!(ob);
            }
            v
        })
        .collect();
    let body = json!({
        "status": "held",
        "decision": top,
        "detail": format!("{} record(s) held in the gate's quarantine for review; nothing was sent to the store", outcomes.len()),
        "records": records,
        "receipts": outcomes.iter().map(|o| o.receipt).collect::<Vec<_>>(),
        "quarantineIds": outcomes.iter().filter_map(|o| o.quarantine).collect::<Vec<_>>(),
    });
    serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec())
}

/// Detail and extension members of the 403 problem of a write of which nothing was admitted.
pub fn blocked_problem(outcomes: &[Outcome]) -> (String, Value) {
    let blocked = outcomes
        .iter()
        .filter(|o| o.action == Action::Blocked)
        .count();
    let held = outcomes.iter().filter(|o| o.action == Action::Held).count();
    let mut reasons: Vec<String> = Vec::new();
    for o in outcomes.iter().filter(|o| !o.action.forwards()) {
        for r in &o.reasons {
            if !reasons.contains(r) {
                reasons.push(r.clone());
            }
        }
    }
    let ids: Vec<String> = outcomes
        .iter()
        .filter(|o| o.action == Action::Blocked)
        .map(|o| o.id.clone().unwrap_or_else(|| format!("#{}", o.index)))
        .take(5)
        .map(|s| header_safe(&s))
        .collect();
    let mut detail = format!(
        "the integrity gate refused {blocked} record(s) ({}{}): {}",
        ids.join(", "),
        if blocked > ids.len() { ", ..." } else { "" },
        reasons.join(", ")
    );
    if held > 0 {
        detail.push_str(&format!("; {held} record(s) held for review"));
    }
    detail.push_str("; nothing was sent to the store");
    let records: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            let mut v = record_json(o);
            v["reasonCodes"] = json!(o.reasons);
            if let Some(ob) = o.obstruction {
                v["obstruction"] = json!(ob);
            }
            v
        })
        .collect();
    let extra = json!({
        "decision": outcomes.iter().map(|o| o.decision).max_by_key(|d| severity(*d)),
        "reasonCodes": reasons,
        "obstructionIds": outcomes.iter().filter_map(|o| o.obstruction).collect::<Vec<_>>(),
        "receiptIds": outcomes.iter().map(|o| o.receipt).collect::<Vec<_>>(),
        "records": records,
    });
    (detail, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(i: usize, id: &str, d: RuntimeDecision, a: Action) -> Outcome {
        Outcome {
            index: i,
            id: Some(id.into()),
            decision: d,
            action: a,
            receipt: Uuid::new_v4(),
            obstruction: None,
            reasons: vec!["r".into()],
            quarantine: None,
        }
    }

    /// Every header value is one the HTTP types accept, whatever the ids: control characters,
    /// DEL and non-ASCII ids are escaped, so a batch whose records landed is answered as such.
    #[test]
    fn headers_are_valid_for_ids_with_control_characters_and_del() {
        for id in [
            "a\u{7f}b",
            "\u{7f}",
            "tab\there",
            "nul\u{0}",
            "ü\u{7f}\u{1}",
        ] {
            let outs = vec![
                o(0, "fine", RuntimeDecision::Allow, Action::Forwarded),
                o(1, id, RuntimeDecision::Block, Action::Blocked),
            ];
            for (name, value) in headers(&outs, EvaluationMode::Enforcement) {
                assert!(
                    http::HeaderValue::from_str(&value).is_ok(),
                    "{name}: {value:?} for id {id:?}"
                );
            }
            let h = headers(&outs, EvaluationMode::Enforcement);
            let recs = &h
                .iter()
                .find(|(k, _)| *k == "x-integrity-records")
                .unwrap()
                .1;
            let v: Value = serde_json::from_str(recs).unwrap();
            assert_eq!(v[1]["id"], id, "the escaped header reads back as the id");
        }
    }

    #[test]
    fn mixed_batch_headers_name_every_record() {
        let outs = vec![
            o(0, "a", RuntimeDecision::Allow, Action::Forwarded),
            o(1, "b", RuntimeDecision::Block, Action::Blocked),
            o(2, "ü", RuntimeDecision::Quarantine, Action::Held),
        ];
        let h = headers(&outs, EvaluationMode::Enforcement);
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(get("x-integrity-decision").as_deref(), Some("block"));
        assert_eq!(
            get("x-integrity-summary").as_deref(),
            Some("total=3, forwarded=1, annotated=0, held=1, blocked=1")
        );
        let recs = get("x-integrity-records").unwrap();
        assert!(recs.is_ascii());
        let v: Value = serde_json::from_str(&recs).unwrap();
        let ids: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["a", "b", "ü"]);
        assert_eq!(get("x-integrity-receipt").unwrap().split(',').count(), 3);
    }

    #[test]
    fn big_batches_stay_under_the_header_budget() {
        let outs: Vec<Outcome> = (0..2000)
            .map(|i| {
                let (d, a) = if i % 3 == 0 {
                    (RuntimeDecision::Quarantine, Action::Held)
                } else {
                    (RuntimeDecision::Allow, Action::Forwarded)
                };
                o(i, &format!("record-{i}"), d, a)
            })
            .collect();
        let h = headers(&outs, EvaluationMode::Enforcement);
        let total: usize = h.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        assert!(total < 12 * 1024, "{total}");
        assert!(h
            .iter()
            .any(|(k, v)| *k == "x-integrity-records-complete" && v == "false"));
        assert!(h
            .iter()
            .any(|(k, v)| *k == "x-integrity-receipt-count" && v == "2000"));
    }

    #[test]
    fn modes_map_decisions_to_actions() {
        use RuntimeDecision as D;
        assert_eq!(
            action_for(D::Block, EvaluationMode::Shadow),
            Action::Forwarded
        );
        assert_eq!(
            action_for(D::Block, EvaluationMode::Advisory),
            Action::Annotated
        );
        assert_eq!(
            action_for(D::Allow, EvaluationMode::Advisory),
            Action::Forwarded
        );
        assert_eq!(
            action_for(D::Block, EvaluationMode::Enforcement),
            Action::Blocked
        );
        assert_eq!(
            action_for(D::Escalate, EvaluationMode::Approval),
            Action::Blocked
        );
        assert_eq!(
            action_for(D::Defer, EvaluationMode::Enforcement),
            Action::Held
        );
        assert_eq!(
            action_for(D::MarkUntrusted, EvaluationMode::HighAssurance),
            Action::Annotated
        );
    }
}
