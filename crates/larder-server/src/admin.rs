//! The endpoints under `/_larder/`: health (with the recovery's progress while the store
//! opens), Prometheus metrics, the JSON stats, and the fault injection of test builds.

use crate::app::App;
use crate::reply::{method_not_allowed, text, text_owned, Body, Resp};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::RecoveryProgress;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `/_larder/faults`, in builds with the engine's fault layer only (tests): POST a rule such
/// as `write nospace` to make the data directory's I/O fail (`dir=N write eio` for the Nth
/// `--data-dir`, from 0), or `power-cut` (with the server started with `LARDER_FAULTS=track`)
/// to simulate a power loss; DELETE clears faults; GET says how many operations a `delay`
/// rule holds at the moment (`delayed N`). Off unless the environment variable
/// `LARDER_FAULTS` is set too.
pub async fn faults(app: &App, req: Request<Incoming>) -> Resp {
    use larder_engine::faults;
    if !app.faults {
        return text(StatusCode::NOT_FOUND, "no such admin endpoint\n");
    }
    let dirs = &app.settings.data_dir;
    match *req.method() {
        Method::POST => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n")),
            };
            let spec = String::from_utf8_lossy(&body);
            if spec.trim() == "power-cut" {
                // Undo every write not yet synced; from now on all I/O on the directories
                // fails. It waits for every I/O call in flight: not on an async worker.
                let dirs = dirs.clone();
                let cut = tokio::task::spawn_blocking(move || {
                    dirs.iter().try_fold(faults::CutReport::default(), |sum, d| {
                        faults::power_cut(d)
                            .map(|r| faults::CutReport { changes: sum.changes + r.changes, files: sum.files + r.files })
                    })
                })
                .await;
                return match cut.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))) {
                    Ok(r) => text_owned(StatusCode::OK, format!("undid {} changes in {} files\n", r.changes, r.files)),
                    Err(e) => text_owned(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                };
            }
            let (dir, spec) = match spec.trim().strip_prefix("dir=").map(|r| r.split_once(' ').unwrap_or((r, ""))) {
                Some((n, rest)) => match n.parse::<usize>().ok().and_then(|n| dirs.get(n)) {
                    Some(d) => (d, rest),
                    None => return text_owned(StatusCode::BAD_REQUEST, format!("no data directory number {n}\n")),
                },
                None => (&dirs[0], spec.trim()),
            };
            match faults::Rule::parse(spec).map(|r| faults::inject(dir, r)) {
                Ok(Ok(())) => text(StatusCode::OK, "injected\n"),
                Ok(Err(e)) => text_owned(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                Err(e) => text_owned(StatusCode::BAD_REQUEST, format!("{e}\n")),
            }
        }
        Method::DELETE => {
            dirs.iter().for_each(|d| faults::clear(d));
            text(StatusCode::OK, "cleared\n")
        }
        // How many operations a delay rule holds right now: a test waits for a read to be in
        // the air rather than sleeping and hoping.
        Method::GET => text_owned(StatusCode::OK, format!("delayed {}\n", faults::delayed())),
        _ => method_not_allowed("GET, POST, DELETE"),
    }
}

