//! The running state: an immutable [`Runtime`] compiled from a validated
//! config (tenants, key hashes, compiled policies, route table), swapped in
//! whole by arc-swap on reload, plus what outlives reloads (storage, kernel
//! cache, rate limiters). A request loads the `Arc<Runtime>` once and finishes
//! on it, so a reload never changes a request half-way.

use crate::config::{ApiKeyConfig, Config, Loaded};
use crate::filters::RouteTable;
use crate::kernel::cache::KernelCache;
use crate::kernel::policy::CompiledPolicy;
use crate::store::Store;
use arc_swap::ArcSwap;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// Kernel outputs kept for repeated inputs.
pub const KERNEL_CACHE_ENTRIES: u64 = 16_384;

pub struct TenantRuntime {
    pub id: Uuid,
    pub name: Option<String>,
    pub policy: Arc<CompiledPolicy>,
}

pub struct KeyEntry {
    pub key_id: String,
    pub tenant: Uuid,
    digest: [u8; 32],
    pub authority_ceiling: Option<f64>,
    pub limiter: Option<Arc<DefaultDirectRateLimiter>>,
    quota: Option<(u32, u32)>,
}

/// The identity a request authenticated as.
#[derive(Clone, Debug)]
pub struct Principal {
    pub tenant: Uuid,
    pub key_id: String,
    pub authority_ceiling: Option<f64>,
}

pub struct Runtime {
    pub config: Config,
    /// sha256 of the effective config, first 12 hex: the `config_info` label.
    pub version: String,
    pub tenants: HashMap<Uuid, TenantRuntime>,
    keys: Vec<KeyEntry>,
    pub routes: Arc<RouteTable>,
    pub base_dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// Seals the store credentials kept in the database (`storage.credentials_key_file`).
    pub sealer: Arc<crate::seal::Sealer>,
    /// Signs checkpoints of the receipt chains (`checkpoints.key_file`).
    pub checkpoints: Option<Arc<crate::checkpoint::Signer>>,
}

