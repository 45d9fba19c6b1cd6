//! Prometheus metrics (`/_larder/metrics`) through the `metrics` facade and its Prometheus
//! exporter.
//!
//! Per request, the server records into handles registered once (a counter per method and
//! status, a latency histogram per method), so the hot path does no name lookup or
//! allocation. The engine's counters and gauges are copied in when scraped, from the same
//! `Stats` that `/_larder/stats` reads, so the two never disagree. The engine records its
//! fsync latency into the same recorder. Requests to `/_larder/` itself are not counted.

use hyper::Method;
use larder_engine::{DirState, Stats};
use metrics::{counter, gauge, Counter, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Upper bounds of the request latency buckets, in seconds: 50 µs (a memory hit) to 10 s.
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the fdatasync latency buckets, in seconds: 100 µs (a fast SSD) to 10 s.
const FSYNC_BUCKETS: [f64; 13] =
    [0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0];

/// The methods counted apart; anything else is `OTHER`.
const METHODS: [&str; 5] = ["GET", "HEAD", "PUT", "DELETE", "OTHER"];
/// Statuses 100 to 599.
const STATUSES: usize = 500;

fn method_index(m: &Method) -> usize {
    match *m {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        _ => 4,
    }
}

/// The server's metrics and the exporter that renders them.
pub struct Metrics {
    handle: PrometheusHandle,
    latency: [Histogram; METHODS.len()],
    /// Registered on first use: most (method, status) pairs never occur.
    requests: Box<[OnceLock<Counter>]>,
    /// Bytes of values received in PUT bodies.
    pub bytes_in: AtomicU64,
    /// Bytes of response bodies sent (HEAD sends none).
    pub bytes_out: AtomicU64,
    /// HTTP connections larder's own loop handed to hyper (`conn::native`).
    pub handovers: AtomicU64,
}

impl Metrics {
    /// Installs the process-wide recorder (once: a second call is an error).
    pub fn install() -> Result<Metrics, String> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full("larder_http_request_duration_seconds".into()), &LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full("larder_fsync_duration_seconds".into()), &FSYNC_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full("larder_origin_duration_seconds".into()), &LATENCY_BUCKETS)
            })
            .map_err(|e| format!("configuring metrics: {e}"))?
            .install_recorder()
            .map_err(|e| format!("installing the metrics recorder: {e}"))?;
        describe();
        let latency = METHODS.map(|m| metrics::histogram!("larder_http_request_duration_seconds", "method" => m));
        let requests = (0..METHODS.len() * STATUSES).map(|_| OnceLock::new()).collect();
        Ok(Metrics {
            handle,
            latency,
            requests,
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            handovers: AtomicU64::new(0),
        })
    }

    /// Counts one answered request.
    pub fn request(&self, method: &Method, status: u16, elapsed: Duration, body_bytes: u64) {
        let m = method_index(method);
        self.latency[m].record(elapsed.as_secs_f64());
        let s = (status as usize).clamp(100, 599) - 100;
        self.requests[m * STATUSES + s]
            .get_or_init(
                || counter!("larder_http_requests_total", "method" => METHODS[m], "status" => (s + 100).to_string()),
            )
            .increment(1);
        if body_bytes > 0 {
            self.bytes_out.fetch_add(body_bytes, Ordering::Relaxed);
        }
    }

    /// Drains recorded histogram samples into their buckets; call every few seconds so that
    /// samples do not pile up between scrapes.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The Prometheus text exposition, with the engine's figures as of now (`None` while
    /// recovering).
    pub fn render(&self, stats: Option<&Stats>) -> String {
        gauge!("larder_ready").set(if stats.is_some() { 1.0 } else { 0.0 });
        counter!("larder_http_received_bytes_total").absolute(self.bytes_in.load(Ordering::Relaxed));
        counter!("larder_http_sent_bytes_total").absolute(self.bytes_out.load(Ordering::Relaxed));
        counter!("larder_http_handovers_total").absolute(self.handovers.load(Ordering::Relaxed));
        if let Some(s) = stats {
            engine(s);
        }
        self.handle.render()
    }
}