/// `part / whole`, 0 when there is no whole.
fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The store's figures, gathered on the blocking pool: they ask the file system for free
/// space, which a failing disk can stall.
async fn stats(app: &Arc<App>) -> Option<larder_engine::Stats> {
    app.store.get()?;
    let app = app.clone();
    tokio::task::spawn_blocking(move || app.store.get().map(|s| s.stats())).await.ok().flatten()
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

/// The other admin endpoints, all read-only: `health` (open to all, see the routing),
/// `metrics` and `stats`.
pub async fn endpoint(app: &Arc<App>, method: &Method, what: &[u8]) -> Resp {
    match *method {
        Method::GET | Method::HEAD => {}
        Method::PUT | Method::DELETE => return text(StatusCode::BAD_REQUEST, "keys under _larder/ are reserved\n"),
        _ => return method_not_allowed("GET, HEAD"),
    }
    match what {
        b"health" => match app.store.get() {
            _ if app.stopping() => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
            Some(_) => text(StatusCode::OK, "ok\n"),
            None => text_owned(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("recovering: {}\n", recovery_status(&app.progress, app.started.elapsed())),
            ),
        },
        b"metrics" => {
            let stats = stats(app).await;
            if let Some(p) = crate::proxy::state() {
                crate::proxy::render_metrics(&p.counters);
            }
            crate::guard::render_metrics(&app.policy);
            crate::memcache::render_metrics();
            let text = app.metrics.render(stats.as_ref());
            let mut r = Response::new(Body::full(Bytes::from(text)));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            r
        }
        b"stats" => {
            let Some(s) = stats(app).await else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n");
            };
            let (bytes_in, bytes_out) =
                (app.metrics.bytes_in.load(Ordering::Relaxed), app.metrics.bytes_out.load(Ordering::Relaxed));
            let body = serde_json::json!({
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
                    "foreign_writes": s.capped_writes,
                })),
                "memcache": memcache_stats(crate::memcache::counters()),
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
            });
            let mut r = Response::new(Body::full(Bytes::from(body.to_string())));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        _ => text(StatusCode::NOT_FOUND, "no such admin endpoint\n"),
    }
}

/// `POST /_larder/flush[?delay=SECONDS]`: memcached's `flush_all` for HTTP clients and for
/// `larder flush`: every value stored before now (or before the delay's end, from then on)
/// reads as absent. The caller has been admitted for `Permission::Flush`.
pub async fn flush(app: &Arc<App>, method: &Method, query: Option<&str>) -> Resp {
    if *method != Method::POST {
        return method_not_allowed("POST");
    }
    if app.store.get().is_none() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n");
    }
    let delay = match query.unwrap_or("").split('&').find_map(|p| p.strip_prefix("delay=")) {
        None => 0,
        Some(d) => match d.parse::<u64>() {
            Ok(d) if d <= 30 * 86_400 => d,
            _ => return text(StatusCode::BAD_REQUEST, "delay is a number of seconds, at most 30 days\n"),
        },
    };
    match crate::storeio::blocking(app, move |s| s.flush_all(Duration::from_secs(delay))).await {
        Ok(()) => text(StatusCode::OK, "flushed\n"),
        Err(e) => {
            tracing::error!(error = %e, "flush failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "flush failed: the store could not save it\n")
        }
    }
}

/// One line on a recovery in progress: volumes and records done, share of the bytes read and
/// the time left at the rate so far.
pub fn recovery_status(p: &RecoveryProgress, elapsed: Duration) -> String {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (done, total) = (load(&p.bytes_done), load(&p.bytes_total));
    let mut line = format!(
        "{}/{} volumes, {} records, {:.0}% of {} MiB read",
        load(&p.volumes_done),
        load(&p.volumes_total),
        load(&p.records),
        if total == 0 { 0.0 } else { done as f64 * 100.0 / total as f64 },
        total >> 20
    );
    if done > 0 && total > done {
        let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
        line.push_str(&format!(", about {left:.0} s left"));
    }
    line
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_status_reports_share_and_time_left() {
        let p = RecoveryProgress::default();
        p.volumes_total.store(4, Ordering::Relaxed);
        p.volumes_done.store(1, Ordering::Relaxed);
        p.bytes_total.store(400 << 20, Ordering::Relaxed);
        p.bytes_done.store(100 << 20, Ordering::Relaxed);
        p.records.store(123_456, Ordering::Relaxed);
        // A quarter read in 2 s: three quarters left take 6 s more at that rate.
        assert_eq!(
            recovery_status(&p, Duration::from_secs(2)),
            "1/4 volumes, 123456 records, 25% of 400 MiB read, about 6 s left"
        );
        assert_eq!(
            recovery_status(&RecoveryProgress::default(), Duration::ZERO),
            "0/0 volumes, 0 records, 0% of 0 MiB read"
        );
    }
}
