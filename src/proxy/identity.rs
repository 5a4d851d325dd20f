//! Who is writing, and for which tenant: decided from configuration and from what the mesh
//! and the upstream credentials say, never from the request body. A header the mesh sets
//! (`proxy.identity_header`, e.g. a SPIFFE id or `x-forwarded-client-cert`) names a configured
//! source; otherwise the sha256 of the upstream API key the agent presents (`Authorization`,
//! `x-api-key`, `api-key`, `x-chroma-token`) does; otherwise the caller is the configured
//! default source (low trust, no authority).

use crate::config::ProxyConfig;
use crate::kernel::types::SourceType;
use crate::state::Runtime;
use http::HeaderMap;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The source a proxied write is attributed to.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    pub source_id: String,
    pub source_type: SourceType,
    pub trust: f64,
    pub authority: f64,
    /// How the caller was recognised: `identity_header`, `upstream_key` or `default`.
    pub matched_by: &'static str,
}

/// Why no tenant governs a request.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantError {
    /// Neither `proxy.tenant` nor a mapped tenant header names one.
    NotConfigured,
    /// The tenant header names no configured tenant.
    Unknown(String),
}

/// The tenant of a proxied request: the tenant header's value when configured and present,
/// else `proxy.tenant`.
pub fn tenant_of(
    cfg: &ProxyConfig,
    rt: &Runtime,
    headers: &HeaderMap,
) -> Result<Uuid, TenantError> {
    if let Some(h) = &cfg.tenant_header {
        if let Some(v) = headers.get(h.as_str()) {
            let raw = v.to_str().unwrap_or("").trim().to_string();
            return match Uuid::parse_str(&raw) {
                Ok(t) if rt.tenant(t).is_some() => Ok(t),
                _ => Err(TenantError::Unknown(raw)),
            };
        }
    }
    match cfg.tenant.as_deref().map(Uuid::parse_str) {
        Some(Ok(t)) if rt.tenant(t).is_some() => Ok(t),
        Some(_) => Err(TenantError::Unknown(cfg.tenant.clone().unwrap_or_default())),
        None => Err(TenantError::NotConfigured),
    }
}

/// Credentials an agent presents to the upstream store, without their scheme.
fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let auth = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let v = v.trim();
            match v.split_once(' ') {
                Some((_scheme, cred)) => cred.trim(),
                None => v,
            }
        });
    let others = ["x-api-key", "api-key", "x-chroma-token"]
        .into_iter()
        .flat_map(move |n| headers.get_all(n).iter())
        .filter_map(|v| v.to_str().ok())
        .map(str::trim);
    auth.chain(others).filter(|k| !k.is_empty())
}

/// Whether an identity header value names `identity`: equal, or (for an
/// `x-forwarded-client-cert` element list) one of its `URI=` / `By=` / `Hash=` fields.
fn identity_matches(value: &str, identity: &str) -> bool {
    let value = value.trim();
    if value == identity {
        return true;
    }
    value.split([',', ';']).any(|part| {
        part.split_once('=').is_some_and(|(k, v)| {
            matches!(k.trim(), "URI" | "By" | "Hash" | "DNS")
                && v.trim().trim_matches('"') == identity
        })
    })
}

