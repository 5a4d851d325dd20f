//! Webhooks end to end, against the real binary on SQLite and PostgreSQL,
//! with a real receiver on loopback: signing (checked by Python's hmac, not
//! the service's code), rotation, retries, dead letters, redrive, 410 /
//! Retry-After / redirects / timeouts, paused and revoked subscriptions,
//! every spec limit as a 400 naming its field, tenant isolation, SSRF
//! refusals at upsert and at delivery, and the OpenAPI `webhooks` section.

mod common;
mod webhook_receiver;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use webhook_receiver::*;

const SUBSCRIPTION_FIELDS: &[&str] = &[
    "id",
    "tenantId",
    "productSurface",
    "eventName",
    "targetUrl",
    "secret",
    "status",
    "metadata",
];
const DELIVERY_FIELDS: &[&str] = &[
    "id",
    "tenantId",
    "subscriptionId",
    "eventName",
    "deliveryStatus",
    "attemptCount",
    "httpStatus",
    "lastError",
    "nextRetryAt",
    "deadLetteredAt",
    "redrivenAt",
    "redriveCount",
    "createdAt",
];

/// Gate options with extra `[webhooks]` keys. The harness writes
/// `schedule_secs = {webhook_schedule}` inside `[webhooks]`, so further keys
/// of that table ride along on the following lines.
fn opts(b: Backend, schedule: &str, webhook_keys: &str) -> GateOptions {
    let mut o = GateOptions::new(b);
    o.webhook_schedule = format!("{schedule}\n{webhook_keys}");
    o
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn subscribe(g: &Gate, key: &str, event: &str, url: &str, extra: Value) -> Value {
    let mut body = json!({"productSurface": "generic", "eventName": event, "targetUrl": url});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (s, v) = g
        .post(key, "/substrate/webhooks/subscriptions", &body)
        .await;
    assert_eq!(s, 200, "subscribe: {v}");
    v
}

async fn eventually(deadline: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn body_of(h: &Hit) -> Value {
    serde_json::from_str(&h.body).expect("event body is JSON")
}

#[tokio::test]
async fn deliveries_are_signed_and_verify_with_an_independent_hmac() {
    for b in backends() {
        let r = Receiver::start().await;
        let g = Gate::start(opts(b, "[0, 1, 1]", "")).await;
        let generated = subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/generated"),
            json!({"metadata": {"team": "ops"}}),
        )
        .await;
        assert_eq!(keys(&generated), set(SUBSCRIPTION_FIELDS), "{generated}");
        assert_eq!(generated["tenantId"], DEMO_TENANT);
        assert_eq!(generated["status"], "active");
        let secret = generated["secret"].as_str().unwrap().to_string();
        let raw = secret
            .strip_prefix("whsec_")
            .expect("generated secrets are whsec_");
        use base64::Engine;
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(raw)
                .unwrap()
                .len(),
            32
        );
        let plain = subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/plain"),
            json!({"secret": "a-plain-shared-secret"}),
        )
        .await;
        assert_eq!(
            keys(&plain),
            set(&SUBSCRIPTION_FIELDS[..7]),
            "no metadata given, none answered"
        );

        let signal = g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(10), |h| h.len() >= 2).await,
            "{b:?}: deliveries did not arrive\n{}",
            g.log()
        );
        for (path, secret) in [
            ("/generated", secret.as_str()),
            ("/plain", "a-plain-shared-secret"),
        ] {
            let hits = r.hits_on(path);
            assert_eq!(hits.len(), 1, "{path}");
            let h = &hits[0];
            assert!(
                uuid::Uuid::parse_str(&h.id).is_ok(),
                "webhook-id is the delivery id"
            );
            let ts: i64 = h.timestamp.parse().unwrap();
            assert!((chrono::Utc::now().timestamp() - ts).abs() < 60);
            let sigs = signatures(&h.signature);
            assert_eq!(sigs.len(), 1, "{}", h.signature);
            assert_eq!(
                sigs[0],
                python_signature(secret, &h.id, &h.timestamp, &h.body),
                "{b:?} {path}: signature must verify independently"
            );
            let body = body_of(h);
            assert_eq!(
                keys(&body),
                set(&["type", "id", "timestamp", "tenantId", "data"])
            );
            assert_eq!(body["type"], "signal.ingested");
            assert_eq!(body["tenantId"], DEMO_TENANT);
            assert_eq!(body["data"]["signal"]["id"], signal.as_str());
            assert_eq!(h.attempt, 1);
        }
        // One event, two deliveries with their own ids, same event id.
        let (a, c) = (&r.hits_on("/generated")[0], &r.hits_on("/plain")[0]);
        assert_ne!(a.id, c.id);
        assert_eq!(body_of(a)["id"], body_of(c)["id"]);
        let id = a.id.clone();
        assert!(
            eventually(Duration::from_secs(5), async || {
                g.count(&format!("SELECT COUNT(*) FROM webhook_deliveries WHERE id = '{id}' AND delivery_status = 'delivered' AND attempt_count = 1 AND http_status = 200")).await == 1
            })
            .await
        );
        // Another tenant's events never reach this tenant's subscriptions.
        g.ingest(OTHER_KEY, signal_body(json!({}))).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(r.hits().len(), 2, "{b:?}");
    }
}

