//! A bare Pingora pass-through proxy that inspects nothing: the framework's own floor, for
//! `benches/proxy.sh` (the gate's overhead is measured against it, not against nginx).
//!
//!   cargo run --release --example bare_proxy -- 127.0.0.1:18082 127.0.0.1:18000 [threads]

use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::Result;
use pingora_proxy::{ProxyHttp, Session};
use std::net::SocketAddr;

struct Bare {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listen = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:18082".into());
    let upstream: SocketAddr = args
        .get(2)
        .map(|s| s.as_str())
        .unwrap_or("127.0.0.1:18000")
        .parse()
        .expect("upstream ip:port");
    let threads: usize = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(1);
    let conf = ServerConf {
        threads,
        upstream_keepalive_pool_size: 256,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = pingora_proxy::http_proxy_service(&server.configuration, Bare { upstream });
    svc.add_tcp(&listen);
    server.add_service(svc);
    server.run_forever();
}
