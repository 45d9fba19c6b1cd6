//! Pause points: named places in the engine where a test can stop one thread, do something
//! else meanwhile, and let it go on. Races that a fast page cache hides become deterministic.
//!
//! A point fires only for the key a test armed it with, so tests running in parallel in one
//! process never catch each other's threads; it catches one arrival and is then spent. With
//! the cargo feature `faults` off (a production build) [`point`] is an empty inline function.

#[cfg(feature = "faults")]
mod on {
    use parking_lot::{Condvar, Mutex};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Default)]
    struct State {
        arrived: bool,
        released: bool,
    }

    #[derive(Default)]
    struct Gate {
        state: Mutex<State>,
        cv: Condvar,
    }

    type Armed = Vec<(&'static str, Box<[u8]>, Arc<Gate>)>;
    static ARMED: Mutex<Armed> = Mutex::new(Vec::new());
    /// Lets every point skip the lock while nothing is armed.
    static ANY: AtomicBool = AtomicBool::new(false);

    /// A thread that reaches point `name` for `key` stops there until released.
    pub fn point(name: &'static str, key: &[u8]) {
        if !ANY.load(Ordering::Acquire) {
            return;
        }
        let gate = {
            let mut armed = ARMED.lock();
            let Some(i) = armed.iter().position(|(n, k, _)| *n == name && &**k == key) else { return };
            let gate = armed.swap_remove(i).2;
            ANY.store(!armed.is_empty(), Ordering::Release);
            gate
        };
        let mut s = gate.state.lock();
        s.arrived = true;
        gate.cv.notify_all();
        while !s.released {
            gate.cv.wait(&mut s);
        }
    }

    /// An armed pause point. Dropping it releases a thread held there (and disarms it).
    pub struct Pause {
        name: &'static str,
        key: Box<[u8]>,
        gate: Arc<Gate>,
    }

    /// Arms point `name` for `key`: the next thread to reach it with that key stops there.
    pub fn arm(name: &'static str, key: &[u8]) -> Pause {
        let gate = Arc::new(Gate::default());
        ARMED.lock().push((name, key.into(), gate.clone()));
        ANY.store(true, Ordering::Release);
        Pause { name, key: key.into(), gate }
    }

    impl Pause {
        /// Waits until a thread is held at the point; false if none came within `timeout`.
        pub fn wait_arrived(&self, timeout: Duration) -> bool {
            let deadline = std::time::Instant::now() + timeout;
            let mut s = self.gate.state.lock();
            while !s.arrived {
                if self.gate.cv.wait_until(&mut s, deadline).timed_out() {
                    return s.arrived;
                }
            }
            true
        }

        /// Lets the held thread go on (and any that comes later pass).
        pub fn release(&self) {
            self.gate.state.lock().released = true;
            self.gate.cv.notify_all();
        }
    }

    impl Drop for Pause {
        fn drop(&mut self) {
            let mut armed = ARMED.lock();
            armed.retain(|(n, k, g)| !(*n == self.name && *k == self.key && Arc::ptr_eq(g, &self.gate)));
            ANY.store(!armed.is_empty(), Ordering::Release);
            drop(armed);
            self.release();
        }
    }
}

#[cfg(feature = "faults")]
pub use on::{arm, point, Pause};

/// Compiled out: production builds have no pause points.
#[cfg(not(feature = "faults"))]
#[inline(always)]
pub fn point(_name: &'static str, _key: &[u8]) {}
