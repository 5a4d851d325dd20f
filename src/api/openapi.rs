//! `GET /openapi.json`: OpenAPI 3.1.0 generated from the handlers' own
//! annotations and the spec types they (de)serialize, so it cannot drift.

use super::error::{FieldError, Problem};
use crate::kernel::operations::action::{ActionKind, BasisView};
use crate::kernel::operations::canonicalization::Assessment;
use crate::kernel::operations::configuration::{Boundary, Conflict, MemberView, WeakestLink};
use crate::kernel::operations::retrieval::RetrievalTreatment;
use crate::kernel::operations::reversal::{Residue, ResidueKind, ReversalMode};
use crate::kernel::types::*;
use crate::operations::types::*;
use crate::webhooks::{
    WebhookDelivery, WebhookRedriveRequest, WebhookRedriveResponse, WebhookRotateRequest,
    WebhookRotateResponse, WebhookSubscription, WebhookSubscriptionUpsert,
};
use axum::http::header;
use axum::response::IntoResponse;
use std::sync::LazyLock;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

pub const API_VERSION: &str = "0.14.0-rc1";

#[derive(OpenApi)]
#[openapi(
    info(title = "substrate-gate: Governed Signal Integrity Service", version = "0.14.0-rc1", description = "Integrity sidecar and API: ingest, evaluate, receipts, replay, the five canonical operations, the governance lifecycle."),
    paths(
        super::health::health,
        super::health::healthz,
        super::health::readyz,
        serve,
        super::signals::ingest,
        super::evaluate::evaluate,
        super::receipts::fetch,
        super::receipts::replay,
        super::receipts::latest_checkpoint,
        super::receipts::sign_checkpoint,
        super::receipts::checkpoint_key,
        super::operations::configurations,
        super::operations::canonicalization,
        super::operations::retrieval,
        super::operations::actions,
        super::operations::reversal,
        super::operations::coordination,
        super::lifecycle::list_obstructions,
        super::lifecycle::get_obstruction,
        super::lifecycle::resolve_obstruction,
        super::lifecycle::reject_obstruction,
        super::lifecycle::escalate_obstruction,
        super::lifecycle::list_plans,
        super::lifecycle::get_plan,
        super::lifecycle::approve_plan,
        super::lifecycle::reject_plan,
        super::lifecycle::complete_plan,
        super::webhooks::upsert_subscription,
        super::webhooks::list_subscriptions,
        super::webhooks::rotate_secret,
        super::webhooks::dead_letters,
        super::webhooks::redrive,
        super::quarantine::list,
        super::quarantine::fetch,
        super::quarantine::release,
        super::quarantine::reject,
    ),
    components(schemas(
        Problem, FieldError, HealthResponse, IngestRequest, IngestResponse, SignalRecord, GovernedSignal, GovernanceDecision,
        EvaluateRequest, EvaluateResponse, ReceiptRef, KernelReceiptRef, SignalIdRef, KernelResult, Trace, Transition,
        Obstruction, RepairPlan, RepairStep, CoordinationState, ReceiptBody, ReceiptResponse, ReplayRequest, KernelArtifact,
        Reexecution, KernelReplayResponse, ProductSurface, SourceType, TargetSubstrate, ProposedMutation, EventType, Intent,
        GovernedTargetType, RiskClass, RuntimeDecision, GovernanceOutcome, EvaluationProfile, EvaluationMode, KernelStatus,
        TracePhase, AllowedInfluence, ObstructionType, ObstructionStatus, ObstructionTargetType, RepairClass, RepairStatus,
        ExpectedOutcome, CoordinationSubjectType, CoordinationRegime, ReplayStatus, SubscriptionStatus,
        SubjectRef, PromotionTarget, ConfigurationMember, ConfigurationEvaluateRequest, ConfigurationEvaluateResponse, WeakestLink, Boundary, Conflict, MemberView,
        CanonicalizationEvaluateRequest, CanonicalizationEvaluateResponse, Assessment,
        RetrievalCandidate, RetrievalFilterRequest, RetrievalFilterResponse, RetrievalResult, TreatmentCounts, RetrievalTreatment,
        ProtectedAction, ActionKind, ActionReleaseRequest, ActionReleaseResponse, BasisView,
        ReversalEvaluateRequest, ReversalEvaluateResponse, ReversalMode, Dependent, Residue, ResidueKind,
        LifecycleActionRequest, LifecycleResponse, ObstructionDetail, RepairPlanDetail,
        WebhookSubscription, WebhookSubscriptionUpsert, WebhookRotateRequest, WebhookRotateResponse,
        WebhookDelivery, WebhookRedriveRequest, WebhookRedriveResponse,
        super::quarantine::QuarantineEntry, super::quarantine::QuarantineStatus, super::quarantine::QuarantineFilter, super::quarantine::HeldRequest,
        super::quarantine::QuarantineList, super::quarantine::QuarantineReleaseResponse, super::quarantine::QuarantineRejectResponse
    )),
    modifiers(&Security),
    tags((name = "health"), (name = "signals"), (name = "receipts"), (name = "operations"), (name = "lifecycle"), (name = "webhooks"), (name = "quarantine", description = "Records the sidecar held for review"))
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("API key")
                    .build(),
            ),
        );
        // The specification's tenant header, declared as an API-key scheme in a header. No
        // operation lists it as a way to authenticate (see `tenant_header_as_parameter`): it
        // checks the Bearer key's tenant and never replaces the key.
        components.add_security_scheme(
            "tenantHeader",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-tenant-id",
                "Optional tenant check: when present it must equal the Bearer key's tenant \
                 (400 when not a UUID, 403 when another tenant's). Never a credential on its own.",
            ))),
        );
    }
}

