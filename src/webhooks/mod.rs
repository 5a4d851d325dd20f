//! Webhooks: subscriptions, the outbox delivery worker, Standard Webhooks
//! signing, retries, dead letters and redrive. The outbox rows are written by
//! [`crate::store`] in the same transaction as the state change (see
//! `enqueue_event!`); this module owns everything after that.
//!
//! - [`model`]: the spec's subscription / delivery objects
//! - [`repo`]: their storage, the worker's claim and its attempt records
//! - [`worker`]: claim → sign → send → record, with the retry [`schedule`]
//! - [`signing`]: secrets and `webhook-signature`
//! - [`ssrf`]: where a webhook may go
//! - [`events`]: the event names and their documented bodies

pub mod events;
pub mod model;
pub mod repo;
pub mod schedule;
pub mod signing;
pub mod ssrf;
pub mod worker;

pub use events::{is_event_name, EVENT_NAMES};
pub use model::*;
pub use signing::Secret;
