//! The small OS layer: positional reads and writes on files kept open, data syncs, and
//! atomic file replacement. Everything above this module is free of OS specifics.
//!
//! With the cargo feature `faults`, each function first asks [`crate::faults`] whether to
//! fail; without it those calls are compiled out.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Applies an injected fault, if any, to a blocking read or a sync (feature `faults` only),
/// keeping the hook in `$name` until the end of the function.
macro_rules! hook {
    ($name:ident = $file:expr, $op:ident) => {
        #[cfg(feature = "faults")]
        let $name = {
            let mut h = crate::faults::before($file, crate::faults::Op::$op, false);
            if let Some(e) = h.take_failure() {
                return Err(e);
            }
            h
        };
    };
}

/// Reads up to `buf.len()` bytes at `offset`; returns how many were read (short at EOF).
pub fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    hook!(_hook = file, Read);
    read_unhooked(file, buf, offset)
}

fn read_unhooked(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Like [`read_at_most`], but only from the page cache: `Ok(None)` when reading would wait
/// for the device (`RWF_NOWAIT`), so that a caller on an async worker can move the read to a
/// thread that may block. Where the flag is unsupported the read simply happens.
pub fn read_cached_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<Option<usize>> {
    #[cfg(feature = "faults")]
    let _hook = {
        use crate::faults::Verdict;
        let mut h = crate::faults::before(file, crate::faults::Op::Read, true);
        match h.take_verdict() {
            Verdict::Proceed | Verdict::Short(..) => h,
            Verdict::Fail(e) => return Err(e),
            // A slow device: the page is not cached.
            Verdict::Delay(_) => return Ok(None),
            Verdict::ShortRead => return read_unhooked(file, buf, offset).map(|n| Some(n / 2)),
        }
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut done = 0;
        while done < buf.len() {
            let iov = libc::iovec { iov_base: buf[done..].as_mut_ptr().cast(), iov_len: buf.len() - done };
            // SAFETY: the iovec points into `buf`, which outlives the call.
            let n =
                unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, (offset + done as u64) as i64, libc::RWF_NOWAIT) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            if n == 0 {
                break;
            }
            match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => {}
                e if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(None),
                // Kernel or file system without RWF_NOWAIT: read the usual way.
                e if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)) => {
                    return read_unhooked(file, &mut buf[done..], offset + done as u64).map(|n| Some(done + n));
                }
                e => return Err(e),
            }
        }
        Ok(Some(done))
    }
    #[cfg(not(target_os = "linux"))]
    {
        read_unhooked(file, buf, offset).map(Some)
    }
}

/// Writes all of `parts`, in order, starting at `offset`, without first joining them.
pub fn write_all_vectored_at(file: &File, parts: &[&[u8]], offset: u64) -> io::Result<()> {
    #[cfg(feature = "faults")]
    let _hook = {
        use crate::faults::Verdict;
        let len = parts.iter().map(|p| p.len()).sum();
        let mut h = crate::faults::before_change(file, offset, len, None);
        match h.take_verdict() {
            Verdict::Proceed | Verdict::ShortRead => h,
            Verdict::Delay(d) => {
                crate::faults::hold(d);
                h
            }
            Verdict::Fail(e) => return Err(e),
            Verdict::Short(n, e) => {
                // Land the first `n` bytes, as a device that fills up mid-write does.
                let joined: Vec<u8> = parts.concat();
                write_unhooked(file, &[&joined[..n]], offset)?;
                return Err(e);
            }
        }
    };
    write_unhooked(file, parts, offset)
}

fn write_unhooked(file: &File, parts: &[&[u8]], offset: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
        let mut bufs = &mut slices[..];
        let mut at = offset;
        while !bufs.is_empty() {
            // SAFETY: IoSlice is ABI-compatible with iovec; the slices outlive the call.
            let n = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    bufs.as_ptr() as *const libc::iovec,
                    bufs.len().min(1024) as i32,
                    at as i64,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote nothing"));
            }
            at += n as u64;
            IoSlice::advance_slices(&mut bufs, n as usize);
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut at = offset;
        for p in parts {
            file.write_all_at(p, at)?;
            at += p.len() as u64;
        }
        Ok(())
    }
}

/// Makes a file's data durable (fdatasync where available).
pub fn sync_data(file: &File) -> io::Result<()> {
    hook!(hook = file, Sync);
    file.sync_data()?;
    #[cfg(feature = "faults")]
    hook.synced();
    Ok(())
}

/// Makes directory entries (creations, renames, removals) in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let f = File::open(dir)?;
    hook!(_hook = &f, Sync);
    f.sync_all()
}

/// Sets a file's length (cutting or extending it with zeros).
pub fn set_len(file: &File, len: u64) -> io::Result<()> {
    #[cfg(feature = "faults")]
    let _hook = {
        let mut h = crate::faults::before_change(file, len, 0, Some(len));
        if let Some(e) = h.take_failure() {
            return Err(e);
        }
        h
    };
    file.set_len(len)
}

/// Replaces `path` with `bytes` atomically: temporary file, fsync, rename, directory fsync.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let f = AtomicFile::create(path)?;
    f.write_at(bytes, 0)?;
    f.commit()
}

/// A file being written under a temporary name that replaces `path` atomically on
/// [`AtomicFile::commit`] (fsync, rename, directory fsync), for files too large to build in
/// memory first. Dropped uncommitted, it removes the temporary file.
pub struct AtomicFile {
    file: File,
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Starts the replacement of `path`.
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        let tmp = path.with_extension("tmp");
        let file = File::create(&tmp)?;
        Ok(AtomicFile { file, tmp, path: path.to_path_buf(), committed: false })
    }

    /// Writes `bytes` at `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        write_all_vectored_at(&self.file, &[bytes], offset)
    }

    /// Makes the file durable and puts it in place of `path`.
    pub fn commit(mut self) -> io::Result<()> {
        {
            hook!(hook = &self.file, Sync);
            self.file.sync_all()?;
            #[cfg(feature = "faults")]
            hook.synced();
        }
        std::fs::rename(&self.tmp, &self.path)?;
        self.committed = true;
        sync_dir(self.path.parent().unwrap_or(Path::new(".")))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Removes a file; a missing file is not an error.
pub fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Lowers the calling thread's CPU priority (Linux: nice is per thread), for background work
/// such as building hint files that must not compete with requests.
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority only reads its arguments; `who` 0 is the calling thread on Linux.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// The filesystem `path` is on (its device number) and the bytes free on it for an
/// unprivileged writer, for placing volumes by utilization.
pub fn free_space(path: &Path) -> io::Result<(u64, u64)> {
    #[cfg(feature = "faults")]
    crate::faults::delay_path(path);
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` is large enough for the answer.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // The field types differ between platforms.
    #[allow(clippy::unnecessary_cast)]
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    Ok((dev, free))
}
