//! The events of the contract: their names, what each one's `data` holds,
//! and the OpenAPI 3.1 `webhooks` section that documents them. Every event
//! body is the envelope `{type, id, timestamp, tenantId, data}`.

use serde_json::{json, Value};

/// Event names a subscription may name (the contract's list).
pub const EVENT_NAMES: &[&str] = &[
    "signal.ingested",
    "signal.evaluated",
    "signal.blocked",
    "signal.quarantined",
    "receipt.created",
    "replay.mismatch",
    "obstruction.opened",
    "repair.proposed",
    "quarantine.released",
    "config.reloaded",
    "config.reload_failed",
    "delivery.dead_lettered",
];

pub fn is_event_name(name: &str) -> bool {
    EVENT_NAMES.contains(&name)
}

fn r(schema: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{schema}")})
}

fn nullable(schema: &str) -> Value {
    json!({"oneOf": [r(schema), {"type": "null"}]})
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "required": required, "properties": properties})
}

/// (name, when it is sent, schema of `data`) for every event.
pub fn catalog() -> Vec<(&'static str, &'static str, Value)> {
    let uuid = json!({"type": "string", "format": "uuid"});
    let receipt = nullable("ReceiptRef");
    let reason_codes = json!({"type": "array", "items": {"type": "string"}});
    vec![
        (
            "signal.ingested",
            "A signal was ingested and normalized (API ingest, or a record the proxy turned into a signal).",
            object(
                &["signal", "governedSignal"],
                json!({"signal": r("SignalRecord"), "governedSignal": r("GovernedSignal")}),
            ),
        ),
        (
            "signal.evaluated",
            "A signal's integrity was evaluated and its receipt committed.",
            object(
                &["decision", "outcome", "receipt"],
                json!({"signalId": {"oneOf": [uuid, {"type": "null"}]}, "decision": r("RuntimeDecision"), "outcome": r("GovernanceOutcome"), "receipt": receipt}),
            ),
        ),
        (
            "signal.blocked",
            "An evaluation decided block or escalate: the write does not reach the substrate.",
            object(
                &["decision", "reasonCodes", "receipt"],
                json!({"signalId": {"oneOf": [uuid, {"type": "null"}]}, "decision": r("RuntimeDecision"), "reasonCodes": reason_codes, "receipt": receipt}),
            ),
        ),
        (
            "signal.quarantined",
            "An evaluation decided quarantine, require_review or defer: the write is held.",
            object(
                &["decision", "reasonCodes", "receipt"],
                json!({"signalId": {"oneOf": [uuid, {"type": "null"}]}, "decision": r("RuntimeDecision"), "reasonCodes": reason_codes, "receipt": receipt}),
            ),
        ),
        (
            "receipt.created",
            "A receipt was appended to the tenant's chain. `data` is the receipt reference itself.",
            r("ReceiptRef"),
        ),
        (
            "replay.mismatch",
            "A replay found the stored receipt altered (hash mismatch) or the decision no longer reproduced.",
            object(
                &["receiptId", "replayStatus", "mismatches"],
                json!({
                    "receiptId": uuid,
                    "replayStatus": r("ReplayStatus"),
                    "mismatches": {"type": "array", "items": {"type": "string"}},
                    "expectedHash": {"type": ["string", "null"]},
                    "actualHash": {"type": ["string", "null"]}
                }),
            ),
        ),
        (
            "obstruction.opened",
            "An evaluation opened an obstruction.",
            object(
                &["obstruction", "receipt"],
                json!({"obstruction": r("Obstruction"), "receipt": receipt}),
            ),
        ),
        (
            "repair.proposed",
            "An evaluation proposed a repair plan for an obstruction.",
            object(
                &["repairPlan", "receipt"],
                json!({"repairPlan": r("RepairPlan"), "receipt": receipt}),
            ),
        ),
        (
            "quarantine.released",
            "A record held in the gate's quarantine was released by a reviewer and forwarded. `data` describes the released record and the receipt of the release.",
            json!({"type": "object", "additionalProperties": true}),
        ),
        (
            "config.reloaded",
            "A new configuration was validated and swapped in (sent to every configured tenant).",
            object(&["version"], json!({"version": {"type": "string", "description": "first 12 hex digits of the effective config's sha256"}})),
        ),
        (
            "config.reload_failed",
            "A configuration change was refused; the running configuration stays (sent to every configured tenant).",
            object(&["problems"], json!({"problems": {"type": "array", "items": {"type": "string"}, "description": "each problem with its path, e.g. `webhooks.timeout_ms: must be 1 to 300000`"}})),
        ),
        (
            "delivery.dead_lettered",
            "A delivery used up its retry schedule and was dead-lettered. Never sent about a delivery.dead_lettered delivery.",
            object(
                &["delivery", "eventId"],
                json!({"delivery": r("WebhookDelivery"), "eventId": {"type": "string", "format": "uuid", "description": "id of the event that could not be delivered"}}),
            ),
        ),
    ]
}

/// The OpenAPI 3.1 top-level `webhooks` object: one POST per event, with
/// the signing headers and the body.
pub fn openapi_webhooks() -> Value {
    let header = |name: &str, description: &str, schema: Value| json!({"name": name, "in": "header", "required": true, "description": description, "schema": schema});
    let parameters = json!([
        header("webhook-id", "The delivery id (a UUID). Stable across retries: the receiver's idempotency key.", json!({"type": "string", "format": "uuid"})),
        header("webhook-timestamp", "Unix seconds at which this attempt was signed. Receivers should refuse timestamps far from their clock (e.g. more than 5 minutes).", json!({"type": "string", "pattern": "^[0-9]+$"})),
        header("webhook-signature", "Space-separated `v1,<base64 HMAC-SHA256 of \"{webhook-id}.{webhook-timestamp}.{body}\">`, one per secret that signs (two during a rotation's grace period). The key is the base64-decoded part after `whsec_` for whsec_ secrets, else the secret's UTF-8 bytes.", json!({"type": "string"})),
        header("webhook-attempt", "Number of this attempt over the delivery's life (1, 2, ...).", json!({"type": "string", "pattern": "^[0-9]+$"})),
    ]);
    let mut out = serde_json::Map::new();
    for (name, description, data) in catalog() {
        let body = json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["type", "id", "timestamp", "tenantId", "data"],
            "properties": {
                "type": {"type": "string", "const": name},
                "id": {"type": "string", "format": "uuid", "description": "event id (one event may be delivered to several subscriptions)"},
                "timestamp": {"type": "string", "format": "date-time"},
                "tenantId": {"type": "string", "format": "uuid"},
                "data": data
            }
        });
        out.insert(
            name.to_string(),
            json!({
                "post": {
                    "operationId": format!("webhook_{}", name.replace('.', "_")),
                    "summary": name,
                    "description": description,
                    "tags": ["webhooks"],
                    "parameters": parameters,
                    "requestBody": {"required": true, "content": {"application/json": {"schema": body}}},
                    "responses": {
                        "2XX": {"description": "Delivered. Any other answer (or none within the timeout) is retried on the schedule; 410 Gone also pauses the subscription; Retry-After is honoured on 429 and 503."}
                    }
                }
            }),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_is_documented_once() {
        let c = catalog();
        let names: Vec<&str> = c.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, EVENT_NAMES);
        let w = openapi_webhooks();
        assert_eq!(w.as_object().unwrap().len(), EVENT_NAMES.len());
    }
}