#[tokio::test]
async fn rotation_signs_with_both_secrets_during_the_grace_period_then_only_the_new() {
    for b in backends() {
        let r = Receiver::start().await;
        // The harness config has rotation_grace_secs = 2.
        let g = Gate::start(opts(b, "[0, 1, 1]", "")).await;
        let old = "old-secret-0123456789";
        let new = "whsec_bmV3LXNlY3JldC1ieXRlcy0wMTIzNDU2Nzg5YWJjZA==";
        let sub = subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/rot"),
            json!({"secret": old}),
        )
        .await;
        let id = sub["id"].as_str().unwrap();
        let path = format!("/substrate/webhooks/subscriptions/{id}/rotate");
        let (s, v) = g
            .post(
                DEMO_KEY,
                &path,
                &json!({"secret": new, "rotationReason": "quarterly", "tenantId": DEMO_TENANT}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        let rotated_at = Instant::now();
        let mut want = set(SUBSCRIPTION_FIELDS);
        want.remove("metadata");
        want.insert("rotatedAt".into());
        assert_eq!(keys(&v), want, "{v}");
        assert_eq!(v["secret"], new);
        assert!(chrono::DateTime::parse_from_rfc3339(v["rotatedAt"].as_str().unwrap()).is_ok());

        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(10), |h| h.len() == 1).await,
            "{}",
            g.log()
        );
        let h = &r.hits()[0];
        assert!(
            rotated_at.elapsed() < Duration::from_secs(2),
            "test too slow to see the grace period"
        );
        let sigs = signatures(&h.signature);
        assert_eq!(
            sigs,
            vec![
                python_signature(new, &h.id, &h.timestamp, &h.body),
                python_signature(old, &h.id, &h.timestamp, &h.body)
            ],
            "{b:?}: during the grace period both secrets sign, the new one first"
        );

        tokio::time::sleep(Duration::from_millis(2300).saturating_sub(rotated_at.elapsed())).await;
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(r.wait_for(Duration::from_secs(10), |h| h.len() == 2).await);
        let h = &r.hits()[1];
        assert_eq!(
            signatures(&h.signature),
            vec![python_signature(new, &h.id, &h.timestamp, &h.body)],
            "{b:?}: after the grace period only the new secret signs"
        );

        // Without a body: a generated secret.
        let resp = g
            .client
            .post(g.url(&path))
            .bearer_auth(DEMO_KEY)
            .send()
            .await
            .unwrap();
        let (s, v) = status_json(resp).await;
        assert_eq!(s, 200, "{v}");
        assert!(v["secret"].as_str().unwrap().starts_with("whsec_"));
        assert_ne!(v["secret"], new);
    }
}

