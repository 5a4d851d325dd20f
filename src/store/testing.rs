//! Stores for unit tests: SQLite in a temporary directory, and PostgreSQL (a fresh database)
//! when `TEST_DATABASE_URL` is set.

use super::receipts::{EventWrite, Finish, ReceiptWrite};
use super::Store;
use crate::config::StorageConfig;
use uuid::Uuid;

/// A fresh SQLite store, and a fresh PostgreSQL one when TEST_DATABASE_URL is set, each with
/// its batchers running on the test's runtime (as the proxy runs them on its own).
pub async fn stores() -> Vec<(Store, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut out = vec![(
        Store::connect(&StorageConfig {
            url,
            ..Default::default()
        })
        .await
        .unwrap(),
        dir,
    )];
    out[0].0.start_batchers();
    if let Ok(admin) = std::env::var("TEST_DATABASE_URL") {
        let name = format!("gate_unit_{}", Uuid::new_v4().simple());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&admin)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let url = format!("{}/{name}", &admin[..admin.rfind('/').unwrap()]);
        out.push((
            Store::connect(&StorageConfig {
                url,
                ..Default::default()
            })
            .await
            .unwrap(),
            tempfile::tempdir().unwrap(),
        ));
        out[1].0.start_batchers();
    }
    out
}

/// An active subscription of `tenant` to `event`, delivering nowhere (port 9).
pub async fn subscribe(
    store: &Store,
    tenant: Uuid,
    event: &str,
) -> crate::webhooks::model::WebhookSubscription {
    store
        .upsert_subscription(
            tenant,
            crate::webhooks::repo::SubscriptionWrite {
                id: None,
                product_surface: crate::kernel::types::ProductSurface::Generic,
                event_name: event.into(),
                target_url: "http://127.0.0.1:9/".into(),
                secret: None,
                status: None,
                metadata: None,
            },
        )
        .await
        .unwrap()
}

/// A bare receipt of `tenant` (kind `test`, no source, no trace) that asks for a
/// `receipt.created` event.
pub fn receipt(tenant: Uuid, n: i64) -> ReceiptWrite {
    let mut content = serde_json::Map::new();
    content.insert("kind".into(), serde_json::json!("test"));
    content.insert("n".into(), serde_json::json!(n));
    ReceiptWrite {
        tenant,
        id: crate::store::new_id(),
        kind: "test".into(),
        signal_id: None,
        source_id: None,
        refused: false,
        decision: "allow".into(),
        outcome: "allow".into(),
        idem_key: None,
        content: crate::receipts::CanonicalContent::new(content),
        trace: None,
        obstruction: None,
        repair_plan: None,
        finish: Box::new(|sealed| Finish {
            result: None,
            events: vec![EventWrite {
                name: "receipt.created".into(),
                data: serde_json::json!({"id": sealed.receipt_id}),
            }],
        }),
    }
}
