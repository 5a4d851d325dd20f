//! The pipeline both the API and the proxy run: request → normalized signal →
//! kernel decision (cached) → receipt committed with the state change and its
//! events. Data flows one way; the kernel stays pure, storage happens here.

use crate::api::error::ApiError;
use crate::kernel::types::*;
use crate::kernel::{self, KernelInput, KernelOutput, NormalizedSignal, StateBasis};
use crate::state::{AppState, Principal};
use crate::store::{EventWrite, Finish, LifecycleWrite, ReceiptWrite, StoreError, TraceWrite};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use uuid::Uuid;

/// How many recent receipts of a source make up its record.
const SOURCE_WINDOW: i64 = 20;

/// Validates what the types cannot (ranges, lengths, formats), collecting every problem.
pub fn validate_ingest(req: &IngestRequest) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    let mut bad = |f: &str, m: &str| {
        errs.push(crate::api::error::FieldError {
            field: f.into(),
            message: m.into(),
        })
    };
    if req.source_id.is_empty() {
        bad("sourceId", "must be at least 1 character");
    }
    if req.source_id.chars().count() > SOURCE_ID_MAX_CHARS {
        bad(
            "sourceId",
            &format!("must be at most {SOURCE_ID_MAX_CHARS} characters"),
        );
    }
    if req.payload.is_empty() {
        bad("payload", "must be at least 1 character");
    }
    if let Some(v) = req.source_trust_level {
        if !(0.0..=1.0).contains(&v) {
            bad("sourceTrustLevel", "must be between 0 and 1");
        }
    }
    if let Some(v) = req.source_authority_level {
        if !(0.0..=1.0).contains(&v) {
            bad("sourceAuthorityLevel", "must be between 0 and 1");
        }
    }
    if let Some(t) = &req.observed_at {
        // chrono also reads a space for the `T` (RFC 3339 allows it in prose, JSON Schema's
        // `date-time` does not): the separator must be `T`.
        let t_sep = matches!(t.as_bytes().get(10), Some(b'T' | b't'));
        if !t_sep || chrono::DateTime::parse_from_rfc3339(t).is_err() {
            bad("observedAt", "must be an ISO 8601 / RFC 3339 date-time");
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::fields(errs))
    }
}

/// Applies the spec's defaults and the key's authority ceiling.
pub fn normalize(req: IngestRequest, principal: &Principal, signal_id: Uuid) -> NormalizedSignal {
    let requested = req.source_authority_level.unwrap_or(0.0);
    let ceiling = principal.authority_ceiling.unwrap_or(1.0);
    let digest = crate::receipts::sha256_hex(req.payload.as_bytes());
    NormalizedSignal {
        id: signal_id,
        tenant_id: principal.tenant,
        product_surface: req.product_surface,
        source_type: req.source_type,
        source_id: req.source_id,
        source_trust_level: req.source_trust_level.unwrap_or(0.5),
        source_authority_level: requested.min(ceiling),
        authority_ceiling_applied: requested > ceiling,
        target_substrate: req.target_substrate,
        target_region_id: req.target_region_id,
        trace_id: req.target_region_id.unwrap_or(signal_id),
        proposed_mutation: req.proposed_mutation,
        event_type: req.event_type,
        payload: req.payload,
        payload_digest: digest,
        payload_summary: req.payload_summary,
        raw_payload_ref: req.raw_payload_ref,
        authority_claim: req.authority_claim,
        evidence_refs: req.evidence_refs.unwrap_or_default(),
        observed_at: req.observed_at,
        metadata: req.metadata.unwrap_or_default(),
    }
}

/// Ingest: normalize, classify, store. The classification is a preview; the
/// decision comes from evaluate.
pub async fn ingest(
    state: &AppState,
    principal: &Principal,
    req: IngestRequest,
) -> Result<IngestResponse, ApiError> {
    validate_ingest(&req)?;
    let rt = state.runtime();
    let tenant = rt
        .tenant(principal.tenant)
        .ok_or_else(|| ApiError::forbidden("the API key's tenant is not configured"))?;
    let signal = normalize(req, principal, crate::store::new_id());
    let governed = classify(&signal, &tenant.policy);
    let record = signal_record(&signal);
    let event = ingested_event(&record, &governed);
    state.store.insert_signal(&signal, &[event]).await?;
    Ok(IngestResponse {
        signal: record,
        governed_signal: Some(governed),
        queued: Some(false),
    })
}

