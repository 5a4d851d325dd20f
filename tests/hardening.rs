//! Input hardening of the api listener: oversized bodies, deep nesting, huge arrays, invalid
//! UTF-8, duplicate keys, numbers at the edges, header injection and ambiguous headers, and
//! slowloris-style slow heads and bodies. Each gets a clear answer (problem+json wherever the
//! request reached the service; a bare 400 or a closed connection where the HTTP parser refuses
//! it), the gate stays healthy, and nothing is left in storage: every table has the same number
//! of rows before and after. Routes come from `/openapi.json`, so later ones are covered too.

mod common;
mod openapi_support;

use common::*;
use openapi_support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BODY_LIMIT: usize = 65536;
const BODY_TIMEOUT_MS: u64 = 1000;

async fn gate(b: Backend) -> Gate {
    let mut o = GateOptions::new(b);
    o.limits = format!(
        "api_body_bytes = {BODY_LIMIT}\nbody_timeout_ms = {BODY_TIMEOUT_MS}\nhead_timeout_ms = {BODY_TIMEOUT_MS}\njson_max_depth = 64"
    );
    Gate::start(o).await
}

const INGEST: &str = "/substrate/signals/ingest";

fn valid_text(extra: &str) -> String {
    format!(
        r#"{{"productSurface":"generic","sourceType":"user_input","sourceId":"hardening","targetSubstrate":"agent_memory","proposedMutation":"write_memory","payload":"p"{extra}}}"#
    )
}

/// Sends raw bytes as the body of a POST with the demo key.
async fn post_bytes(g: &Gate, path: &str, ct: &str, body: Vec<u8>) -> (u16, String, Value) {
    let r = g
        .client
        .post(g.url(path))
        .bearer_auth(DEMO_KEY)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("request");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let (s, v) = status_json(r).await;
    (s, ct, v)
}

/// A problem with the given status (and code, when given), and a gate that still answers.
async fn assert_refused(
    g: &Gate,
    what: &str,
    got: (u16, String, Value),
    status: u16,
    code: Option<&str>,
) {
    let (s, ct, v) = got;
    assert_eq!(s, status, "{what}: {v}");
    assert_eq!(ct, "application/problem+json", "{what}: {v}");
    for f in [
        "type",
        "title",
        "status",
        "detail",
        "code",
        "requestId",
        "errors",
    ] {
        assert!(v.get(f).is_some(), "{what}: problem lacks {f}: {v}");
    }
    if let Some(c) = code {
        assert_eq!(v["code"], c, "{what}: {v}");
    }
    assert_alive(g).await;
}

async fn assert_alive(g: &Gate) {
    let (s, _) = g.get(DEMO_KEY, "/readyz").await;
    assert_eq!(s, 200, "the gate is not ready any more:\n{}", g.log());
}

/// Runs `f` and asserts that no table gained or lost a row.
macro_rules! no_trace {
    ($g:expr, $what:expr, $body:expr) => {{
        let before = $g.table_counts().await;
        let out = $body;
        let after = $g.table_counts().await;
        assert_eq!(before, after, "{}: storage changed", $what);
        out
    }};
}

#[tokio::test]
async fn oversized_bodies_are_refused_on_every_route() {
    for b in backends() {
        let g = gate(b).await;
        let doc = g.openapi().await;
        let big = valid_text(&format!(
            r#","payloadSummary":"{}""#,
            "x".repeat(BODY_LIMIT)
        ));
        let mut routes = 0;
        for op in operations(&doc)
            .iter()
            .filter(|o| o.secured && o.body.is_some())
        {
            let path = op.fill(&|_| uuid::Uuid::new_v4().to_string());
            let what = format!("{} with {} bytes", op.label(), big.len());
            no_trace!(g, what, {
                // Declared length over the cap: refused before reading.
                let got = post_bytes(&g, &path, "application/json", big.clone().into_bytes()).await;
                assert_refused(&g, &what, got, 413, Some("payload_too_large")).await;
                // Chunked, no length declared: refused when the cap is crossed.
                let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
                    .as_bytes()
                    .chunks(4096)
                    .map(|c| Ok(c.to_vec()))
                    .collect();
                let r = g
                    .client
                    .request(
                        reqwest::Method::from_bytes(op.method.as_bytes()).unwrap(),
                        g.url(&path),
                    )
                    .bearer_auth(DEMO_KEY)
                    .header("content-type", "application/json")
                    .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
                    .send()
                    .await
                    .expect("request");
                let ct = r
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let (s, v) = status_json(r).await;
                assert_refused(
                    &g,
                    &format!("{what} (chunked)"),
                    (s, ct, v),
                    413,
                    Some("payload_too_large"),
                )
                .await;
                // A huge array over the cap, too.
                let arr = valid_text(&format!(
                    r#","evidenceRefs":[{}"x"]"#,
                    "\"x\",".repeat(BODY_LIMIT / 4)
                ));
                let got = post_bytes(&g, &path, "application/json", arr.into_bytes()).await;
                assert_refused(
                    &g,
                    &format!("{what} (array)"),
                    got,
                    413,
                    Some("payload_too_large"),
                )
                .await;
            });
            routes += 1;
        }
        assert!(routes >= 3, "only {routes} routes take a body");
    }
}

