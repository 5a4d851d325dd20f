//! Memoized kernel evaluations. The key is (tenant, coefficient version,
//! canonical input digest): a policy change is a new coefficient version, so a
//! reload can never serve a decision made under the old policy.

use super::{evaluate_with_digest, input_digest, KernelInput, KernelOutput};
use crate::kernel::policy::CompiledPolicy;
use moka::sync::Cache;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub tenant: Uuid,
    pub version: Uuid,
    pub digest: String,
}

pub struct KernelCache {
    cache: Cache<CacheKey, Arc<KernelOutput>>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl KernelCache {
    pub fn new(capacity: u64) -> Self {
        KernelCache {
            cache: Cache::builder().max_capacity(capacity).build(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Evaluates `input` under `policy`, from the cache when the same input was seen.
    pub fn evaluate(&self, input: &KernelInput, policy: &CompiledPolicy) -> Arc<KernelOutput> {
        let digest = input_digest(input);
        let key = CacheKey {
            tenant: input.signal.tenant_id,
            version: policy.version_id,
            digest,
        };
        if let Some(hit) = self.cache.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            crate::metrics::KERNEL_CACHE
                .with_label_values(&["hit"])
                .inc();
            return hit;
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        crate::metrics::KERNEL_CACHE
            .with_label_values(&["miss"])
            .inc();
        let timer = std::time::Instant::now();
        let out = Arc::new(evaluate_with_digest(input, policy, key.digest.clone()));
        crate::metrics::KERNEL_LATENCY.observe(timer.elapsed().as_secs_f64());
        self.cache.insert(key, out.clone());
        out
    }

    /// A lookup by an already computed key (benchmarks, and callers that keep digests).
    pub fn get(&self, key: &CacheKey) -> Option<Arc<KernelOutput>> {
        self.cache.get(key)
    }
}
