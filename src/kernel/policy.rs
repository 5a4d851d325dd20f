//! A tenant policy compiled for the hot path: parsed enums, detector automata
//! built once, and the coefficient version: the sha256 of the policy's RFC 8785
//! canonical JSON, named by a UUIDv5 of that hash so the same content is the
//! same version everywhere (every gate of a fleet, every restart).

use super::detectors::Detectors;
use super::learned::Model;
use super::types::{
    AllowedInfluence, EvaluationMode, EvaluationProfile, ProposedMutation, TargetSubstrate,
};
use crate::config::PolicyConfig;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use uuid::Uuid;

/// Namespace of coefficient-version and kernel-derived ids (UUIDv5).
pub const NAMESPACE: Uuid = Uuid::from_bytes([
    0x5b, 0x1e, 0x8a, 0x44, 0x2c, 0x7d, 0x4f, 0x1a, 0x9e, 0x0b, 0x6d, 0x3c, 0x8f, 0x21, 0x57, 0x90,
]);

#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub substrate: Option<TargetSubstrate>,
    pub mutation: Option<ProposedMutation>,
    pub min_authority: f64,
    pub min_evidence: u32,
    pub max_risk: f64,
    pub max_influence: AllowedInfluence,
}

pub struct CompiledPolicy {
    pub name: String,
    pub mode: EvaluationMode,
    pub profile: EvaluationProfile,
    pub quarantine_threshold: f64,
    pub block_threshold: f64,
    pub warn_threshold: f64,
    pub trust_decay_ratio: f64,
    pub release_authority: f64,
    pub requirements: Vec<Requirement>,
    pub detectors: Detectors,
    /// The policy as written, canonical JSON: what a coefficient version stores.
    pub content: String,
    pub content_hash: String,
    pub version_id: Uuid,
}

impl std::fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPolicy")
            .field("name", &self.name)
            .field("version_id", &self.version_id)
            .finish()
    }
}

const FALLBACK: Requirement = Requirement {
    substrate: None,
    mutation: None,
    min_authority: 0.0,
    min_evidence: 0,
    max_risk: 0.6,
    max_influence: AllowedInfluence::AcceptedContext,
};

impl CompiledPolicy {
    /// Compiles a policy; the error says what is wrong (validation has
    /// normally caught it earlier with a field path).
    pub fn compile(name: &str, cfg: &PolicyConfig) -> Result<CompiledPolicy, String> {
        CompiledPolicy::compile_with_model(name, cfg, Model::builtin())
    }

    /// [`CompiledPolicy::compile`] with another learned model than the built-in one (training
    /// and evaluation). The model's digest is bound into the content, so a changed model is a
    /// new coefficient version.
    pub fn compile_with_model(
        name: &str,
        cfg: &PolicyConfig,
        model: Option<Arc<Model>>,
    ) -> Result<CompiledPolicy, String> {
        let mode = EvaluationMode::parse(&cfg.mode)
            .ok_or_else(|| format!("unknown mode {:?}", cfg.mode))?;
        let profile = EvaluationProfile::parse(&cfg.profile)
            .ok_or_else(|| format!("unknown profile {:?}", cfg.profile))?;
        let mut requirements = Vec::with_capacity(cfg.requirements.len());
        for r in &cfg.requirements {
            requirements.push(Requirement {
                substrate: if r.substrate == "*" {
                    None
                } else {
                    Some(TargetSubstrate::parse(&r.substrate).ok_or("unknown substrate")?)
                },
                mutation: if r.mutation == "*" {
                    None
                } else {
                    Some(ProposedMutation::parse(&r.mutation).ok_or("unknown mutation")?)
                },
                min_authority: r.min_authority,
                min_evidence: r.min_evidence,
                max_risk: r.max_risk,
                max_influence: AllowedInfluence::parse(&r.max_influence)
                    .ok_or("unknown influence")?,
            });
        }
        let detectors = Detectors::compile_with_model(&cfg.detectors, model)?;
        let mut bound = cfg.clone();
        if bound.detectors.model.digest.is_none() {
            bound.detectors.model.digest = detectors.model_digest().map(str::to_string);
        }
        let value = serde_json::to_value(&bound).map_err(|e| e.to_string())?;
        let content = crate::receipts::canonical_json(&value).map_err(|e| e.to_string())?;
        let content_hash = hex::encode(Sha256::digest(content.as_bytes()));
        let version_id = Uuid::new_v5(
            &NAMESPACE,
            format!("coefficients:{content_hash}").as_bytes(),
        );
        Ok(CompiledPolicy {
            name: name.to_string(),
            mode,
            profile,
            quarantine_threshold: cfg.quarantine_threshold,
            block_threshold: cfg.block_threshold,
            warn_threshold: cfg.warn_threshold,
            trust_decay_ratio: cfg.trust_decay_ratio,
            release_authority: cfg.release_authority,
            requirements,
            detectors,
            content,
            content_hash,
            version_id,
        })
    }

    /// Rebuilds a policy from a stored coefficient version (replay with a pinned version).
    /// A version stored before the learned detector existed names no model: it is rebuilt
    /// without one, as it was evaluated.
    pub fn from_content(content: &str) -> Result<CompiledPolicy, String> {
        let mut value: serde_json::Value = serde_json::from_str(content)
            .map_err(|e| format!("stored coefficient version does not parse: {e}"))?;
        if let Some(detectors) = value.get_mut("detectors").and_then(|d| d.as_object_mut()) {
            detectors
                .entry("model")
                .or_insert_with(|| serde_json::json!({"enabled": false}));
        }
        let cfg: PolicyConfig = serde_json::from_value(value)
            .map_err(|e| format!("stored coefficient version does not parse: {e}"))?;
        CompiledPolicy::compile("stored", &cfg)
    }

    /// First requirement in policy order that matches the pair (operators
    /// list specific entries first); a permissive fallback otherwise.
    pub fn requirement(
        &self,
        substrate: TargetSubstrate,
        mutation: ProposedMutation,
    ) -> &Requirement {
        self.requirements
            .iter()
            .find(|r| {
                r.substrate.is_none_or(|s| s == substrate)
                    && r.mutation.is_none_or(|m| m == mutation)
            })
            .unwrap_or(&FALLBACK)
    }
}