/// OpenAPI links between operations (the id an answer names, used by the next call), so that
/// clients and stateful testers (Schemathesis) can follow ingest → evaluate → receipt → replay.
/// A link is added only when its source response and target operation are both documented.
/// Added to the JSON form: utoipa 5.5's `Link` serializes `operation_id` / `request_body` in
/// snake_case, which OpenAPI tools do not read.
/// (source path, source method, status, link name, link object)
const LINKS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "/substrate/signals/ingest",
        "post",
        "200",
        "EvaluateSignal",
        r#"{"operationId": "evaluate", "requestBody": {"signalId": "$response.body#/signal/id"}}"#,
    ),
    (
        "/substrate/integrity/evaluate",
        "post",
        "200",
        "FetchReceipt",
        r#"{"operationId": "fetch", "parameters": {"id": "$response.body#/receipt/id"}}"#,
    ),
    (
        "/substrate/integrity/evaluate",
        "post",
        "200",
        "ReplayReceipt",
        r#"{"operationId": "replay", "parameters": {"id": "$response.body#/receipt/id"}}"#,
    ),
    (
        "/substrate/receipts/{id}",
        "get",
        "200",
        "ReplayReceipt",
        r#"{"operationId": "replay", "parameters": {"id": "$response.body#/receipt/id"}}"#,
    ),
];

