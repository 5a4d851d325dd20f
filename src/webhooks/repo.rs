//! Storage of subscriptions and deliveries, on SQLite and PostgreSQL alike.
//! Every query a request can reach names the tenant, so one tenant never sees
//! (or learns of) another's rows. The worker's claim takes due deliveries in
//! one statement that also leases them (`FOR UPDATE SKIP LOCKED` on
//! PostgreSQL; SQLite serializes writers), and numbers the attempt as it
//! claims it, so no two claims, on any number of gates, share an attempt.

use super::model::{WebhookDelivery, WebhookSubscription};
use super::signing::Secret;
use crate::kernel::types::{FreeForm, ProductSurface, SubscriptionStatus};
use crate::store::{now, ts, EventWrite, Result, Store, StoreError};
use crate::with_pool;
use chrono::Utc;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

const SUBSCRIPTION_COLUMNS: &str =
    "id, tenant_id, product_surface, event_name, target_url, secret, status, metadata";
const DELIVERY_COLUMNS: &str = "id, tenant_id, subscription_id, event_name, delivery_status, attempt_count, http_status, last_error, next_retry_at, dead_lettered_at, redriven_at, redrive_count, created_at";

/// Delivery states a claim picks up.
pub const WAITING: &str = "delivery_status IN ('pending', 'retrying')";

#[derive(sqlx::FromRow)]
struct SubscriptionRow {
    id: String,
    tenant_id: String,
    product_surface: String,
    event_name: String,
    target_url: String,
    secret: String,
    status: String,
    metadata: Option<String>,
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn uuid(s: &str, what: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("{what} {s:?} is not a UUID")))
}

impl SubscriptionRow {
    fn into_model(self) -> Result<WebhookSubscription> {
        Ok(WebhookSubscription {
            id: uuid(&self.id, "subscription id")?,
            tenant_id: uuid(&self.tenant_id, "subscription tenant")?,
            product_surface: ProductSurface::parse(&self.product_surface)
                .ok_or_else(|| corrupt(format!("product surface {:?}", self.product_surface)))?,
            event_name: self.event_name,
            target_url: self.target_url,
            secret: Secret::new(self.secret),
            status: SubscriptionStatus::parse(&self.status)
                .ok_or_else(|| corrupt(format!("subscription status {:?}", self.status)))?,
            metadata: match self.metadata {
                None => None,
                Some(m) => Some(
                    serde_json::from_str(&m)
                        .map_err(|e| corrupt(format!("subscription metadata: {e}")))?,
                ),
            },
        })
    }
}

#[derive(sqlx::FromRow)]
struct DeliveryRow {
    id: String,
    tenant_id: String,
    subscription_id: String,
    event_name: String,
    delivery_status: String,
    attempt_count: i64,
    http_status: Option<i64>,
    last_error: Option<String>,
    next_retry_at: Option<String>,
    dead_lettered_at: Option<String>,
    redriven_at: Option<String>,
    redrive_count: i64,
    created_at: String,
}

impl DeliveryRow {
    fn into_model(self) -> Result<WebhookDelivery> {
        Ok(WebhookDelivery {
            id: uuid(&self.id, "delivery id")?,
            tenant_id: uuid(&self.tenant_id, "delivery tenant")?,
            subscription_id: uuid(&self.subscription_id, "delivery subscription")?,
            event_name: self.event_name,
            delivery_status: self.delivery_status,
            attempt_count: self.attempt_count,
            http_status: self.http_status,
            last_error: self.last_error,
            next_retry_at: self.next_retry_at,
            dead_lettered_at: self.dead_lettered_at,
            redriven_at: self.redriven_at,
            redrive_count: self.redrive_count,
            created_at: self.created_at,
        })
    }
}

/// What an upsert writes. Fields that are None keep their stored value on
/// update (and take their default on insert).
#[derive(Debug, Clone)]
pub struct SubscriptionWrite {
    pub id: Option<Uuid>,
    pub product_surface: ProductSurface,
    pub event_name: String,
    pub target_url: String,
    pub secret: Option<Secret>,
    pub status: Option<SubscriptionStatus>,
    pub metadata: Option<FreeForm>,
}

/// Filter of the subscription list (the tenant is always the caller's).
#[derive(Debug, Clone, Default)]
pub struct SubscriptionFilter {
    pub product_surface: Option<ProductSurface>,
    pub event_name: Option<String>,
    pub status: Option<SubscriptionStatus>,
}

/// The outcome of a redrive.
#[derive(Debug)]
pub enum Redrive {
    Done(Box<(WebhookDelivery, Option<WebhookSubscription>)>),
    NotFound,
    /// Not dead-lettered (its current status), or its subscription is revoked.
    Conflict(String),
}