/// The stored signal as the API shows it.
pub fn signal_record(signal: &NormalizedSignal) -> SignalRecord {
    SignalRecord {
        id: signal.id,
        tenant_id: signal.tenant_id,
        product_surface: signal.product_surface,
        source_type: signal.source_type,
        target_substrate: signal.target_substrate,
        proposed_mutation: signal.proposed_mutation,
        payload_digest: signal.payload_digest.clone(),
    }
}

/// `signal.ingested`: the same for a signal from the API and for a record the proxy turned
/// into one.
pub fn ingested_event(record: &SignalRecord, governed: &GovernedSignal) -> EventWrite {
    EventWrite {
        name: "signal.ingested".into(),
        data: json!({"signal": record, "governedSignal": governed}),
    }
}

/// The governed-signal view of a signal before any decision.
pub fn classify(s: &NormalizedSignal, policy: &kernel::policy::CompiledPolicy) -> GovernedSignal {
    let ctx = kernel::detectors::ScanContext {
        source_type: s.source_type.as_str(),
        source_trust: s.source_trust_level,
        source_authority: s.source_authority_level,
        authority_claim: s.authority_claim.as_deref(),
        event_type: s.event_type.map(|e| e.as_str()),
        metadata_text: None,
        metadata: None,
    };
    let findings = policy.detectors.scan(&s.payload, &ctx);
    let risk = 1.0
        - findings
            .iter()
            .fold(1.0, |a, f| a * (1.0 - f.weight.clamp(0.0, 1.0)));
    GovernedSignal {
        id: None,
        tenant_id: s.tenant_id,
        substrate_signal_id: Some(s.id),
        source_type: s.source_type.as_str().into(),
        source_id: s.source_id.clone(),
        intent: kernel::intent_of(s.proposed_mutation, s.event_type),
        target_type: kernel::target_type_of(s.target_substrate),
        target_id: s.target_region_id.unwrap_or(s.trace_id).to_string(),
        risk_class: kernel::risk_class(risk),
        sensitivity: kernel::detectors::sensitivity(&findings).into(),
        status: "classified".into(),
        proposed_effect: None,
    }
}

/// Options of one evaluation.
pub struct EvalOptions {
    pub profile: EvaluationProfile,
    pub mode: Option<EvaluationMode>,
    pub equation_bundles: Vec<String>,
    /// Receipt kind (`evaluation`, `proxy_write`, ...).
    pub kind: &'static str,
    /// Extra bound content (e.g. the proxied request's route and record id).
    pub extra: Option<Value>,
    /// Receipts this decision depends on.
    pub dependencies: Vec<Uuid>,
}

impl EvalOptions {
    pub fn api(
        profile: EvaluationProfile,
        mode: Option<EvaluationMode>,
        bundles: Vec<String>,
    ) -> Self {
        EvalOptions {
            profile,
            mode,
            equation_bundles: bundles,
            kind: "evaluation",
            extra: None,
            dependencies: Vec::new(),
        }
    }
}

/// A committed evaluation.
pub struct Evaluated {
    pub response: EvaluateResponse,
    pub output: Arc<KernelOutput>,
    pub receipt_id: Uuid,
    pub replay_hash: String,
}

/// Loads the state basis of a signal's trace.
pub async fn basis_of(state: &AppState, s: &NormalizedSignal) -> Result<StateBasis, StoreError> {
    let trace = state.store.get_trace(s.tenant_id, s.trace_id).await?;
    let (recent, refused) = state
        .store
        .source_history(s.tenant_id, &s.source_id, SOURCE_WINDOW)
        .await?;
    Ok(StateBasis {
        trace_id: s.trace_id,
        phase: trace.map(|t| t.0),
        influence: trace.map(|t| t.1).unwrap_or(AllowedInfluence::None),
        source_recent: recent,
        source_refused: refused,
    })
}

