//! A recording test upstream: a small HTTP server that keeps every request it receives (method,
//! target, headers as received, body bytes) and answers as the store would, from a closure.
//! It stands in for stores that cannot run here (Qdrant, Weaviate, Pinecone, Milvus, a memory
//! API): the answers follow the stores' documented shapes, and the record of what arrived is
//! the proof of what the gate let through.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Seen {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// What the upstream answers.
pub struct Reply {
    pub status: u16,
    pub body: Value,
    /// Wait this long before answering (timeouts, a write in flight during a crash).
    pub delay: Option<Duration>,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body,
            delay: None,
        }
    }
    pub fn ok(body: Value) -> Reply {
        Reply::json(200, body)
    }
    pub fn after(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }
}

type Responder = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

#[derive(Clone)]
struct Shared {
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Responder,
}

pub struct Upstream {
    pub addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Upstream {
    pub async fn start(respond: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            seen: seen.clone(),
            respond: Arc::new(respond),
        };
        let app = axum::Router::new().fallback(handle).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Upstream {
            addr,
            seen,
            stop: Some(tx),
        }
    }

    /// Every request received, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn requests(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method && s.path() == path)
            .collect()
    }

    /// Whether any body that reached the upstream contains `needle`.
    pub fn saw_text(&self, needle: &str) -> bool {
        self.seen().iter().any(|s| s.text().contains(needle))
    }

    pub fn clear(&self) {
        self.seen.lock().expect("lock").clear();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

async fn handle(State(s): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let seen = Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    let reply = (s.respond)(&seen);
    s.seen.lock().expect("lock").push(seen);
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let bytes = serde_json::to_vec(&reply.body).unwrap_or_default();
    Response::builder()
        .status(reply.status)
        .header("content-type", "application/json")
        .body(Body::from(bytes))
        .expect("response")
}
