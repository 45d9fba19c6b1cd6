//! Fault injection for tests: make chosen I/O operations under a data directory fail, and
//! simulate a power cut by undoing every change that was not made durable.
//!
//! `FaultyFile`, the I/O layer's second implementation of `FileIo`, exists only with the
//! cargo feature `faults`, so a production build pays nothing; without it [`inject`] and
//! [`track`] refuse. Test builds turn the feature on through dev-dependencies. A file is tied
//! to its directory's state once, when it is opened; each operation then applies the first
//! rule of that directory that matches (a look at one atomic flag while it has none).
//!
//! Power-cut model (as redb's crash backend): a file's durable content is what it held when
//! its last successful `fdatasync`/`fsync` started, or when tracking began. Every write and
//! length change since is logged with the bytes it replaced; [`power_cut`] replays the logs
//! backwards, so each file is left as a power loss would at worst leave it. Two simplifications,
//! both on the kind side: directory entries (creations, renames, removals) are durable at once
//! (larder syncs the directory after each), and a sync that fails does not poison the changes
//! it covered for later syncs, as Linux may.

// Without the feature nothing calls the hooks; the registry stays so the API compiles.
#![cfg_attr(not(feature = "faults"), allow(dead_code))]

#[cfg(feature = "faults")]
use super::FileIo;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
#[cfg(feature = "faults")]
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Which operations a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Positional reads.
    Read,
    /// Writes and length changes.
    Write,
    /// `fdatasync`/`fsync` of files and directories.
    Sync,
}

/// How a matching operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `ENOSPC`: the device is full.
    NoSpace,
    /// `EIO`: the device failed.
    Io,
    /// A write lands half of its bytes, then fails with `ENOSPC` (what a filling disk does).
    /// A non-blocking read (`RWF_NOWAIT`) comes back with half of its bytes and no error
    /// (what Linux 5.9 and 5.10 may do for a read that would block); blocking reads are not
    /// affected.
    Short,
    /// The operation takes this many milliseconds longer, then succeeds: a slow device. A
    /// non-blocking read answers "would block" at once, as it would for a cold page. A read
    /// delay also holds up looks at the directory's free space (`statvfs`).
    Delay(u64),
}

/// One injected fault: operations `op` on files under the directory whose name contains
/// `file` (any file if empty) pass `skip` times, then fail `count` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The operations it applies to.
    pub op: Op,
    /// How they fail.
    pub failure: Failure,
    /// Only files whose name contains this; empty for every file.
    pub file: String,
    /// Matching operations that succeed before the first failure.
    pub skip: u64,
    /// Failures before the rule is spent; `u64::MAX` lasts until [`clear`].
    pub count: u64,
}

impl Rule {
    /// A rule that fails every `op` on every file until cleared.
    pub fn always(op: Op, failure: Failure) -> Rule {
        Rule { op, failure, file: String::new(), skip: 0, count: u64::MAX }
    }

    /// Parses `OP FAILURE [ms=N] [file=SUBSTR] [skip=N] [count=N]`, e.g. `write nospace`,
    /// `sync eio count=1`, `read eio file=vol-00002`, `read short`, `read delay ms=300`
    /// (`delay` needs `ms`). Used by the server's fault endpoint.
    pub fn parse(spec: &str) -> Result<Rule, String> {
        let mut words = spec.split_whitespace();
        let op = match words.next() {
            Some("read") => Op::Read,
            Some("write") => Op::Write,
            Some("sync") => Op::Sync,
            other => return Err(format!("expected read, write or sync, got {other:?}")),
        };
        let failure = match words.next() {
            Some("nospace") => Failure::NoSpace,
            Some("eio") => Failure::Io,
            Some("short") if op != Op::Sync => Failure::Short,
            Some("delay") => Failure::Delay(u64::MAX),
            other => {
                return Err(format!("expected nospace, eio, delay or (for reads and writes) short, got {other:?}"))
            }
        };
        let mut rule = Rule::always(op, failure);
        for w in words {
            let (name, value) = w.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got {w:?}"))?;
            let number = || value.parse::<u64>().map_err(|_| format!("{name} takes a number, got {value:?}"));
            match name {
                "file" => rule.file = value.to_string(),
                "skip" => rule.skip = number()?,
                "count" => rule.count = number()?,
                "ms" if matches!(rule.failure, Failure::Delay(_)) => rule.failure = Failure::Delay(number()?),
                _ => return Err(format!("unknown setting {name:?}")),
            }
        }
        if rule.failure == Failure::Delay(u64::MAX) {
            return Err("delay needs ms=N".into());
        }
        Ok(rule)
    }
}

