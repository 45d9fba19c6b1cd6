//! Run results: counts and an HDR latency histogram, printed for people and as JSON.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
}

/// Counts of one worker or of a whole run.
pub struct Tally {
    /// Requests completed (errors included).
    pub requests: u64,
    /// Requests answered with an unexpected status, a wrong body length, or an I/O error.
    pub errors: u64,
    /// Body bytes sent and received.
    pub bytes: u64,
    /// Latency of every completed request, in microseconds.
    pub hist: Histogram<u64>,
    /// Failures by cause ("GET status 404", "GET wrong body length", "PUT io: …").
    pub failures: std::collections::BTreeMap<String, u64>,
    /// GETs answered 404 where misses are allowed (not errors).
    pub misses: u64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            requests: 0,
            errors: 0,
            bytes: 0,
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
            failures: Default::default(),
            misses: 0,
        }
    }
}

impl Tally {
    /// Records one request that took `d`.
    pub fn record(&mut self, d: Duration, ok: bool, bytes: usize) {
        self.requests += 1;
        self.errors += u64::from(!ok);
        self.bytes += bytes as u64;
        let _ = self.hist.record((d.as_micros() as u64).clamp(1, 60_000_000));
    }

    /// Notes why a request failed (call along with `record(.., false, ..)`).
    pub fn failure(&mut self, cause: String) {
        *self.failures.entry(cause).or_default() += 1;
    }

    /// Adds another worker's counts.
    pub fn merge(&mut self, other: &Tally) {
        for (k, v) in &other.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
        self.requests += other.requests;
        self.errors += other.errors;
        self.misses += other.misses;
        self.bytes += other.bytes;
        let _ = self.hist.add(&other.hist);
    }

    /// The run's summary over `elapsed`.
    pub fn summary(&self, label: &str, elapsed: Duration) -> Summary {
        let q = |p: f64| self.hist.value_at_quantile(p);
        let secs = elapsed.as_secs_f64().max(1e-9);
        Summary {
            label: label.to_string(),
            seconds: secs,
            requests: self.requests,
            errors: self.errors,
            error_ratio: if self.requests == 0 { 0.0 } else { self.errors as f64 / self.requests as f64 },
            req_per_s: self.requests as f64 / secs,
            mb_per_s: self.bytes as f64 / secs / 1e6,
            latency: Latency {
                p50_us: q(0.5),
                p90_us: q(0.9),
                p99_us: q(0.99),
                p999_us: q(0.999),
                max_us: self.hist.max(),
            },
            failures: self.failures.clone(),
            misses: self.misses,
        }
    }
}

/// What a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What ran.
    pub label: String,
    /// Wall time of the measured part.
    pub seconds: f64,
    /// Requests completed.
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
    /// errors / requests.
    pub error_ratio: f64,
    /// Throughput.
    pub req_per_s: f64,
    /// Body bytes per second (both directions), in MB.
    pub mb_per_s: f64,
    /// Latency percentiles.
    pub latency: Latency,
    /// Failures by cause.
    pub failures: std::collections::BTreeMap<String, u64>,
    /// GETs answered 404 with `--allow-misses`.
    pub misses: u64,
}

impl Summary {
    /// A two-line human summary.
    pub fn print(&self) {
        let l = &self.latency;
        println!(
            "{}: {} requests in {:.1} s = {:.0} req/s, {:.1} MB/s, errors {} ({:.3}%)",
            self.label,
            self.requests,
            self.seconds,
            self.req_per_s,
            self.mb_per_s,
            self.errors,
            self.error_ratio * 100.0
        );
        println!(
            "  latency us: p50 {} p90 {} p99 {} p99.9 {} max {}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        );
        if !self.failures.is_empty() {
            println!("  failures: {:?}", self.failures);
        }
        if self.misses > 0 {
            println!("  misses (404, allowed): {}", self.misses);
        }
    }
}
