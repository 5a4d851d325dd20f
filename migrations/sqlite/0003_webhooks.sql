-- Webhooks: what the delivery worker and the secret rotation need beyond the
-- tables of 0001. attempt_count counts every attempt ever made (it numbers the
-- attempts: claim increments it, so two gates can never send the same attempt);
-- cycle_attempt counts the attempts of the current cycle (a redrive resets it)
-- and decides when the schedule is exhausted.

ALTER TABLE webhook_deliveries ADD COLUMN cycle_attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE webhook_deliveries ADD COLUMN last_attempt_at TEXT;

ALTER TABLE webhook_subscriptions ADD COLUMN rotated_at TEXT;
ALTER TABLE webhook_subscriptions ADD COLUMN rotation_reason TEXT;

-- The claim query scans only deliveries that still wait for an attempt, so it
-- stays fast however many delivered rows accumulate.
CREATE INDEX webhook_deliveries_claim ON webhook_deliveries (next_retry_at)
    WHERE delivery_status IN ('pending', 'retrying');
CREATE INDEX webhook_deliveries_dead ON webhook_deliveries (tenant_id, dead_lettered_at)
    WHERE delivery_status = 'dead_lettered';
CREATE INDEX webhook_deliveries_subscription ON webhook_deliveries (subscription_id, delivery_status);
CREATE INDEX webhook_subscriptions_tenant ON webhook_subscriptions (tenant_id, created_at);
