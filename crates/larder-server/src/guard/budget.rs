//! The memory clients make the server hold, charged to one budget (`--max-body-memory`) as
//! the bytes arrive and given back when done, the same way on every door.
//!
//! A body is charged in two steps (see [`PROVEN`]): what arrives, without waiting, until it has
//! shown it is really sending; then room for the whole of it, waited for in order.
//!
//! Two pools share the budget. *Bodies* (HTTP request bodies, memcached data blocks, values
//! being sent) get three quarters and wait for room: backpressure, never an error for load.
//! *Heads* (command lines and binary headers beyond a connection's fixed allowance: a long
//! `get k k k …`) get a quarter and never wait: past it the connection is refused, as
//! memcached answers `SERVER_ERROR out of memory reading request`. So clients that stall with
//! half-sent lines can never take the room bodies need, and a body waits only behind bytes
//! that really arrived, never behind a length a client merely declared.
//!
//! Counted in KiB, the semaphores' unit, so that any size fits their permit counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget's two pools.
pub struct Budget {
    bodies: Pool,
    heads: Pool,
}

/// Requests waiting for room, for the operator's view (one count for every pool).
static WAITING: AtomicU64 = AtomicU64::new(0);

/// Counts a wait for room until dropped, and times it as the request's budget wait.
struct Waiting(#[allow(dead_code)] larder_engine::trace::Open);

impl Waiting {
    fn new() -> Waiting {
        WAITING.fetch_add(1, Ordering::Relaxed);
        Waiting(larder_engine::trace::span(larder_engine::trace::Step::Budget))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Pool {
    room: Arc<Semaphore>,
    kib: u32,
}

impl Pool {
    fn new(kib: u32) -> Pool {
        let kib = kib.max(1);
        Pool { room: Arc::new(Semaphore::new(kib as usize)), kib }
    }
}

/// How much of a body must have arrived before its declared length is reserved. Until then
/// what arrives is charged without waiting: a client that trickles holds only what it sent,
/// and never queues ahead of others for a length it merely declared. Past it, or when the
/// room is not there, the body waits (in order) for room for all of it, holding nothing
/// meanwhile but the few KiB it read: how many bodies are half in stays bounded.
pub const PROVEN: u64 = 16 << 10;

/// Bytes of a connection's input buffer that are never charged: what every connection holds
/// anyway (part of the fixed allowance per connection).
pub const FREE_INPUT: u64 = 32 << 10;

impl Budget {
    /// A budget of `bytes` (at least 2 KiB).
    pub fn new(bytes: u64) -> Budget {
        let kib = bytes.div_ceil(1024).clamp(2, u32::MAX as u64) as u32;
        let heads = (kib / 4).max(1);
        Budget { bodies: Pool::new(kib - heads), heads: Pool::new(heads) }
    }

    /// Waits for room for `bytes` of a value being sent (pieces of a large value): exactly that,
    /// no read buffer. A size larger than the pool waits until it has the pool to itself.
    pub async fn reserve_exact(&self, bytes: u64) -> OwnedSemaphorePermit {
        let kib = bytes.div_ceil(1024).min(self.bodies.kib as u64) as u32;
        if let Ok(p) = self.bodies.room.clone().try_acquire_many_owned(kib) {
            return p;
        }
        let _w = Waiting::new();
        self.bodies.room.clone().acquire_many_owned(kib).await.expect("the budget is never closed")
    }

    /// Bytes of the bodies' pool in use, and its size.
    pub fn bodies_used(&self) -> (u64, u64) {
        let kib = self.bodies.kib as u64;
        ((kib - (self.bodies.room.available_permits() as u64).min(kib)) << 10, kib << 10)
    }

    /// Requests waiting for room.
    pub fn waiting(&self) -> u64 {
        WAITING.load(Ordering::Relaxed)
    }

    /// A charge on the bodies' pool, empty until it grows with what arrives.
    pub fn body(&self) -> Charge {
        Charge { pool: self.bodies.clone(), held: None }
    }

    /// A charge on the heads' pool.
    pub fn head(&self) -> Charge {
        Charge { pool: self.heads.clone(), held: None }
    }

    /// What a body of `bytes` costs: itself and its share of the connection's read buffer it
    /// passes through (hyper grows it up to about 400 KiB while a large body streams in).
    pub fn with_read_buffer(bytes: u64) -> u64 {
        bytes + bytes.min(400 << 10)
    }
}

/// Room held for one client's bytes, grown as they arrive and given back when dropped.
pub struct Charge {
    pool: Pool,
    held: Option<OwnedSemaphorePermit>,
}

impl Charge {
    fn held_kib(&self) -> u32 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u32)
    }

    /// KiB for `bytes`, at most the whole pool (a larger need waits for the pool to itself).
    fn kib_for(&self, bytes: u64) -> u32 {
        bytes.div_ceil(1024).min(self.pool.kib as u64) as u32
    }

    fn add(&mut self, p: OwnedSemaphorePermit) {
        match &mut self.held {
            Some(h) => h.merge(p),
            None => self.held = Some(p),
        }
    }

    /// Grows the charge to cover `bytes`, waiting for room when it is not there. Requests are
    /// served in the order they asked (the semaphore is fair).
    ///
    /// A charge that must wait gives back what it holds and waits for the whole: holders
    /// never wait for one another, so no number of bodies half in can deadlock the budget.
    pub async fn grow_to(&mut self, bytes: u64) {
        if self.try_grow_to(bytes) {
            return;
        }
        let whole = self.kib_for(bytes);
        self.held = None;
        let _w = Waiting::new();
        let p = self.pool.room.clone().acquire_many_owned(whole).await.expect("the budget is never closed");
        self.held = Some(p);
    }

    /// The first step for a unit that has `have` bytes in, costing `bytes`: charged without
    /// waiting while it is not yet [`PROVEN`] and the room is there; `false` when it must now
    /// wait for room for the whole of it ([`Charge::grow_to`]).
    pub fn try_arrived(&mut self, have: u64, bytes: u64) -> bool {
        have < PROVEN && self.try_grow_to(bytes)
    }

    /// Grows the charge to cover `bytes` if the room is there now; `false` if not.
    pub fn try_grow_to(&mut self, bytes: u64) -> bool {
        let more = self.kib_for(bytes).saturating_sub(self.held_kib());
        if more == 0 {
            return true;
        }
        match self.pool.room.clone().try_acquire_many_owned(more) {
            Ok(p) => {
                self.add(p);
                true
            }
            Err(_) => false,
        }
    }

    /// Gives back what is held beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = self.kib_for(bytes) as usize;
        if let Some(h) = &mut self.held {
            if let Some(extra) = h.num_permits().checked_sub(keep).filter(|&n| n > 0) {
                drop(h.split(extra));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn charges_grow_and_shrink_within_their_pool() {
        let b = Budget::new(64 << 10); // 48 KiB of bodies, 16 KiB of heads
        let mut head = b.head();
        assert!(head.try_grow_to(10 << 10));
        assert!(!b.head().try_grow_to(8 << 10), "the heads' pool is full");
        head.shrink_to(4 << 10);
        assert!(b.head().try_grow_to(8 << 10), "given back");
        let mut body = b.body();
        body.grow_to(40 << 10).await;
        let mut other = b.body();
        assert!(!other.try_grow_to(16 << 10), "heads never take the bodies' room, nor the reverse");
        drop(body);
        assert!(other.try_grow_to(48 << 10));
        assert!(other.try_grow_to(1 << 30), "a need larger than the pool is the whole pool");
    }
}
