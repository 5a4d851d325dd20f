//! Background workers started by `serve`, each stopping when the shutdown
//! signal flips: the webhook delivery worker, the proxy's start-up
//! reconciliation of journaled writes, and the periodic signed checkpoints.

use crate::state::AppState;
use std::sync::Arc;

pub fn spawn(state: Arc<AppState>, shutdown: tokio::sync::watch::Receiver<bool>) {
    crate::webhooks::worker::spawn(state.clone(), shutdown.clone());
    tokio::spawn(crate::proxy::reconcile::run_at_startup(
        state.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(checkpoints(state, shutdown));
}

/// Every `checkpoints.interval_secs` (read each round, so a reload applies), signs the head of
/// each tenant's chain that grew since its last checkpoint. Gates sharing a database may sign
/// the same head; the store keeps one checkpoint per sequence.
async fn checkpoints(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let (signer, every) = {
            let rt = state.runtime();
            (rt.checkpoints.clone(), rt.config.checkpoints.interval_secs)
        };
        // Off (no key, or on demand only): look again in a minute, in case a reload turns it on.
        let wait = if signer.is_some() && every > 0 {
            every
        } else {
            60
        };
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(wait)) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let Some(signer) = signer.filter(|_| every > 0) else {
            continue;
        };
        let tenants = match state.store.receipt_tenants().await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "checkpoints: cannot list chains");
                continue;
            }
        };
        for t in tenants.iter().filter_map(|t| uuid::Uuid::parse_str(t).ok()) {
            if let Err(e) = crate::audit::checkpoint_now(&state.store, &signer, t).await {
                tracing::warn!(tenant = %t, error = %e, "checkpoint not signed");
            }
        }
    }
}
