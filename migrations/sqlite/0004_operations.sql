-- Canonical operations and the governance lifecycle: the dependency graph
-- (what each signal, action or trace was derived from), protected actions
-- and their release, and what approving a repair plan carries out.

-- "child was derived from / based on parent", per tenant. Kinds: signal,
-- receipt, trace, action. Written when a signal naming stored objects in its
-- evidenceRefs is ingested, and when an action names its basis.
CREATE TABLE dependency_edges (
    tenant_id TEXT NOT NULL,
    child_kind TEXT NOT NULL,
    child_id TEXT NOT NULL,
    parent_kind TEXT NOT NULL,
    parent_id TEXT NOT NULL,
    relation TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, child_kind, child_id, parent_kind, parent_id)
);
CREATE INDEX dependency_edges_parent ON dependency_edges (tenant_id, parent_kind, parent_id);

-- Protected actions (execute_tool, release_disclosure, deploy_code): the last
-- answer per action id. A released action is residue when its basis is reversed.
CREATE TABLE actions (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    receipt_id TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- What approving a repair plan does (promote a trace, apply a reversal,
-- quarantine a trace); group_id binds the plans of one canonicalization.
CREATE TABLE repair_effects (
    tenant_id TEXT NOT NULL,
    plan_id TEXT NOT NULL,
    group_id TEXT,
    effect TEXT NOT NULL,
    PRIMARY KEY (tenant_id, plan_id)
);
CREATE INDEX repair_effects_group ON repair_effects (tenant_id, group_id);

CREATE INDEX signals_trace ON signals (tenant_id, trace_id, created_at);
CREATE INDEX obstructions_status ON obstructions (tenant_id, status, created_at);
CREATE INDEX repair_plans_obstruction ON repair_plans (tenant_id, obstruction_id);
CREATE INDEX traces_type_phase ON traces (tenant_id, trace_type, phase);
