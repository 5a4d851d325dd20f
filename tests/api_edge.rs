//! The API edge: authentication, tenancy, limits and problem+json errors,
//! health and readiness, the OpenAPI document, and tenant isolation.

mod common;
use common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn authentication_and_tenancy_errors_are_problems() {
    for b in backends() {
        let g = Gate::start(GateOptions::new(b)).await;
        let body = signal_body(json!({}));
        // No key, unknown key, wrong scheme.
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers().get("content-type").unwrap(),
            "application/problem+json"
        );
        let (s, p) = status_json(r).await;
        assert_problem(s, &p, 401, "unauthenticated");
        let (s, p) = g
            .post("not-a-key", "/substrate/signals/ingest", &body)
            .await;
        assert_problem(s, &p, 401, "unauthenticated");
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .header("authorization", format!("Basic {DEMO_KEY}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let (s, p) = status_json(r).await;
        assert_problem(s, &p, 401, "unauthenticated");
        // The scheme is case-insensitive (RFC 9110): `BEARER` is the Bearer scheme.
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .header("authorization", format!("BEARER {DEMO_KEY}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);

        // Tenant header and body tenantId must name the key's tenant.
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .bearer_auth(DEMO_KEY)
            .header("x-tenant-id", OTHER_TENANT)
            .json(&body)
            .send()
            .await
            .unwrap();
        let (s, p) = status_json(r).await;
        assert_problem(s, &p, 403, "tenant_mismatch");
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .bearer_auth(DEMO_KEY)
            .header("x-tenant-id", DEMO_TENANT)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let (s, p) = g
            .post(
                DEMO_KEY,
                "/substrate/signals/ingest",
                &signal_body(json!({"tenantId": OTHER_TENANT})),
            )
            .await;
        assert_problem(s, &p, 403, "tenant_mismatch");
        let (s, _) = g
            .post(
                DEMO_KEY,
                "/substrate/signals/ingest",
                &signal_body(json!({"tenantId": DEMO_TENANT})),
            )
            .await;
        assert_eq!(s, 200);
        // Refused requests stored nothing: three accepted ingests only.
        assert_eq!(g.count("SELECT COUNT(*) FROM signals").await, 3);
    }
}

#[tokio::test]
async fn body_limits_media_type_and_malformed_json() {
    let g = Gate::start(GateOptions::new(Backend::Sqlite)).await;
    // 415
    // The gate answers 413 without reading the rest and closes that connection:
    // use a client of its own so no later request lands on the closed socket.
    let once = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = once
        .post(g.url("/substrate/signals/ingest"))
        .bearer_auth(DEMO_KEY)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (s, p) = status_json(r).await;
    assert_problem(s, &p, 415, "unsupported_media_type");
    // A coded body is not read as if it were plain (nor a plain one labelled as coded).
    for coding in ["gzip", "br", "identity, gzip"] {
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .bearer_auth(DEMO_KEY)
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .body(signal_body(json!({})).to_string())
            .send()
            .await
            .unwrap();
        let (s, p) = status_json(r).await;
        assert_problem(s, &p, 415, "unsupported_media_type");
    }
    // 413 (default API limit 1 MiB), declared and streamed.
    let big = signal_body(json!({"payload": "x".repeat(1_100_000)}));
    let (s, p) = g.post(DEMO_KEY, "/substrate/signals/ingest", &big).await;
    assert_problem(s, &p, 413, "payload_too_large");
    // The gate answers 413 without reading the rest and closes that connection: use a client
    // of its own so no later request lands on the closed socket. A client still writing the
    // rest when the gate closes may fail its write (broken pipe) before it reads the answer;
    // that race is the client's, so the request is sent again (at most five times) until the
    // 413 is read.
    let once = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut answer = None;
    for attempt in 0..5 {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..40)
            .map(|_| Ok(bytes::Bytes::from(vec![b' '; 32 * 1024])))
            .collect();
        match once
            .post(g.url("/substrate/signals/ingest"))
            .bearer_auth(DEMO_KEY)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            .send()
            .await
        {
            Ok(r) => {
                answer = Some(r);
                break;
            }
            Err(e) => eprintln!("streamed 413, attempt {attempt}: the write failed first: {e}"),
        }
    }
    let (s, p) = status_json(answer.expect("a 413 answer was read in five attempts")).await;
    assert_problem(s, &p, 413, "payload_too_large");
    // Malformed JSON, empty body, invalid UTF-8, deep nesting, duplicate keys, huge numbers.
    for raw in [
        &b"{\"payload\": "[..],
        b"",
        b"\xff\xfe{}",
        &b"{\"a\": 1e309}"[..],
    ] {
        let r = g
            .client
            .post(g.url("/substrate/signals/ingest"))
            .bearer_auth(DEMO_KEY)
            .header("content-type", "application/json")
            .body(raw.to_vec())
            .send()
            .await
            .unwrap();
        let (s, p) = status_json(r).await;
        assert_eq!(s, 400, "{p}");
        assert!(
            p["code"] == "invalid_json" || p["code"] == "validation_failed",
            "{p}"
        );
    }
    let deep = format!("{{\"metadata\": {}{}}}", "[".repeat(200), "]".repeat(200));
    // The gate answers 413 without reading the rest and closes that connection:
    // use a client of its own so no later request lands on the closed socket.
    let once = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = once
        .post(g.url("/substrate/signals/ingest"))
        .bearer_auth(DEMO_KEY)
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    let (s, p) = status_json(r).await;
    assert_problem(s, &p, 400, "invalid_json");
    let dup = r#"{"productSurface":"generic","sourceType":"user_input","sourceId":"a","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"a","payload":"b"}"#;
    // The gate answers 413 without reading the rest and closes that connection:
    // use a client of its own so no later request lands on the closed socket.
    let once = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = once
        .post(g.url("/substrate/signals/ingest"))
        .bearer_auth(DEMO_KEY)
        .header("content-type", "application/json")
        .body(dup)
        .send()
        .await
        .unwrap();
    let (s, p) = status_json(r).await;
    assert_problem(s, &p, 400, "validation_failed");
    assert_eq!(p["errors"][0]["field"], "payload");
    // A number out of range or a broken \u escape in a field says so (not "one of the allowed
    // values": neither field is an enumeration).
    for (body, field, says) in [
        (
            r#"{"productSurface":"generic","sourceType":"user_input","sourceId":"a","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"a","sourceTrustLevel":1e309}"#,
            "sourceTrustLevel",
            "out of range",
        ),
        (
            r#"{"productSurface":"generic","sourceType":"user_input","sourceId":"a","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"\ud800x"}"#,
            "payload",
            "escape",
        ),
    ] {
        let (s, p) = status_json(
            g.client
                .post(g.url("/substrate/signals/ingest"))
                .bearer_auth(DEMO_KEY)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(s, &p, 400, "validation_failed");
        assert_eq!(p["errors"][0]["field"], field, "{p}");
        assert!(
            p["errors"][0]["message"].as_str().unwrap().contains(says),
            "{p}"
        );
    }
    assert_eq!(
        g.count("SELECT COUNT(*) FROM signals").await,
        0,
        "nothing stored"
    );
}

/// A request refused before its body is read (no key, no such route) says `Connection: close`:
/// its unread body is left on the connection, and a client that sent its next request there
/// failed it with a broken pipe. A refusal that read the body keeps the connection.
#[tokio::test]
async fn a_body_left_unread_closes_its_connection() {
    let g = Gate::start(GateOptions::new(Backend::Sqlite)).await;
    let body = signal_body(json!({})).to_string();
    let send = |key: Option<&str>, path: &str| {
        let mut r = g
            .client
            .post(g.url(path))
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let connection = |r: &reqwest::Response| {
        r.headers()
            .get("connection")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let r = send(Some("not-a-key"), "/substrate/signals/ingest")
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(connection(&r).as_deref(), Some("close"));
    let r = send(Some(DEMO_KEY), "/substrate/no-such-route")
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(connection(&r).as_deref(), Some("close"));
    // Read, then refused: the connection stays.
    let r = g
        .client
        .post(g.url("/substrate/signals/ingest"))
        .bearer_auth(DEMO_KEY)
        .header("content-type", "application/json")
        .body(r#"{"unknown": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(connection(&r), None);
    // The client goes on with new connections: every request is answered.
    for _ in 0..20 {
        let r = send(Some("not-a-key"), "/substrate/signals/ingest")
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
}

/// What PostgreSQL cannot store or index is refused as the client's mistake, on both backends
/// alike (it was a 503 "storage is unavailable" on PostgreSQL and a 200 on SQLite): a NUL
/// character in a typed string of a body, in a path or in a query; a `sourceId` longer than the
/// gate's limit. Long equation bundles are bound by digest in the idempotency key. Nothing
/// refused is stored, and storage keeps answering.
#[tokio::test]
async fn nul_characters_and_oversized_keys_are_refused_alike_on_both_backends() {
    for b in backends() {
        let g = Gate::start(GateOptions::new(b)).await;
        let ingest = "/substrate/signals/ingest";
        let field_of = |p: &Value| p["errors"][0]["field"].as_str().map(str::to_string);
        for (body, field) in [
            (signal_body(json!({"sourceId": "a\u{0}b"})), "sourceId"),
            (signal_body(json!({"payload": "x\u{0}"})), "payload"),
            (
                signal_body(json!({"authorityClaim": "n\u{0}"})),
                "authorityClaim",
            ),
            (
                signal_body(json!({"sourceId": "s".repeat(513)})),
                "sourceId",
            ),
        ] {
            let (s, p) = g.post(DEMO_KEY, ingest, &body).await;
            assert_problem(s, &p, 400, "validation_failed");
            assert_eq!(field_of(&p).as_deref(), Some(field), "{b:?}: {p}");
        }
        for path in [
            "/substrate/coordination/edge/a%00b",
            "/substrate/webhooks/dead-letters?eventName=a%00b",
        ] {
            let (s, p) = g.get(DEMO_KEY, path).await;
            assert_problem(s, &p, 400, "validation_failed");
        }
        // Free-form metadata is kept as JSON text, where a NUL is an escape like any other:
        // accepted and stored on both backends.
        let (s, p) = g
            .post(
                DEMO_KEY,
                ingest,
                &signal_body(json!({"metadata": {"k": ["ok", "n\u{0}"]}})),
            )
            .await;
        assert_eq!(s, 200, "{b:?}: {p}");
        // The longest sourceId is evaluated like any other; long bundles too.
        let (s, p) = g
            .post(
                DEMO_KEY,
                ingest,
                &signal_body(json!({"sourceId": "é".repeat(512)})),
            )
            .await;
        assert_eq!(s, 200, "{b:?}: {p}");
        let signal = p["signal"]["id"].clone();
        let bundles: Vec<String> = (0..40)
            .map(|i| format!("bundle-{i}-{}", "x".repeat(90)))
            .collect();
        for body in [
            json!({"signalId": signal}),
            json!({"signalId": signal, "equationBundles": bundles}),
        ] {
            let (s, p) = g
                .post(DEMO_KEY, "/substrate/integrity/evaluate", &body)
                .await;
            assert_eq!(s, 200, "{b:?}: {p}");
            assert!(p["receipt"]["id"].is_string(), "{b:?}: {p}");
            // The same request answers the same receipt.
            let (_, again) = g
                .post(DEMO_KEY, "/substrate/integrity/evaluate", &body)
                .await;
            assert_eq!(again["receipt"]["id"], p["receipt"]["id"], "{b:?}");
        }
        assert_eq!(g.count("SELECT count(*) FROM signals").await, 2, "{b:?}");
    }
}

#[tokio::test]
async fn unknown_routes_ids_and_other_tenants_objects_are_404() {
    for b in backends() {
        let g = Gate::start(GateOptions::new(b)).await;
        let id = g.ingest(DEMO_KEY, signal_body(json!({}))).await;
        let e = g.evaluate(DEMO_KEY, &id).await;
        let rid = e["receipt"]["id"].as_str().unwrap().to_string();
        // A route whose body is optional takes no body, whatever content type the client sets.
        for content_type in [None, Some("application/json")] {
            let mut r = g
                .client
                .post(g.url(&format!("/substrate/receipts/{rid}/replay")))
                .bearer_auth(DEMO_KEY)
                .header("content-length", "0");
            if let Some(t) = content_type {
                r = r.header("content-type", t);
            }
            let r = r.send().await.unwrap();
            assert_eq!(
                r.status(),
                200,
                "{b:?} {content_type:?}: {}",
                r.text().await.unwrap()
            );
        }
        for key in [OTHER_KEY] {
            let (s, p) = g.get(key, &format!("/substrate/receipts/{rid}")).await;
            assert_problem(s, &p, 404, "not_found");
            let (s, p) = g
                .post(
                    key,
                    &format!("/substrate/receipts/{rid}/replay"),
                    &json!({}),
                )
                .await;
            assert_problem(s, &p, 404, "not_found");
            let (s, p) = g
                .post(
                    key,
                    "/substrate/integrity/evaluate",
                    &json!({"signalId": id}),
                )
                .await;
            assert_problem(s, &p, 404, "not_found");
        }
        let (s, p) = g
            .get(
                DEMO_KEY,
                &format!("/substrate/receipts/{}", uuid::Uuid::new_v4()),
            )
            .await;
        assert_problem(s, &p, 404, "not_found");
        let (s, p) = g.get(DEMO_KEY, "/substrate/receipts/not-a-uuid").await;
        assert_problem(s, &p, 404, "not_found");
        let (s, p) = g.get(DEMO_KEY, "/substrate/nothing-here").await;
        assert_problem(s, &p, 404, "not_found");
        // A path id that is not UTF-8 once percent-decoded: the router's own rejection is a
        // problem too, never its plain text.
        for path in ["/substrate/receipts/%FF", "/substrate/quarantine/%C3%28"] {
            let (s, p) = g.get(DEMO_KEY, path).await;
            assert_problem(s, &p, 400, "validation_failed");
        }
        // The owner still sees it.
        let (s, _) = g.get(DEMO_KEY, &format!("/substrate/receipts/{rid}")).await;
        assert_eq!(s, 200);
    }
}

#[tokio::test]
async fn rate_limits_hold_per_key() {
    let g = Gate::start(GateOptions::new(Backend::Sqlite)).await;
    let mut statuses = vec![];
    for _ in 0..6 {
        let (s, p) = g
            .get(
                LIMITED_KEY,
                &format!("/substrate/receipts/{}", uuid::Uuid::new_v4()),
            )
            .await;
        if s == 429 {
            assert_problem(s, &p, 429, "rate_limited");
        }
        statuses.push(s);
    }
    assert!(
        statuses.contains(&429),
        "the limited key hits its limit: {statuses:?}"
    );
    // Another key of the same tenant is unaffected.
    let (s, _) = g
        .get(
            DEMO_KEY,
            &format!("/substrate/receipts/{}", uuid::Uuid::new_v4()),
        )
        .await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn health_readiness_and_openapi() {
    let g = Gate::start(GateOptions::new(Backend::Sqlite)).await;
    for p in ["/health", "/healthz", "/readyz"] {
        let r = g.client.get(g.url(p)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{p} needs no key");
    }
    let r = g.client.get(g.url("/openapi.json")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], "0.14.0-rc1");
    let paths = doc["paths"].as_object().unwrap();
    for (p, m) in [
        ("/health", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/openapi.json", "get"),
        ("/substrate/signals/ingest", "post"),
        ("/substrate/integrity/evaluate", "post"),
        ("/substrate/receipts/{id}", "get"),
        ("/substrate/receipts/{id}/replay", "post"),
    ] {
        assert!(
            paths.get(p).and_then(|x| x.get(m)).is_some(),
            "openapi lacks {m} {p}"
        );
    }
    // Every documented route has its schemas resolvable.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let text = doc.to_string();
    for cap in text.split("#/components/schemas/").skip(1) {
        let name: String = cap
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        assert!(
            schemas.contains_key(&name),
            "dangling schema reference {name}"
        );
    }
    // Metrics are served on the metrics listener.
    let m = g.metrics_text().await;
    assert!(m.contains("substrate_gate_config_info"), "{m}");
}

#[tokio::test]
async fn check_config_prints_every_problem_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        r#"
[listeners]
api = "nowhere"
[storage]
url = "mysql://x"
[[tenants]]
id = "00000000-0000-4000-8000-000000000001"
[[tenants.api_keys]]
id = "k"
sha256 = "abc"
[[tenants]]
id = "not-a-uuid"
[policies.default]
mode = "yolo"
"#,
    )
    .unwrap();
    let out = std::process::Command::new(gate_bin())
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "listeners.api:",
        "storage.url:",
        "tenants[0].api_keys[0].sha256: not 64 hex characters",
        "tenants[1].id: not a UUID",
        "policies.default.mode:",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let good = std::process::Command::new(gate_bin())
        .args([
            "check-config",
            repo_root().join("config/local.toml").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stdout)
    );
}