/// `x-tenant-id` is an optional check, not a credential: handlers list `("tenantHeader" = [])` in
/// their `security(...)`, which OpenAPI reads as an alternative way to authenticate (any client
/// or tester may then send the header *instead of* the Bearer key). In the served document it
/// becomes what it is: an optional `x-tenant-id` header parameter (a UUID that must equal the
/// key's tenant: 400 when not a UUID, 403 when another tenant's) beside Bearer authentication.
fn tenant_header_as_parameter(doc: &mut serde_json::Value) {
    use serde_json::{json, Value};
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for op in item.values_mut().filter_map(Value::as_object_mut) {
            let Some(Value::Array(security)) = op.get_mut("security") else {
                continue;
            };
            let before = security.len();
            security.retain(|req| req.get("tenantHeader").is_none());
            if security.len() == before {
                continue;
            }
            let params = op
                .entry("parameters")
                .or_insert_with(|| json!([]))
                .as_array_mut();
            if let Some(params) = params {
                if !params.iter().any(|p| {
                    p["in"] == "header"
                        && p["name"].as_str().map(str::to_ascii_lowercase).as_deref()
                            == Some("x-tenant-id")
                }) {
                    params.push(json!({
                        "name": "x-tenant-id",
                        "in": "header",
                        "required": false,
                        "description": "Optional: when present it must be the API key's tenant (400 when not a UUID, 403 when another tenant's).",
                        "schema": {"type": "string", "format": "uuid"}
                    }));
                }
            }
            // The header brings its own 400 to operations that have no other input.
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                responses.entry("400").or_insert_with(|| {
                    json!({
                        "description": "x-tenant-id is not a UUID (named in errors[])",
                        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
                    })
                });
            }
        }
    }
}

/// `eventName` (query filters, subscriptions, deliveries) is one of the contract's event names
/// (400 otherwise): the served document lists them as an enum, from the same table the handlers
/// check against.
fn event_name_enums(doc: &mut serde_json::Value) {
    use serde_json::Value;
    let names: Vec<Value> = crate::webhooks::events::EVENT_NAMES
        .iter()
        .map(|n| Value::from(*n))
        .collect();
    // Subscriptions (and the deliveries that name them) carry one of them, too.
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for schema in schemas.values_mut() {
            if let Some(prop) = schema.pointer_mut("/properties/eventName") {
                *prop = serde_json::json!({"type": "string", "enum": names});
            }
        }
    }
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for op in item.values_mut().filter_map(Value::as_object_mut) {
            let Some(Value::Array(params)) = op.get_mut("parameters") else {
                continue;
            };
            for p in params.iter_mut() {
                if p["in"] == "query" && p["name"] == "eventName" {
                    p["schema"] = serde_json::json!({"type": "string", "enum": names});
                }
            }
        }
    }
}

/// A secret a caller gives: `whsec_` + standard base64 (padded, canonical: the key bytes, as
/// Standard Webhooks libraries read it), or any other non-empty string (its UTF-8 bytes are the
/// key). `key_bytes` in `webhooks::signing` is the parser this describes.
fn secret_schemas(doc: &mut serde_json::Value) {
    const BASE64: &str = "^whsec_([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$";
    for (schema, min) in [
        ("WebhookSubscriptionUpsert", 1),
        ("WebhookRotateRequest", 16),
    ] {
        if let Some(prop) =
            doc.pointer_mut(&format!("/components/schemas/{schema}/properties/secret"))
        {
            *prop = serde_json::json!({
                "type": "string",
                "minLength": min,
                "description": "whsec_ + standard base64 of the key bytes, or any other string (its UTF-8 bytes are the key)",
                "anyOf": [{"pattern": BASE64}, {"not": {"pattern": "^whsec_"}}]
            });
        }
    }
}

fn add_links(doc: &mut serde_json::Value) {
    let ids: std::collections::HashSet<String> = doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .filter_map(|item| item.as_object())
        .flat_map(|item| item.values())
        .filter_map(|op| op.get("operationId").and_then(|v| v.as_str()))
        .map(str::to_string)
        .collect();
    for (path, method, status, name, link) in LINKS {
        let Ok(link) = serde_json::from_str::<serde_json::Value>(link) else {
            continue;
        };
        if !link["operationId"]
            .as_str()
            .is_some_and(|t| ids.contains(t))
        {
            continue;
        }
        let Some(resp) = doc
            .pointer_mut(&format!(
                "/paths/{}/{method}/responses/{status}",
                path.replace('~', "~0").replace('/', "~1")
            ))
            .and_then(|r| r.as_object_mut())
        else {
            continue;
        };
        if let Some(links) = resp
            .entry("links")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
        {
            links.insert((*name).to_string(), link);
        }
    }
}

