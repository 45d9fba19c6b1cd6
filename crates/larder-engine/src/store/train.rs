//! Dictionaries trained automatically, one per key prefix (`Compression::dictionary`): a
//! prefix's small values are sampled until there are enough to train on; a thread trains the
//! dictionary and keeps it on disk (`disk::dicts`) before the prefix's values are coded with
//! it; when the values it codes compress markedly worse than the values held out of its
//! training did, the prefix is sampled and trained again, and the old dictionary retired (kept
//! while records need it).

use crate::config::Dictionaries;
use crate::disk::dicts::Dict;
use crate::disk::Disk;
use crate::format::codec;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Most prefixes followed: the keys of further prefixes are coded without a dictionary.
const MAX_PREFIXES: usize = 256;
/// Largest dictionary trained (zstd's guidance: about a hundredth of the sample, and a sample
/// far larger than the dictionary; small samples get smaller dictionaries).
const MAX_DICT: usize = 64 << 10;
/// Values per window whose ratio is compared with the one the dictionary reached on the
/// sampled values it was not trained on.
const WINDOW: u64 = 256;
/// Every this many sampled values, one is held out of training to measure the dictionary on.
const HOLD_OUT: usize = 8;
/// Fewest sampled values a dictionary is trained from (the sample grows past its size for
/// them, up to four times).
const MIN_SAMPLES: usize = 16;
/// A window this much worse (coded bytes per byte) than that ratio retrains.
const WORSE: f64 = 1.25;
/// Bytes all samples may hold together, at least (four samples' worth, if that is more).
const SAMPLE_BUDGET: u64 = 64 << 20;
/// Trainings of one prefix that fail in a row before it is left without a dictionary.
const MAX_FAILURES: u32 = 3;

/// The values sampled for a prefix's next dictionary.
#[derive(Default)]
struct Sample {
    on: bool,
    bytes: Vec<u8>,
    sizes: Vec<usize>,
    failures: u32,
}

/// What is known of one key prefix.
pub(super) struct Prefix {
    key_prefix: Vec<u8>,
    active: RwLock<Option<Arc<Dict>>>,
    sample: Mutex<Sample>,
    /// Whether `sample` takes values (`Sample::on`, read without its lock on every put).
    sampling: AtomicBool,
    /// Since the active dictionary took over: values, bytes as sent, bytes coded; the ratio
    /// it reached on held-out values (coded per sent, in millionths) and the current window's
    /// start.
    values: AtomicU64,
    logical: AtomicU64,
    coded: AtomicU64,
    settled: AtomicU64,
    window: Mutex<(u64, u64)>,
}

impl Prefix {
    fn new(key_prefix: Vec<u8>, active: Option<Arc<Dict>>) -> Prefix {
        let sampling = active.is_none();
        Prefix {
            key_prefix,
            active: RwLock::new(active),
            sample: Mutex::new(Sample { on: sampling, ..Default::default() }),
            sampling: AtomicBool::new(sampling),
            values: AtomicU64::new(0),
            logical: AtomicU64::new(0),
            coded: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            window: Mutex::new((0, 0)),
        }
    }

    /// The dictionary that codes this prefix's values now.
    pub fn active(&self) -> Option<Arc<Dict>> {
        self.active.read().clone()
    }
}

/// The store's prefixes and its one training thread.
pub(crate) struct Trainer {
    cfg: Dictionaries,
    prefixes: RwLock<HashMap<Vec<u8>, Arc<Prefix>>>,
    busy: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Bytes the prefixes' samples hold.
    sampled: AtomicU64,
    /// Set at close: no training starts.
    closing: AtomicBool,
    pub trained: AtomicU64,
    pub retrains: AtomicU64,
    pub failures: AtomicU64,
}

/// The prefix of `key`: its first `depth` segments (split at `/`), or the empty prefix for a
/// key with fewer (such keys share one dictionary).
pub(crate) fn prefix_of(key: &[u8], depth: u32) -> &[u8] {
    let mut seen = 0;
    for (i, &b) in key.iter().enumerate() {
        if b == b'/' && i > 0 {
            seen += 1;
            if seen == depth {
                return &key[..i];
            }
        }
    }
    &[]
}