/// What [`power_cut`] undid.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutReport {
    /// Files that had changes since their last sync.
    pub files: usize,
    /// Logged writes and length changes undone.
    pub changes: usize,
}

/// Whether this build has the hooks (cargo feature `faults`).
pub const fn available() -> bool {
    cfg!(feature = "faults")
}

enum Undo {
    /// Put `old` back at `offset`, then cut the file to `len` (its length before the write).
    Write { offset: u64, old: Vec<u8>, len: u64 },
    /// Give a file cut to a shorter length its tail back, or cut a grown file back to `len`.
    SetLen { len: u64, tail: Vec<u8> },
}

/// A file's changes not yet durable, oldest first; the first `completed` have returned
/// from their system call (only those can a sync that starts now make durable).
#[derive(Default)]
struct Log {
    undo: Vec<Undo>,
    completed: usize,
}

#[derive(Default)]
struct Dir {
    rules: Vec<Rule>,
    tracking: bool,
    /// Per file, its changes since the last sync.
    logs: HashMap<PathBuf, Log>,
    /// After a power cut every operation fails: the process is "dead" until [`clear`].
    dead: bool,
    /// Raised by [`clear`]: an operation that began before it must not count in the new logs.
    epoch: u64,
}

/// A directory's state, shared by every file opened in it.
#[derive(Default)]
struct DirCell {
    /// Whether it has rules, is tracked or is dead: otherwise operations pass untouched.
    active: AtomicBool,
    state: Mutex<Dir>,
}

impl DirCell {
    fn update(&self, f: impl FnOnce(&mut Dir)) {
        let mut d = self.state.lock();
        f(&mut d);
        self.active.store(!d.rules.is_empty() || d.tracking || d.dead, Ordering::Release);
    }
}

/// Every directory a file was opened in or a rule was given for (canonical paths). Entries
/// stay (cleared, not removed), so that files opened before a rule is injected see it.
static DIRS: Mutex<Vec<(PathBuf, Arc<DirCell>)>> = Mutex::new(Vec::new());
/// Set once any rule or tracking was asked for: until then the looks by path (directory
/// syncs, free space) skip the registry.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Held shared by every hooked operation across its system call and exclusively by a power
/// cut, so no write slips in between the undo and the "death".
static CUT: RwLock<()> = RwLock::new(());

fn unavailable() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "fault injection needs the `faults` cargo feature")
}

/// The state of `dir` (canonical), made on first use.
fn cell(dir: &Path) -> Arc<DirCell> {
    let mut dirs = DIRS.lock();
    if let Some((_, d)) = dirs.iter().find(|(p, _)| p == dir) {
        return d.clone();
    }
    let d = Arc::new(DirCell::default());
    dirs.push((dir.to_path_buf(), d.clone()));
    d
}

/// The state of the directory `dir` (canonical), if one was made.
fn cell_of(dir: &Path) -> Option<Arc<DirCell>> {
    DIRS.lock().iter().find(|(p, _)| p == dir).map(|x| x.1.clone())
}

/// Adds a fault for the files in `dir` (not in its subdirectories: larder's data directories
/// are flat) and for syncs and free-space looks of `dir` itself.
pub fn inject(dir: &Path, rule: Rule) -> io::Result<()> {
    if !available() {
        return Err(unavailable());
    }
    ARMED.store(true, Ordering::Release);
    cell(&dir.canonicalize()?).update(|d| d.rules.push(rule));
    Ok(())
}

/// Removes every fault and all tracking of `dir`, and revives it after a power cut.
pub fn clear(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else { return };
    if let Some(c) = cell_of(&dir) {
        c.update(|d| *d = Dir { epoch: d.epoch + 1, ..Dir::default() });
    }
}

/// Starts logging changes to the files in `dir`, for [`power_cut`]. Call it before the store
/// is opened: files are taken as durable as they are now.
pub fn track(dir: &Path) -> io::Result<()> {
    if !available() {
        return Err(unavailable());
    }
    ARMED.store(true, Ordering::Release);
    cell(&dir.canonicalize()?).update(|d| d.tracking = true);
    Ok(())
}

