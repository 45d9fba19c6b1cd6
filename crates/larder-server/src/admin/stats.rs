//! `/_larder/stats`: the store's figures and every door's, as JSON. The status page and
//! `larder top` read these same numbers (and the sampler's seconds made from them).

use crate::app::App;
use crate::watch::{Door, OUTCOMES};
use larder_engine::Stats;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The store's figures, gathered on the blocking pool: they ask the file system for free
/// space, which a failing disk can stall.
pub async fn gather(app: &Arc<App>) -> Option<larder_engine::Stats> {
    app.store.get()?;
    let app = app.clone();
    tokio::task::spawn_blocking(move || app.store.get().map(|s| s.stats())).await.ok().flatten()
}

/// The stats as JSON.
pub fn json(app: &Arc<App>, s: &Stats) -> serde_json::Value {
    let (bytes_in, bytes_out) =
        (app.metrics.bytes_in.load(Ordering::Relaxed), app.metrics.bytes_out.load(Ordering::Relaxed));
    let (budget_used, budget_capacity) = app.body_budget.bodies_used();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_ms": app.watch.started_ms,
        "uptime_seconds": app.started.elapsed().as_secs_f64(),
        "keys": s.keys,
        "bytes_used": s.bytes_used,
        "capacity_bytes": s.capacity_bytes,
        "volumes": s.volumes,
        "active_volume": s.active_volume,
        "volume_size": s.volume_size,
        "volume_count": s.volume_count,
        "puts": s.puts,
        "deletes": s.deletes,
        "hits": s.hits,
        "misses": s.misses,
        "hit_ratio": ratio(s.hits, s.hits + s.misses),
        "memory_hits": s.memory_hits,
        "disk_hits": s.hits.saturating_sub(s.memory_hits),
        "memory_hit_ratio": ratio(s.memory_hits, s.hits + s.misses),
        "disk_hit_ratio": ratio(s.hits.saturating_sub(s.memory_hits), s.hits + s.misses),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "disk_reads": s.disk_reads,
        "coalesced_reads": s.coalesced_reads,
        "promotions": s.promotions,
        "memory_capacity": s.memory_capacity,
        "memory_bytes": s.memory_bytes,
        "memory_logical_bytes": s.memory_logical_bytes,
        "memory_value_bytes": s.memory_value_bytes,
        "memory_entries": s.memory_entries,
        "admission_tracked": s.admission_tracked,
        "reinsert_candidates": s.reinsert_candidates,
        "reinserted": s.reinserted,
        "reinserted_bytes": s.reinserted_bytes,
        "reinsert_over_budget": s.reinsert_over_budget,
        "reinsert_skipped": s.reinsert_skipped,
        "corrupt_reads": s.corrupt_reads,
        "collision_reads": s.collision_reads,
        "false_evictions": s.false_evictions,
        "index_bytes": s.index_bytes,
        "rotations": s.rotations,
        "volumes_evicted": s.volumes_evicted,
        "evicted_entries": s.evicted_entries,
        "hints_written": s.hints_written,
        "write_failures": s.write_failures,
        "sync_failures": s.sync_failures,
        "read_failures": s.read_failures,
        "punched_bytes": s.punched_bytes,
        "allocated_bytes": s.allocated_bytes,
        "degraded": s.degraded,
        "downtime_ms": s.recovery.down_ms,
        "started_empty": s.recovery.started_empty,
        "downtime_flushes": s.downtime_flushes,
        "cas_refused": s.cas_refused,
        "compression": serde_json::json!({
            "codec": app.settings.compression.codec.map_or("none", |c| c.name()),
            "level": app.settings.compression.codec.map(|_| app.settings.compression.level),
            "min_size": app.settings.compression.min_size,
            "coded_puts": s.coded_puts,
            "coded_logical_bytes": s.coded_logical_bytes,
            "coded_stored_bytes": s.coded_stored_bytes,
            "raw_probed": s.raw_probed,
            "raw_no_gain": s.raw_no_gain,
            "decode_failures": s.decode_failures,
            "dictionary": app.settings.compression.dictionary.map(|d| serde_json::json!({
                "depth": d.depth,
                "sample_bytes": d.sample_bytes,
                "max_value": d.max_value,
            })),
            "dictionaries": dictionaries(&s.dictionaries),
            "held": held(&s.held),
        }),
        "cluster": app.settings.cluster.as_ref().map(|c| serde_json::json!({
            "self": c.ring.nodes()[c.me].name,
            "hash": c.ring.placement().name(),
            "nodes": c.ring.nodes().iter().map(|n| serde_json::json!({"name": n.name, "weight": n.weight})).collect::<Vec<_>>(),
            "foreign_ttl_seconds": c.foreign_ttl.as_secs_f64(),
            "share": c.ring.share(c.me),
            "foreign_writes": s.capped_writes,
        })),
        "memcache": memcache_stats(crate::memcache::counters()),
        "doors": doors(app),
        "budget": {"used_bytes": budget_used, "capacity_bytes": budget_capacity, "waiting": app.body_budget.waiting()},
        "slow": {"threshold_ms": app.watch.slow.threshold().as_secs_f64() * 1e3, "seen": app.watch.slow.seen()},
        "memory_policy": (app.settings.memory.capacity > 0).then(|| format!("{:?}", app.settings.memory.eviction).to_lowercase()),
        "slots": s.slots.iter().map(|v| serde_json::json!({
            "generation": v.generation,
            "dir": v.dir,
            "bytes": v.bytes,
            "started_ms": v.started_ms,
        })).collect::<Vec<_>>(),
        "refusals": crate::guard::refusals_json(&app.policy),
        "deadline_closes": crate::guard::lates_json(&app.policy),
        "dirs": s.dirs.iter().map(|d| serde_json::json!({
            "path": d.path.display().to_string(),
            "id": d.id,
            "state": d.state.as_str(),
            "volumes": d.volumes,
            "bytes_used": d.bytes_used,
            "free_bytes": d.free_bytes,
        })).collect::<Vec<_>>(),
        "recovery": {
            "volumes": s.recovery.volumes,
            "discarded": s.recovery.discarded,
            "hint_loads": s.recovery.hint_loads,
            "checkpoint_loads": s.recovery.checkpoint_loads,
            "scans": s.recovery.scans,
            "tail_bytes_scanned": s.recovery.tail_bytes_scanned,
            "records": s.recovery.records,
            "skipped": s.recovery.skipped,
            "truncated_bytes": s.recovery.truncated_bytes,
            "millis": s.recovery.millis,
        },
    })
}