#[tokio::test]
async fn a_failing_receiver_is_retried_then_dead_lettered_listed_redriven_and_delivered() {
    for b in backends() {
        let r = Receiver::start().await;
        let g = Gate::start(opts(b, "[0, 1, 1]", "jitter = \"none\"")).await;
        r.set_default("/fail", Reply::status(500).body("receiver down"));
        let sub = subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/fail"), json!({})).await;
        subscribe(
            &g,
            DEMO_KEY,
            "delivery.dead_lettered",
            &r.url("/dlq"),
            json!({}),
        )
        .await;
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;

        assert!(
            r.wait_for(Duration::from_secs(15), |_| r.hits_on("/fail").len() >= 3)
                .await,
            "{b:?}: three attempts expected\n{}",
            g.log()
        );
        let hits = r.hits_on("/fail");
        let id = hits[0].id.clone();
        assert!(
            hits.iter().all(|h| h.id == id),
            "webhook-id is stable across retries"
        );
        assert_eq!(
            hits.iter().map(|h| h.attempt).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        for w in hits.windows(2) {
            let gap = w[1].at - w[0].at;
            assert!(
                gap >= Duration::from_millis(950) && gap < Duration::from_millis(2500),
                "{b:?}: retry gap {gap:?} does not follow the 1 s schedule"
            );
        }

        // Dead-lettered: listed with exactly the delivery fields.
        let mut listed = Value::Null;
        assert!(
            eventually(Duration::from_secs(5), async || {
                let (s, v) = g.get(DEMO_KEY, "/substrate/webhooks/dead-letters").await;
                assert_eq!(s, 200, "{v}");
                listed = v;
                listed.as_array().is_some_and(|a| a.len() == 1)
            })
            .await,
            "{listed}"
        );
        let d = &listed[0];
        assert_eq!(keys(d), set(DELIVERY_FIELDS), "{d}");
        assert_eq!(d["id"], id.as_str());
        assert_eq!(d["subscriptionId"], sub["id"]);
        assert_eq!(d["tenantId"], DEMO_TENANT);
        assert_eq!(d["eventName"], "signal.ingested");
        assert_eq!(d["deliveryStatus"], "dead_lettered");
        assert_eq!(d["attemptCount"], 3);
        assert_eq!(d["httpStatus"], 500);
        assert!(d["lastError"].as_str().unwrap().contains("500"), "{d}");
        assert!(d["deadLetteredAt"].is_string() && d["nextRetryAt"].is_null());
        assert!(d["redrivenAt"].is_null());
        assert_eq!(d["redriveCount"], 0);

        // ... and announced by delivery.dead_lettered (not itself dead-lettered).
        assert!(
            r.wait_for(Duration::from_secs(5), |_| !r.hits_on("/dlq").is_empty())
                .await
        );
        let ev = body_of(&r.hits_on("/dlq")[0]);
        assert_eq!(ev["type"], "delivery.dead_lettered");
        assert_eq!(ev["data"]["delivery"]["id"], id.as_str());
        assert_eq!(ev["data"]["delivery"]["deliveryStatus"], "dead_lettered");
        assert_eq!(keys(&ev["data"]["delivery"]), set(DELIVERY_FIELDS));

        // Filters.
        let (_, v) = g
            .get(
                DEMO_KEY,
                "/substrate/webhooks/dead-letters?eventName=signal.ingested&limit=1",
            )
            .await;
        assert_eq!(v.as_array().unwrap().len(), 1);
        let (_, v) = g.get(DEMO_KEY, &format!("/substrate/webhooks/dead-letters?eventName=receipt.created&tenantId={DEMO_TENANT}")).await;
        assert_eq!(v, json!([]));
        let (_, v) = g.get(OTHER_KEY, "/substrate/webhooks/dead-letters").await;
        assert_eq!(v, json!([]), "another tenant sees none");
        let redrive = format!("/substrate/webhooks/deliveries/{id}/redrive");
        let (s, v) = g.post(OTHER_KEY, &redrive, &json!({})).await;
        assert_problem(s, &v, 404, "not_found");

        // Redrive: a new cycle, delivered now that the receiver is back.
        r.set_default("/fail", Reply::status(204));
        let (s, v) = g
            .post(DEMO_KEY, &redrive, &json!({"tenantId": DEMO_TENANT}))
            .await;
        assert_eq!(s, 200, "{v}");
        let mut want = set(DELIVERY_FIELDS);
        want.insert("subscription".into());
        want.insert("redriven".into());
        assert_eq!(keys(&v), want, "{v}");
        assert_eq!(v["redriven"], true);
        assert_eq!(v["redriveCount"], 1);
        assert_eq!(v["deliveryStatus"], "pending");
        assert!(v["deadLetteredAt"].is_null() && v["redrivenAt"].is_string());
        assert_eq!(v["subscription"]["id"], sub["id"]);
        assert_eq!(keys(&v["subscription"]), set(&SUBSCRIPTION_FIELDS[..7]));

        assert!(
            r.wait_for(Duration::from_secs(10), |_| r.hits_on("/fail").len() == 4)
                .await
        );
        let last = r.hits_on("/fail").pop().unwrap();
        assert_eq!((last.id.as_str(), last.attempt), (id.as_str(), 4));
        assert!(
            eventually(Duration::from_secs(5), async || {
                g.count(&format!("SELECT COUNT(*) FROM webhook_deliveries WHERE id = '{id}' AND delivery_status = 'delivered' AND redrive_count = 1 AND attempt_count = 4 AND http_status = 204")).await == 1
            })
            .await
        );
        let (_, v) = g.get(DEMO_KEY, "/substrate/webhooks/dead-letters").await;
        assert_eq!(v, json!([]));

        // Not dead-lettered (any more): 409. Unknown ids: 404.
        let (s, v) = g.post(DEMO_KEY, &redrive, &json!({})).await;
        assert_problem(s, &v, 409, "conflict");
        let (s, v) = g
            .post(
                DEMO_KEY,
                &format!(
                    "/substrate/webhooks/deliveries/{}/redrive",
                    uuid::Uuid::new_v4()
                ),
                &json!({}),
            )
            .await;
        assert_problem(s, &v, 404, "not_found");
        let (s, v) = g
            .post(
                DEMO_KEY,
                "/substrate/webhooks/deliveries/not-a-uuid/redrive",
                &json!({}),
            )
            .await;
        assert_problem(s, &v, 404, "not_found");
    }
}

#[tokio::test]
async fn retry_after_gone_redirects_and_timeouts() {
    for b in backends() {
        let r = Receiver::start().await;
        let g = Gate::start(opts(b, "[0, 1, 1]", "jitter = \"none\"")).await;
        // 429 with Retry-After: 2 → the next attempt waits 2 s, not 1 s.
        r.script("/busy", vec![Reply::status(429).header("retry-after", "2")]);
        subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/busy"), json!({})).await;
        // 410 pauses the subscription.
        r.set_default("/gone", Reply::status(410));
        let gone = subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/gone"), json!({})).await;
        // Redirects are not followed.
        r.set_default(
            "/moved",
            Reply::status(302).header("location", &r.url("/elsewhere")),
        );
        subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/moved"), json!({})).await;
        // An answer slower than timeout_ms (2 s) is a failure, retried.
        r.script(
            "/slow",
            vec![Reply::status(200).delay(Duration::from_millis(3000))],
        );
        subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/slow"), json!({})).await;

        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(15), |_| r.hits_on("/busy").len() >= 2
                && r.hits_on("/moved").len() >= 3
                && r.hits_on("/slow").len() >= 2)
                .await,
            "{b:?}\n{}",
            g.log()
        );
        let busy = r.hits_on("/busy");
        let gap = busy[1].at - busy[0].at;
        assert!(
            gap >= Duration::from_millis(1950),
            "{b:?}: Retry-After ignored ({gap:?})"
        );
        assert!(
            r.hits_on("/elsewhere").is_empty(),
            "a redirect was followed"
        );
        assert!(
            eventually(Duration::from_secs(5), async || {
                g.count("SELECT COUNT(*) FROM webhook_deliveries WHERE last_error LIKE '%redirects are not followed%' AND http_status = 302").await == 1
            })
            .await
        );
        let slow = r.hits_on("/slow");
        assert_eq!(slow[0].id, slow[1].id);
        assert!(
            slow[1].at - slow[0].at >= Duration::from_millis(1900),
            "the first attempt timed out after 2 s"
        );

        // The 410 paused the subscription: nothing more is sent to it.
        assert_eq!(r.hits_on("/gone").len(), 1);
        let (_, v) = g
            .get(DEMO_KEY, "/substrate/webhooks/subscriptions?status=paused")
            .await;
        assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
        assert_eq!(v[0]["id"], gone["id"]);
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            r.hits_on("/gone").len(),
            1,
            "{b:?}: a paused subscription received a delivery"
        );
    }
}

