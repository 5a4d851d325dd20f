//! Webhooks: subscriptions (upsert, list, rotate the secret), dead letters
//! and redrive. Every id is the caller's tenant's or answers 404.

use super::error::{ApiError, FieldError, Problem};
use super::extract::{ApiJson, ApiJsonOrEmpty, Auth};
use super::receipts::path_id;
use crate::kernel::types::{ProductSurface, SubscriptionStatus};
use crate::state::AppState;
use crate::webhooks::repo::{Redrive, SubscriptionFilter, SubscriptionWrite};
use crate::webhooks::signing::{key_bytes, Secret};
use crate::webhooks::ssrf::{parse_target, NetPolicy, TargetError};
use crate::webhooks::{
    is_event_name, WebhookDelivery, WebhookRedriveRequest, WebhookRedriveResponse,
    WebhookRotateRequest, WebhookRotateResponse, WebhookSubscription, WebhookSubscriptionUpsert,
    EVENT_NAMES,
};
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

/// Shortest secret a rotation accepts (spec: at least 16 characters).
pub const MIN_ROTATED_SECRET_CHARS: usize = 16;
pub const DEAD_LETTER_DEFAULT_LIMIT: i64 = 50;
pub const DEAD_LETTER_MAX_LIMIT: i64 = 200;

/// Query parameters by name; unknown or repeated names are a 400 naming them.
fn query(raw: Option<&str>, allowed: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    let mut errors = Vec::new();
    for (k, v) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        if !allowed.contains(&k.as_ref()) {
            errors.push(FieldError {
                field: k.to_string(),
                message: format!(
                    "unknown query parameter, expected one of {}",
                    allowed.join(", ")
                ),
            });
        } else if out.insert(k.to_string(), v.to_string()).is_some() {
            errors.push(FieldError {
                field: k.to_string(),
                message: "given more than once".into(),
            });
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ApiError::fields(errors))
    }
}

fn field(errors: &mut Vec<FieldError>, f: &str, m: impl Into<String>) {
    errors.push(FieldError {
        field: f.into(),
        message: m.into(),
    });
}

/// The query's `tenantId`, which (like the body's) must be the key's tenant.
fn query_tenant(
    auth: &Auth,
    q: &HashMap<String, String>,
    errors: &mut Vec<FieldError>,
) -> Result<(), ApiError> {
    if let Some(t) = q.get("tenantId") {
        match Uuid::parse_str(t) {
            Ok(t) => auth.check_body_tenant(Some(t))?,
            Err(_) => field(errors, "tenantId", "not a UUID"),
        }
    }
    Ok(())
}

fn event_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("length must be at least 1".into())
    } else if !is_event_name(name) {
        Some(format!(
            "not an event name; expected one of {}",
            EVENT_NAMES.join(", ")
        ))
    } else {
        None
    }
}

const PROBLEMS: &str = "application/problem+json";

/// Create or update a webhook subscription.
///
/// Without `id` (or with an `id` none of the tenant's subscriptions has) the
/// subscription is inserted (ids are the tenant's own: another tenant's
/// subscription of the same id is neither seen nor changed);
/// a secret is generated (`whsec_` + base64 of 32 random bytes) when none is
/// given. With the `id` of one of the tenant's subscriptions it is updated:
/// fields left out (`secret`, `status`, `metadata`) keep their value; a new
/// `secret` replaces the old one at once (use rotate for a grace period).
/// Revoking cancels the subscription's undelivered deliveries. `targetUrl`
/// is resolved: loopback, private, link-local, unique-local, CGNAT,
/// multicast and metadata addresses are refused unless the config's
/// `webhooks.allow_networks` names them. A name that does not resolve yet is
/// accepted; every delivery resolves it again and is refused then if forbidden.
#[utoipa::path(post, path = "/substrate/webhooks/subscriptions", tag = "webhooks",
    request_body = WebhookSubscriptionUpsert,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The stored subscription (with its secret)", body = WebhookSubscription),
        (status = 400, description = "Invalid request, e.g. a targetUrl that is not http(s) or resolves to a forbidden address", body = Problem, content_type = PROBLEMS),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = PROBLEMS),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = PROBLEMS),
        (status = 409, description = "A concurrent upsert took the same id", body = Problem, content_type = PROBLEMS),
        (status = 413, description = "Body too large", body = Problem, content_type = PROBLEMS),
        (status = 415, description = "Not JSON", body = Problem, content_type = PROBLEMS),
        (status = 429, description = "Rate limited", body = Problem, content_type = PROBLEMS),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = PROBLEMS)
    ))]
