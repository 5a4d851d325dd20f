//! Policy configuration as the operator writes it: mode, profile, thresholds,
//! requirements per (substrate, mutation), detector tuning. Compiled into a
//! [`crate::kernel::policy::CompiledPolicy`] (content-hashed coefficient version).

use crate::kernel::detectors::DetectorConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// `shadow`, `advisory`, `approval`, `enforcement` or `high_assurance`.
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Profile used when a request names none.
    #[serde(default = "default_profile")]
    pub profile: String,
    /// Risk at or above which a write is quarantined.
    #[serde(default = "default_quarantine")]
    pub quarantine_threshold: f64,
    /// Risk at or above which a write is blocked.
    #[serde(default = "default_block")]
    pub block_threshold: f64,
    /// Risk at or above which an otherwise admitted write carries a warning.
    #[serde(default = "default_warn")]
    pub warn_threshold: f64,
    /// A source whose recent writes were refused at this rate or more loses trust
    /// (coordination regime `trust_decay`).
    #[serde(default = "default_decay")]
    pub trust_decay_ratio: f64,
    /// Authority a reviewer's key needs to release a quarantined record.
    #[serde(default = "default_release_authority")]
    pub release_authority: f64,
    /// Absent: the shipped defaults ([`default_requirements`]); an empty list means none.
    #[serde(default = "default_requirements")]
    pub requirements: Vec<RequirementConfig>,
    #[serde(default)]
    pub detectors: DetectorConfig,
}

/// What a (substrate, mutation) pair demands. `*` matches any.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequirementConfig {
    pub substrate: String,
    #[serde(default = "star")]
    pub mutation: String,
    #[serde(default)]
    pub min_authority: f64,
    #[serde(default)]
    pub min_evidence: u32,
    #[serde(default = "default_max_risk")]
    pub max_risk: f64,
    /// Highest influence a trace on this target may reach.
    #[serde(default = "default_max_influence")]
    pub max_influence: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            mode: default_mode(),
            profile: default_profile(),
            quarantine_threshold: default_quarantine(),
            block_threshold: default_block(),
            warn_threshold: default_warn(),
            trust_decay_ratio: default_decay(),
            release_authority: default_release_authority(),
            requirements: default_requirements(),
            detectors: DetectorConfig::default(),
        }
    }
}

/// The shipped defaults, also written out in `config/local.toml`.
pub fn default_requirements() -> Vec<RequirementConfig> {
    let r = |substrate: &str,
             mutation: &str,
             min_authority,
             min_evidence,
             max_risk,
             max_influence: &str| RequirementConfig {
        substrate: substrate.into(),
        mutation: mutation.into(),
        min_authority,
        min_evidence,
        max_risk,
        max_influence: max_influence.into(),
    };
    vec![
        r("policy_corpus", "*", 0.8, 1, 0.4, "policy_authority"),
        r("execution_boundary", "*", 0.8, 1, 0.3, "execution_basis"),
        r("code_substrate", "*", 0.7, 1, 0.4, "execution_basis"),
        r("*", "canonicalize_trace", 0.7, 2, 0.3, "canonical_memory"),
        r("*", "promote_trace", 0.6, 1, 0.4, "canonical_memory"),
        r("agent_memory", "*", 0.0, 0, 0.6, "accepted_context"),
        r("rag_store", "*", 0.0, 0, 0.6, "accepted_context"),
        r("*", "*", 0.0, 0, 0.6, "accepted_context"),
    ]
}

fn star() -> String {
    "*".into()
}
fn default_mode() -> String {
    "enforcement".into()
}
fn default_profile() -> String {
    "standard".into()
}
fn default_quarantine() -> f64 {
    0.7
}
fn default_block() -> f64 {
    0.95
}
fn default_warn() -> f64 {
    0.3
}
fn default_decay() -> f64 {
    0.5
}
fn default_release_authority() -> f64 {
    0.7
}
fn default_max_risk() -> f64 {
    0.6
}
fn default_max_influence() -> String {
    "accepted_context".into()
}
