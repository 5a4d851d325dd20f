-- Core schema: signals, traces, coefficient versions, the receipt chain,
-- obstructions and repair plans, and the webhook outbox (written in the same
-- transaction as the state change that causes an event). Ids are UUID text,
-- timestamps RFC 3339 UTC text with a fixed width, so they sort as strings.

CREATE TABLE signals (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    source_id TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX signals_tenant_created ON signals (tenant_id, created_at);

CREATE TABLE traces (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    phase TEXT NOT NULL,
    influence TEXT NOT NULL,
    trace_type TEXT,
    last_receipt_id TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE coefficient_versions (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE receipts (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    signal_id TEXT,
    source_id TEXT,
    refused BIGINT NOT NULL DEFAULT 0,
    decision TEXT NOT NULL,
    outcome TEXT NOT NULL,
    replay_hash TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    payload TEXT NOT NULL,
    field_digests TEXT NOT NULL,
    idem_key TEXT,
    result TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, seq),
    UNIQUE (tenant_id, idem_key)
);
CREATE INDEX receipts_source ON receipts (tenant_id, source_id, seq);
CREATE INDEX receipts_signal ON receipts (tenant_id, signal_id);

CREATE TABLE receipt_heads (
    tenant_id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);

CREATE TABLE obstructions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    signal_id TEXT,
    receipt_id TEXT,
    status TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX obstructions_tenant ON obstructions (tenant_id, created_at);

CREATE TABLE repair_plans (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    obstruction_id TEXT NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX repair_plans_tenant ON repair_plans (tenant_id, created_at);

CREATE TABLE webhook_subscriptions (
    id TEXT PRIMARY KEY,
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
    updated_at TEXT NOT NULL
);
CREATE INDEX webhook_subscriptions_match ON webhook_subscriptions (tenant_id, event_name, status);

CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    subscription_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_name TEXT NOT NULL,
    payload TEXT NOT NULL,
    delivery_status TEXT NOT NULL,
    attempt_count BIGINT NOT NULL DEFAULT 0,
    http_status BIGINT,
    last_error TEXT,
    next_retry_at TEXT,
    dead_lettered_at TEXT,
    redriven_at TEXT,
    redrive_count BIGINT NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (delivery_status, next_retry_at);
CREATE INDEX webhook_deliveries_tenant ON webhook_deliveries (tenant_id, delivery_status, event_name);
