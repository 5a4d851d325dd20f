-- The sidecar's own tables: the dispatch journal (one row per admitted record
-- of a proxied write, written in the same transaction as its receipt, before
-- the upstream is contacted; the upstream's answer is recorded after) and the
-- quarantine (held records, with the exact single-record request to forward
-- when a reviewer releases one).

CREATE TABLE proxy_dispatches (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    -- Groups the rows of one proxied request (or one quarantine release).
    request_id TEXT NOT NULL,
    -- The gate process that journaled the row (start-up reconciliation only
    -- judges rows of processes that are gone).
    instance_id TEXT NOT NULL,
    receipt_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    pack TEXT NOT NULL,
    route TEXT NOT NULL,
    kind TEXT NOT NULL,
    -- Path parameters of the request as a JSON array of [name, value] pairs.
    params TEXT NOT NULL,
    collection TEXT,
    record_id TEXT,
    -- Credential headers the agent presented upstream, JSON object (readback needs them).
    upstream_headers TEXT,
    -- pending | completed | failed | dispatch_unknown | landed | not_landed
    status TEXT NOT NULL,
    upstream_status INTEGER,
    detail TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX proxy_dispatches_request ON proxy_dispatches (request_id);
CREATE INDEX proxy_dispatches_status ON proxy_dispatches (status, created_at);

CREATE TABLE quarantine (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    -- held | releasing | released | rejected
    status TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason_codes TEXT NOT NULL,
    receipt_id TEXT NOT NULL,
    signal_id TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    obstruction_id TEXT,
    source_id TEXT NOT NULL,
    pack TEXT NOT NULL,
    route TEXT NOT NULL,
    params TEXT NOT NULL,
    collection TEXT,
    record_id TEXT,
    record_index INTEGER NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    -- End-to-end request headers to replay on release (JSON array of [name, value]).
    headers TEXT NOT NULL,
    -- The exact single-record request body that release forwards.
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    reviewed_at TEXT,
    reviewed_by TEXT,
    review_receipt_id TEXT,
    upstream_status INTEGER
);
CREATE INDEX quarantine_tenant_status ON quarantine (tenant_id, status, created_at);
