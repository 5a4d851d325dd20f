//! `POST /substrate/retrieval/filter`: the treatment of each candidate record
//! under the current integrity state, by its trace's phase and, when its
//! text is given, by the poisoning detectors. The texts are scanned, never
//! stored: the receipt binds their digests and findings.

use super::types::{
    RetrievalFilterRequest, RetrievalFilterResponse, RetrievalResult, TreatmentCounts,
};
use super::*;
use crate::kernel::operations::retrieval::{
    self, record_trace_id, scan_text, CandidateFacts, RetrievalInput, RetrievalTreatment,
};
use crate::store::OperationWrite;

/// The proxy's read path keeps its own three-way treatment type; the mapping
/// by phase is the same ([`crate::kernel::operations::retrieval::treatment_for_phase`]).
impl From<RetrievalTreatment> for crate::filters::Treatment {
    fn from(t: RetrievalTreatment) -> Self {
        match t {
            RetrievalTreatment::Include => crate::filters::Treatment::Include,
            RetrievalTreatment::IncludeWithWarning => crate::filters::Treatment::Warn,
            RetrievalTreatment::Exclude => crate::filters::Treatment::Exclude,
        }
    }
}

/// The trace a candidate id names: a trace id, a signal id (its trace), or
/// a record id of the collection ([`record_trace_id`]).
async fn candidate_trace(
    state: &AppState,
    tenant: Uuid,
    id: &str,
    collection: Option<&str>,
) -> Result<Option<TraceFacts>, ApiError> {
    let mut tries: Vec<Uuid> = Vec::with_capacity(3);
    if let Ok(u) = Uuid::parse_str(id) {
        tries.push(u);
        if let Some(s) = state.store.signal_row(tenant, u).await? {
            tries.push(s.signal.trace_id);
        }
    }
    // The collection as named, and in canonical form when it is a UUID (a pack's
    // `uuid_collections`: Chroma keys a collection id in any spelling as one collection); the
    // record id as named, and canonical for stores that key UUID ids so (a pack's `uuid_ids`).
    let canonical_collection = collection
        .and_then(|c| Uuid::try_parse(c).ok())
        .map(|u| u.hyphenated().to_string());
    let mut collections = vec![collection];
    if canonical_collection.as_deref() != collection && canonical_collection.is_some() {
        collections.push(canonical_collection.as_deref());
    }
    for c in collections {
        for t in [
            record_trace_id(c, id),
            crate::kernel::operations::retrieval::record_trace_id_of(c, id, true),
        ] {
            if !tries.contains(&t) {
                tries.push(t);
            }
        }
    }
    for t in tries {
        if let Some(row) = state.store.trace_row(tenant, t).await? {
            return Ok(Some(TraceFacts {
                trace_id: row.id,
                phase: Some(row.phase),
                influence: row.influence,
                substrate: row.trace_type.as_deref().and_then(TargetSubstrate::parse),
                signals: vec![],
            }));
        }
    }
    // A signal that was ingested but never decided: governed, not yet trusted.
    if let Ok(u) = Uuid::parse_str(id) {
        if let Some(s) = state.store.signal_row(tenant, u).await? {
            return Ok(Some(TraceFacts {
                trace_id: s.signal.trace_id,
                phase: None,
                influence: AllowedInfluence::None,
                substrate: Some(s.signal.target_substrate),
                signals: vec![],
            }));
        }
    }
    Ok(None)
}

pub async fn filter(
    state: &AppState,
    principal: &Principal,
    req: RetrievalFilterRequest,
) -> Result<RetrievalFilterResponse, ApiError> {
    check_len(&req.candidates, "candidates", 1, 1000)?;
    for (i, c) in req.candidates.iter().enumerate() {
        check_text(&c.id, &format!("candidates[{i}].id"), 1, 512)?;
    }
    if let Some(c) = &req.collection {
        check_text(c, "collection", 1, 512)?;
    }
    if let Some(p) = &req.pack {
        check_text(p, "pack", 1, 128)?;
    }
    let tenant = principal.tenant;
    let policy = policy_of(state, principal)?;
    let mut candidates = Vec::with_capacity(req.candidates.len());
    for c in &req.candidates {
        let trace = candidate_trace(state, tenant, &c.id, req.collection.as_deref()).await?;
        candidates.push(CandidateFacts {
            id: c.id.clone(),
            trace,
            text_digest: c
                .text
                .as_ref()
                .map(|t| crate::receipts::sha256_hex(t.as_bytes())),
            findings: c
                .text
                .as_deref()
                .map(|t| scan_text(&policy, t))
                .unwrap_or_default(),
        });
    }
    // Scoped by tenant: two tenants filtering the same candidates get ids of their own.
    let key = crate::receipts::sha256_hex(
        serde_json::to_string(&(
            tenant,
            candidates
                .iter()
                .map(|c| {
                    (
                        &c.id,
                        c.trace.as_ref().map(|t| (t.trace_id, t.phase)),
                        &c.text_digest,
                    )
                })
                .collect::<Vec<_>>(),
        ))
        .unwrap_or_default()
        .as_bytes(),
    );
    let input = RetrievalInput {
        key,
        collection: req.collection.clone(),
        pack: req.pack.clone(),
        candidates,
    };
    let out = retrieval::evaluate(&input, &policy);
    let v = &out.verdict;
    let receipt_id = Uuid::new_v4();
    let lc = lifecycle_rows(state, tenant, v, None, None).await?;
    let count =
        |t: RetrievalTreatment| out.results.iter().filter(|r| r.treatment == t).count() as u64;
    let counts = TreatmentCounts {
        include: count(RetrievalTreatment::Include),
        include_with_warning: count(RetrievalTreatment::IncludeWithWarning),
        exclude: count(RetrievalTreatment::Exclude),
    };
    let subject = json!({
        "collection": input.collection,
        "pack": input.pack,
        "results": out.results.iter().map(|r| json!({"id": r.id, "treatment": r.treatment, "traceId": r.trace.as_ref().map(|t| t.id)})).collect::<Vec<_>>(),
    });
    let material = OperationMaterial::Retrieval(input.clone());
    let mut w = OperationWrite::new(
        tenant,
        receipt_id,
        "retrieval_filter",
        content(
            "retrieval_filter",
            receipt_id,
            principal,
            &policy,
            v,
            &material,
            subject,
            &[],
            &[],
        ),
    );
    w.decision = v.decision.as_str().into();
    w.outcome = v.outcome.as_str().into();
    w.finish = finish_with(v.decision, lc.announce(), |_| vec![]);
    w.obstructions = lc.new_obstructions;
    w.repair_plans = lc.new_plans;
    let c = state.store.commit_operation(w).await?;
    let subject_id = crate::kernel::operations::mint("retrieval", &input.key, "id");
    Ok(RetrievalFilterResponse {
        decision: v.decision,
        governance_decision: governance(subject_id, c.id, v, None),
        results: out
            .results
            .iter()
            .map(|r| RetrievalResult {
                id: r.id.clone(),
                treatment: r.treatment,
                reason_codes: r.reason_codes.clone(),
                trace: r.trace.clone(),
            })
            .collect(),
        counts,
        obstructions: lc.obstructions,
        repair_plans: lc.repair_plans,
        receipt: receipt_ref(c.id, &c.replay_hash, v.decision),
        reason_codes: v.reason_codes.clone(),
    })
}