/// A request body the route may go without (declared `Option<T>`: an empty body is `{}`) is not
/// `required`; when one is sent it is a `T` object. utoipa writes the option as `oneOf: [null, T]`,
/// which would document a JSON `null` body as valid: the schema is `T`.
fn optional_bodies(doc: &mut serde_json::Value) {
    use serde_json::Value;
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for op in item.values_mut() {
            let Some(schema) = op.pointer_mut("/requestBody/content/application~1json/schema")
            else {
                continue;
            };
            let inner = schema["oneOf"]
                .as_array()
                .and_then(|alts| match alts.as_slice() {
                    [a, b] if a["type"] == "null" => Some(b.clone()),
                    [a, b] if b["type"] == "null" => Some(a.clone()),
                    _ => None,
                });
            if let Some(inner) = inner {
                *schema = inner;
            }
        }
    }
}

/// The gate refuses a NUL character in any typed string (PostgreSQL stores none; see
/// `api::extract`): every string schema with no format, enumeration or pattern of its own says
/// so with a pattern, in bodies and parameters alike. Free-form objects (metadata) keep theirs.
fn no_nul_strings(doc: &mut serde_json::Value) {
    use serde_json::Value;
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                let is_string = match m.get("type") {
                    Some(Value::String(t)) => t == "string",
                    Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                    _ => false,
                };
                let constrained = ["format", "enum", "const", "pattern"]
                    .iter()
                    .any(|k| m.contains_key(*k));
                if is_string && !constrained {
                    m.insert("pattern".into(), Value::from("^[^\\u0000]*$"));
                }
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    for key in ["paths", "components"] {
        if let Some(v) = doc.get_mut(key) {
            walk(v);
        }
    }
}

/// The document, with routes of other modules merged in, and the OpenAPI
/// 3.1 top-level `webhooks` (utoipa has no field for it: it goes in as a
/// top-level key through the flattened extensions map).
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.extensions.get_or_insert_with(Default::default).insert(
        "webhooks".into(),
        crate::webhooks::events::openapi_webhooks(),
    );
    doc
}

static DOC: LazyLock<String> = LazyLock::new(|| {
    let mut doc = serde_json::to_value(document()).unwrap_or_default();
    tenant_header_as_parameter(&mut doc);
    event_name_enums(&mut doc);
    secret_schemas(&mut doc);
    optional_bodies(&mut doc);
    no_nul_strings(&mut doc);
    add_links(&mut doc);
    serde_json::to_string(&doc).unwrap_or_else(|_| "{}".into())
});

