//! A door's request times as a histogram of atomics: quarter octaves of microseconds from
//! 1 µs to about 17 s, one relaxed add a request. The operator's view takes the difference
//! of two snapshots a second apart and reads that second's percentiles from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets: 0 under 1 µs, then four a power of two up to 2^24 µs, the last open-ended.
pub const BUCKETS: usize = 98;

/// The bucket of a time in microseconds.
pub fn bucket(us: u64) -> usize {
    if us == 0 {
        return 0;
    }
    let octave = 63 - us.leading_zeros() as usize;
    // The two bits after the leading one: which quarter of the octave.
    let quarter = if octave >= 2 { (us >> (octave - 2)) as usize & 3 } else { ((us << (2 - octave)) & 3) as usize };
    (1 + octave * 4 + quarter).min(BUCKETS - 1)
}

/// The end of a bucket (its times are below it), in microseconds rounded up: what a
/// percentile in it is reported as.
pub fn upper_us(b: usize) -> u64 {
    if b == 0 {
        return 1;
    }
    let (octave, quarter) = ((b - 1) / 4, (b - 1) % 4);
    ((1u64 << octave) * (4 + quarter as u64 + 1)).div_ceil(4)
}

/// A histogram of request times.
pub struct Latency {
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Latency {
    fn default() -> Latency {
        Latency { buckets: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl Latency {
    /// Counts a request that took `d`.
    #[inline]
    pub fn record(&self, d: Duration) {
        self.buckets[bucket(d.as_micros() as u64)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }
}

/// The `q` quantile (0 to 1) of counts, in microseconds (a bucket's upper bound); 0 for none.
pub fn quantile(counts: &[u64; BUCKETS], q: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (b, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= want {
            return upper_us(b);
        }
    }
    upper_us(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_times() {
        for us in [1u64, 2, 3, 5, 7, 8, 100, 999, 1000, 12_345, 1 << 20, 5_000_000] {
            let b = bucket(us);
            assert!(upper_us(b) >= us, "{us} µs in bucket {b} bounded by {}", upper_us(b));
            assert!(b == 1 || upper_us(b - 1) <= us, "{us} µs: bucket {b} is not the first that holds it");
            // A quarter octave: the bound is within 25% of the time.
            assert!(upper_us(b) as f64 <= us as f64 * 1.25 + 1.0);
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_second() {
        let l = Latency::default();
        (0..990).for_each(|_| l.record(Duration::from_micros(100)));
        (0..10).for_each(|_| l.record(Duration::from_millis(50)));
        let c = l.snapshot();
        assert_eq!(quantile(&c, 0.5), upper_us(bucket(100)));
        assert_eq!(quantile(&c, 0.99), upper_us(bucket(100)));
        assert_eq!(quantile(&c, 0.999), upper_us(bucket(50_000)));
        assert_eq!(quantile(&[0; BUCKETS], 0.5), 0);
    }
}
