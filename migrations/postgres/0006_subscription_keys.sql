-- A webhook subscription is keyed by its tenant and its id, not its id alone: an
-- upsert may choose the id, and a global key made the answer tell whether another
-- tenant held that id.
ALTER TABLE webhook_subscriptions DROP CONSTRAINT webhook_subscriptions_pkey;
ALTER TABLE webhook_subscriptions ADD PRIMARY KEY (tenant_id, id);