#[tokio::test]
async fn deep_nesting_and_huge_arrays() {
    for b in backends() {
        let g = gate(b).await;
        // Just over the depth limit, in metadata and at the top, objects and arrays.
        let deep_obj = format!("{}1{}", "{\"a\":".repeat(64), "}".repeat(64));
        let deep_arr = format!("{}{}", "[".repeat(30000), "]".repeat(30000));
        let unclosed = "[".repeat(60000);
        let in_string = format!("\"{}\"", "[".repeat(5000));
        for (what, text) in [
            (
                "metadata 65 deep",
                valid_text(&format!(r#","metadata":{{"x":{deep_obj}}}"#)),
            ),
            (
                "30000 nested arrays",
                valid_text(&format!(r#","metadata":{{"x":{deep_arr}}}"#)),
            ),
            ("60000 unclosed arrays", unclosed.clone()),
            ("nested arrays as the body", deep_arr.clone()),
        ] {
            no_trace!(g, what, {
                let got = post_bytes(&g, INGEST, "application/json", text.into_bytes()).await;
                assert_refused(&g, what, got, 400, Some("invalid_json")).await;
            });
        }
        // Brackets inside strings are text, not nesting.
        let (s, _, v) = post_bytes(
            &g,
            INGEST,
            "application/json",
            valid_text(&format!(r#","payloadSummary":{in_string}"#)).into_bytes(),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        // A huge array under the size cap is read and answered, promptly.
        let many = format!(r#","evidenceRefs":[{}"e"]"#, "\"e\",".repeat(14000));
        let t = Instant::now();
        let (s, _, v) = post_bytes(
            &g,
            INGEST,
            "application/json",
            valid_text(&many).into_bytes(),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let sid = v["signal"]["id"].as_str().unwrap().to_string();
        let ev = g.evaluate(DEMO_KEY, &sid).await;
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "14000 evidence refs took {:?}",
            t.elapsed()
        );
        assert!(ev["decision"].is_string());
        let nums = format!(r#","metadata":{{"n":[{}0]}}"#, "0,".repeat(30000));
        let (s, _, v) = post_bytes(
            &g,
            INGEST,
            "application/json",
            valid_text(&nums).into_bytes(),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_alive(&g).await;
    }
}

#[tokio::test]
async fn invalid_text_and_duplicate_keys() {
    for b in backends() {
        let g = gate(b).await;
        let mut latin1 = valid_text(r#","payloadSummary":"caf"#).into_bytes();
        latin1.truncate(latin1.len() - 1);
        latin1.extend_from_slice(b"\xe9\"}");
        let mut overlong = valid_text(r#","payloadSummary":"x"#).into_bytes();
        overlong.truncate(overlong.len() - 1);
        overlong.extend_from_slice(b"\xc0\xaf\"}");
        let mut utf16 = vec![0xff, 0xfe];
        for u in valid_text("").encode_utf16() {
            utf16.extend_from_slice(&u.to_le_bytes());
        }
        let mut bom = b"\xef\xbb\xbf".to_vec();
        bom.extend_from_slice(valid_text("").as_bytes());
        let cases: Vec<(&str, Vec<u8>, &str, Option<&str>)> = vec![
            ("Latin-1 byte", latin1, "invalid_json", None),
            ("overlong UTF-8", overlong, "invalid_json", None),
            ("UTF-16 with BOM", utf16, "invalid_json", None),
            ("UTF-8 BOM", bom, "invalid_json", None),
            (
                "lone surrogate escape",
                valid_text(r#","payloadSummary":"\ud800""#).into_bytes(),
                "validation_failed",
                Some("payloadSummary"),
            ),
            (
                "NUL byte outside strings",
                valid_text("").replace("{", "{\u{0}").into_bytes(),
                "invalid_json",
                None,
            ),
            (
                "trailing garbage",
                format!("{} x", valid_text("")).into_bytes(),
                "invalid_json",
                None,
            ),
            (
                "two documents",
                format!("{}{}", valid_text(""), valid_text("")).into_bytes(),
                "invalid_json",
                None,
            ),
            (
                "duplicate payload",
                valid_text(r#","payload":"other""#).into_bytes(),
                "validation_failed",
                Some("payload"),
            ),
            (
                "duplicate authority",
                valid_text(r#","sourceAuthorityLevel":0.1,"sourceAuthorityLevel":1.0"#)
                    .into_bytes(),
                "validation_failed",
                Some("sourceAuthorityLevel"),
            ),
            (
                "duplicate tenant",
                valid_text(&format!(
                    r#","tenantId":"{DEMO_TENANT}","tenantId":"{OTHER_TENANT}""#
                ))
                .into_bytes(),
                "validation_failed",
                Some("tenantId"),
            ),
            (
                "case-twin key",
                valid_text(r#","Payload":"x""#).into_bytes(),
                "validation_failed",
                Some("Payload"),
            ),
            (
                "array body",
                b"[\"generic\"]".to_vec(),
                "validation_failed",
                Some("body"),
            ),
            ("empty body", vec![], "invalid_json", None),
            ("whitespace body", b" \n\t ".to_vec(), "invalid_json", None),
        ];
        for (what, bytes, code, field) in cases {
            no_trace!(g, what, {
                let got = post_bytes(&g, INGEST, "application/json", bytes).await;
                let field_named = got.2["errors"][0]["field"].as_str().map(str::to_string);
                assert_refused(&g, what, got, 400, Some(code)).await;
                if let Some(f) = field {
                    assert_eq!(field_named.as_deref(), Some(f), "{what}");
                }
            });
        }
        // Not JSON at all: 415, whatever the body.
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
        ] {
            no_trace!(g, ct, {
                let got = post_bytes(&g, INGEST, ct, valid_text("").into_bytes()).await;
                assert_refused(&g, ct, got, 415, Some("unsupported_media_type")).await;
            });
        }
    }
}

#[tokio::test]
async fn numbers_at_the_edges() {
    for b in backends() {
        let g = gate(b).await;
        for (what, num) in [
            ("NaN", "NaN"),
            ("Infinity", "Infinity"),
            ("-Infinity", "-Infinity"),
            ("1e309", "1e309"),
            ("-1e309", "-1e309"),
            ("hex", "0x1"),
            ("leading plus", "+0.5"),
            ("leading zero", "00.5"),
            ("bare point", ".5"),
            ("over 1", "1.0000000000000002"),
            ("under 0", "-1e-300"),
        ] {
            no_trace!(g, what, {
                let text = valid_text(&format!(r#","sourceTrustLevel":{num}"#));
                let got = post_bytes(&g, INGEST, "application/json", text.into_bytes()).await;
                let code = got.2["code"].as_str().map(str::to_string);
                assert_refused(&g, what, got, 400, None).await;
                assert!(
                    matches!(code.as_deref(), Some("invalid_json" | "validation_failed")),
                    "{what}: {code:?}"
                );
            });
        }
        // In free-form metadata too: a number JSON cannot hold is refused, naming the field.
        for num in ["1e309", "NaN", "-1e400"] {
            no_trace!(g, num, {
                let text = valid_text(&format!(r#","metadata":{{"n":{num}}}"#));
                let got = post_bytes(&g, INGEST, "application/json", text.into_bytes()).await;
                assert_refused(&g, num, got, 400, None).await;
            });
        }
        // Valid spellings of in-range numbers are accepted, and stored as the numbers they are.
        for (num, want) in [
            ("-0", 0.0),
            ("-0.0", 0.0),
            ("1e-400", 0.0),
            ("0.5e0", 0.5),
            ("1E0", 1.0),
            ("5e-324", 5e-324),
        ] {
            let text = valid_text(&format!(
                r#","sourceTrustLevel":{num},"metadata":{{"big":18446744073709551616,"tiny":{num}}}"#
            ));
            let (s, _, v) = post_bytes(&g, INGEST, "application/json", text.into_bytes()).await;
            assert_eq!(s, 200, "{num}: {v}");
            let sid = v["signal"]["id"].as_str().unwrap().to_string();
            let ev = g.evaluate(DEMO_KEY, &sid).await;
            let rid = ev["receipt"]["id"].as_str().unwrap();
            let (s, r) = g.get(DEMO_KEY, &format!("/substrate/receipts/{rid}")).await;
            assert_eq!(s, 200);
            let mut trust = vec![];
            find(&r, "sourceTrustLevel", &mut trust);
            assert!(
                trust.iter().all(|t| t.as_f64() == Some(want)),
                "{num}: {trust:?}"
            );
            let (s, rep) = g
                .post(
                    DEMO_KEY,
                    &format!("/substrate/receipts/{rid}/replay"),
                    &json!({}),
                )
                .await;
            assert_eq!(
                (s, rep["replayStatus"].as_str()),
                (200, Some("matched")),
                "{num}: {rep}"
            );
        }
    }
}

fn find(v: &Value, key: &str, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    out.push(x.clone());
                }
                find(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| find(x, key, out)),
        _ => {}
    }
}

// ------------------------------------------------------------------------------ raw HTTP

struct Raw {
    status: u16,
    head: String,
    body: String,
    elapsed: Duration,
}

impl Raw {
    fn headers(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }
}

/// Sends `parts` with `gap` between them and reads the answer until the server closes
/// (or `limit` passes). Status 0: closed without an answer.
async fn raw(addr: &str, parts: &[Vec<u8>], gap: Duration, limit: Duration) -> Raw {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        if s.write_all(p).await.is_err() {
            break;
        }
    }
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Raw {
        status,
        head: head.to_string(),
        body: body.to_string(),
        elapsed: t.elapsed(),
    }
}

fn addr(g: &Gate) -> String {
    g.api.trim_start_matches("http://").to_string()
}

fn request(extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {INGEST} HTTP/1.1\r\nHost: gate\r\nAuthorization: Bearer {DEMO_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn header_injection_is_neither_echoed_nor_split() {
    for b in backends() {
        let g = gate(b).await;
        let a = addr(&g);
        let body = valid_text(r#","sourceId":"injection""#);
        let quick = Duration::from_secs(5);
        // Values the edge must not echo into the response: a fresh id is minted instead.
        for (what, value) in [
            ("encoded CRLF", "abc%0d%0aSet-Cookie:%20x=1".to_string()),
            ("too long", "a".repeat(10_000)),
            ("non-ASCII", "r\u{e9}quest".to_string()),
            ("spaces and quotes", "a b \"c\" <d>".to_string()),
        ] {
            let r = raw(
                &a,
                &[request(&format!("X-Request-Id: {value}\r\n"), &body)],
                Duration::ZERO,
                quick,
            )
            .await;
            assert!(
                r.status == 200 || r.status == 400 || r.status == 431,
                "{what}: {}",
                r.head
            );
            let ids = r.headers("x-request-id");
            if r.status == 200 {
                assert_eq!(ids.len(), 1, "{what}: {}", r.head);
                assert!(
                    uuid::Uuid::parse_str(&ids[0]).is_ok(),
                    "{what}: echoed {:?}",
                    ids[0]
                );
            }
            assert!(r.headers("set-cookie").is_empty(), "{what}: {}", r.head);
        }
        // A sane id is echoed as sent.
        let r = raw(
            &a,
            &[request("X-Request-Id: trace-42.a_b\r\n", &body)],
            Duration::ZERO,
            quick,
        )
        .await;
        assert_eq!(r.headers("x-request-id"), vec!["trace-42.a_b".to_string()]);

        // Raw CR, LF, NUL or an obsolete line fold inside a header value: the HTTP parser refuses
        // the request (or, for a bare LF, it ends the header and the rest is a header of its own);
        // in no case is an injected header answered or a stored row written.
        let before = g.table_counts().await;
        for (what, header) in [
            (
                "bare CR in x-request-id",
                "X-Request-Id: abc\rSet-Cookie: x=1\r\n".to_string(),
            ),
            (
                "NUL in x-request-id",
                "X-Request-Id: abc\0def\r\n".to_string(),
            ),
            (
                "obs-fold in x-request-id",
                "X-Request-Id: abc\r\n Set-Cookie: x=1\r\n".to_string(),
            ),
            (
                "bare CR in x-tenant-id",
                format!("X-Tenant-Id: {DEMO_TENANT}\rX-Evil: 1\r\n"),
            ),
            (
                "obs-fold in x-tenant-id",
                format!("X-Tenant-Id: {DEMO_TENANT}\r\n {OTHER_TENANT}\r\n"),
            ),
        ] {
            let r = raw(
                &a,
                &[request(
                    &header,
                    &valid_text(r#","sourceId":"refused-injection""#),
                )],
                Duration::ZERO,
                quick,
            )
            .await;
            assert!(
                matches!(r.status, 0 | 400),
                "{what}: {}\n{}",
                r.head,
                r.body
            );
            assert!(
                r.headers("set-cookie").is_empty() && r.headers("x-evil").is_empty(),
                "{what}: {}",
                r.head
            );
        }
        assert_eq!(
            before,
            g.table_counts().await,
            "a refused request left rows"
        );

        // A CRLF in the raw stream ends the header line: what follows is a header of its own,
        // never part of the tenant check's value, and never reflected.
        let r = raw(
            &a,
            &[request(
                &format!("X-Tenant-Id: {OTHER_TENANT}\r\nX-Evil: 1\r\n"),
                &body,
            )],
            Duration::ZERO,
            quick,
        )
        .await;
        assert_eq!(r.status, 403, "{}", r.head);
        assert!(r.headers("x-evil").is_empty());
        // Garbage tenant headers are a 400 that does not repeat them.
        for v in [
            "not-a-uuid",
            "00000000-0000-4000-8000-00000000000g",
            "<script>alert(1)</script>",
            "' OR 1=1 --",
        ] {
            let r = raw(
                &a,
                &[request(&format!("X-Tenant-Id: {v}\r\n"), &body)],
                Duration::ZERO,
                quick,
            )
            .await;
            assert_eq!(r.status, 400, "{v}: {}", r.head);
            assert!(!r.body.contains(v), "{v} echoed: {}", r.body);
        }
        // Ambiguous duplicates are refused: two tenant headers, two Authorization headers.
        let before = g.table_counts().await;
        let r = raw(
            &a,
            &[request(
                &format!("X-Tenant-Id: {DEMO_TENANT}\r\nX-Tenant-Id: {OTHER_TENANT}\r\n"),
                &body,
            )],
            Duration::ZERO,
            quick,
        )
        .await;
        assert!(
            matches!(r.status, 400 | 403),
            "two tenant headers: {}",
            r.head
        );
        let r = raw(
            &a,
            &[request(
                &format!("Authorization: Bearer {OTHER_KEY}\r\n"),
                &body,
            )],
            Duration::ZERO,
            quick,
        )
        .await;
        assert_eq!(
            r.status, 401,
            "two Authorization headers: {}\n{}",
            r.head, r.body
        );
        assert_eq!(
            before,
            g.table_counts().await,
            "an ambiguous request left rows"
        );
        assert_alive(&g).await;
    }
}

#[tokio::test]
async fn slow_clients_are_cut_off() {
    let g = gate(Backend::Sqlite).await;
    let a = addr(&g);
    let bound = Duration::from_millis(BODY_TIMEOUT_MS);
    let before = g.table_counts().await;

    // A body trickled one byte at a time: 408 problem once the body timeout passes.
    let body = valid_text(r#","sourceId":"slow-body""#);
    let mut parts = vec![format!(
        "POST {INGEST} HTTP/1.1\r\nHost: gate\r\nAuthorization: Bearer {DEMO_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes()];
    parts.extend(body.bytes().map(|b| vec![b]));
    let r = raw(
        &a,
        &parts,
        Duration::from_millis(100),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 408, "{}\n{}", r.head, r.body);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("application/problem+json"),
        "{}",
        r.head
    );
    assert!(r.elapsed < bound * 4, "answered after {:?}", r.elapsed);

    // A body that never comes at all (declared, not sent).
    let r = raw(
        &a,
        &[parts[0].clone()],
        Duration::ZERO,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 408, "{}", r.head);

    // A head trickled one header at a time: the connection is closed once the bound passes.
    let mut head = vec![format!("POST {INGEST} HTTP/1.1\r\nHost: gate\r\n").into_bytes()];
    head.extend((0..40).map(|i| format!("X-Slow-{i}: a\r\n").into_bytes()));
    let r = raw(
        &a,
        &head,
        Duration::from_millis(250),
        Duration::from_secs(15),
    )
    .await;
    assert!(
        r.elapsed < bound * 4,
        "a slow head held the connection for {:?}",
        r.elapsed
    );

    // An idle connection (nothing sent) is closed too.
    let r = raw(&a, &[], Duration::ZERO, Duration::from_secs(15)).await;
    assert!(
        r.elapsed < bound * 4,
        "an idle connection was held for {:?}",
        r.elapsed
    );

    // Many slow clients at once do not keep others from being served.
    let mut slow = vec![];
    for _ in 0..64 {
        let a = a.clone();
        let parts = parts.clone();
        slow.push(tokio::spawn(async move {
            raw(
                &a,
                &parts,
                Duration::from_millis(200),
                Duration::from_secs(20),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let (s, _) = g
        .get(
            DEMO_KEY,
            &format!("/substrate/receipts/{}", uuid::Uuid::new_v4()),
        )
        .await;
    assert_eq!(s, 404);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a normal request waited {:?} behind slow ones",
        t.elapsed()
    );
    for h in slow {
        let r = h.await.unwrap();
        assert!(matches!(r.status, 0 | 408), "{}", r.head);
    }
    assert_eq!(before, g.table_counts().await, "slow requests left rows");
    assert_alive(&g).await;
}

/// The proxy listener, like the API's: a connection that sends nothing, and a kept-alive one
/// that sends no next request, are closed once `limits.body_timeout_ms` passes (Pingora waits
/// for a new connection's first bytes, and for the next request after a keep-alive answer,
/// without a time bound of its own); past `limits.max_client_connections` open connections a
/// new one is closed at once, and once idle ones are gone the listener serves again.
#[tokio::test]
async fn proxy_connections_are_bounded_in_time_and_number() {
    let up =
        common::upstream::Upstream::start(|_| common::upstream::Reply::ok(json!({"ok": true})))
            .await;
    let mut o = GateOptions::new(Backend::Sqlite);
    o.upstream = up.addr.clone();
    o.limits = format!("body_timeout_ms = {BODY_TIMEOUT_MS}\nmax_client_connections = 8");
    let g = Gate::start(o).await;
    let a = g.proxy.trim_start_matches("http://").to_string();
    let bound = Duration::from_millis(BODY_TIMEOUT_MS);

    // Nothing sent: closed after the bound.
    let r = raw(&a, &[], Duration::ZERO, Duration::from_secs(15)).await;
    assert!(
        r.elapsed < bound * 4,
        "an idle connection was held for {:?}",
        r.elapsed
    );

    // One request answered with keep-alive, then nothing: closed after the bound too.
    let get = b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: store\r\n\r\n".to_vec();
    let r = raw(
        &a,
        std::slice::from_ref(&get),
        Duration::ZERO,
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        r.elapsed < bound * 4,
        "a kept-alive connection was held for {:?}",
        r.elapsed
    );

    // h2c still works through the guard (its preface is the first bytes).
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = h2
        .get(format!("{}/api/v2/heartbeat", g.proxy))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(h2);

    // Eight idle connections fill the listener: a ninth is closed at once, unanswered.
    let mut idle = vec![];
    for _ in 0..8 {
        idle.push(TcpStream::connect(&a).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let r = raw(
        &a,
        std::slice::from_ref(&get),
        Duration::ZERO,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(r.status, 0, "served past the cap: {}", r.head);
    assert!(
        t.elapsed() < bound,
        "the refused connection was held {:?}",
        t.elapsed()
    );
    // The API listener is not affected by the proxy's.
    assert_alive(&g).await;
    // Once the idle ones are cut off, the proxy serves again.
    tokio::time::sleep(bound * 2).await;
    let r = raw(&a, &[get], Duration::ZERO, Duration::from_secs(5)).await;
    assert_eq!(r.status, 200, "{}", r.head);
    drop(idle);
}

/// A connection from `source` (any 127/8 address reaches the loopback listener), as a client
/// elsewhere on the network would come.
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    sock.connect(addr.parse().unwrap()).await.unwrap()
}

/// Whether the gate closed `s` within `limit` (end of stream or a reset), reading and dropping
/// whatever it answered.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Trickles a header byte every 200 ms (each read well inside any per-read timeout), never the
/// blank line, and asserts the gate cuts the connection within the head deadline's margin.
async fn assert_trickle_cut(s: &mut TcpStream, head_ms: u64, what: &str) {
    let t = Instant::now();
    let mut cut = false;
    while t.elapsed() < Duration::from_millis(head_ms * 6) {
        if s.write_all(b"X").await.is_err() || closed_within(s, Duration::from_millis(200)).await {
            cut = true;
            break;
        }
    }
    assert!(
        cut,
        "{what}: a trickled head was held for {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_millis(head_ms * 4),
        "{what}: cut after {:?}",
        t.elapsed()
    );
}

/// Slowloris, on both listeners: a client that trickles its request head (a byte at a time,
/// each in time for a per-read timeout) is cut off once `limits.head_timeout_ms` passes for
/// the whole head; one address holding many slow connections gets only its share
/// (`limits.max_connections_per_client`), and a client from another address is served at
/// once while they hang.
#[tokio::test]
async fn slow_heads_are_cut_and_one_address_holds_only_its_share() {
    const HEAD_MS: u64 = 1500;
    let up =
        common::upstream::Upstream::start(|_| common::upstream::Reply::ok(json!({"ok": true})))
            .await;
    let mut o = GateOptions::new(Backend::Sqlite);
    o.upstream = up.addr.clone();
    o.limits = format!(
        "body_timeout_ms = 10000\nhead_timeout_ms = {HEAD_MS}\nmax_client_connections = 16\nmax_connections_per_client = 4"
    );
    let g = Gate::start(o).await;
    let proxy = g.proxy.trim_start_matches("http://").to_string();
    let api = addr(&g);
    let heads = [
        (
            proxy.clone(),
            "GET /api/v2/heartbeat HTTP/1.1\r\nHost: store\r\n",
        ),
        (api.clone(), "GET /healthz HTTP/1.1\r\nHost: gate\r\n"),
    ];
    for (a, start) in &heads {
        // One slow head: a header byte every 200 ms (each read well inside any per-read
        // timeout), never the blank line.
        let mut s = connect_from("127.0.0.3", a).await;
        s.write_all(start.as_bytes()).await.unwrap();
        assert_trickle_cut(&mut s, HEAD_MS, a).await;

        // Twenty slow connections from one address (more than the listener's total): four are
        // taken, the rest are closed at once.
        let mut slow = vec![];
        for _ in 0..20 {
            let mut s = connect_from("127.0.0.3", a).await;
            let _ = s.write_all(start.as_bytes()).await;
            slow.push(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut refused = 0;
        for s in slow.iter_mut() {
            if closed_within(s, Duration::from_millis(50)).await {
                refused += 1;
            }
        }
        assert_eq!(
            refused,
            16,
            "{a}: one address kept {} connections",
            20 - refused
        );
        // Another address is served while they hang.
        let mut c = connect_from("127.0.0.2", a).await;
        c.write_all(format!("{start}Connection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = Vec::new();
        let t = Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{a}: {answer}");
        assert!(
            t.elapsed() < Duration::from_millis(HEAD_MS),
            "{a}: served after {:?}",
            t.elapsed()
        );
        drop(slow);
    }

    // The head's time starts with its first byte: a kept-alive proxy connection that idles
    // longer than the head deadline (within the idle bound) is served when its next request
    // comes.
    let mut c = connect_from("127.0.0.2", &proxy).await;
    c.write_all(b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: store\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    tokio::time::sleep(Duration::from_millis(HEAD_MS * 2)).await;
    c.write_all(b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: store\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "after an idle pause: {answer:?}"
    );

    // Pingora serves a kept-alive connection's requests in a loop of its own: the next head
    // is timed too. One request answered, then a second head trickled: cut off.
    let mut c = connect_from("127.0.0.4", &proxy).await;
    c.write_all(b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: store\r\n\r\n")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    c.write_all(b"GET /api/v2/heartbeat HTTP/1.1\r\n")
        .await
        .unwrap();
    assert_trickle_cut(&mut c, HEAD_MS, "a kept-alive connection").await;
    assert_alive(&g).await;
}