/// A delivery claimed for one attempt: what the sender needs.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub subscription_id: Uuid,
    pub event_id: String,
    pub event_name: String,
    pub payload: String,
    /// The number of this attempt over the delivery's life (1-based).
    pub attempt_count: i64,
    /// The number of this attempt in the current cycle (1-based).
    pub cycle_attempt: i64,
    pub redrive_count: i64,
    pub redriven_at: Option<String>,
    pub created_at: String,
    /// The lease: only the holder records the attempt's result.
    pub lease_token: String,
    /// None when the subscription is gone.
    pub target: Option<Target>,
}

/// Where and with what a claimed delivery is sent.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    /// The current secret, then the rotated-out one while its grace lasts.
    pub secrets: Vec<Secret>,
    /// The subscription's status when the delivery was claimed (a claim
    /// takes only active ones, but it may change in between).
    pub status: SubscriptionStatus,
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    id: String,
    tenant_id: String,
    subscription_id: String,
    event_id: String,
    event_name: String,
    payload: String,
    attempt_count: i64,
    cycle_attempt: i64,
    redrive_count: i64,
    redriven_at: Option<String>,
    created_at: String,
}

#[derive(sqlx::FromRow)]
struct TargetRow {
    tenant_id: String,
    id: String,
    target_url: String,
    secret: String,
    previous_secret: Option<String>,
    previous_secret_expires_at: Option<String>,
    status: String,
}

/// The result of an attempt, decided by the worker, to be recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered {
        http_status: i64,
    },
    Retry {
        http_status: Option<i64>,
        error: String,
        next_retry_at: String,
    },
    DeadLetter {
        http_status: Option<i64>,
        error: String,
    },
    /// The subscription is revoked or gone: nothing will ever be sent.
    Cancel {
        error: String,
    },
    /// Not attempted after all (its subscription was paused after the claim,
    /// or too little of the lease was left to send safely): the claim is
    /// undone, attempt number included, and the delivery is due again.
    Release,
}

/// One attempt to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub claimed: Claimed,
    pub outcome: Outcome,
    /// The receiver answered 410 Gone: pause its subscription.
    pub pause_subscription: bool,
}

impl AttemptRecord {
    /// The delivery as it stands once this record is written.
    fn delivery_after(&self, at: &str) -> WebhookDelivery {
        let c = &self.claimed;
        let (status, http, err, next, dead) = match &self.outcome {
            Outcome::Delivered { http_status } => {
                ("delivered", Some(*http_status), None, None, None)
            }
            Outcome::Retry {
                http_status,
                error,
                next_retry_at,
            } => (
                "retrying",
                *http_status,
                Some(error.clone()),
                Some(next_retry_at.clone()),
                None,
            ),
            Outcome::DeadLetter { http_status, error } => (
                "dead_lettered",
                *http_status,
                Some(error.clone()),
                None,
                Some(at.to_string()),
            ),
            Outcome::Cancel { error } => ("cancelled", None, Some(error.clone()), None, None),
            Outcome::Release => ("pending", None, None, Some(at.to_string()), None),
        };
        WebhookDelivery {
            id: c.id,
            tenant_id: c.tenant_id,
            subscription_id: c.subscription_id,
            event_name: c.event_name.clone(),
            delivery_status: status.into(),
            attempt_count: c.attempt_count,
            http_status: http,
            last_error: err,
            next_retry_at: next,
            dead_lettered_at: dead,
            redriven_at: c.redriven_at.clone(),
            redrive_count: c.redrive_count,
            created_at: c.created_at.clone(),
        }
    }
}

/// What happened to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Written,
    /// The lease had passed to another claim: this result was dropped.
    LeaseLost,
}

pub const DEAD_LETTER_EVENT: &str = "delivery.dead_lettered";

