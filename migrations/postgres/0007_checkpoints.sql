-- Signed checkpoints of the receipt chains (src/checkpoint.rs): each is a C2SP signed note of
-- one tenant's chain head. Kept here so the API can serve the latest; their worth is in the
-- copies kept elsewhere, which `receipts verify --checkpoint` checks the chain against.
CREATE TABLE receipt_checkpoints (
    tenant_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    note TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, seq)
);
