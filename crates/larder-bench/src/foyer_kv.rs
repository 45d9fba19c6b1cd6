//! foyer's HybridCache as a [`Kv`] for the engine benchmark: memory weighted by value bytes, a
//! filesystem device (buffered IO, like larder's volumes) of the given capacity, foyer's
//! defaults otherwise. foyer's reads are async, so calls are bridged onto its own
//! multi-threaded runtime, which gets more worker threads than this machine has cores (on 2
//! cores foyer needs them to make progress).

use crate::engine::Kv;
use anyhow::{Context, Result};
use foyer::{BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder};
use std::path::{Path, PathBuf};

/// A foyer HybridCache with its runtime and directory.
pub struct FoyerKv {
    rt: tokio::runtime::Runtime,
    cache: HybridCache<u64, Vec<u8>>,
    dir: PathBuf,
}

impl FoyerKv {
    /// Builds the cache on `dir`.
    pub fn open(dir: &Path, memory: u64, disk: u64, workers: usize) -> Result<FoyerKv> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(4))
            .enable_all()
            .build()
            .context("foyer runtime")?;
        let cache = rt.block_on(async {
            let device = FsDeviceBuilder::new(dir).with_capacity(disk as usize).build()?;
            HybridCacheBuilder::new()
                .memory(memory as usize)
                .with_weighter(|_key: &u64, value: &Vec<u8>| value.len())
                .storage()
                .with_engine_config(BlockEngineConfig::new(device))
                .build()
                .await
        });
        let cache = cache.map_err(|e| anyhow::anyhow!("building foyer: {e}"))?;
        Ok(FoyerKv { rt, cache, dir: dir.to_path_buf() })
    }
}

impl Kv for FoyerKv {
    fn insert(&self, key: u64, value: &[u8]) -> bool {
        // foyer takes owned values: the copy is part of what an insert costs its users.
        self.cache.insert(key, value.to_vec());
        true
    }

    fn get(&self, key: u64) -> Option<usize> {
        self.rt.block_on(self.cache.get(&key)).ok().flatten().map(|e| e.value().len())
    }

    fn settle(&self) {
        self.rt.block_on(self.cache.storage().wait());
    }

    fn close(self: Box<Self>) {
        let FoyerKv { rt, cache, dir } = *self;
        let _ = rt.block_on(cache.close());
        drop(cache);
        drop(rt);
        let _ = std::fs::remove_dir_all(dir);
    }
}