/// Copies the engine's counters and gauges into the recorder.
fn engine(s: &Stats) {
    counter!("larder_cache_hits_total", "tier" => "memc").absolute(s.memory_hits);
    counter!("larder_cache_hits_total", "tier" => "disk").absolute(s.hits.saturating_sub(s.memory_hits));
    counter!("larder_cache_misses_total").absolute(s.misses);
    counter!("larder_puts_total").absolute(s.puts);
    counter!("larder_deletes_total").absolute(s.deletes);
    gauge!("larder_index_keys").set(s.keys as f64);
    gauge!("larder_disk_used_bytes").set(s.bytes_used as f64);
    gauge!("larder_disk_capacity_bytes").set(s.capacity_bytes as f64);
    gauge!("larder_volumes").set(s.volumes as f64);
    gauge!("larder_active_volume").set(s.active_volume as f64);
    counter!("larder_volumes_sealed_total").absolute(s.rotations);
    counter!("larder_volumes_evicted_total").absolute(s.volumes_evicted);
    for d in &s.dirs {
        let dir = d.path.display().to_string();
        gauge!("larder_dir_up", "dir" => dir.clone()).set(if d.state == DirState::Ok { 1.0 } else { 0.0 });
        gauge!("larder_dir_used_bytes", "dir" => dir.clone()).set(d.bytes_used as f64);
        gauge!("larder_dir_free_bytes", "dir" => dir).set(d.free_bytes as f64);
    }
    counter!("larder_evicted_entries_total").absolute(s.evicted_entries);
    counter!("larder_reinserted_total").absolute(s.reinserted);
    counter!("larder_reinserted_bytes_total").absolute(s.reinserted_bytes);
    counter!("larder_checksum_failures_total").absolute(s.corrupt_reads);
    counter!("larder_index_collision_reads_total").absolute(s.collision_reads);
    counter!("larder_index_false_evictions_total").absolute(s.false_evictions);
    gauge!("larder_index_bytes").set(s.index_bytes as f64);
    counter!("larder_disk_reads_total").absolute(s.disk_reads);
    counter!("larder_coalesced_reads_total").absolute(s.coalesced_reads);
    counter!("larder_promotions_total").absolute(s.promotions);
    gauge!("larder_memory_bytes").set(s.memory_bytes as f64);
    gauge!("larder_memory_logical_bytes").set(s.memory_logical_bytes as f64);
    gauge!("larder_memory_value_bytes").set(s.memory_value_bytes as f64);
    gauge!("larder_memory_entries").set(s.memory_entries as f64);
    gauge!("larder_memory_capacity_bytes").set(s.memory_capacity as f64);
    counter!("larder_hint_files_written_total").absolute(s.hints_written);
    counter!("larder_write_failures_total").absolute(s.write_failures);
    counter!("larder_sync_failures_total").absolute(s.sync_failures);
    counter!("larder_read_failures_total").absolute(s.read_failures);
    counter!("larder_punched_bytes_total").absolute(s.punched_bytes);
    gauge!("larder_allocated_bytes").set(s.allocated_bytes as f64);
    gauge!("larder_recovery_duration_seconds").set(s.recovery.millis as f64 / 1000.0);
    counter!("larder_foreign_writes_total").absolute(s.capped_writes);
    counter!("larder_cas_refused_total").absolute(s.cas_refused);
    counter!("larder_values_stored_total", "coding" => "coded").absolute(s.coded_puts);
    counter!("larder_values_stored_total", "coding" => "raw_probed").absolute(s.raw_probed);
    counter!("larder_values_stored_total", "coding" => "raw_no_gain").absolute(s.raw_no_gain);
    counter!("larder_coded_logical_bytes_total").absolute(s.coded_logical_bytes);
    counter!("larder_coded_stored_bytes_total").absolute(s.coded_stored_bytes);
    counter!("larder_decode_failures_total").absolute(s.decode_failures);
    let h = &s.held;
    for (coding, t) in [("raw", &h.raw), ("zstd", &h.zstd), ("zstd_dictionary", &h.zstd_dictionary), ("lz4", &h.lz4)] {
        gauge!("larder_held_values", "coding" => coding).set(t.values as f64);
        gauge!("larder_held_logical_bytes", "coding" => coding).set(t.logical_bytes as f64);
        gauge!("larder_held_stored_bytes", "coding" => coding).set(t.stored_bytes as f64);
    }
    gauge!("larder_held_unaccounted_bytes").set(h.bytes_unaccounted as f64);
    let d = &s.dictionaries;
    gauge!("larder_dictionaries", "state" => "active").set(d.each.iter().filter(|x| !x.retired).count() as f64);
    gauge!("larder_dictionaries", "state" => "retired").set(d.each.iter().filter(|x| x.retired).count() as f64);
    counter!("larder_dictionaries_trained_total").absolute(d.trained);
    counter!("larder_dictionary_retrains_total").absolute(d.retrains);
    counter!("larder_dictionaries_removed_total").absolute(d.removed);
    counter!("larder_dictionary_training_failures_total").absolute(d.training_failures);
    gauge!("larder_dictionary_files_damaged").set(d.damaged_files as f64);
    // Since open, summed over the dictionaries (a prefix's label would grow without bound).
    let sum = |f: fn(&larder_engine::DictionaryInfo) -> u64| d.each.iter().map(f).sum::<u64>();
    gauge!("larder_dictionary_coded_values").set(sum(|x| x.values) as f64);
    gauge!("larder_dictionary_coded_logical_bytes").set(sum(|x| x.logical_bytes) as f64);
    gauge!("larder_dictionary_coded_stored_bytes").set(sum(|x| x.stored_bytes) as f64);
    gauge!("larder_started_empty").set(if s.recovery.started_empty { 1.0 } else { 0.0 });
    counter!("larder_downtime_flushes_total").absolute(s.downtime_flushes);
    if let Some(ms) = s.recovery.down_ms {
        gauge!("larder_downtime_seconds").set(ms as f64 / 1000.0);
    }
}