/// Cuts the power to `dir`: undoes every logged change not yet synced, then fails every
/// later operation on it with `EIO` until [`clear`], so the store still open on it cannot
/// change it any more. Drop that store, clear, and reopen to see what recovery makes of it.
pub fn power_cut(dir: &Path) -> io::Result<CutReport> {
    use std::os::unix::fs::FileExt;
    let c = cell_of(&dir.canonicalize()?).ok_or_else(|| io::Error::other("the directory is not tracked"))?;
    ARMED.store(true, Ordering::Release);
    let _cut = CUT.write();
    c.active.store(true, Ordering::Release);
    let mut d = c.state.lock();
    d.dead = true;
    let mut report = CutReport::default();
    let mut first_error = None;
    for (path, log) in d.logs.drain() {
        // A file removed since (a temporary file renamed away) has nothing left to undo.
        let f = match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        report.files += 1;
        for u in log.undo.iter().rev() {
            report.changes += 1;
            let r = match u {
                Undo::Write { offset, old, len } => f.write_all_at(old, *offset).and_then(|_| f.set_len(*len)),
                Undo::SetLen { len, tail } => f.set_len(*len).and_then(|_| {
                    if tail.is_empty() {
                        Ok(())
                    } else {
                        f.write_all_at(tail, *len - tail.len() as u64)
                    }
                }),
            };
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
    }
    // Every file is undone as far as it can be before an error is reported.
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// What a hooked operation should do.
pub(crate) enum Verdict {
    Proceed,
    Fail(io::Error),
    /// Write only this many bytes, then fail with the error.
    Short(usize, io::Error),
    /// A non-blocking read returns half of what it read.
    ShortRead,
    /// Take this much longer (a non-blocking read: would block).
    Delay(std::time::Duration),
}

/// Sets the store's clock (`now_ms`) `ms` milliseconds off the real one, as a clock stepped
/// forward or back would. Process-wide: a test that uses it should run in a process of its own.
pub fn skew_clock(ms: i64) {
    #[cfg(feature = "faults")]
    crate::clock::set_skew(ms);
    #[cfg(not(feature = "faults"))]
    let _ = ms;
}

/// Operations held in an injected delay right now (see [`Failure::Delay`]): lets a test wait
/// until a read is in the air instead of guessing with a sleep.
static DELAYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many operations are being held by a delay rule at this moment.
pub fn delayed() -> usize {
    DELAYED.load(Ordering::Acquire)
}

/// Serves an injected delay.
pub(crate) fn hold(d: std::time::Duration) {
    DELAYED.fetch_add(1, Ordering::AcqRel);
    std::thread::sleep(d);
    DELAYED.fetch_sub(1, Ordering::AcqRel);
}

fn errno(failure: Failure) -> io::Error {
    io::Error::from(if failure == Failure::Io { rustix::io::Errno::IO } else { rustix::io::Errno::NOSPC })
}

impl Dir {
    /// `nowait`: the operation is a non-blocking read.
    fn verdict(&mut self, path: &Path, op: Op, len: usize, nowait: bool) -> Verdict {
        if self.dead {
            return Verdict::Fail(io::Error::from(rustix::io::Errno::IO));
        }
        let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        for r in &mut self.rules {
            if r.op != op || r.count == 0 || !name.contains(r.file.as_str()) {
                continue;
            }
            // A short read is a non-blocking read's failure only.
            if op == Op::Read && r.failure == Failure::Short && !nowait {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            r.count = r.count.saturating_sub(if r.count == u64::MAX { 0 } else { 1 });
            return match r.failure {
                Failure::Delay(ms) => Verdict::Delay(std::time::Duration::from_millis(ms)),
                Failure::Short if op == Op::Read => Verdict::ShortRead,
                Failure::Short if len > 1 => Verdict::Short(len / 2, errno(Failure::NoSpace)),
                f => Verdict::Fail(errno(f)),
            };
        }
        Verdict::Proceed
    }
}

/// A hooked operation in progress: holds off power cuts until it is dropped.
pub(crate) struct Hook {
    pub verdict: Verdict,
    /// For a logged change: counted complete when dropped. For a sync: how many changes
    /// were complete when it started, made durable by [`Hook::synced`].
    log: Option<(Arc<DirCell>, PathBuf, Pending, u64)>,
    _cut: Option<parking_lot::RwLockReadGuard<'static, ()>>,
}

enum Pending {
    Change,
    Sync(usize),
}

const PASS: Hook = Hook { verdict: Verdict::Proceed, log: None, _cut: None };

impl Hook {
    /// Takes the verdict out (leaving `Proceed`).
    pub(crate) fn take_verdict(&mut self) -> Verdict {
        std::mem::replace(&mut self.verdict, Verdict::Proceed)
    }

    /// The error the operation must fail with, if any (a short write fails too); a delay is
    /// served here.
    pub(crate) fn take_failure(&mut self) -> Option<io::Error> {
        match self.take_verdict() {
            Verdict::Proceed | Verdict::ShortRead => None,
            Verdict::Delay(d) => {
                hold(d);
                None
            }
            Verdict::Fail(e) | Verdict::Short(_, e) => Some(e),
        }
    }

    /// The sync this hook guarded succeeded: the changes complete before it are durable.
    pub(crate) fn synced(mut self) {
        if let Some((d, path, Pending::Sync(n), epoch)) = self.log.take() {
            let mut d = d.state.lock();
            let current = d.epoch == epoch;
            if let Some(log) = d.logs.get_mut(&path).filter(|_| current) {
                log.undo.drain(..n.min(log.undo.len()));
                log.completed = log.completed.saturating_sub(n);
            }
        }
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        // Runs before the power-cut guard is released (fields drop after this).
        if let Some((d, path, Pending::Change, epoch)) = self.log.take() {
            let mut d = d.state.lock();
            let current = d.epoch == epoch;
            if let Some(log) = d.logs.get_mut(&path).filter(|_| current) {
                log.completed += 1;
            }
        }
    }
}

/// A file whose operations go through its directory's rules and power-cut log.
#[cfg(feature = "faults")]
pub struct FaultyFile {
    os: File,
    dir: Arc<DirCell>,
    /// Its path when opened (canonical directory): rules match its name, logs are kept by it.
    path: PathBuf,
}

#[cfg(feature = "faults")]
impl FaultyFile {
    pub(crate) fn new(os: File, path: &Path) -> FaultyFile {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let parent = parent.canonicalize().unwrap_or_else(|_| parent.to_path_buf());
        let path = parent.join(path.file_name().unwrap_or_default());
        FaultyFile { os, dir: cell(&parent), path }
    }

    /// Before a read (`nowait`: a non-blocking one) or a sync.
    fn before(&self, op: Op, nowait: bool) -> Hook {
        if !self.dir.active.load(Ordering::Acquire) {
            return PASS;
        }
        let cut = CUT.read();
        let mut dir = self.dir.state.lock();
        let verdict = dir.verdict(&self.path, op, 0, nowait);
        // A sync makes durable only what had been written when it started.
        let pending = match (op, &verdict) {
            (Op::Sync, Verdict::Proceed) => dir.logs.get(&self.path).map(|l| Pending::Sync(l.completed)),
            _ => None,
        };
        let epoch = dir.epoch;
        drop(dir);
        Hook { verdict, log: pending.map(|p| (self.dir.clone(), self.path.clone(), p, epoch)), _cut: Some(cut) }
    }

    /// Before writing `len` bytes at `offset` (`set_len` is `Some(new_len)` for a length
    /// change instead): applies the rules and logs what the change will replace.
    fn before_change(&self, offset: u64, len: usize, set_len: Option<u64>) -> Hook {
        if !self.dir.active.load(Ordering::Acquire) {
            return PASS;
        }
        let cut = CUT.read();
        let mut dir = self.dir.state.lock();
        let verdict = dir.verdict(&self.path, Op::Write, len, false);
        let logged = dir.tracking && !matches!(verdict, Verdict::Fail(_));
        if logged {
            let size = self.os.len().unwrap_or(0);
            // Reads what is there, unhooked (with the locks held); a failed read logs zeros.
            let old = |at: u64, n: u64| {
                let mut b = vec![0u8; n as usize];
                let _ = self.os.read_at_most(&mut b, at);
                b
            };
            let undo = match set_len {
                Some(new) => Undo::SetLen { len: size, tail: old(new, size.saturating_sub(new)) },
                None => {
                    Undo::Write { offset, old: old(offset, size.saturating_sub(offset).min(len as u64)), len: size }
                }
            };
            dir.logs.entry(self.path.clone()).or_default().undo.push(undo);
        }
        let epoch = dir.epoch;
        drop(dir);
        Hook {
            verdict,
            log: logged.then(|| (self.dir.clone(), self.path.clone(), Pending::Change, epoch)),
            _cut: Some(cut),
        }
    }

    fn sync(&self, f: impl FnOnce(&File) -> io::Result<()>) -> io::Result<()> {
        let mut hook = self.before(Op::Sync, false);
        if let Some(e) = hook.take_failure() {
            return Err(e);
        }
        f(&self.os)?;
        hook.synced();
        Ok(())
    }
}

#[cfg(feature = "faults")]
impl FileIo for FaultyFile {
    fn read_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut hook = self.before(Op::Read, false);
        if let Some(e) = hook.take_failure() {
            return Err(e);
        }
        self.os.read_at_most(buf, offset)
    }

    fn read_cached_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<Option<usize>> {
        let mut hook = self.before(Op::Read, true);
        match hook.take_verdict() {
            Verdict::Proceed | Verdict::Short(..) => self.os.read_cached_at_most(buf, offset),
            Verdict::Fail(e) => Err(e),
            // A slow device: the page is not cached.
            Verdict::Delay(_) => Ok(None),
            Verdict::ShortRead => self.os.read_at_most(buf, offset).map(|n| Some(n / 2)),
        }
    }

    fn read_uninit(
        &self,
        buf: &mut [std::mem::MaybeUninit<u8>],
        offset: u64,
        nowait: bool,
    ) -> io::Result<Option<usize>> {
        // As `read_at_most` and `read_cached_at_most` apply the rules.
        let mut hook = self.before(Op::Read, nowait);
        if !nowait {
            if let Some(e) = hook.take_failure() {
                return Err(e);
            }
            return self.os.read_uninit(buf, offset, false);
        }
        match hook.take_verdict() {
            Verdict::Proceed | Verdict::Short(..) => self.os.read_uninit(buf, offset, true),
            Verdict::Fail(e) => Err(e),
            // A slow device: the page is not cached.
            Verdict::Delay(_) => Ok(None),
            Verdict::ShortRead => self.os.read_uninit(buf, offset, false).map(|n| n.map(|n| n / 2)),
        }
    }

    fn write_all_vectored_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut hook = self.before_change(offset, len, None);
        match hook.take_verdict() {
            Verdict::Proceed | Verdict::ShortRead => {}
            Verdict::Delay(d) => hold(d),
            Verdict::Fail(e) => return Err(e),
            Verdict::Short(n, e) => {
                // Land the first `n` bytes, as a device that fills up mid-write does.
                let joined: Vec<u8> = parts.concat();
                self.os.write_all_vectored_at(&[&joined[..n]], offset)?;
                return Err(e);
            }
        }
        self.os.write_all_vectored_at(parts, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync(File::sync_data)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync(File::sync_all)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut hook = self.before_change(len, 0, Some(len));
        if let Some(e) = hook.take_failure() {
            return Err(e);
        }
        File::set_len(&self.os, len)
    }

    fn len(&self) -> io::Result<u64> {
        self.os.len()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        // Subject to write rules, but never undone by a power cut: a punch changes the file's
        // metadata, which the file system may commit before data written earlier, so it is
        // taken as durable at once (the worst case for what a store must order before it).
        if !self.dir.active.load(Ordering::Acquire) {
            return self.os.punch_hole(offset, len);
        }
        let _cut = CUT.read();
        let verdict = self.dir.state.lock().verdict(&self.path, Op::Write, len as usize, false);
        if let Verdict::Fail(e) = verdict {
            return Err(e);
        }
        self.os.punch_hole(offset, len)
    }

    fn allocated(&self) -> io::Result<u64> {
        self.os.allocated()
    }

    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        self.os.is_hole(offset, len)
    }
}

/// Before a sync of the directory `dir` (opened just for it): its rules apply, looked up by
/// path (directory syncs are rare). The guard holds off a power cut until the sync is done.
pub(crate) fn before_dir_sync(dir: &Path) -> io::Result<Hook> {
    if !ARMED.load(Ordering::Acquire) {
        return Ok(PASS);
    }
    let Ok(dir) = dir.canonicalize() else { return Ok(PASS) };
    let Some(c) = cell_of(&dir).filter(|c| c.active.load(Ordering::Acquire)) else { return Ok(PASS) };
    let cut = CUT.read();
    let verdict = c.state.lock().verdict(&dir, Op::Sync, 0, false);
    let mut hook = Hook { verdict, log: None, _cut: Some(cut) };
    match hook.take_failure() {
        Some(e) => Err(e),
        None => Ok(hook),
    }
}

/// Serves a read delay rule, if one applies, to a look at the file system under `path` that
/// has no open file (its free space: a slow device stalls `statvfs` too). Only delays: other
/// rules are left for the reads they were written for.
pub(crate) fn delay_path(path: &Path) {
    if !ARMED.load(Ordering::Acquire) {
        return;
    }
    let Ok(path) = path.canonicalize() else { return };
    let Some(c) = cell_of(&path).filter(|c| c.active.load(Ordering::Acquire)) else { return };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let delay = c.state.lock().rules.iter_mut().find_map(|r| match r.failure {
        Failure::Delay(ms) if r.op == Op::Read && r.count > 0 && name.contains(r.file.as_str()) => {
            if r.skip > 0 {
                r.skip -= 1;
                return None;
            }
            r.count = r.count.saturating_sub(if r.count == u64::MAX { 0 } else { 1 });
            Some(std::time::Duration::from_millis(ms))
        }
        _ => None,
    });
    if let Some(d) = delay {
        hold(d);
    }
}