impl Store {
    /// Inserts, or updates the tenant's subscription `w.id` names. Ids are keyed per tenant:
    /// another tenant's subscription of the same id is neither seen nor touched. Revoking a
    /// subscription cancels its undelivered deliveries in the same transaction.
    pub async fn upsert_subscription(
        &self,
        tenant: Uuid,
        w: SubscriptionWrite,
    ) -> Result<WebhookSubscription> {
        let tenant_s = tenant.to_string();
        let at = now();
        let id = w.id.unwrap_or_else(Uuid::new_v4);
        let id_s = id.to_string();
        let metadata = w
            .metadata
            .as_ref()
            .map(|m| serde_json::Value::Object(m.clone()).to_string());
        let sql_existing = |d: &crate::store::Dialect| {
            format!(
                "SELECT {SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions WHERE tenant_id = $1 AND id = $2{}",
                d.for_update
            )
        };
        let stored = with_pool!(self, write, |p, d| {
            let mut tx = p.begin().await?;
            let existing: Option<SubscriptionRow> = sqlx::query_as(&sql_existing(d))
                .bind(&tenant_s)
                .bind(&id_s)
                .fetch_optional(&mut *tx)
                .await?;
            let row = match existing {
                Some(e) => {
                    let secret = w
                        .secret
                        .as_ref()
                        .map(|s| s.expose().to_string())
                        .unwrap_or(e.secret.clone());
                    let status = w
                        .status
                        .map(|s| s.as_str().to_string())
                        .unwrap_or(e.status.clone());
                    let metadata = metadata.or(e.metadata.clone());
                    // A secret set by upsert replaces the old one at once (no
                    // grace): the rotate operation is the graceful way.
                    let replaced = secret != e.secret;
                    sqlx::query(
                        "UPDATE webhook_subscriptions SET product_surface = $1, event_name = $2, target_url = $3, secret = $4, status = $5, metadata = $6, updated_at = $7, \
                         previous_secret = CASE WHEN $8 = 1 THEN NULL ELSE previous_secret END, \
                         previous_secret_expires_at = CASE WHEN $8 = 1 THEN NULL ELSE previous_secret_expires_at END \
                         WHERE tenant_id = $9 AND id = $10",
                    )
                    .bind(w.product_surface.as_str())
                    .bind(&w.event_name)
                    .bind(&w.target_url)
                    .bind(&secret)
                    .bind(&status)
                    .bind(&metadata)
                    .bind(&at)
                    .bind(replaced as i64)
                    .bind(&tenant_s)
                    .bind(&id_s)
                    .execute(&mut *tx)
                    .await?;
                    SubscriptionRow {
                        id: id_s.clone(),
                        tenant_id: tenant_s.clone(),
                        product_surface: w.product_surface.as_str().into(),
                        event_name: w.event_name.clone(),
                        target_url: w.target_url.clone(),
                        secret,
                        status,
                        metadata,
                    }
                }
                None => {
                    let secret = w
                        .secret
                        .clone()
                        .unwrap_or_else(Secret::generate)
                        .expose()
                        .to_string();
                    let status = w.status.unwrap_or(SubscriptionStatus::Active);
                    sqlx::query(
                        "INSERT INTO webhook_subscriptions (id, tenant_id, product_surface, event_name, target_url, secret, status, metadata, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)",
                    )
                    .bind(&id_s)
                    .bind(&tenant_s)
                    .bind(w.product_surface.as_str())
                    .bind(&w.event_name)
                    .bind(&w.target_url)
                    .bind(&secret)
                    .bind(status.as_str())
                    .bind(&metadata)
                    .bind(&at)
                    .execute(&mut *tx)
                    .await?;
                    SubscriptionRow {
                        id: id_s.clone(),
                        tenant_id: tenant_s.clone(),
                        product_surface: w.product_surface.as_str().into(),
                        event_name: w.event_name.clone(),
                        target_url: w.target_url.clone(),
                        secret,
                        status: status.as_str().into(),
                        metadata,
                    }
                }
            };
            if row.status == SubscriptionStatus::Revoked.as_str() {
                sqlx::query(&format!(
                    "UPDATE webhook_deliveries SET delivery_status = 'cancelled', next_retry_at = NULL, lease_owner = NULL, last_error = 'subscription revoked', updated_at = $1 \
                     WHERE subscription_id = $2 AND tenant_id = $3 AND {WAITING}"
                ))
                .bind(&at)
                .bind(&id_s)
                .bind(&tenant_s)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            // Proxied receipts' events must find the subscription from now on.
            crate::store::subscriptions_changed();
            Ok::<_, StoreError>(row)
        })?;
        stored.into_model()
    }

    pub async fn get_subscription(
        &self,
        tenant: Uuid,
        id: Uuid,
    ) -> Result<Option<WebhookSubscription>> {
        let sql = format!(
            "SELECT {SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions WHERE tenant_id = $1 AND id = $2"
        );
        let row: Option<SubscriptionRow> = with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        row.map(SubscriptionRow::into_model).transpose()
    }

    /// The tenant's subscriptions matching the filter, oldest first.
    pub async fn list_subscriptions(
        &self,
        tenant: Uuid,
        f: &SubscriptionFilter,
    ) -> Result<Vec<WebhookSubscription>> {
        let mut sql = format!(
            "SELECT {SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions WHERE tenant_id = $1"
        );
        let mut binds: Vec<String> = vec![tenant.to_string()];
        if let Some(ps) = f.product_surface {
            binds.push(ps.as_str().into());
            sql.push_str(&format!(" AND product_surface = ${}", binds.len()));
        }
        if let Some(e) = &f.event_name {
            binds.push(e.clone());
            sql.push_str(&format!(" AND event_name = ${}", binds.len()));
        }
        if let Some(s) = f.status {
            binds.push(s.as_str().into());
            sql.push_str(&format!(" AND status = ${}", binds.len()));
        }
        sql.push_str(" ORDER BY created_at, id");
        let rows: Vec<SubscriptionRow> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql);
            for b in &binds {
                q = q.bind(b);
            }
            q.fetch_all(p).await?
        });
        rows.into_iter().map(SubscriptionRow::into_model).collect()
    }

    /// Replaces the secret; the old one keeps signing until `grace_until`
    /// (None: it stops at once). A second rotation within the grace period
    /// ends the first old secret's grace. None when the tenant has no such
    /// subscription.
    pub async fn rotate_secret(
        &self,
        tenant: Uuid,
        id: Uuid,
        secret: &Secret,
        grace_until: Option<String>,
        reason: Option<&str>,
        at: &str,
    ) -> Result<Option<WebhookSubscription>> {
        let tenant_s = tenant.to_string();
        let id_s = id.to_string();
        let row = with_pool!(self, write, |p, d| {
            let mut tx = p.begin().await?;
            let existing: Option<SubscriptionRow> = sqlx::query_as(&format!(
                "SELECT {SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions WHERE tenant_id = $1 AND id = $2{}",
                d.for_update
            ))
            .bind(&tenant_s)
            .bind(&id_s)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(mut row) = existing else {
                return Ok(None);
            };
            let (previous, expires) = match &grace_until {
                Some(g) => (Some(row.secret.clone()), Some(g.clone())),
                None => (None, None),
            };
            sqlx::query(
                "UPDATE webhook_subscriptions SET secret = $1, previous_secret = $2, previous_secret_expires_at = $3, rotated_at = $4, rotation_reason = $5, updated_at = $4 \
                 WHERE tenant_id = $6 AND id = $7",
            )
            .bind(secret.expose())
            .bind(&previous)
            .bind(&expires)
            .bind(at)
            .bind(reason)
            .bind(&tenant_s)
            .bind(&id_s)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            row.secret = secret.expose().to_string();
            Ok::<_, StoreError>(Some(row))
        })?;
        row.map(SubscriptionRow::into_model).transpose()
    }

    /// The tenant's dead-lettered deliveries, most recently dead-lettered first.
    pub async fn dead_letters(
        &self,
        tenant: Uuid,
        event_name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WebhookDelivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE tenant_id = $1 AND delivery_status = 'dead_lettered'{} ORDER BY dead_lettered_at DESC, id LIMIT $2",
            if event_name.is_some() { " AND event_name = $3" } else { "" }
        );
        let rows: Vec<DeliveryRow> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql).bind(tenant.to_string()).bind(limit);
            if let Some(e) = event_name {
                q = q.bind(e);
            }
            q.fetch_all(p).await?
        });
        rows.into_iter().map(DeliveryRow::into_model).collect()
    }

    pub async fn get_delivery(&self, tenant: Uuid, id: Uuid) -> Result<Option<WebhookDelivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE tenant_id = $1 AND id = $2"
        );
        let row: Option<DeliveryRow> = with_pool!(self, read, |p, _d| {
            sqlx::query_as(&sql)
                .bind(tenant.to_string())
                .bind(id.to_string())
                .fetch_optional(p)
                .await?
        });
        row.map(DeliveryRow::into_model).transpose()
    }

    /// Starts a new attempt cycle for a dead-lettered delivery, due now.
    pub async fn redrive_delivery(&self, tenant: Uuid, id: Uuid) -> Result<Redrive> {
        let tenant_s = tenant.to_string();
        let id_s = id.to_string();
        let at = now();
        let out = with_pool!(self, write, |p, d| {
            let mut tx = p.begin().await?;
            let row: Option<DeliveryRow> = sqlx::query_as(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE tenant_id = $1 AND id = $2{}",
                d.for_update
            ))
            .bind(&tenant_s)
            .bind(&id_s)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(mut row) = row else {
                return Ok(Redrive::NotFound);
            };
            if row.delivery_status != "dead_lettered" {
                return Ok(Redrive::Conflict(format!(
                    "the delivery is {}, not dead_lettered; only dead-lettered deliveries can be redriven",
                    row.delivery_status
                )));
            }
            let sub: Option<SubscriptionRow> = sqlx::query_as(&format!(
                "SELECT {SUBSCRIPTION_COLUMNS} FROM webhook_subscriptions WHERE tenant_id = $1 AND id = $2"
            ))
            .bind(&tenant_s)
            .bind(&row.subscription_id)
            .fetch_optional(&mut *tx)
            .await?;
            if sub.as_ref().is_some_and(|s| s.status == "revoked") {
                return Ok(Redrive::Conflict(
                    "the delivery's subscription is revoked; nothing would be delivered".into(),
                ));
            }
            sqlx::query(
                "UPDATE webhook_deliveries SET delivery_status = 'pending', cycle_attempt = 0, next_retry_at = $1, dead_lettered_at = NULL, redriven_at = $1, redrive_count = redrive_count + 1, lease_owner = NULL, updated_at = $1 \
                 WHERE tenant_id = $2 AND id = $3",
            )
            .bind(&at)
            .bind(&tenant_s)
            .bind(&id_s)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            row.delivery_status = "pending".into();
            row.next_retry_at = Some(at.clone());
            row.dead_lettered_at = None;
            row.redriven_at = Some(at.clone());
            row.redrive_count += 1;
            Ok::<_, StoreError>(Redrive::Done(Box::new((
                row.into_model()?,
                sub.map(SubscriptionRow::into_model).transpose()?,
            ))))
        })?;
        Ok(out)
    }

    /// Claims up to `limit` due deliveries of active subscriptions for one
    /// attempt each: leases them until `now + lease` (by then the attempt is
    /// recorded, or the gate died and the delivery is due again) and numbers
    /// the attempt. `first_delay` holds back first attempts of a cycle that
    /// are younger than the schedule's first delay.
    pub async fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
        first_delay: Duration,
    ) -> Result<Vec<Claimed>> {
        let token = Uuid::new_v4().to_string();
        let t = Utc::now();
        let now_s = ts(t);
        let lease_s = ts(t + chrono::Duration::from_std(lease).unwrap_or_default());
        let first_due = ts(t - chrono::Duration::from_std(first_delay).unwrap_or_default());
        let rows: Vec<ClaimRow> = with_pool!(self, write, |p, d| {
            let lock = if d.name == "postgres" {
                " FOR UPDATE OF d SKIP LOCKED"
            } else {
                ""
            };
            // The due rows are picked once, in a CTE: an `IN (subquery)` may
            // be re-run by the planner and, with SKIP LOCKED, pick more rows
            // than the limit. The outer conditions repeat the inner ones: on
            // PostgreSQL a row another claim updated meanwhile is re-checked.
            let sql = format!(
                "WITH due AS (SELECT d.id FROM webhook_deliveries d JOIN webhook_subscriptions s ON s.tenant_id = d.tenant_id AND s.id = d.subscription_id \
                   WHERE d.{WAITING} AND d.next_retry_at <= $3 AND (d.cycle_attempt > 0 OR d.next_retry_at <= $5) AND s.status = 'active' \
                   ORDER BY d.next_retry_at LIMIT $4{lock}) \
                 UPDATE webhook_deliveries SET lease_owner = $1, next_retry_at = $2, attempt_count = attempt_count + 1, cycle_attempt = cycle_attempt + 1, last_attempt_at = $3, updated_at = $3 \
                 FROM due WHERE webhook_deliveries.id = due.id AND webhook_deliveries.{WAITING} AND webhook_deliveries.next_retry_at <= $3 \
                 RETURNING webhook_deliveries.id AS id, tenant_id, subscription_id, event_id, event_name, payload, attempt_count, cycle_attempt, redrive_count, redriven_at, created_at"
            );
            sqlx::query_as(&sql)
                .bind(&token)
                .bind(&lease_s)
                .bind(&now_s)
                .bind(limit as i64)
                .bind(&first_due)
                .fetch_all(p)
                .await?
        });
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        // Subscriptions are keyed per tenant: each claimed row's own (tenant, subscription).
        let mut sub_keys: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.tenant_id.as_str(), r.subscription_id.as_str()))
            .collect();
        sub_keys.sort_unstable();
        sub_keys.dedup();
        let wanted: Vec<String> = (0..sub_keys.len())
            .map(|i| format!("(tenant_id = ${} AND id = ${})", 2 * i + 1, 2 * i + 2))
            .collect();
        let sql = format!(
            "SELECT tenant_id, id, target_url, secret, previous_secret, previous_secret_expires_at, status FROM webhook_subscriptions WHERE {}",
            wanted.join(" OR ")
        );
        let targets: Vec<TargetRow> = with_pool!(self, read, |p, _d| {
            let mut q = sqlx::query_as(&sql);
            for (tenant, id) in &sub_keys {
                q = q.bind(*tenant).bind(*id);
            }
            q.fetch_all(p).await?
        });
        let targets: HashMap<(String, String), Target> = targets
            .into_iter()
            .map(|t| {
                let mut secrets = vec![Secret::new(t.secret)];
                if let (Some(prev), Some(until)) = (t.previous_secret, t.previous_secret_expires_at)
                {
                    if until > now_s {
                        secrets.push(Secret::new(prev));
                    }
                }
                (
                    (t.tenant_id, t.id),
                    Target {
                        url: t.target_url,
                        secrets,
                        status: SubscriptionStatus::parse(&t.status)
                            .unwrap_or(SubscriptionStatus::Revoked),
                    },
                )
            })
            .collect();
        rows.into_iter()
            .map(|r| {
                Ok(Claimed {
                    id: uuid(&r.id, "delivery id")?,
                    tenant_id: uuid(&r.tenant_id, "delivery tenant")?,
                    subscription_id: uuid(&r.subscription_id, "delivery subscription")?,
                    target: targets
                        .get(&(r.tenant_id.clone(), r.subscription_id.clone()))
                        .cloned(),
                    event_id: r.event_id,
                    event_name: r.event_name,
                    payload: r.payload,
                    attempt_count: r.attempt_count,
                    cycle_attempt: r.cycle_attempt,
                    redrive_count: r.redrive_count,
                    redriven_at: r.redriven_at,
                    created_at: r.created_at,
                    lease_token: token.clone(),
                })
            })
            .collect()
    }

    /// Records attempts in one transaction: each only if its lease still
    /// holds. A dead letter puts `delivery.dead_lettered` in the outbox in the
    /// same transaction (never for a `delivery.dead_lettered` delivery:
    /// no event about an event about an event); a 410 pauses the subscription.
    pub async fn record_attempts(&self, records: &[AttemptRecord]) -> Result<Vec<Recorded>> {
        let at = now();
        // Successes (the common case) are written one statement per claim
        // and status code, not one per delivery.
        let mut groups: HashMap<(&str, i64), Vec<usize>> = HashMap::new();
        for (i, r) in records.iter().enumerate() {
            if let Outcome::Delivered { http_status } = r.outcome {
                groups
                    .entry((r.claimed.lease_token.as_str(), http_status))
                    .or_default()
                    .push(i);
            }
        }
        with_pool!(self, write, |p, _d| {
            let mut tx = p.begin().await?;
            let mut out = vec![Recorded::LeaseLost; records.len()];
            let mut paused = false;
            for ((token, http_status), idx) in &groups {
                for chunk in idx.chunks(500) {
                    let placeholders: Vec<String> =
                        (0..chunk.len()).map(|k| format!("${}", k + 4)).collect();
                    let sql = format!(
                        "UPDATE webhook_deliveries SET delivery_status = 'delivered', http_status = $1, last_error = NULL, next_retry_at = NULL, dead_lettered_at = NULL, lease_owner = NULL, updated_at = $2 \
                         WHERE lease_owner = $3 AND id IN ({}) RETURNING id",
                        placeholders.join(", ")
                    );
                    let mut q = sqlx::query_as::<_, (String,)>(&sql)
                        .bind(*http_status)
                        .bind(&at)
                        .bind(*token);
                    for &i in chunk {
                        q = q.bind(records[i].claimed.id.to_string());
                    }
                    let written: std::collections::HashSet<String> = q
                        .fetch_all(&mut *tx)
                        .await?
                        .into_iter()
                        .map(|r| r.0)
                        .collect();
                    for &i in chunk {
                        if written.contains(&records[i].claimed.id.to_string()) {
                            out[i] = Recorded::Written;
                        }
                    }
                }
            }
            for (i, r) in records.iter().enumerate() {
                let c = &r.claimed;
                match r.outcome {
                    Outcome::Delivered { .. } => continue,
                    Outcome::Release => {
                        let done = sqlx::query(
                            "UPDATE webhook_deliveries SET next_retry_at = $1, lease_owner = NULL, attempt_count = attempt_count - 1, cycle_attempt = cycle_attempt - 1, updated_at = $1 \
                             WHERE id = $2 AND lease_owner = $3",
                        )
                        .bind(&at)
                        .bind(c.id.to_string())
                        .bind(&c.lease_token)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        if done == 1 {
                            out[i] = Recorded::Written;
                        }
                        continue;
                    }
                    _ => {}
                }
                let (status, http, err, next, dead): (
                    &str,
                    Option<i64>,
                    Option<&str>,
                    Option<&str>,
                    Option<&str>,
                ) = match &r.outcome {
                    Outcome::Delivered { http_status } => {
                        ("delivered", Some(*http_status), None, None, None)
                    }
                    Outcome::Retry {
                        http_status,
                        error,
                        next_retry_at,
                    } => (
                        "retrying",
                        *http_status,
                        Some(error),
                        Some(next_retry_at),
                        None,
                    ),
                    Outcome::DeadLetter { http_status, error } => {
                        ("dead_lettered", *http_status, Some(error), None, Some(&at))
                    }
                    Outcome::Cancel { error } => ("cancelled", None, Some(error), None, None),
                    Outcome::Release => continue,
                };
                let done = sqlx::query(
                    "UPDATE webhook_deliveries SET delivery_status = $1, http_status = $2, last_error = $3, next_retry_at = $4, dead_lettered_at = $5, lease_owner = NULL, updated_at = $6 \
                     WHERE id = $7 AND lease_owner = $8",
                )
                .bind(status)
                .bind(http)
                .bind(err)
                .bind(next)
                .bind(dead)
                .bind(&at)
                .bind(c.id.to_string())
                .bind(&c.lease_token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if done == 0 {
                    continue;
                }
                out[i] = Recorded::Written;
                if matches!(r.outcome, Outcome::DeadLetter { .. })
                    && c.event_name != DEAD_LETTER_EVENT
                {
                    let event = EventWrite {
                        name: DEAD_LETTER_EVENT.into(),
                        data: serde_json::json!({
                            "delivery": r.delivery_after(&at),
                            "eventId": c.event_id,
                        }),
                    };
                    crate::enqueue_event!(tx, c.tenant_id, event, &at);
                }
                if r.pause_subscription {
                    paused = true;
                    sqlx::query(
                        "UPDATE webhook_subscriptions SET status = 'paused', updated_at = $1 WHERE id = $2 AND tenant_id = $3 AND status = 'active'",
                    )
                    .bind(&at)
                    .bind(c.subscription_id.to_string())
                    .bind(c.tenant_id.to_string())
                    .execute(&mut *tx)
                    .await?;
                }
            }
            tx.commit().await?;
            if paused {
                // A paused subscription gets no more deliveries of proxied receipts' events.
                crate::store::subscriptions_changed();
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::testing::stores;

    async fn setup(store: &Store, tenant: Uuid, n: usize) -> WebhookSubscription {
        let sub = crate::store::testing::subscribe(store, tenant, "receipt.created").await;
        let events: Vec<EventWrite> = (0..n)
            .map(|i| EventWrite {
                name: "receipt.created".into(),
                data: serde_json::json!({ "n": i }),
            })
            .collect();
        store.enqueue_events(tenant, &events).await.unwrap();
        sub
    }

    /// Subscription ids are keyed per tenant: two tenants may hold the same id (an upsert lets
    /// the caller choose it), each reads and updates its own, and each tenant's deliveries go
    /// to its own subscription's target.
    #[tokio::test]
    async fn two_tenants_may_hold_one_subscription_id_each_their_own() {
        for (store, _dir) in stores().await {
            let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
            let id = Uuid::new_v4();
            let write = |target: &str| SubscriptionWrite {
                id: Some(id),
                product_surface: crate::kernel::types::ProductSurface::Generic,
                event_name: "receipt.created".into(),
                target_url: target.into(),
                secret: None,
                status: None,
                metadata: None,
            };
            let sa = store
                .upsert_subscription(a, write("http://a.example/hook"))
                .await
                .unwrap();
            let sb = store
                .upsert_subscription(b, write("http://b.example/hook"))
                .await
                .unwrap();
            assert_eq!((sa.id, sb.id), (id, id));
            assert_ne!(sa.secret.expose(), sb.secret.expose());
            // An update of b's touches only b's.
            store
                .upsert_subscription(b, write("http://b.example/other"))
                .await
                .unwrap();
            let got_a = store.get_subscription(a, id).await.unwrap().unwrap();
            let got_b = store.get_subscription(b, id).await.unwrap().unwrap();
            assert_eq!(got_a.target_url, "http://a.example/hook");
            assert_eq!(got_a.tenant_id, a);
            assert_eq!(got_b.target_url, "http://b.example/other");
            let event = |n| EventWrite {
                name: "receipt.created".into(),
                data: serde_json::json!({ "n": n }),
            };
            store.enqueue_events(a, &[event(1)]).await.unwrap();
            store.enqueue_events(b, &[event(2)]).await.unwrap();
            let claimed = store
                .claim_deliveries(10, Duration::from_secs(60), Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(claimed.len(), 2);
            for c in claimed {
                let target = c.target.expect("the delivery's subscription");
                let want = if c.tenant_id == a {
                    "http://a.example/hook"
                } else {
                    "http://b.example/other"
                };
                assert_eq!(target.url, want);
            }
        }
    }

    #[tokio::test]
    async fn claims_lease_number_and_release_attempts() {
        for (store, _dir) in stores().await {
            let tenant = Uuid::new_v4();
            setup(&store, tenant, 5).await;
            let lease = Duration::from_secs(60);
            let first = store
                .claim_deliveries(3, lease, Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(first.len(), 3, "never more than asked");
            assert!(first
                .iter()
                .all(|c| c.attempt_count == 1 && c.cycle_attempt == 1));
            assert!(first[0].target.as_ref().unwrap().secrets.len() == 1);
            // Leased rows are not claimed again; the other two are.
            let second = store
                .claim_deliveries(10, lease, Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(second.len(), 2);
            assert!(store
                .claim_deliveries(10, lease, Duration::ZERO)
                .await
                .unwrap()
                .is_empty());

            // Only the lease holder records; a release undoes the claim.
            let mut stale = first[0].clone();
            stale.lease_token = "someone-else".into();
            let recs = vec![
                AttemptRecord {
                    claimed: first[0].clone(),
                    outcome: Outcome::Delivered { http_status: 200 },
                    pause_subscription: false,
                },
                AttemptRecord {
                    claimed: stale,
                    outcome: Outcome::Delivered { http_status: 200 },
                    pause_subscription: false,
                },
                AttemptRecord {
                    claimed: first[1].clone(),
                    outcome: Outcome::Release,
                    pause_subscription: false,
                },
                AttemptRecord {
                    claimed: first[2].clone(),
                    outcome: Outcome::DeadLetter {
                        http_status: Some(500),
                        error: "x".into(),
                    },
                    pause_subscription: true,
                },
            ];
            let res = store.record_attempts(&recs).await.unwrap();
            assert_eq!(
                res,
                vec![
                    Recorded::Written,
                    Recorded::LeaseLost,
                    Recorded::Written,
                    Recorded::Written
                ]
            );
            let again = store
                .claim_deliveries(10, lease, Duration::ZERO)
                .await
                .unwrap();
            assert!(
                again.is_empty(),
                "the 410 paused the subscription: nothing is claimed for it"
            );
            let d = store
                .get_delivery(tenant, first[1].id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (d.delivery_status.as_str(), d.attempt_count),
                ("pending", 0),
                "released unsent"
            );
            let dead = store.dead_letters(tenant, None, 50).await.unwrap();
            assert_eq!(dead.len(), 1);
            assert_eq!(dead[0].id, first[2].id);
            assert!(store
                .dead_letters(Uuid::new_v4(), None, 50)
                .await
                .unwrap()
                .is_empty());
        }
    }

    #[tokio::test]
    async fn an_expired_lease_makes_the_delivery_due_again_with_a_new_attempt_number() {
        for (store, _dir) in stores().await {
            let tenant = Uuid::new_v4();
            setup(&store, tenant, 1).await;
            let c1 = store
                .claim_deliveries(1, Duration::from_millis(300), Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(c1.len(), 1);
            tokio::time::sleep(Duration::from_millis(400)).await;
            let c2 = store
                .claim_deliveries(1, Duration::from_secs(60), Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(c2.len(), 1, "a dead gate's claim comes back");
            assert_eq!((c2[0].id, c2[0].attempt_count), (c1[0].id, 2));
            // The first claimant's late result is refused.
            let late = AttemptRecord {
                claimed: c1[0].clone(),
                outcome: Outcome::Delivered { http_status: 200 },
                pause_subscription: false,
            };
            assert_eq!(
                store.record_attempts(&[late]).await.unwrap(),
                vec![Recorded::LeaseLost]
            );
        }
    }

    #[tokio::test]
    async fn a_first_delay_holds_back_new_deliveries() {
        for (store, _dir) in stores().await {
            let tenant = Uuid::new_v4();
            setup(&store, tenant, 1).await;
            let lease = Duration::from_secs(60);
            assert!(store
                .claim_deliveries(1, lease, Duration::from_secs(30))
                .await
                .unwrap()
                .is_empty());
            assert_eq!(
                store
                    .claim_deliveries(1, lease, Duration::ZERO)
                    .await
                    .unwrap()
                    .len(),
                1
            );
        }
    }
}
