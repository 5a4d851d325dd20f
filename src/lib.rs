//! substrate-gate: an integrity sidecar. Data flows one way:
//! request → signal → kernel decision → action → receipt → events.
//!
//! - [`config`]: the TOML schema, loading, validation, hot reload
//! - [`kernel`]: the pure, deterministic integrity kernel and the spec's types
//! - [`engine`]: the pipeline the API and the proxy share
//! - [`api`]: the JSON API (one file per resource) and its OpenAPI document
//! - [`proxy`]: the Pingora sidecar (phases only)
//! - [`filters`]: filter packs compiled into the proxy's route table
//! - [`store`]: SQLite / PostgreSQL through sqlx
//! - [`receipts`]: canonical hashing, the chain, replay
//! - [`webhooks`]: subscriptions and signed deliveries

pub mod admission;
pub mod api;
pub mod audit;
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod filters;
pub mod kernel;
pub mod metrics;
pub mod operations;
pub mod proxy;
pub mod receipts;
pub mod seal;
pub mod server;
pub mod state;
pub mod store;
pub mod webhooks;
pub mod workers;
