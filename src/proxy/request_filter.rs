//! `request_filter`: the one decision every request meets. A read no pack describes, a read
//! whose answers get no treatment, and a `forward` route continue to Pingora's own forwarding
//! untouched (the route lookup is all the work they cost). A governed write, and a read whose
//! answer is treated, is handled here and answered (`Ok(true)`). A mutating request no pack
//! describes is refused (403) unless the operator forwards such requests.

use super::{problem, read, write, Ctx, GateProxy};
use crate::config::UndescribedMutations;
use crate::filters::RouteKind;
use pingora_core::Result;
use pingora_proxy::Session;

/// Methods that never change the store (RFC 9110 safe methods a store answers): an undescribed
/// request with one of these is forwarded.
fn is_safe(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

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
        None => {
            if is_safe(&req.method) {
                return Ok(false);
            }
            return match guard.config.proxy.undescribed_mutations {
                UndescribedMutations::Forward => {
                    crate::metrics::UNDESCRIBED
                        .with_label_values(&["forwarded"])
                        .inc();
                    Ok(false)
                }
                UndescribedMutations::Deny => {
                    crate::metrics::UNDESCRIBED
                        .with_label_values(&["denied"])
                        .inc();
                    let detail = format!(
                        "no filter pack describes {} {}: the gate forwards only the mutating routes its packs describe (proxy.undescribed_mutations = \"deny\")",
                        req.method,
                        req.uri.path()
                    );
                    drop(guard);
                    problem::write_problem(
                        session,
                        403,
                        "undescribed_route",
                        &detail,
                        serde_json::Value::Null,
                        &[],
                    )
                    .await?;
                    Ok(true)
                }
            };
        }
        Some(m) => match m.route.kind {
            RouteKind::Write | RouteKind::Delete => true,
            RouteKind::Read => guard.config.proxy.retrieval_treatment && m.route.treats_response(),
            RouteKind::Forward => false,
        },
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
        RouteKind::Forward => Ok(false),
    }
}
