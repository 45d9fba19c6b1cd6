//! A cluster node's own policy (docs/CLUSTER.md): how long it keeps keys it does not own, and
//! whether it may serve what it held after being down.

use crate::config::Settings;
use std::time::Duration;

/// The cluster's write policy, for the engine: a node with ring awareness keeps the values of
/// keys it does not own (written while their owner was away, or by a client that placed them
/// wrongly) at most `--foreign-ttl`, so that a copy the ring no longer reaches cannot come
/// back, stale, when the ring moves again. Applied by the store to every write and touch, so
/// every door gets it.
pub fn foreign_cap(s: &Settings) -> Option<larder_engine::ExpiryCap> {
    let c = s.cluster.clone()?;
    let (ring, me) = (c.ring, c.me);
    Some(larder_engine::ExpiryCap {
        most: c.foreign_ttl,
        applies: std::sync::Arc::new(move |key| ring.owner(key) != me),
    })
}

/// At start, after recovery: a node down longer than `--max-downtime` (or for a time it
/// cannot know) starts as if `flush_all` had been sent when it stopped, since its router may
/// have given its keys to other nodes meanwhile. Returns whether it flushed.
pub fn rejoin(store: &larder_engine::Store, max_downtime: Option<Duration>) -> larder_engine::Result<bool> {
    let Some(max) = max_downtime else { return Ok(false) };
    let stats = store.stats();
    let down = stats.recovery.down_ms;
    if down.is_some_and(|d| d <= max.as_millis() as u64) || stats.keys == 0 {
        return Ok(false);
    }
    store.flush_all(Duration::ZERO)?;
    let down = down.map_or("an unknown time (no alive stamp)".to_string(), |d| format!("{:.1} s", d as f64 / 1000.0));
    tracing::warn!(
        target: "larder::lifecycle",
        keys = stats.keys,
        "down for {down}, more than --max-downtime {:.1} s: started empty, as if flush_all had been sent when it stopped",
        max.as_secs_f64()
    );
    Ok(true)
}
