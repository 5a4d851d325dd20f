//! Background workers started by `serve`, each stopping when the shutdown
//! signal flips: the webhook delivery worker and the proxy's start-up
//! reconciliation of journaled writes.

use crate::state::AppState;
use std::sync::Arc;

pub fn spawn(state: Arc<AppState>, shutdown: tokio::sync::watch::Receiver<bool>) {
    crate::webhooks::worker::spawn(state.clone(), shutdown.clone());
    tokio::spawn(crate::proxy::reconcile::run_at_startup(
        state.clone(),
        shutdown.clone(),
    ));
}
