//! Store time: the wall clock as the engine reads it, and the sequences of new volumes.
//!
//! In builds with the fault layer the clock can be set off (see `faults::skew_clock`), so
//! that tests can step it back or forward; the skew lives here so that nothing below the
//! fault layer has to reach up to it.

use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(feature = "faults")]
static SKEW_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets the clock off by `ms` (fault-layer builds only).
#[cfg(feature = "faults")]
pub(crate) fn set_skew(ms: i64) {
    SKEW_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// Milliseconds since the Unix epoch (in builds with the fault layer, set off by
/// the fault layer's `skew_clock`).
pub fn now_ms() -> u64 {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    #[cfg(feature = "faults")]
    let ms = ms.saturating_add_signed(SKEW_MS.load(std::sync::atomic::Ordering::Relaxed));
    ms
}

/// The sequence of a volume started now: at least `next`, and above that of every volume
/// started earlier in wall-clock time (milliseconds × 1024), so that the volumes written while
/// a data directory was missing sort after everything it holds when it returns, even though
/// this run could not know its highest sequence.
pub(crate) fn sequence_after(next: u64) -> u64 {
    next.max(now_ms() << 10)
}
