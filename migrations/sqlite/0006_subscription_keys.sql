-- A webhook subscription is keyed by its tenant and its id, not its id alone: an
-- upsert may choose the id, and a global key made the answer tell whether another
-- tenant held that id. SQLite cannot change a primary key in place, so the table
-- is rebuilt (in the migration's transaction) with every row and index it had.
CREATE TABLE webhook_subscriptions_keyed (
    id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    product_surface TEXT NOT NULL,
    event_name TEXT NOT NULL,
    target_url TEXT NOT NULL,
    secret TEXT NOT NULL,
    previous_secret TEXT,
    previous_secret_expires_at TEXT,
    status TEXT NOT NULL,
    metadata TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    rotated_at TEXT,
    rotation_reason TEXT,
    PRIMARY KEY (tenant_id, id)
);
INSERT INTO webhook_subscriptions_keyed (id, tenant_id, product_surface, event_name, target_url,
    secret, previous_secret, previous_secret_expires_at, status, metadata, created_at, updated_at,
    rotated_at, rotation_reason)
SELECT id, tenant_id, product_surface, event_name, target_url, secret, previous_secret,
    previous_secret_expires_at, status, metadata, created_at, updated_at, rotated_at,
    rotation_reason
FROM webhook_subscriptions;
DROP TABLE webhook_subscriptions;
ALTER TABLE webhook_subscriptions_keyed RENAME TO webhook_subscriptions;
CREATE INDEX webhook_subscriptions_match ON webhook_subscriptions (tenant_id, event_name, status);
CREATE INDEX webhook_subscriptions_tenant ON webhook_subscriptions (tenant_id, created_at);