pub async fn upsert_subscription(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    ApiJson(req): ApiJson<WebhookSubscriptionUpsert>,
) -> Result<Json<WebhookSubscription>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    let mut errors = Vec::new();
    if let Some(m) = event_name_problem(&req.event_name) {
        field(&mut errors, "eventName", m);
    }
    if let Err(e) = parse_target(&req.target_url) {
        field(&mut errors, "targetUrl", e.to_string());
    }
    if let Some(s) = &req.secret {
        if let Err(e) = key_bytes(s.expose()) {
            field(&mut errors, "secret", e.to_string());
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::fields(errors));
    }
    // A name that resolves to a forbidden address, or a forbidden address literal, is refused
    // here. A name that does not resolve yet (a receiver not deployed yet, a DNS outage) is
    // accepted: every delivery resolves it again and is refused then if it is forbidden.
    let policy = NetPolicy::new(&state.runtime().config.webhooks.allow_networks);
    match policy.check_target(&req.target_url).await {
        Ok(_) | Err(TargetError::Unresolvable(_)) => {}
        Err(e) => return Err(ApiError::field("targetUrl", e.to_string())),
    }
    let stored = state
        .store
        .upsert_subscription(
            auth.0.tenant,
            SubscriptionWrite {
                id: req.id,
                product_surface: req.product_surface,
                event_name: req.event_name,
                target_url: req.target_url,
                secret: req.secret,
                status: req.status,
                metadata: req.metadata,
            },
        )
        .await?;
    tracing::info!(subscription = %stored.id, event = %stored.event_name, status = %stored.status, "webhook subscription stored");
    Ok(Json(stored))
}

/// List the tenant's webhook subscriptions.
#[utoipa::path(get, path = "/substrate/webhooks/subscriptions", tag = "webhooks",
    params(
        ("tenantId" = Option<Uuid>, Query, description = "Must be the API key's tenant when given"),
        ("productSurface" = Option<ProductSurface>, Query, description = "Only this product surface"),
        ("eventName" = Option<String>, Query, description = "Only this event name"),
        ("status" = Option<SubscriptionStatus>, Query, description = "Only this status")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The subscriptions, oldest first", body = [WebhookSubscription]),
        (status = 400, description = "Invalid or unknown query parameter", body = Problem, content_type = PROBLEMS),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = PROBLEMS),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = PROBLEMS),
        (status = 429, description = "Rate limited", body = Problem, content_type = PROBLEMS),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = PROBLEMS)
    ))]
