//! `request_filter`: the one decision every request meets. A request no pack describes, or a
//! read whose answers get no treatment, continues to Pingora's own forwarding untouched (the
//! route lookup is all the work it costs). A governed write, and a read whose answer is
//! treated, is handled here and answered (`Ok(true)`).

use super::{read, write, Ctx, GateProxy};
use crate::filters::RouteKind;
use pingora_core::Result;
use pingora_proxy::Session;

pub async fn request_filter(
    proxy: &GateProxy,
    session: &mut Session,
    _ctx: &mut Ctx,
) -> Result<bool> {
    let guard = proxy.state.runtime.load();
    let req = session.req_header();
    let governed = match guard
        .routes
        .match_route(req.method.as_str(), req.uri.path())
    {
        None => return Ok(false),
        Some(m) => {
            m.route.kind != RouteKind::Read
                || (guard.config.proxy.retrieval_treatment && m.route.treats_response())
        }
    };
    if !governed {
        return Ok(false);
    }
    // The whole request runs on this config snapshot, even across a reload.
    let rt = arc_swap::Guard::into_inner(guard);
    let (method, path) = (req.method.as_str().to_string(), req.uri.path().to_string());
    let Some(m) = rt.routes.match_route(&method, &path) else {
        return Ok(false);
    };
    match m.route.kind {
        RouteKind::Read => read::handle(proxy, session, rt.clone(), m).await,
        RouteKind::Write | RouteKind::Delete => write::handle(proxy, session, rt.clone(), m).await,
    }
}