/// Compiles filter packs into one route table; errors carry file and line.
pub fn compile_route_table(
    packs: &[(String, String)],
) -> Result<RouteTable, Vec<crate::filters::PackError>> {
    let mut compiled = Vec::new();
    let mut errors = Vec::new();
    for (name, text) in packs {
        match crate::filters::compile_pack(name, text) {
            Ok(p) => compiled.push(p),
            Err(e) => errors.extend(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    crate::filters::build_table(compiled)
}

impl Runtime {
    /// Builds a runtime from a validated config. Rate limiters of unchanged
    /// keys are carried over from `previous` so a reload does not reset them.
    pub fn build(loaded: Loaded, previous: Option<&Runtime>) -> Result<Runtime, String> {
        let config = loaded.config;
        let mut tenants = HashMap::new();
        let mut keys = Vec::new();
        let mut policies: HashMap<String, Arc<CompiledPolicy>> = HashMap::new();
        for (name, p) in &config.policies {
            policies.insert(name.clone(), Arc::new(CompiledPolicy::compile(name, p)?));
        }
        for t in &config.tenants {
            let id = Uuid::parse_str(&t.id).map_err(|e| format!("tenant {}: {e}", t.id))?;
            let policy = policies
                .get(&t.policy)
                .cloned()
                .ok_or_else(|| format!("tenant {}: no policy {}", t.id, t.policy))?;
            tenants.insert(
                id,
                TenantRuntime {
                    id,
                    name: t.name.clone(),
                    policy,
                },
            );
            for k in &t.api_keys {
                keys.push(key_entry(id, k, previous));
            }
        }
        let routes = Arc::new(compile_route_table(&loaded.packs).map_err(|e| {
            e.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        })?);
        let version = {
            let mut h = Sha256::new();
            h.update(format!("{config:?}").as_bytes());
            for (n, t) in &loaded.packs {
                h.update(n.as_bytes());
                h.update(t.as_bytes());
            }
            hex::encode(h.finalize())[..12].to_string()
        };
        let sealer = match &config.storage.credentials_key_file {
            Some(f) => Arc::new(
                crate::seal::Sealer::from_key_file(&loaded.base_dir.join(f))
                    .map_err(|e| format!("storage.credentials_key_file: {e}"))?,
            ),
            None => Arc::new(crate::seal::Sealer::plain()),
        };
        let checkpoints = match &config.checkpoints.key_file {
            Some(f) => Some(Arc::new(
                crate::checkpoint::Signer::from_key_file(
                    &config.checkpoints.name,
                    &loaded.base_dir.join(f),
                )
                .map_err(|e| format!("checkpoints.key_file: {e}"))?,
            )),
            None => None,
        };
        Ok(Runtime {
            config,
            version,
            tenants,
            keys,
            routes,
            base_dir: loaded.base_dir,
            files: loaded.files,
            sealer,
            checkpoints,
        })
    }

    /// Finds the key's principal. Every configured digest is compared in
    /// constant time, all of them, so timing says nothing about which matched.
    pub fn authenticate(
        &self,
        presented_key: &str,
    ) -> Option<(Principal, Option<Arc<DefaultDirectRateLimiter>>)> {
        let digest: [u8; 32] = Sha256::digest(presented_key.as_bytes()).into();
        let mut found: Option<&KeyEntry> = None;
        for k in &self.keys {
            if bool::from(k.digest.ct_eq(&digest)) {
                found = Some(k);
            }
        }
        found.map(|k| {
            (
                Principal {
                    tenant: k.tenant,
                    key_id: k.key_id.clone(),
                    authority_ceiling: k.authority_ceiling,
                },
                k.limiter.clone(),
            )
        })
    }

    pub fn tenant(&self, id: Uuid) -> Option<&TenantRuntime> {
        self.tenants.get(&id)
    }
}

fn key_entry(tenant: Uuid, k: &ApiKeyConfig, previous: Option<&Runtime>) -> KeyEntry {
    let mut digest = [0u8; 32];
    // Validation guarantees 64 hex characters.
    let _ = hex::decode_to_slice(&k.sha256, &mut digest);
    let quota = k
        .rate_limit_per_second
        .map(|r| (r, k.rate_limit_burst.unwrap_or(r)));
    let reused = previous
        .and_then(|p| {
            p.keys
                .iter()
                .find(|e| e.digest == digest && e.quota == quota)
        })
        .and_then(|e| e.limiter.clone());
    let limiter = reused.or_else(|| {
        quota.and_then(|(r, b)| {
            let q = Quota::per_second(NonZeroU32::new(r)?).allow_burst(NonZeroU32::new(b)?);
            Some(Arc::new(RateLimiter::direct(q)))
        })
    });
    KeyEntry {
        key_id: k.id.clone(),
        tenant,
        digest,
        authority_ceiling: k.authority_ceiling,
        limiter,
        quota,
    }
}

/// Shared by the API, the proxy and the workers.
pub struct AppState {
    pub runtime: ArcSwap<Runtime>,
    pub store: Arc<Store>,
    pub cache: KernelCache,
    pub config_path: Option<PathBuf>,
    /// Compiled stored coefficient versions (replay with a pinned version).
    pub versions: moka::sync::Cache<Uuid, Arc<CompiledPolicy>>,
    pub started: std::time::Instant,
}

impl AppState {
    pub fn new(runtime: Runtime, store: Arc<Store>, config_path: Option<PathBuf>) -> Arc<AppState> {
        crate::metrics::set_config_version(&runtime.version);
        Arc::new(AppState {
            runtime: ArcSwap::from_pointee(runtime),
            store,
            // Bounded by entries: an output is 2–3 KiB, so ~40 MiB at most. A soak run with
            // 100,000 entries grew the RSS by ~30 MiB a minute until the cache was full (the
            // cache serves repeated inputs: retries, re-sent records, replays), not worth 300 MiB.
            cache: KernelCache::new(KERNEL_CACHE_ENTRIES),
            config_path,
            versions: moka::sync::Cache::new(64),
            started: std::time::Instant::now(),
        })
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// Records every tenant's current coefficient version (idempotent).
    pub async fn record_coefficient_versions(&self) -> Result<(), crate::store::StoreError> {
        let rt = self.runtime();
        for t in rt.tenants.values() {
            self.store
                .ensure_coefficient_version(
                    t.id,
                    t.policy.version_id,
                    &t.policy.content_hash,
                    &t.policy.content,
                )
                .await?;
        }
        Ok(())
    }
}