pub async fn list_subscriptions(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<WebhookSubscription>>, ApiError> {
    let q = query(
        raw.as_deref(),
        &["tenantId", "productSurface", "eventName", "status"],
    )?;
    let mut errors = Vec::new();
    query_tenant(&auth, &q, &mut errors)?;
    let mut filter = SubscriptionFilter::default();
    if let Some(v) = q.get("productSurface") {
        match ProductSurface::parse(v) {
            Some(p) => filter.product_surface = Some(p),
            None => field(
                &mut errors,
                "productSurface",
                format!(
                    "unknown variant `{v}`, expected one of {}",
                    names(ProductSurface::ALL)
                ),
            ),
        }
    }
    if let Some(v) = q.get("eventName") {
        match known_event_name(v) {
            Ok(()) => filter.event_name = Some(v.clone()),
            Err(m) => field(&mut errors, "eventName", m),
        }
    }
    if let Some(v) = q.get("status") {
        match SubscriptionStatus::parse(v) {
            Some(s) => filter.status = Some(s),
            None => field(
                &mut errors,
                "status",
                format!(
                    "unknown variant `{v}`, expected one of {}",
                    names(SubscriptionStatus::ALL)
                ),
            ),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::fields(errors));
    }
    Ok(Json(
        state
            .store
            .list_subscriptions(auth.0.tenant, &filter)
            .await?,
    ))
}

fn names<T: std::fmt::Display>(all: &[T]) -> String {
    all.iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rotate a subscription's secret.
///
/// The new secret (at least 16 characters; generated when absent) signs
/// from now on; the old one keeps signing beside it for
/// `webhooks.rotation_grace_secs` (default 24 h), so receivers can switch
/// without losing a delivery.
#[utoipa::path(post, path = "/substrate/webhooks/subscriptions/{id}/rotate", tag = "webhooks",
    params(("id" = String, Path, description = "Subscription id (UUID)")),
    request_body = Option<WebhookRotateRequest>,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The subscription with its new secret", body = WebhookRotateResponse),
        (status = 400, description = "Invalid request (e.g. a secret shorter than 16 characters)", body = Problem, content_type = PROBLEMS),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = PROBLEMS),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = PROBLEMS),
        (status = 404, description = "Unknown subscription", body = Problem, content_type = PROBLEMS),
        (status = 413, description = "Body too large", body = Problem, content_type = PROBLEMS),
        (status = 415, description = "Not JSON", body = Problem, content_type = PROBLEMS),
        (status = 429, description = "Rate limited", body = Problem, content_type = PROBLEMS),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = PROBLEMS)
    ))]
pub async fn rotate_secret(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    ApiJsonOrEmpty(req): ApiJsonOrEmpty<WebhookRotateRequest>,
) -> Result<Json<WebhookRotateResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    let secret = match req.secret {
        Some(s) => {
            if s.expose().chars().count() < MIN_ROTATED_SECRET_CHARS {
                return Err(ApiError::field(
                    "secret",
                    format!("length must be at least {MIN_ROTATED_SECRET_CHARS} characters"),
                ));
            }
            if let Err(e) = key_bytes(s.expose()) {
                return Err(ApiError::field("secret", e.to_string()));
            }
            s
        }
        None => Secret::generate(),
    };
    let id = path_id(&id, "webhook subscription")?;
    let grace = state.runtime().config.webhooks.rotation_grace_secs;
    let now = chrono::Utc::now();
    let at = crate::store::ts(now);
    let grace_until = (grace > 0).then(|| {
        crate::store::ts(now + chrono::Duration::seconds(grace.min(i64::MAX as u64) as i64))
    });
    let sub = state
        .store
        .rotate_secret(
            auth.0.tenant,
            id,
            &secret,
            grace_until,
            req.rotation_reason.as_deref(),
            &at,
        )
        .await?
        .ok_or_else(|| ApiError::not_found("webhook subscription"))?;
    tracing::info!(subscription = %sub.id, grace_secs = grace, "webhook secret rotated");
    Ok(Json(WebhookRotateResponse::new(sub, at)))
}

/// List the tenant's dead-lettered deliveries, most recent first.
#[utoipa::path(get, path = "/substrate/webhooks/dead-letters", tag = "webhooks",
    params(
        ("tenantId" = Option<Uuid>, Query, description = "Must be the API key's tenant when given"),
        ("eventName" = Option<String>, Query, description = "Only this event name"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "At most this many (1 to 200, default 50)")
    ),
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "Dead-lettered deliveries", body = [WebhookDelivery]),
        (status = 400, description = "Invalid or unknown query parameter", body = Problem, content_type = PROBLEMS),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = PROBLEMS),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = PROBLEMS),
        (status = 429, description = "Rate limited", body = Problem, content_type = PROBLEMS),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = PROBLEMS)
    ))]
