//! A real HTTP webhook receiver on loopback for the webhook tests: records
//! every request (path, Standard Webhooks headers, body, arrival time) and
//! answers from a per-path script (then a per-path default), and a signature
//! check done by an independent implementation (Python's hmac module).
#![allow(dead_code)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub attempt: u32,
    pub body: String,
    pub at: Instant,
}

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
    pub body: String,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: vec![],
            delay: Duration::ZERO,
            body: String::new(),
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
    pub fn body(mut self, b: &str) -> Reply {
        self.body = b.into();
        self
    }
}

#[derive(Default)]
struct Inner {
    hits: Vec<Hit>,
    script: HashMap<String, VecDeque<Reply>>,
    default: HashMap<String, Reply>,
}

#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let path = uri.path().to_string();
    let reply = {
        let mut g = inner.lock().unwrap();
        g.hits.push(Hit {
            path: path.clone(),
            id: h("webhook-id"),
            timestamp: h("webhook-timestamp"),
            signature: h("webhook-signature"),
            attempt: h("webhook-attempt").parse().unwrap_or(0),
            body: String::from_utf8_lossy(&body).into_owned(),
            at: Instant::now(),
        });
        let scripted = g.script.get_mut(&path).and_then(|q| q.pop_front());
        scripted
            .or_else(|| g.default.get(&path).cloned())
            .unwrap_or(Reply::status(200))
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut resp = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (k, v) in reply.headers {
        resp.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&v).unwrap(),
        );
    }
    resp
}

impl Receiver {
    pub async fn start() -> Receiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, inner }
    }

    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Answers the next requests to `path` with `replies`, in order.
    pub fn script(&self, path: &str, replies: Vec<Reply>) {
        self.inner
            .lock()
            .unwrap()
            .script
            .entry(path.into())
            .or_default()
            .extend(replies);
    }

    /// Answers requests to `path` with `reply` once the script is used up.
    pub fn set_default(&self, path: &str, reply: Reply) {
        self.inner
            .lock()
            .unwrap()
            .default
            .insert(path.into(), reply);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.inner.lock().unwrap().hits.clone()
    }

    pub fn hits_on(&self, path: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.path == path).collect()
    }

    /// Waits until `f(hits)` holds (true) or the deadline passes (false).
    pub async fn wait_for(&self, deadline: Duration, f: impl Fn(&[Hit]) -> bool) -> bool {
        let end = Instant::now() + deadline;
        loop {
            if f(&self.hits()) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// HMAC-SHA256 signature computed by Python's standard library, from the
/// secret text as a Standard Webhooks receiver holds it: `whsec_` secrets are
/// base64 keys, any other secret is its UTF-8 bytes.
pub fn python_signature(secret: &str, id: &str, timestamp: &str, body: &str) -> String {
    use std::io::Write;
    let script = r#"
import base64, hashlib, hmac, sys
secret, msg_id, ts = sys.argv[1], sys.argv[2], sys.argv[3]
body = sys.stdin.buffer.read()
key = base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()
mac = hmac.new(key, msg_id.encode() + b"." + ts.encode() + b"." + body, hashlib.sha256)
sys.stdout.write(base64.b64encode(mac.digest()).decode())
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, secret, id, timestamp])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 for the independent signature check");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python signature script failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The `v1,` signatures of a `webhook-signature` header.
pub fn signatures(header: &str) -> Vec<String> {
    header
        .split(' ')
        .filter_map(|p| p.strip_prefix("v1,"))
        .map(str::to_string)
        .collect()
}