fn describe() {
    use metrics::{describe_counter as c, describe_gauge as g, describe_histogram as h};
    h!("larder_http_request_duration_seconds", Unit::Seconds, "Time from request head to response, by method.");
    c!("larder_http_requests_total", "Requests answered, by method and status.");
    c!("larder_http_received_bytes_total", Unit::Bytes, "Bytes of values received in PUT bodies.");
    c!("larder_http_sent_bytes_total", Unit::Bytes, "Bytes of response bodies sent.");
    c!(
        "larder_http_handovers_total",
        "HTTP connections larder's own loop handed to hyper, at a request it does not take."
    );
    c!("larder_memcache_commands_total", "memcached commands by outcome (a get counts once per key), both protocols.");
    c!("larder_refusals_total", "Requests and commands the access policy refused, by door and reason.");
    c!(
        "larder_deadline_closes_total",
        "Clients closed for missing a deadline, by door and unit of input (head, body)."
    );
    g!("larder_memcache_connections", "Open memcached connections.");
    c!("larder_memcache_received_bytes_total", Unit::Bytes, "Bytes read from memcached clients.");
    c!("larder_memcache_sent_bytes_total", Unit::Bytes, "Bytes written to memcached clients.");
    h!("larder_fsync_duration_seconds", Unit::Seconds, "fdatasync of one volume file.");
    h!("larder_origin_duration_seconds", Unit::Seconds, "Read-through mode: time to the origin's response head.");
    c!(
        "larder_proxy_requests_total",
        "Read-through mode: GET and HEAD by X-Cache (hit, miss, revalidated, stale, pass)."
    );
    c!("larder_proxy_revalidations_total", "Read-through mode: revalidations by the origin's answer (304, 200).");
    c!("larder_proxy_coalesced_total", "Read-through mode: requests that shared another's origin fetch.");
    c!("larder_proxy_stored_total", "Read-through mode: responses stored.");
    c!("larder_proxy_not_stored_total", "Read-through mode: responses passed on without being stored.");
    c!("larder_proxy_origin_errors_total", "Read-through mode: origin requests that failed or broke off.");
    c!("larder_proxy_invalidations_total", "Read-through mode: stored responses dropped after unsafe methods.");
    c!("larder_proxy_purges_total", "Read-through mode: stored responses purged through /_larder/purge.");
    c!("larder_cache_hits_total", "Value reads (GET) that found a value, by the tier that answered (memc, disk).");
    c!("larder_cache_misses_total", "Value reads (GET) that found nothing.");
    c!("larder_cas_refused_total", "--verify-cas: writes refused because the value did not hash to its key.");
    c!(
        "larder_values_stored_total",
        "With --compression: values stored coded, or raw because the probe took them for compressed data (raw_probed) or coding saved under an eighth (raw_no_gain)."
    );
    c!("larder_coded_logical_bytes_total", Unit::Bytes, "Bytes of the values stored coded, as sent.");
    c!("larder_coded_stored_bytes_total", Unit::Bytes, "Bytes those values were stored in.");
    g!("larder_held_values", "Values in the ring's volumes written since start (replaced ones too, until the ring reuses their volume), by how they are stored (coding: raw, zstd, zstd_dictionary, lz4).");
    g!("larder_held_logical_bytes", Unit::Bytes, "Their bytes as sent.");
    g!("larder_held_stored_bytes", Unit::Bytes, "The bytes they take in their records.");
    g!(
        "larder_held_unaccounted_bytes",
        Unit::Bytes,
        "Bytes of records in volumes written before this start (not accounted by coding until the ring reuses them)."
    );
    g!("larder_dictionaries", "--compression-dictionary auto: dictionaries on disk, coding their prefix (active) or kept for records that need them (retired).");
    c!("larder_dictionaries_trained_total", "Dictionaries trained since start.");
    c!(
        "larder_dictionary_retrains_total",
        "Prefixes sampled again because their values compressed markedly worse with their dictionary."
    );
    c!("larder_dictionaries_removed_total", "Retired dictionaries removed once no volume needed them.");
    c!("larder_dictionary_training_failures_total", "Trainings that produced no dictionary.");
    g!("larder_dictionary_files_damaged", "Dictionary files found damaged at start (their values read as misses).");
    g!("larder_dictionary_coded_values", "Values coded with a dictionary since start (of dictionaries still on disk).");
    g!("larder_dictionary_coded_logical_bytes", Unit::Bytes, "Their bytes as sent.");
    g!("larder_dictionary_coded_stored_bytes", Unit::Bytes, "Their bytes as stored.");
    c!(
        "larder_decode_failures_total",
        "Coded values whose checksum held but which did not decode: answered as misses."
    );
    c!(
        "larder_foreign_writes_total",
        "Ring awareness: writes of keys this node does not own, kept at most --foreign-ttl."
    );
    g!("larder_downtime_seconds", Unit::Seconds, "How long the node was down before this start (absent: unknown).");
    g!("larder_started_empty", "1 if the node was down longer than --max-downtime and started as if flushed.");
    c!(
        "larder_downtime_flushes_total",
        "Flushes for --max-downtime: at start, or after the process did not run for that long."
    );
    c!("larder_puts_total", "Values stored.");
    c!("larder_deletes_total", "Keys deleted.");
    g!("larder_index_keys", "Keys in the index.");
    g!("larder_disk_used_bytes", Unit::Bytes, "Bytes of volume files on disk.");
    g!("larder_disk_capacity_bytes", Unit::Bytes, "volume-count x volume-size.");
    g!("larder_volumes", "Volume files that exist.");
    g!("larder_active_volume", "Slot of the volume being written.");
    c!("larder_volumes_sealed_total", "Times the ring moved to the next slot, sealing the volume it left.");
    c!("larder_volumes_evicted_total", "Volumes whose data the ring overwrote.");
    g!("larder_dir_up", "1 if the data directory serves and takes new volumes; 0 if failed or missing.");
    g!("larder_dir_used_bytes", "Bytes of larder's volumes in the data directory.");
    g!("larder_dir_free_bytes", "Free bytes on the data directory's filesystem.");
    c!("larder_evicted_entries_total", "Index entries dropped because the ring reused their volume.");
    c!("larder_reinserted_total", "Entries copied forward before the ring overwrote their volume.");
    c!("larder_reinserted_bytes_total", Unit::Bytes, "Bytes of records copied forward.");
    c!("larder_checksum_failures_total", "Reads whose record failed its checksum (answered as misses).");
    c!("larder_index_collision_reads_total", "Disk reads that found another key's record where the index pointed.");
    c!("larder_index_false_evictions_total", "Keys whose index entry a key the index could not tell apart took.");
    g!("larder_index_bytes", Unit::Bytes, "Bytes the index's tables hold.");
    c!("larder_disk_reads_total", "Record reads from volume files made for GETs.");
    c!("larder_coalesced_reads_total", "GETs that shared another GET's disk read.");
    c!("larder_promotions_total", "Values copied into the memory tier after disk reads.");
    g!("larder_memory_bytes", Unit::Bytes, "Bytes the memory tier holds.");
    g!("larder_memory_logical_bytes", Unit::Bytes, "The bytes of the values the memory tier holds, as sent.");
    g!("larder_memory_value_bytes", Unit::Bytes, "The bytes those values take there (coded ones held coded).");
    g!("larder_memory_entries", "Entries in the memory tier.");
    g!("larder_memory_capacity_bytes", Unit::Bytes, "Capacity of the memory tier.");
    c!("larder_hint_files_written_total", "Hint files written: of sealed volumes, and checkpoints at stop.");
    c!("larder_write_failures_total", "Records whose write failed.");
    c!("larder_sync_failures_total", "fdatasync calls that failed.");
    c!("larder_read_failures_total", "Reads that failed with an I/O error (answered 503).");
    c!("larder_punched_bytes_total", Unit::Bytes, "Bytes of dead large values' chunks given back to the file system.");
    g!(
        "larder_allocated_bytes",
        Unit::Bytes,
        "Bytes of disk the volume files occupy (less than used where holes were punched)."
    );
    g!("larder_ready", "1 when serving, 0 while recovering.");
    g!("larder_recovery_duration_seconds", Unit::Seconds, "Wall time of the last recovery.");
}