#[tokio::test]
async fn paused_and_revoked_subscriptions_receive_nothing() {
    for b in backends() {
        let r = Receiver::start().await;
        let g = Gate::start(opts(b, "[0, 1, 1, 1, 1, 1]", "jitter = \"none\"")).await;
        let paused = subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/paused"),
            json!({"status": "paused"}),
        )
        .await;
        subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/revoked"),
            json!({"status": "revoked"}),
        )
        .await;
        subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/active"),
            json!({}),
        )
        .await;
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(10), |_| r.hits_on("/active").len() == 1)
                .await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(r.hits_on("/paused").is_empty() && r.hits_on("/revoked").is_empty());
        assert_eq!(paused["status"], "paused");

        // A delivery in its retry cycle is held while its subscription is
        // paused and goes out when it is active again.
        r.set_default("/held", Reply::status(500));
        let held = subscribe(&g, DEMO_KEY, "signal.ingested", &r.url("/held"), json!({})).await;
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(10), |_| r.hits_on("/held").len() == 1)
                .await
        );
        let mut update = json!({"id": held["id"], "productSurface": "generic", "eventName": "signal.ingested", "targetUrl": r.url("/held"), "status": "paused"});
        let (s, v) = g
            .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &update)
            .await;
        assert_eq!((s, v["status"].as_str()), (200, Some("paused")), "{v}");
        assert_eq!(
            v["secret"], held["secret"],
            "an update without a secret keeps it"
        );
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let n = r.hits_on("/held").len();
        assert!(n <= 2, "{b:?}: {n} attempts while paused");
        r.set_default("/held", Reply::status(200));
        update["status"] = json!("active");
        let (s, _) = g
            .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &update)
            .await;
        assert_eq!(s, 200);
        assert!(
            r.wait_for(Duration::from_secs(10), |_| r.hits_on("/held").len()
                == n + 1)
                .await,
            "{b:?}: held delivery not sent after resume"
        );

        // Revoking cancels what is still undelivered.
        r.set_default("/revoke", Reply::status(500));
        let rv = subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/revoke"),
            json!({}),
        )
        .await;
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            r.wait_for(Duration::from_secs(10), |_| !r
                .hits_on("/revoke")
                .is_empty())
                .await
        );
        let upd = json!({"id": rv["id"], "productSurface": "generic", "eventName": "signal.ingested", "targetUrl": r.url("/revoke"), "status": "revoked"});
        let (s, _) = g
            .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &upd)
            .await;
        assert_eq!(s, 200);
        let n = r.hits_on("/revoke").len();
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert!(r.hits_on("/revoke").len() <= n + 1);
        let sid = rv["id"].as_str().unwrap();
        assert!(
            eventually(Duration::from_secs(5), async || {
                g.count(&format!("SELECT COUNT(*) FROM webhook_deliveries WHERE subscription_id = '{sid}' AND delivery_status <> 'cancelled'")).await == 0
            })
            .await
        );
    }
}

