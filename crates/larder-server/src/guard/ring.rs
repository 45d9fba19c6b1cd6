//! A cluster node's own policy (docs/CLUSTER.md): how long it keeps keys it does not own.
//! (Whether it may serve what it held after being down, `--max-downtime`, the store decides
//! as it opens, before it stamps itself alive: `StoreConfig::max_downtime`.)

use crate::config::Settings;

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
