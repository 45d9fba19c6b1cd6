//! The OS layer: every operation the engine makes on a file goes through [`FileIo`], on a
//! [`Handle`] opened by [`open`]. Everything above this module is free of OS specifics.
//!
//! `std::fs::File` implements it with system calls (through rustix). In builds with the cargo
//! feature `faults`, [`open`] wraps it in [`faults::FaultyFile`], another implementation of the
//! same trait, which applies the failures, delays and power-cut log of the file's directory
//! (the shape of redb's and foyer's storage backends). A production build has no wrapper and
//! pays nothing.

pub mod faults;

use rustix::io::ReadWriteFlags;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The operations the engine makes on a file it keeps open.
pub trait FileIo: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (short at EOF).
    fn read_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Like [`FileIo::read_at_most`], but only from the page cache: `Ok(None)` when reading
    /// would wait for the device (`RWF_NOWAIT`), so that a caller on an async worker can move
    /// the read to a thread that may block. Where the flag is unsupported the read happens.
    fn read_cached_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<Option<usize>>;

    /// Reads up to `buf.len()` bytes at `offset` into memory that need not be initialised
    /// (a record buffer is not zeroed first: the profiles of large GETs showed that `memset`);
    /// returns how many were read (short at EOF), or `None` if `nowait` and reading would
    /// wait for the device, as [`FileIo::read_cached_at_most`]. Those bytes of `buf` are then
    /// initialised.
    fn read_uninit(&self, buf: &mut [MaybeUninit<u8>], offset: u64, nowait: bool) -> io::Result<Option<usize>>;

    /// Writes all of `parts`, in order, starting at `offset`, without first joining them.
    fn write_all_vectored_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()>;

    /// Makes the file's data durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;

    /// Makes the file's data and metadata durable (fsync).
    fn sync_all(&self) -> io::Result<()>;

    /// Sets the file's length (cutting it, or extending it with zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// The file's length.
    fn len(&self) -> io::Result<u64>;

    /// Releases the disk blocks of `len` bytes at `offset`, which then read as zeros; the
    /// file's length stays (`fallocate(PUNCH_HOLE | KEEP_SIZE)`).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Bytes of disk the file occupies (its allocated blocks), for comparing with its length.
    fn allocated(&self) -> io::Result<u64>;

    /// Whether `offset..offset + len` holds no data: a hole, as [`FileIo::punch_hole`] leaves.
    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// An open file, as the engine holds it.
pub type Handle = Box<dyn FileIo>;

/// How [`open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write, created if missing, kept as it is otherwise.
    Create,
    /// Write, created if missing, emptied otherwise.
    Truncate,
}

/// Opens `path`.
pub fn open(path: &Path, mode: Mode) -> io::Result<Handle> {
    let mut o = std::fs::OpenOptions::new();
    match mode {
        Mode::Read => o.read(true),
        Mode::ReadWrite => o.read(true).write(true),
        Mode::Create => o.read(true).write(true).create(true).truncate(false),
        Mode::Truncate => o.write(true).create(true).truncate(true),
    };
    let file = o.open(path)?;
    #[cfg(feature = "faults")]
    return Ok(Box::new(faults::FaultyFile::new(file, path)));
    #[cfg(not(feature = "faults"))]
    Ok(Box::new(file))
}

/// Reads `len` bytes at `offset` of `file` into `buf`, an empty buffer whose memory is not
/// zeroed first ([`FileIo::read_uninit`]); it is then as long as what was read (short at EOF).
/// `None` if `nowait` and reading would wait for the device.
pub fn read_new(
    file: &dyn FileIo,
    mut buf: Vec<u8>,
    len: usize,
    offset: u64,
    nowait: bool,
) -> io::Result<Option<Vec<u8>>> {
    buf.clear();
    buf.reserve_exact(len);
    let Some(n) = file.read_uninit(&mut buf.spare_capacity_mut()[..len], offset, nowait)? else {
        return Ok(None);
    };
    // SAFETY: `read_uninit` initialised the first `n` bytes (at most `len`, within capacity).
    unsafe { buf.set_len(n.min(len)) };
    Ok(Some(buf))
}