#[tokio::test]
async fn every_invalid_input_is_a_400_naming_the_field() {
    for b in backends() {
        let g = Gate::start(opts(b, "[0, 1, 1]", "")).await;
        let url = "http://127.0.0.1:9/hook";
        let ok =
            json!({"productSurface": "generic", "eventName": "receipt.created", "targetUrl": url});
        let with = |k: &str, v: Value| {
            let mut o = ok.clone();
            o[k] = v;
            o
        };
        let without = |k: &str| {
            let mut o = ok.clone();
            o.as_object_mut().unwrap().remove(k);
            o
        };
        let upserts: Vec<(Value, &str)> = vec![
            (without("productSurface"), "productSurface"),
            (without("eventName"), "eventName"),
            (without("targetUrl"), "targetUrl"),
            (with("productSurface", json!("product_z")), "productSurface"),
            (with("productSurface", json!(null)), "productSurface"),
            (with("eventName", json!("")), "eventName"),
            (with("eventName", json!("signal.exploded")), "eventName"),
            (with("eventName", json!(7)), "eventName"),
            (with("targetUrl", json!("not a url")), "targetUrl"),
            (
                with("targetUrl", json!("ftp://example.com/hook")),
                "targetUrl",
            ),
            (with("targetUrl", json!("/relative/path")), "targetUrl"),
            (with("targetUrl", json!(null)), "targetUrl"),
            (with("status", json!("deleted")), "status"),
            (with("status", json!(null)), "status"),
            (with("secret", json!("")), "secret"),
            (with("secret", json!("whsec_!!not-base64!!")), "secret"),
            (with("secret", json!(12345678901234567i64)), "secret"),
            (with("metadata", json!("free text")), "metadata"),
            (with("tenantId", json!("not-a-uuid")), "tenantId"),
            (with("id", json!("not-a-uuid")), "id"),
            (with("colour", json!("blue")), "colour"),
        ];
        for (body, field) in upserts {
            let (s, v) = g
                .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &body)
                .await;
            assert_eq!(s, 400, "{b:?} {body} → {v}");
            let fields: Vec<&str> = v["errors"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|e| e["field"].as_str())
                .collect();
            assert!(
                fields.contains(&field),
                "{body}: errors {v} do not name {field}"
            );
        }

        let sub = subscribe(&g, DEMO_KEY, "receipt.created", url, json!({})).await;
        let rotate = format!(
            "/substrate/webhooks/subscriptions/{}/rotate",
            sub["id"].as_str().unwrap()
        );
        for (body, field) in [
            (json!({"secret": "fifteen-chars-x"}), "secret"),
            (json!({"secret": ""}), "secret"),
            (json!({"secret": null}), "secret"),
            (json!({"secret": "whsec_!!!!!!!!!!!!!!!!!!"}), "secret"),
            (json!({"rotationReason": 5}), "rotationReason"),
            (json!({"tenantId": "x"}), "tenantId"),
            (json!({"grace": 10}), "grace"),
        ] {
            let (s, v) = g.post(DEMO_KEY, &rotate, &body).await;
            assert_eq!(s, 400, "{body} → {v}");
            assert!(
                v["errors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["field"] == field),
                "{body}: {v}"
            );
        }
        let (s, v) = g
            .post(DEMO_KEY, &rotate, &json!({"secret": "sixteen-chars-xx"}))
            .await;
        assert_eq!(s, 200, "16 characters are enough: {v}");

        for (q, field) in [
            ("limit=0", "limit"),
            ("limit=201", "limit"),
            ("limit=-1", "limit"),
            ("limit=1.5", "limit"),
            ("limit=ten", "limit"),
            ("limit=", "limit"),
            ("limit=5&limit=6", "limit"),
            ("eventName=", "eventName"),
            ("eventName=receipt.made", "eventName"),
            ("tenantId=zzz", "tenantId"),
            ("cursor=abc", "cursor"),
        ] {
            let (s, v) = g
                .get(DEMO_KEY, &format!("/substrate/webhooks/dead-letters?{q}"))
                .await;
            assert_eq!(s, 400, "{q} → {v}");
            assert!(
                v["errors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["field"] == field),
                "{q}: {v}"
            );
        }
        for q in ["limit=1", "limit=200", "limit=50&eventName=receipt.created"] {
            let (s, v) = g
                .get(DEMO_KEY, &format!("/substrate/webhooks/dead-letters?{q}"))
                .await;
            assert_eq!(s, 200, "{q} → {v}");
        }
        for (q, field) in [
            ("status=deleted", "status"),
            ("productSurface=product_z", "productSurface"),
            ("eventName=", "eventName"),
            ("eventName=receipt.made", "eventName"),
            ("tenantId=1", "tenantId"),
            ("limit=5", "limit"),
        ] {
            let (s, v) = g
                .get(DEMO_KEY, &format!("/substrate/webhooks/subscriptions?{q}"))
                .await;
            assert_eq!(s, 400, "{q} → {v}");
            assert!(
                v["errors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["field"] == field),
                "{q}: {v}"
            );
        }
        let (s, v) = g
            .post(
                DEMO_KEY,
                &format!(
                    "/substrate/webhooks/deliveries/{}/redrive",
                    uuid::Uuid::new_v4()
                ),
                &json!({"force": true}),
            )
            .await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["errors"][0]["field"], "force");

        // Not JSON / no key / wrong tenant.
        let r = g
            .client
            .post(g.url("/substrate/webhooks/subscriptions"))
            .bearer_auth(DEMO_KEY)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 415);
        let r = g
            .client
            .get(g.url("/substrate/webhooks/subscriptions"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let (s, v) = g
            .post(
                DEMO_KEY,
                "/substrate/webhooks/subscriptions",
                &with("tenantId", json!(OTHER_TENANT)),
            )
            .await;
        assert_problem(s, &v, 403, "tenant_mismatch");
        let (s, v) = g
            .get(
                DEMO_KEY,
                &format!("/substrate/webhooks/subscriptions?tenantId={OTHER_TENANT}"),
            )
            .await;
        assert_problem(s, &v, 403, "tenant_mismatch");
    }
}

#[tokio::test]
async fn tenants_see_and_touch_only_their_own_subscriptions() {
    for b in backends() {
        let g = Gate::start(opts(b, "[0, 1, 1]", "")).await;
        let url = "http://127.0.0.1:9/hook";
        let mine = subscribe(&g, DEMO_KEY, "receipt.created", url, json!({})).await;
        let theirs = subscribe(
            &g,
            OTHER_KEY,
            "signal.blocked",
            url,
            json!({"productSurface": "product_a"}),
        )
        .await;
        let (_, v) = g.get(DEMO_KEY, "/substrate/webhooks/subscriptions").await;
        assert_eq!(v.as_array().unwrap().len(), 1);
        assert_eq!(v[0]["id"], mine["id"]);
        let (_, v) = g.get(OTHER_KEY, "/substrate/webhooks/subscriptions?productSurface=product_a&eventName=signal.blocked&status=active").await;
        assert_eq!(v.as_array().unwrap().len(), 1);
        assert_eq!(
            v[0]["secret"], theirs["secret"],
            "the owner reads its secret back"
        );
        let (_, v) = g
            .get(
                OTHER_KEY,
                "/substrate/webhooks/subscriptions?productSurface=generic",
            )
            .await;
        assert_eq!(v, json!([]));

        // Another tenant's id: an upsert with it makes a subscription of the caller's own
        // (ids are keyed per tenant: the answer is that of an unused id), rotate answers 404,
        // and the owner's subscription is untouched.
        let hijack = json!({"id": mine["id"], "productSurface": "generic", "eventName": "receipt.created", "targetUrl": "http://127.0.0.1:9/stolen"});
        let (s, v) = g
            .post(OTHER_KEY, "/substrate/webhooks/subscriptions", &hijack)
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["id"], mine["id"]);
        assert_eq!(v["tenantId"], theirs["tenantId"]);
        assert_ne!(v["secret"], mine["secret"]);
        let (_, v) = g.get(OTHER_KEY, "/substrate/webhooks/subscriptions").await;
        assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
        let rotate = format!(
            "/substrate/webhooks/subscriptions/{}/rotate",
            mine["id"].as_str().unwrap()
        );
        let (s, v) = g.post(OTHER_KEY, &rotate, &json!({})).await;
        assert_eq!(s, 200, "the caller's own subscription of that id: {v}");
        let (s, v) = g
            .post(
                OTHER_KEY,
                &format!(
                    "/substrate/webhooks/subscriptions/{}/rotate",
                    uuid::Uuid::new_v4()
                ),
                &json!({}),
            )
            .await;
        assert_problem(s, &v, 404, "not_found");
        let (s, v) = g
            .post(
                DEMO_KEY,
                "/substrate/webhooks/subscriptions/not-a-uuid/rotate",
                &json!({}),
            )
            .await;
        assert_problem(s, &v, 404, "not_found");
        let (_, v) = g.get(DEMO_KEY, "/substrate/webhooks/subscriptions").await;
        assert_eq!(v[0], mine);

        // Upsert with an unused id inserts under that id; with the same id again it updates.
        let id = uuid::Uuid::new_v4().to_string();
        let body = json!({"id": id, "productSurface": "product_b", "eventName": "replay.mismatch", "targetUrl": url, "secret": "caller-chosen-secret"});
        let (s, v) = g
            .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &body)
            .await;
        assert_eq!((s, v["id"].as_str()), (200, Some(id.as_str())), "{v}");
        let mut body2 = body.clone();
        body2["eventName"] = json!("repair.proposed");
        body2.as_object_mut().unwrap().remove("secret");
        let (s, v) = g
            .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &body2)
            .await;
        assert_eq!(s, 200);
        assert_eq!(
            (v["eventName"].as_str(), v["secret"].as_str()),
            (Some("repair.proposed"), Some("caller-chosen-secret"))
        );
        let (_, v) = g.get(DEMO_KEY, "/substrate/webhooks/subscriptions").await;
        assert_eq!(v.as_array().unwrap().len(), 2);
    }
}