pub async fn dead_letters(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<WebhookDelivery>>, ApiError> {
    let q = query(raw.as_deref(), &["tenantId", "eventName", "limit"])?;
    let mut errors = Vec::new();
    query_tenant(&auth, &q, &mut errors)?;
    let event_name = q.get("eventName").map(String::as_str);
    if let Some(Err(m)) = event_name.map(known_event_name) {
        field(&mut errors, "eventName", m);
    }
    let limit = match q.get("limit") {
        None => DEAD_LETTER_DEFAULT_LIMIT,
        Some(v) => match v.parse::<i64>() {
            Ok(n) if (1..=DEAD_LETTER_MAX_LIMIT).contains(&n) => n,
            _ => {
                field(
                    &mut errors,
                    "limit",
                    format!("must be an integer from 1 to {DEAD_LETTER_MAX_LIMIT}"),
                );
                0
            }
        },
    };
    if !errors.is_empty() {
        return Err(ApiError::fields(errors));
    }
    Ok(Json(
        state
            .store
            .dead_letters(auth.0.tenant, event_name, limit)
            .await?,
    ))
}

/// Redrive a dead-lettered delivery: a new attempt cycle from now.
///
/// `redriveCount` goes up by one, `deadLetteredAt` is cleared and the
/// delivery is due at once. A delivery that is not dead-lettered (or whose
/// subscription is revoked) answers 409.
#[utoipa::path(post, path = "/substrate/webhooks/deliveries/{id}/redrive", tag = "webhooks",
    params(("id" = String, Path, description = "Delivery id (UUID, the webhook-id header of its attempts)")),
    request_body = Option<WebhookRedriveRequest>,
    security(("bearer" = []), ("tenantHeader" = [])),
    responses(
        (status = 200, description = "The redriven delivery with its subscription", body = WebhookRedriveResponse),
        (status = 400, description = "Invalid request", body = Problem, content_type = PROBLEMS),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = PROBLEMS),
        (status = 403, description = "Tenant mismatch", body = Problem, content_type = PROBLEMS),
        (status = 404, description = "Unknown delivery", body = Problem, content_type = PROBLEMS),
        (status = 409, description = "The delivery is not dead-lettered, or its subscription is revoked", body = Problem, content_type = PROBLEMS),
        (status = 413, description = "Body too large", body = Problem, content_type = PROBLEMS),
        (status = 415, description = "Not JSON", body = Problem, content_type = PROBLEMS),
        (status = 429, description = "Rate limited", body = Problem, content_type = PROBLEMS),
        (status = 503, description = "Storage unavailable", body = Problem, content_type = PROBLEMS)
    ))]
pub async fn redrive(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    ApiJsonOrEmpty(req): ApiJsonOrEmpty<WebhookRedriveRequest>,
) -> Result<Json<WebhookRedriveResponse>, ApiError> {
    auth.check_body_tenant(req.tenant_id)?;
    let id = path_id(&id, "webhook delivery")?;
    match state.store.redrive_delivery(auth.0.tenant, id).await? {
        Redrive::Done(done) => {
            let (d, sub) = *done;
            tracing::info!(delivery = %d.id, redrive_count = d.redrive_count, "webhook delivery redriven");
            Ok(Json(WebhookRedriveResponse::new(d, sub)))
        }
        Redrive::NotFound => Err(ApiError::not_found("webhook delivery")),
        Redrive::Conflict(m) => Err(ApiError::conflict(m)),
    }
}

/// An `eventName` query filter names one of the contract's events (the served document lists
/// them as its enum): anything else is a 400, not an empty list.
fn known_event_name(v: &str) -> Result<(), String> {
    if crate::webhooks::events::EVENT_NAMES.contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "unknown event name `{v}`, expected one of {}",
            crate::webhooks::events::EVENT_NAMES.join(", ")
        ))
    }
}