/// The idempotency key of an evaluation: (kind, signal, profile, mode, coefficient version,
/// bundles). Bundles are the caller's strings: past a few hundred bytes they are bound by their
/// digest, so the key stays within what a unique index holds (PostgreSQL: ~2.7 KB an entry).
fn idem_key(opts: &EvalOptions, signal: Uuid, mode: EvaluationMode, version: Uuid) -> String {
    let mut bundles = opts.equation_bundles.join(",");
    if bundles.len() > 256 {
        bundles = format!("sha256:{}", crate::receipts::sha256_hex(bundles.as_bytes()));
    }
    format!(
        "{}:{}:{}:{}:{}:{}",
        opts.kind, signal, opts.profile, mode, version, bundles
    )
}

/// Evaluates a stored signal and commits its receipt. Idempotent per (signal,
/// profile, mode, coefficient version, bundles): the same request answers the
/// same receipt, which is what "same input, same decision and hash" means for
/// a stateful store.
pub async fn evaluate_signal(
    state: &AppState,
    signal: NormalizedSignal,
    opts: EvalOptions,
) -> Result<Evaluated, ApiError> {
    let rt = state.runtime();
    let tenant = rt
        .tenant(signal.tenant_id)
        .ok_or_else(|| ApiError::forbidden("tenant is not configured"))?;
    let policy = tenant.policy.clone();
    let mode = opts.mode.unwrap_or(policy.mode);
    let idem = idem_key(&opts, signal.id, mode, policy.version_id);
    if let Some(done) = stored_result(
        state,
        signal.tenant_id,
        &idem,
        &policy,
        &signal,
        opts.profile,
        mode,
    )
    .await?
    {
        return Ok(done);
    }
    let basis = basis_of(state, &signal).await?;
    let input = KernelInput {
        signal,
        profile: opts.profile,
        mode,
        equation_bundles: opts.equation_bundles.clone(),
        basis,
    };
    let out = state.cache.evaluate(&input, &policy);
    crate::metrics::DECISIONS
        .with_label_values(&[
            out.decision.as_str(),
            input.signal.target_substrate.as_str(),
        ])
        .inc();
    let receipt_id = crate::store::new_id();
    let tenant_id = input.signal.tenant_id;
    let content = receipt_content(
        receipt_id,
        &input,
        &out,
        &policy,
        opts.kind,
        opts.extra.clone(),
        &opts.dependencies,
    );
    let refused = matches!(
        out.decision,
        RuntimeDecision::Block
            | RuntimeDecision::Escalate
            | RuntimeDecision::Quarantine
            | RuntimeDecision::RequireReview
            | RuntimeDecision::Defer
    );
    let enforced = out.transition.enforced;
    let response_out = out.clone();
    let input_for_finish = input.clone();
    let write = ReceiptWrite {
        tenant: tenant_id,
        id: receipt_id,
        kind: opts.kind.into(),
        signal_id: Some(input.signal.id),
        source_id: Some(input.signal.source_id.clone()),
        refused,
        decision: out.decision.as_str().into(),
        outcome: out.outcome.as_str().into(),
        idem_key: Some(idem.clone()),
        content: crate::receipts::CanonicalContent::new(content),
        trace: enforced.then(|| TraceWrite {
            id: out.trace.id,
            phase: out.next_phase,
            influence: out.next_influence,
            trace_type: out.trace.trace_type.clone(),
        }),
        obstruction: out.obstruction.as_ref().map(|o| LifecycleWrite {
            id: o.id,
            status: o.status.as_str().into(),
            body: json!(o),
            parent: None,
        }),
        repair_plan: out.repair_plan.as_ref().map(|r| LifecycleWrite {
            id: r.id,
            status: r.status.as_str().into(),
            body: json!(r),
            parent: Some(r.obstruction_id),
        }),
        finish: Box::new(move |sealed| {
            let response = build_response(
                &input_for_finish,
                &response_out,
                sealed.receipt_id,
                sealed.replay_hash,
            );
            let events = events_for(&response, &response_out);
            Finish {
                result: serde_json::to_string(&response).ok(),
                events,
            }
        }),
    };
    match state.store.commit_receipt(write).await {
        Ok(c) => {
            let response = build_response(&input, &out, c.id, &c.replay_hash);
            Ok(Evaluated {
                response,
                output: out,
                receipt_id: c.id,
                replay_hash: c.replay_hash,
            })
        }
        // Two evaluations of the same request raced: answer the one that won.
        Err(StoreError::Conflict(_)) => stored_result(
            state,
            tenant_id,
            &idem,
            &policy,
            &input.signal,
            opts.profile,
            mode,
        )
        .await?
        .ok_or_else(|| ApiError::unavailable("concurrent evaluation did not settle; retry")),
        Err(e) => Err(e.into()),
    }
}