/// Every forbidden range is refused at upsert (400 naming targetUrl); with
/// the loopback allowlist removed by a hot reload, loopback is refused too,
/// at upsert and, for subscriptions made before, at delivery time.
#[tokio::test]
async fn ssrf_targets_are_refused_for_every_forbidden_range() {
    for b in backends() {
        let r = Receiver::start().await;
        let o = opts(b, "[0, 1, 1]", "jitter = \"none\"");
        let g = Gate::start(o.clone()).await;
        for target in [
            "http://10.0.0.1/hook",
            "http://10.255.255.254:8443/hook",
            "http://172.16.5.4/hook",
            "http://172.31.0.1/hook",
            "http://192.168.1.1/hook",
            "http://169.254.1.1/hook",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/hook",
            "http://100.127.1.1/hook",
            "http://0.0.0.0/hook",
            "http://0.1.2.3/hook",
            "http://255.255.255.255/hook",
            "http://224.0.0.1/hook",
            "http://239.1.2.3/hook",
            "http://240.0.0.1/hook",
            "http://[fc00::1]/hook",
            "http://[fd12:3456::1]/hook",
            "http://[fd00:ec2::254]/latest/meta-data/",
            "http://[fe80::1]/hook",
            "http://[ff02::1]/hook",
            "http://[::]/hook",
            "http://[::ffff:10.0.0.1]/hook",
            "http://[::ffff:169.254.169.254]/hook",
            "http://[64:ff9b::c0a8:1]/hook",
            "http://167772161/hook",
            "ftp://example.com/hook",
            "file:///etc/passwd",
            "gopher://127.0.0.1:25/",
        ] {
            let body = json!({"productSurface": "generic", "eventName": "receipt.created", "targetUrl": target});
            let (s, v) = g
                .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &body)
                .await;
            assert_eq!(s, 400, "{b:?} {target} → {v}");
            assert_eq!(v["errors"][0]["field"], "targetUrl", "{target}: {v}");
        }
        // Loopback is allowlisted in this config: these are accepted ...
        subscribe(
            &g,
            DEMO_KEY,
            "signal.ingested",
            &r.url("/literal"),
            json!({}),
        )
        .await;
        let named = format!("http://localhost:{}/named", r.addr.port());
        subscribe(&g, DEMO_KEY, "signal.ingested", &named, json!({})).await;

        // ... until the allowlist is emptied (hot reload).
        let text = g.config_with(&o).replace(
            r#"allow_networks = ["127.0.0.0/8", "::1/128"]"#,
            "allow_networks = []",
        );
        assert!(text.contains("allow_networks = []"));
        g.write_config(&text);
        let probe = json!({"productSurface": "generic", "eventName": "receipt.created", "targetUrl": r.url("/probe")});
        assert!(
            eventually(Duration::from_secs(15), async || {
                g.post(DEMO_KEY, "/substrate/webhooks/subscriptions", &probe)
                    .await
                    .0
                    == 400
            })
            .await,
            "{b:?}: the reload did not take effect\n{}",
            g.log()
        );
        for target in [
            r.url("/x"),
            named.clone(),
            format!("http://[::1]:{}/x", r.addr.port()),
            format!("http://[::ffff:127.0.0.1]:{}/x", r.addr.port()),
            format!("http://2130706433:{}/x", r.addr.port()),
            format!("http://127.1:{}/x", r.addr.port()),
        ] {
            let body = json!({"productSurface": "generic", "eventName": "receipt.created", "targetUrl": target});
            let (s, v) = g
                .post(DEMO_KEY, "/substrate/webhooks/subscriptions", &body)
                .await;
            assert_eq!(s, 400, "{b:?} {target} → {v}");
            assert_eq!(v["errors"][0]["field"], "targetUrl");
            assert!(
                v["errors"][0]["message"]
                    .as_str()
                    .unwrap()
                    .contains("loopback"),
                "{v}"
            );
        }
        // Delivery re-checks: the subscriptions made while loopback was
        // allowed get nothing now, by literal address or by name.
        g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        assert!(
            eventually(Duration::from_secs(10), async || {
                g.count("SELECT COUNT(*) FROM webhook_deliveries WHERE event_name = 'signal.ingested' AND last_error LIKE '%refused%' AND last_error LIKE '%loopback%'").await == 2
            })
            .await,
            "{b:?}\n{}",
            g.log()
        );
        assert!(r.hits().is_empty(), "{b:?}: a refused target was contacted");
    }
}