/// The OpenAPI document of this service.
#[utoipa::path(get, path = "/openapi.json", tag = "health", responses((status = 200, description = "OpenAPI 3.1.0 document", content_type = "application/json", body = Object)))]
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOC.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's tenant header is declared as an API-key scheme in a header, and no operation
    /// offers it in place of the Bearer key.
    #[test]
    fn tenant_header_is_a_declared_scheme_but_never_a_credential() {
        let doc: serde_json::Value = serde_json::from_str(&DOC).unwrap();
        let scheme = &doc["components"]["securitySchemes"]["tenantHeader"];
        assert_eq!(
            (&scheme["type"], &scheme["in"], &scheme["name"]),
            (&"apiKey".into(), &"header".into(), &"x-tenant-id".into())
        );
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                for req in op["security"].as_array().into_iter().flatten() {
                    assert!(req.get("tenantHeader").is_none(), "{op}");
                }
            }
        }
    }

    /// The documented reference pattern is the one the handlers parse with.
    #[test]
    fn subject_ref_pattern_is_the_parsers() {
        let doc: serde_json::Value = serde_json::from_str(&DOC).unwrap();
        assert_eq!(
            doc["components"]["schemas"]["SubjectRef"]["pattern"],
            crate::kernel::operations::SUBJECT_REF_PATTERN
        );
        let re = regex::Regex::new(crate::kernel::operations::SUBJECT_REF_PATTERN).unwrap();
        let id = "0b7c9a52-6f0e-4a57-9d1c-2f6a3e0b9c11";
        for ok in [
            id.to_string(),
            format!("trace:{id}"),
            format!("receipt:{id}"),
            id.to_uppercase(),
        ] {
            assert!(re.is_match(&ok));
            assert!(
                crate::kernel::operations::parse_subject_ref(&ok).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            format!(" {id}"),
            format!("Trace:{id}"),
            format!("action:{id}"),
            id.replace('-', ""),
            format!("{{{id}}}"),
            format!("urn:uuid:{id}"),
        ] {
            assert!(!re.is_match(&bad));
            assert!(
                crate::kernel::operations::parse_subject_ref(&bad).is_err(),
                "{bad}"
            );
        }
    }

    /// The documented secret schema accepts exactly what `key_bytes` accepts.
    #[test]
    fn secret_schema_is_the_parsers() {
        use crate::webhooks::signing::key_bytes;
        let doc: serde_json::Value = serde_json::from_str(&DOC).unwrap();
        let prop =
            &doc["components"]["schemas"]["WebhookSubscriptionUpsert"]["properties"]["secret"];
        let canonical = regex::Regex::new(prop["anyOf"][0]["pattern"].as_str().unwrap()).unwrap();
        let documented =
            |s: &str| !s.is_empty() && (canonical.is_match(s) || !s.starts_with("whsec_"));
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut cases = vec![
            String::new(),
            "whsec_".into(),
            "whsec_ AAAA".into(),
            "whsec_AAAA ".into(),
            "whsec_AAA".into(),
            "whsec_AAAA=".into(),
            "whsec_====".into(),
            "whsec".into(),
            "a".into(),
            "whsec-AAAA".into(),
        ];
        for &a in ALPHABET {
            for &b in ALPHABET {
                cases.push(format!("whsec_AAAA{}{}==", a as char, b as char));
                for &c in ALPHABET.iter().step_by(3) {
                    cases.push(format!("whsec_{}{}{}=", a as char, b as char, c as char));
                }
            }
        }
        for case in cases {
            assert_eq!(documented(&case), key_bytes(&case).is_ok(), "{case:?}");
        }
    }

    /// The routes whose body is optional (an empty body is `{}`) say so, and document the
    /// object they take when one is sent, not `null`.
    #[test]
    fn optional_bodies_are_not_required_and_are_objects() {
        let doc: serde_json::Value = serde_json::from_str(&DOC).unwrap();
        let op = |path: &str| doc["paths"][path]["post"]["requestBody"].clone();
        for path in [
            "/substrate/receipts/{id}/replay",
            "/substrate/webhooks/deliveries/{id}/redrive",
            "/substrate/webhooks/subscriptions/{id}/rotate",
            "/substrate/repair-plans/{id}/approve",
            "/substrate/quarantine/{id}/release",
        ] {
            let body = op(path);
            assert_ne!(body["required"], true, "{path}");
            let schema = &body["content"]["application/json"]["schema"];
            assert!(schema["$ref"].is_string(), "{path}: {schema}");
        }
        assert_eq!(op("/substrate/signals/ingest")["required"], true);
    }

    /// Every operation that takes input documents the 400 it answers for bad input.
    #[test]
    fn operations_with_input_document_400() {
        let doc: serde_json::Value = serde_json::from_str(&DOC).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let takes_input = op.get("requestBody").is_some()
                    || op["parameters"].as_array().is_some_and(|p| !p.is_empty());
                if takes_input {
                    assert!(
                        op["responses"].get("400").is_some(),
                        "{method} {path} takes input but documents no 400"
                    );
                }
            }
        }
    }
}