async fn stored_result(
    state: &AppState,
    tenant: Uuid,
    idem: &str,
    policy: &kernel::policy::CompiledPolicy,
    signal: &NormalizedSignal,
    profile: EvaluationProfile,
    mode: EvaluationMode,
) -> Result<Option<Evaluated>, ApiError> {
    let Some(row) = state.store.find_receipt_by_idem(tenant, idem).await? else {
        return Ok(None);
    };
    let Some(result) = row.result.as_deref() else {
        return Ok(None);
    };
    let response: EvaluateResponse = serde_json::from_str(result)
        .map_err(|e| ApiError::unavailable(format!("stored evaluation is unreadable: {e}")))?;
    // The kernel output is recomputed from the stored replay material (the
    // cache normally answers), so callers like the proxy get the same view.
    let content: Value = serde_json::from_str(&row.payload).unwrap_or(Value::Null);
    let input: KernelInput = match serde_json::from_value(
        content
            .get("replayMaterial")
            .cloned()
            .unwrap_or(Value::Null),
    ) {
        Ok(i) => i,
        Err(_) => KernelInput {
            signal: signal.clone(),
            profile,
            mode,
            equation_bundles: vec![],
            basis: StateBasis {
                trace_id: signal.trace_id,
                phase: None,
                influence: AllowedInfluence::None,
                source_recent: 0,
                source_refused: 0,
            },
        },
    };
    let output = state.cache.evaluate(&input, policy);
    let receipt_id = Uuid::parse_str(&row.id)
        .map_err(|_| ApiError::unavailable("stored receipt id is corrupt"))?;
    Ok(Some(Evaluated {
        response,
        output,
        receipt_id,
        replay_hash: row.replay_hash,
    }))
}

/// The content a receipt binds (before the chain fields are added).
pub fn receipt_content(
    receipt_id: Uuid,
    input: &KernelInput,
    out: &KernelOutput,
    policy: &kernel::policy::CompiledPolicy,
    kind: &str,
    extra: Option<Value>,
    dependencies: &[Uuid],
) -> Map<String, Value> {
    let s = &input.signal;
    let mut m = Map::new();
    m.insert("version".into(), json!(1));
    m.insert("kind".into(), json!(kind));
    m.insert("receiptId".into(), json!(receipt_id));
    m.insert("tenantId".into(), json!(s.tenant_id));
    m.insert("issuedAt".into(), json!(crate::store::now()));
    m.insert("signal".into(), json!({"id": s.id, "payloadDigest": s.payload_digest, "sourceId": s.source_id, "sourceType": s.source_type}));
    m.insert(
        "stateBasis".into(),
        json!({"traceId": input.basis.trace_id, "phase": input.basis.phase, "influence": input.basis.influence, "sourceRecent": input.basis.source_recent, "sourceRefused": input.basis.source_refused}),
    );
    m.insert("policy".into(), json!({"name": policy.name, "coefficientVersionId": policy.version_id, "contentHash": policy.content_hash}));
    m.insert("decision".into(), json!(out.decision));
    m.insert("governanceOutcome".into(), json!(out.outcome));
    m.insert("kernelStatus".into(), json!(out.status));
    m.insert("reasonCodes".into(), json!(out.reason_codes));
    m.insert("scores".into(), json!({"risk": out.risk_score, "authority": out.authority_score, "evidence": out.evidence_score}));
    m.insert(
        "mutation".into(),
        json!({"targetSubstrate": s.target_substrate, "proposedMutation": s.proposed_mutation, "transition": out.transition}),
    );
    m.insert(
        "obstructionId".into(),
        json!(out.obstruction.as_ref().map(|o| o.id)),
    );
    m.insert(
        "repairPlanId".into(),
        json!(out.repair_plan.as_ref().map(|r| r.id)),
    );
    m.insert("dependencies".into(), json!(dependencies));
    m.insert("kernelInputDigest".into(), json!(out.input_digest));
    m.insert(
        "replayMaterial".into(),
        serde_json::to_value(input).unwrap_or(Value::Null),
    );
    if let Some(x) = extra {
        m.insert("context".into(), x);
    }
    m
}