#[tokio::test]
async fn openapi_documents_the_routes_and_every_event_body() {
    let g = Gate::start(opts(Backend::Sqlite, "[0, 1, 1]", "")).await;
    let (s, doc) = g.get(DEMO_KEY, "/openapi.json").await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = &doc["paths"];
    assert!(paths["/substrate/webhooks/subscriptions"]["post"].is_object());
    assert!(paths["/substrate/webhooks/subscriptions"]["get"].is_object());
    assert!(paths["/substrate/webhooks/subscriptions/{id}/rotate"]["post"].is_object());
    assert!(paths["/substrate/webhooks/dead-letters"]["get"].is_object());
    assert!(
        paths["/substrate/webhooks/deliveries/{id}/redrive"]["post"]["responses"]["409"]
            .is_object()
    );
    let events = doc["webhooks"].as_object().expect("top-level webhooks");
    let names: BTreeSet<String> = events.keys().cloned().collect();
    assert_eq!(
        names,
        set(&[
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
        ])
    );
    for (name, item) in events {
        let schema = &item["post"]["requestBody"]["content"]["application/json"]["schema"];
        assert_eq!(schema["properties"]["type"]["const"], name.as_str());
        assert!(schema["properties"]["data"].is_object(), "{name}");
        let headers: Vec<&str> = item["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(headers.contains(&"webhook-signature"), "{name}");
    }
    // Every $ref in the webhooks section resolves.
    let text = doc["webhooks"].to_string();
    for part in text.split("#/components/schemas/").skip(1) {
        let name = part.split('"').next().unwrap();
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "dangling $ref {name}"
        );
    }
    let sub = &doc["components"]["schemas"]["WebhookSubscription"]["properties"];
    assert_eq!(keys(sub), set(SUBSCRIPTION_FIELDS));
    let d = &doc["components"]["schemas"]["WebhookDelivery"]["properties"];
    assert_eq!(keys(d), set(DELIVERY_FIELDS));
}
