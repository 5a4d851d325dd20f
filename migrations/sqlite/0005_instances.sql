-- Liveness of the gates that share this database (a fleet on PostgreSQL): each
-- gate refreshes its row every few seconds while it runs. Reconciliation judges
-- only the unsettled journal rows of gates whose row went stale, so a live
-- gate's slow write is never settled by another gate.
CREATE TABLE gate_instances (
    instance_id TEXT PRIMARY KEY,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL
);