impl Trainer {
    /// The trainer of a store whose dictionaries on disk are `dicts` (the newest of each prefix
    /// codes it again).
    pub fn new(cfg: Dictionaries, dicts: &[Arc<Dict>]) -> Trainer {
        let mut prefixes = HashMap::new();
        for d in dicts.iter().filter(|d| !d.retired()) {
            prefixes.insert(d.key_prefix.clone(), Arc::new(Prefix::new(d.key_prefix.clone(), Some(d.clone()))));
        }
        Trainer {
            cfg,
            prefixes: RwLock::new(prefixes),
            busy: AtomicBool::new(false),
            thread: Mutex::new(None),
            sampled: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            trained: AtomicU64::new(0),
            retrains: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// Whether a value of `len` bytes is one a dictionary codes (and samples).
    pub fn takes(&self, len: u64) -> bool {
        len <= self.cfg.max_value
    }

    /// The prefix `key` belongs to; `None` past [`MAX_PREFIXES`].
    pub fn prefix(&self, key: &[u8]) -> Option<Arc<Prefix>> {
        let p = prefix_of(key, self.cfg.depth);
        {
            let all = self.prefixes.read();
            if let Some(x) = all.get(p) {
                return Some(x.clone());
            }
            if all.len() >= MAX_PREFIXES {
                return None; // without taking the write lock on every such put
            }
        }
        let mut all = self.prefixes.write();
        if all.len() >= MAX_PREFIXES && !all.contains_key(p) {
            return None;
        }
        Some(all.entry(p.to_vec()).or_insert_with(|| Arc::new(Prefix::new(p.to_vec(), None))).clone())
    }

    /// Notes that a value of `len` bytes of `p` was coded with its dictionary `d` into `coded`
    /// bytes; starts sampling anew when a window's ratio is markedly worse than the one the
    /// dictionary reached on held-out values.
    pub fn coded(&self, p: &Prefix, d: &Dict, len: u64, coded: u64) {
        d.values.fetch_add(1, Ordering::Relaxed);
        d.logical_bytes.fetch_add(len, Ordering::Relaxed);
        d.stored_bytes.fetch_add(coded, Ordering::Relaxed);
        let n = p.values.fetch_add(1, Ordering::Relaxed) + 1;
        let logical = p.logical.fetch_add(len, Ordering::Relaxed) + len;
        let total = p.coded.fetch_add(coded, Ordering::Relaxed) + coded;
        if n.is_multiple_of(WINDOW) {
            let mut w = p.window.lock();
            // (A training may have reset the totals since they were read.)
            let ratio = total.saturating_sub(w.1) as f64 * 1e6 / logical.saturating_sub(w.0).max(1) as f64;
            *w = (logical, total);
            let settled = p.settled.load(Ordering::Relaxed) as f64;
            if settled == 0.0 {
                // A dictionary found at open: its first window is the ratio to keep up.
                p.settled.store((ratio as u64).max(1), Ordering::Relaxed);
            } else if ratio > settled * WORSE {
                let mut s = p.sample.lock();
                if !s.on && s.failures < MAX_FAILURES {
                    tracing::info!(prefix = %String::from_utf8_lossy(&p.key_prefix), settled = settled / 1e6, now = ratio / 1e6, "values compress worse with their dictionary: training another");
                    self.retrains.fetch_add(1, Ordering::Relaxed);
                    *s = Sample { on: true, failures: s.failures, ..Default::default() };
                    p.sampling.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// Offers `value` of prefix `p` to its sample; once the sample is large enough (and no
    /// other training runs) a thread trains its dictionary.
    pub fn offer(self: &Arc<Self>, disk: &Arc<Disk>, p: &Arc<Prefix>, value: &[&[u8]]) {
        if !p.sampling.load(Ordering::Relaxed) {
            return;
        }
        let mut s = p.sample.lock();
        if !s.on {
            return;
        }
        let most = self.cfg.sample_bytes.saturating_mul(4);
        let len: usize = value.iter().map(|v| v.len()).sum();
        let room = self.sampled.load(Ordering::Relaxed) + len as u64 <= self.budget();
        if room
            && ((s.bytes.len() as u64) < self.cfg.sample_bytes
                || (s.sizes.len() < MIN_SAMPLES && (s.bytes.len() as u64) < most))
        {
            value.iter().for_each(|v| s.bytes.extend_from_slice(v));
            s.sizes.push(len);
            self.sampled.fetch_add(len as u64, Ordering::Relaxed);
        }
        if !self.enough(&s) || self.closing.load(Ordering::Acquire) || self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let taken = self.take(p, &mut s);
        drop(s);
        let (disk, p) = (disk.clone(), p.clone());
        let mut thread = self.thread.lock();
        if let Some(t) = thread.take() {
            let _ = t.join(); // done: `busy` was clear
        }
        let started = std::thread::Builder::new().name("larder-train".into()).spawn({
            let trainer = TrainJob { trainer: self.clone(), disk, p, sample: taken };
            move || trainer.run()
        });
        match started {
            Ok(t) => *thread = Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "could not start training a dictionary");
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.busy.store(false, Ordering::Release);
            }
        }
    }

    /// Bytes all prefixes' samples may hold together (a sample that fills while another
    /// prefix trains waits for its turn, holding its bytes).
    fn budget(&self) -> u64 {
        self.cfg.sample_bytes.saturating_mul(4).max(SAMPLE_BUDGET)
    }

    fn enough(&self, s: &Sample) -> bool {
        let most = self.cfg.sample_bytes.saturating_mul(4);
        s.on && (s.bytes.len() as u64) >= self.cfg.sample_bytes
            && (s.sizes.len() >= MIN_SAMPLES || (s.bytes.len() as u64) >= most)
    }

    /// Takes `p`'s sample to train from (it samples no more meanwhile).
    fn take(&self, p: &Prefix, s: &mut Sample) -> Sample {
        let taken = std::mem::take(s);
        s.failures = taken.failures;
        p.sampling.store(false, Ordering::Relaxed);
        self.sampled.fetch_sub(taken.bytes.len() as u64, Ordering::Relaxed);
        taken
    }

    /// A prefix whose sample is ready to train from, taken (with `busy` set), when no training
    /// runs: the training thread goes on with it, so a sample that filled while another
    /// trained does not wait for its prefix's next value.
    fn next_ready(&self) -> Option<(Arc<Prefix>, Sample)> {
        if self.closing.load(Ordering::Acquire) {
            return None;
        }
        let all = self.prefixes.read();
        for p in all.values().filter(|p| p.sampling.load(Ordering::Relaxed)) {
            let mut s = p.sample.lock();
            if self.enough(&s) && !self.busy.swap(true, Ordering::AcqRel) {
                let taken = self.take(p, &mut s);
                return Some((p.clone(), taken));
            }
        }
        None
    }

    /// Waits for a training under way (at close).
    pub fn finish(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// A training ended (`ok` if a dictionary now codes the prefix).
    fn ended(&self, ok: bool) {
        if ok {
            self.trained.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The training thread's first job: `p`'s dictionary, from `sample` (then any other prefix
/// whose sample is ready).
struct TrainJob {
    trainer: Arc<Trainer>,
    disk: Arc<Disk>,
    p: Arc<Prefix>,
    sample: Sample,
}

impl TrainJob {
    /// Trains `p`'s dictionary, then any other prefix's whose sample is ready.
    fn run(self) {
        /// Clears `busy` however a training ends (a panic included).
        struct Idle<'a>(&'a AtomicBool);
        impl Drop for Idle<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let TrainJob { trainer, disk, mut p, mut sample } = self;
        loop {
            {
                let _idle = Idle(&trainer.busy);
                train_one(&trainer, &disk, &p, sample);
            }
            match trainer.next_ready() {
                Some((next, taken)) => (p, sample) = (next, taken),
                None => return,
            }
        }
    }
}

/// One training: of `p`'s dictionary, from `sample`.
fn train_one(trainer: &Trainer, disk: &Disk, p: &Prefix, sample: Sample) {
    {
        let most = (sample.bytes.len() / 10).clamp(1 << 10, MAX_DICT);
        let t0 = std::time::Instant::now();
        let id = disk.dicts.next_id();
        // Every HOLD_OUT-th value is left out of training, to measure the dictionary on values
        // it has not seen: the ratio later values are held to.
        let (mut train, mut sizes, mut held) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0;
        for (i, &n) in sample.sizes.iter().enumerate() {
            let v = &sample.bytes[at..at + n];
            at += n;
            if i % HOLD_OUT == HOLD_OUT - 1 {
                held.push(v);
            } else {
                train.extend_from_slice(v);
                sizes.push(n);
            }
        }
        let trained = codec::train(&train, &sizes, most)
            .ok_or_else(|| "zstd could not train a dictionary from the sample".to_string())
            .and_then(|bytes| disk.dicts.add(&disk.ring.dirs, id, &p.key_prefix, &bytes).map_err(|e| e.to_string()));
        let prefix = String::from_utf8_lossy(&p.key_prefix).into_owned();
        match trained {
            Ok(d) => {
                let (mut sent, mut coded) = (0u64, 0u64);
                for v in &held {
                    sent += v.len() as u64;
                    coded += codec::encode_with(&d.prepared, v).map_or(v.len(), |c| c.len()) as u64;
                }
                let ratio = (coded * 1_000_000).checked_div(sent).map_or(0, |r| r.max(1));
                tracing::info!(
                    prefix,
                    id,
                    bytes = d.len,
                    values = sample.sizes.len(),
                    held_out_ratio = ratio as f64 / 1e6,
                    ms = t0.elapsed().as_millis() as u64,
                    "trained a dictionary"
                );
                for n in [&p.values, &p.logical, &p.coded] {
                    n.store(0, Ordering::Relaxed);
                }
                *p.window.lock() = (0, 0);
                p.settled.store(ratio, Ordering::Relaxed);
                let old = p.active.write().replace(d);
                if let Some(old) = old {
                    old.retire();
                }
                p.sample.lock().failures = 0;
                trainer.ended(true);
            }
            Err(e) => {
                tracing::warn!(prefix, error = %e, "training a dictionary failed");
                let mut s = p.sample.lock();
                s.failures += 1;
                // Sampled again (from scratch), unless it failed too often.
                s.on = s.failures < MAX_FAILURES;
                p.sampling.store(s.on, Ordering::Relaxed);
                drop(s);
                trainer.ended(false);
            }
        }
    }
}