/// The OS implementation: a file, operated on with system calls.
impl FileIo for File {
    fn read_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn read_cached_at_most(&self, buf: &mut [u8], offset: u64) -> io::Result<Option<usize>> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            match rustix::io::preadv2(self, &mut [IoSliceMut::new(&mut buf[done..])], at, ReadWriteFlags::NOWAIT) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                // Kernel or file system without RWF_NOWAIT: read the usual way.
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                    return self.read_at_most(&mut buf[done..], at).map(|n| Some(done + n));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(done))
    }

    fn read_uninit(&self, buf: &mut [MaybeUninit<u8>], offset: u64, nowait: bool) -> io::Result<Option<usize>> {
        let mut done = 0;
        let mut nowait = nowait;
        while done < buf.len() {
            let at = offset + done as u64;
            let rest = &mut buf[done..];
            let r = if nowait {
                // SAFETY: the slice is handed to the kernel only, which writes into it and
                // never reads it; the bytes it reports are initialised and no others are read.
                let rest = unsafe { &mut *(std::ptr::from_mut(rest) as *mut [u8]) };
                rustix::io::preadv2(self, &mut [IoSliceMut::new(rest)], at, ReadWriteFlags::NOWAIT)
            } else {
                rustix::io::pread(self, rest, at).map(|(read, _)| read.len())
            };
            match r {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) if nowait => return Ok(None),
                // Kernel or file system without RWF_NOWAIT: read the usual way.
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) if nowait => {
                    nowait = false
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(done))
    }

    fn write_all_vectored_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
        let mut bufs = &mut slices[..];
        let mut at = offset;
        while !bufs.is_empty() {
            let n = match rustix::io::pwritev(self, &bufs[..bufs.len().min(1024)], at) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote nothing"));
            }
            at += n as u64;
            IoSlice::advance_slices(&mut bufs, n);
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        use rustix::fs::FallocateFlags;
        Ok(rustix::fs::fallocate(self, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len)?)
    }

    fn allocated(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.metadata()?.blocks() * 512)
    }

    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        // The next data at or after `offset`; none at all is ENXIO. Positioned I/O only is
        // used on these files, so moving the file offset is harmless.
        match rustix::fs::seek(self, rustix::fs::SeekFrom::Data(offset)) {
            Ok(next) => Ok(next >= offset + len),
            Err(rustix::io::Errno::NXIO) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

/// Makes directory entries (creations, renames, removals) in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let f = File::open(dir)?;
    // A look-up by path, not through an open file: directories are synced rarely.
    #[cfg(feature = "faults")]
    let _hook = faults::before_dir_sync(dir)?;
    f.sync_all()
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
    file: Handle,
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Starts the replacement of `path`.
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        let tmp = path.with_extension("tmp");
        let file = open(&tmp, Mode::Truncate)?;
        Ok(AtomicFile { file, tmp, path: path.to_path_buf(), committed: false })
    }

    /// Writes `bytes` at `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_vectored_at(&[bytes], offset)
    }

    /// Makes the file durable and puts it in place of `path`.
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all()?;
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
    // `None` is the calling thread on Linux (its nice value is per thread); best effort.
    let _ = rustix::process::setpriority_process(None, 10);
}

/// The filesystem `path` is on (its device number) and the bytes free on it for an
/// unprivileged writer, for placing volumes by utilization.
pub fn free_space(path: &Path) -> io::Result<(u64, u64)> {
    #[cfg(feature = "faults")]
    faults::delay_path(path);
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    let st = rustix::fs::statvfs(path)?;
    Ok((dev, st.f_bavail.saturating_mul(st.f_frsize)))
}