/// The spec's evaluate response for a committed decision.
pub fn build_response(
    input: &KernelInput,
    out: &KernelOutput,
    receipt_id: Uuid,
    replay_hash: &str,
) -> EvaluateResponse {
    let s = &input.signal;
    let governance = GovernanceDecision {
        id: Some(out.governance_decision_id),
        signal_id: s.id,
        receipt_id: Some(receipt_id),
        outcome: out.outcome,
        reason_codes: out.reason_codes.clone(),
        runtime_decision: Some(out.decision),
        allowed_influence: Some(out.allowed_influence.clone()),
        risk_score: None,
        authority_score: None,
        evidence_score: None,
    };
    let kernel_result = KernelResult {
        id: Some(out.kernel_result_id),
        tenant_id: s.tenant_id,
        signal_id: s.id,
        status: out.status,
        governed_signal: out.governed_signal.clone(),
        governance_decision: governance.clone(),
        trace: Some(out.trace.clone()),
        receipt: KernelReceiptRef { id: receipt_id, replay_hash: Some(replay_hash.to_string()), decision: Some(out.decision) },
        transition: Some(out.transition.clone()),
        obstruction: out.obstruction.clone(),
        repair_plan: out.repair_plan.clone(),
        completion_receipt_id: None,
        coordination_state: out.coordination_state.clone().map(|mut c| {
            c.source_receipt_id = Some(receipt_id);
            c
        }),
        metadata: Some(
            json!({"kernelInputDigest": out.input_digest, "evaluationMode": input.mode, "coefficientVersionId": out.profile_artifacts.get("coefficientVersionId")})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
    };
    EvaluateResponse {
        decision: out.decision,
        evaluation_profile: Some(input.profile),
        profile_artifacts: Some(out.profile_artifacts.clone()),
        governed_signal: Some(out.governed_signal.clone()),
        governance_decision: Some(GovernanceDecision {
            risk_score: Some(out.risk_score),
            authority_score: Some(out.authority_score),
            evidence_score: Some(out.evidence_score),
            ..governance
        }),
        kernel_result: Some(kernel_result),
        receipt: Some(ReceiptRef {
            id: receipt_id,
            replay_hash: Some(replay_hash.to_string()),
            decision: Some(out.decision),
        }),
        signal: Some(SignalIdRef { id: s.id }),
        reason_codes: Some(out.reason_codes.clone()),
    }
}

/// Events a committed evaluation causes.
fn events_for(response: &EvaluateResponse, out: &KernelOutput) -> Vec<EventWrite> {
    let receipt = json!(response.receipt);
    let mut v = vec![
        EventWrite {
            name: "signal.evaluated".into(),
            data: json!({"signalId": out.governed_signal.substrate_signal_id, "decision": out.decision, "outcome": out.outcome, "receipt": receipt}),
        },
        EventWrite {
            name: "receipt.created".into(),
            data: receipt.clone(),
        },
    ];
    match out.decision {
        RuntimeDecision::Block | RuntimeDecision::Escalate => v.push(EventWrite {
            name: "signal.blocked".into(),
            data: json!({"signalId": out.governed_signal.substrate_signal_id, "decision": out.decision, "reasonCodes": out.reason_codes, "receipt": receipt}),
        }),
        RuntimeDecision::Quarantine | RuntimeDecision::RequireReview | RuntimeDecision::Defer => v.push(EventWrite {
            name: "signal.quarantined".into(),
            data: json!({"signalId": out.governed_signal.substrate_signal_id, "decision": out.decision, "reasonCodes": out.reason_codes, "receipt": receipt}),
        }),
        _ => {}
    }
    if let Some(o) = &out.obstruction {
        v.push(EventWrite {
            name: "obstruction.opened".into(),
            data: json!({"obstruction": o, "receipt": receipt}),
        });
    }
    if let Some(p) = &out.repair_plan {
        v.push(EventWrite {
            name: "repair.proposed".into(),
            data: json!({"repairPlan": p, "receipt": receipt}),
        });
    }
    v
}