/// The configured source of a request, or the default source.
pub fn source_of(cfg: &ProxyConfig, headers: &HeaderMap) -> Source {
    let from = |s: &crate::config::SourceConfig, how| Source {
        source_id: s.source_id.clone(),
        source_type: SourceType::parse(&s.source_type).unwrap_or(SourceType::AgentOutput),
        trust: s.trust,
        authority: s.authority,
        matched_by: how,
    };
    if let Some(h) = &cfg.identity_header {
        let values: Vec<&str> = headers
            .get_all(h.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if !values.is_empty() {
            for s in &cfg.sources {
                if let Some(id) = &s.identity {
                    if values.iter().any(|v| identity_matches(v, id)) {
                        return from(s, "identity_header");
                    }
                }
            }
        }
    }
    if cfg.sources.iter().any(|s| s.upstream_key_sha256.is_some()) {
        for key in presented_keys(headers) {
            let digest = hex::encode(Sha256::digest(key.as_bytes()));
            for s in &cfg.sources {
                if s.upstream_key_sha256.as_deref() == Some(digest.as_str()) {
                    return from(s, "upstream_key");
                }
            }
        }
    }
    let d = &cfg.default_source;
    Source {
        source_id: d.source_id.clone(),
        source_type: SourceType::parse(&d.source_type).unwrap_or(SourceType::AgentOutput),
        trust: d.trust,
        authority: d.authority,
        matched_by: "default",
    }
}

/// The credential headers of a request, kept (sealed, see [`crate::seal`]) with journaled
/// writes so a start-up readback can present them to the upstream again.
pub fn credential_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    crate::seal::CREDENTIAL_HEADERS
        .iter()
        .flat_map(|n| {
            headers
                .get_all(*n)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(|v| (n.to_string(), v.to_string()))
        })
        .collect()
}

/// The journal's `upstream_headers` of the row `row`: the credentials, sealed, or nothing.
pub fn journal_credentials(
    sealer: &crate::seal::Sealer,
    creds: &[(String, String)],
    row: Uuid,
) -> Option<String> {
    (!creds.is_empty()).then(|| {
        serde_json::to_string(&sealer.seal_credentials(creds, &row.to_string())).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DefaultSource, SourceConfig};
    use http::HeaderValue;

    fn cfg() -> ProxyConfig {
        ProxyConfig {
            identity_header: Some("x-mesh-identity".into()),
            sources: vec![
                SourceConfig {
                    source_id: "ingest-bot".into(),
                    identity: Some("spiffe://corp/ingest".into()),
                    upstream_key_sha256: None,
                    source_type: "tool_output".into(),
                    trust: 0.8,
                    authority: 0.5,
                },
                SourceConfig {
                    source_id: "keyed".into(),
                    identity: None,
                    upstream_key_sha256: Some(hex::encode(Sha256::digest(b"secret-key"))),
                    source_type: "agent_output".into(),
                    trust: 0.6,
                    authority: 0.1,
                },
            ],
            default_source: DefaultSource::default(),
            ..ProxyConfig::default()
        }
    }

    #[test]
    fn identity_header_then_key_then_default() {
        let c = cfg();
        let mut h = HeaderMap::new();
        assert_eq!(source_of(&c, &h).matched_by, "default");
        assert_eq!(source_of(&c, &h).trust, 0.2);
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer secret-key"),
        );
        let s = source_of(&c, &h);
        assert_eq!(
            (s.source_id.as_str(), s.matched_by),
            ("keyed", "upstream_key")
        );
        h.insert(
            "x-mesh-identity",
            HeaderValue::from_static("By=spiffe://corp/gate;Hash=ab;URI=spiffe://corp/ingest"),
        );
        let s = source_of(&c, &h);
        assert_eq!(s.source_id, "ingest-bot");
        assert_eq!(s.source_type, SourceType::ToolOutput);
        // An identity the config does not know falls through to the key.
        h.insert(
            "x-mesh-identity",
            HeaderValue::from_static("spiffe://corp/other"),
        );
        assert_eq!(source_of(&c, &h).source_id, "keyed");
        let mut h = HeaderMap::new();
        h.insert("api-key", HeaderValue::from_static("secret-key"));
        assert_eq!(source_of(&c, &h).source_id, "keyed");
        h.insert("api-key", HeaderValue::from_static("wrong"));
        assert_eq!(source_of(&c, &h).matched_by, "default");
    }

    #[test]
    fn a_body_cannot_claim_an_identity() {
        // The only inputs are headers and config: nothing else is even passed in.
        let c = cfg();
        let h = HeaderMap::new();
        assert_eq!(source_of(&c, &h).source_id, "unknown");
    }
}
