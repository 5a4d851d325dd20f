//! The webhook objects of the specification, exactly its field tables:
//! subscription (and its upsert request), rotate request / response,
//! delivery, redrive request / response.

use super::signing::Secret;
use crate::kernel::types::{present, FreeForm, ProductSurface, SubscriptionStatus};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;
use uuid::Uuid;

impl Serialize for Secret {
    /// A subscription's secret is serialized only into its owner's answers.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.expose())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// A webhook subscription as stored and answered.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSubscription {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub product_surface: ProductSurface,
    /// One of the event names (see the `webhooks` section of this document).
    #[schema(min_length = 1)]
    pub event_name: String,
    /// http(s) URL; must not resolve to a loopback, private, link-local,
    /// unique-local, CGNAT, multicast or metadata address.
    #[schema(format = "uri")]
    pub target_url: String,
    /// Signing secret; returned only to the owning tenant.
    #[schema(value_type = String)]
    pub secret: Secret,
    pub status: SubscriptionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<FreeForm>,
}

/// Upsert request: the subscription's fields. With `id` of an existing
/// subscription it updates that one (fields left out keep their value);
/// otherwise it inserts (a secret is generated when none is given).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSubscriptionUpsert {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub id: Option<Uuid>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    pub product_surface: ProductSurface,
    #[schema(min_length = 1)]
    pub event_name: String,
    #[schema(format = "uri")]
    pub target_url: String,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>)]
    pub secret: Option<Secret>,
    /// Default `active`.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub status: Option<SubscriptionStatus>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<Object>)]
    pub metadata: Option<FreeForm>,
}

/// Rotate request: all fields optional; without `secret` one is generated.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookRotateRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
    /// At least 16 characters.
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, value_type = Option<String>, min_length = 16)]
    pub secret: Option<Secret>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub rotation_reason: Option<String>,
}

/// Rotate response: the subscription with its new secret, and when it rotated.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRotateResponse {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub product_surface: ProductSurface,
    pub event_name: String,
    #[schema(format = "uri")]
    pub target_url: String,
    #[schema(value_type = String)]
    pub secret: Secret,
    pub status: SubscriptionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<FreeForm>,
    pub rotated_at: String,
}

impl WebhookRotateResponse {
    pub fn new(s: WebhookSubscription, rotated_at: String) -> Self {
        WebhookRotateResponse {
            id: s.id,
            tenant_id: s.tenant_id,
            product_surface: s.product_surface,
            event_name: s.event_name,
            target_url: s.target_url,
            secret: s.secret,
            status: s.status,
            metadata: s.metadata,
            rotated_at,
        }
    }
}

/// A delivery of one event to one subscription, with its attempt record.
/// `deliveryStatus` is one of `pending` (waiting for its first attempt),
/// `retrying` (an attempt failed; `nextRetryAt` says when the next one is
/// due), `delivered`, `dead_lettered` and `cancelled` (its subscription was
/// revoked before it was delivered).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookDelivery {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub subscription_id: Uuid,
    pub event_name: String,
    pub delivery_status: String,
    /// Attempts made over the delivery's life (redrives included).
    #[schema(minimum = 0)]
    pub attempt_count: i64,
    pub http_status: Option<i64>,
    pub last_error: Option<String>,
    pub next_retry_at: Option<String>,
    pub dead_lettered_at: Option<String>,
    pub redriven_at: Option<String>,
    #[schema(minimum = 0)]
    pub redrive_count: i64,
    pub created_at: String,
}

/// Redrive request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookRedriveRequest {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub tenant_id: Option<Uuid>,
}

/// Redrive response: the delivery (as it is after the redrive), its
/// subscription (null when it no longer exists) and `redriven`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRedriveResponse {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub subscription_id: Uuid,
    pub event_name: String,
    pub delivery_status: String,
    #[schema(minimum = 0)]
    pub attempt_count: i64,
    pub http_status: Option<i64>,
    pub last_error: Option<String>,
    pub next_retry_at: Option<String>,
    pub dead_lettered_at: Option<String>,
    pub redriven_at: Option<String>,
    #[schema(minimum = 0)]
    pub redrive_count: i64,
    pub created_at: String,
    pub subscription: Option<WebhookSubscription>,
    pub redriven: bool,
}

impl WebhookRedriveResponse {
    pub fn new(d: WebhookDelivery, subscription: Option<WebhookSubscription>) -> Self {
        WebhookRedriveResponse {
            id: d.id,
            tenant_id: d.tenant_id,
            subscription_id: d.subscription_id,
            event_name: d.event_name,
            delivery_status: d.delivery_status,
            attempt_count: d.attempt_count,
            http_status: d.http_status,
            last_error: d.last_error,
            next_retry_at: d.next_retry_at,
            dead_lettered_at: d.dead_lettered_at,
            redriven_at: d.redriven_at,
            redrive_count: d.redrive_count,
            created_at: d.created_at,
            subscription,
            redriven: true,
        }
    }
}