/// `part / whole`, 0 when there is no whole.
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The memcached listener's connections, bytes and commands (`{"get": {"hit": 3, …}, …}`).
fn memcache_stats(m: &crate::memcache::Counters) -> serde_json::Value {
    let mut commands = serde_json::Map::new();
    for (command, outcome, n) in m.nonzero() {
        let e = commands.entry(command).or_insert_with(|| serde_json::json!({}));
        e[outcome] = n.into();
    }
    serde_json::json!({
        "curr_connections": m.curr_connections.load(Ordering::Relaxed),
        "total_connections": m.total_connections.load(Ordering::Relaxed),
        "rejected_connections": m.rejected_connections.load(Ordering::Relaxed),
        "bytes_read": m.bytes_read.load(Ordering::Relaxed),
        "bytes_written": m.bytes_written.load(Ordering::Relaxed),
        "commands": commands,
    })
}

/// What the ring holds, by how values are stored, as JSON.
fn held(h: &larder_engine::HeldStats) -> serde_json::Value {
    let t = |t: &larder_engine::Tally| serde_json::json!({"values": t.values, "logical_bytes": t.logical_bytes, "stored_bytes": t.stored_bytes});
    serde_json::json!({
        "raw": t(&h.raw),
        "zstd": t(&h.zstd),
        "zstd_dictionary": t(&h.zstd_dictionary),
        "lz4": t(&h.lz4),
        "volumes_unaccounted": h.volumes_unaccounted,
        "bytes_unaccounted": h.bytes_unaccounted,
    })
}

/// The dictionaries' part of the stats, as JSON.
fn dictionaries(d: &larder_engine::DictionaryStats) -> serde_json::Value {
    serde_json::json!({
        "trained": d.trained,
        "retrains": d.retrains,
        "training_failures": d.training_failures,
        "removed": d.removed,
        "damaged_files": d.damaged_files,
        "each": d.each.iter().map(|x| serde_json::json!({
            "id": x.id,
            "prefix": x.key_prefix,
            "bytes": x.bytes,
            "created_ms": x.created_ms,
            "retired": x.retired,
            "values": x.values,
            "logical_bytes": x.logical_bytes,
            "stored_bytes": x.stored_bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Each door's requests by outcome so far (memcached's from its listener's counters), the
/// same counts the sampler's seconds are differences of.
pub fn door_outcomes(app: &App) -> [(&'static str, [u64; OUTCOMES.len()]); 3] {
    let memcache = {
        let mut o = [0u64; OUTCOMES.len()];
        for (_, outcome, n) in crate::memcache::counters().nonzero() {
            let i = match outcome {
                "hit" => 0,
                "miss" | "not_found" => 1,
                "stored" | "not_stored" | "exists" | "touched" => 2,
                "deleted" => 3,
                "client_error" | "refused" => 4,
                "server_error" | "error" => 5,
                _ => 6,
            };
            o[i] += n;
        }
        o
    };
    let http = |d| app.watch.outcomes(d).unwrap_or_default();
    [("http", http(Door::Http)), ("proxy", http(Door::Proxy)), ("memcache", memcache)]
}

/// The doors' outcomes as JSON, with their sum.
fn doors(app: &App) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, counts) in door_outcomes(app) {
        let mut d = serde_json::Map::new();
        d.insert("requests".into(), counts.iter().sum::<u64>().into());
        for (o, n) in OUTCOMES.iter().zip(counts) {
            d.insert((*o).into(), n.into());
        }
        m.insert(name.into(), d.into());
    }
    m.into()
}
