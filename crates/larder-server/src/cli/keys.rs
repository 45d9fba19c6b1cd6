//! `larder get`, `put` and `delete` of a key against a running server, values streamed both
//! ways so that a value of any size takes little memory.

use super::client::{answer, call, fail, human_bytes, key_url, send, Target};
use clap::Args;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

/// `larder get KEY`: the value to stdout (or a file).
#[derive(Args, Debug)]
pub struct GetArgs {
    /// The key (any bytes but NUL; it is percent-encoded for the URL).
    pub key: String,
    /// Write the value to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub target: Target,
}

/// `larder put KEY [FILE]`: store a file's bytes, or stdin's.
#[derive(Args, Debug)]
pub struct PutArgs {
    /// The key.
    pub key: String,
    /// File holding the value; stdin when absent or `-`.
    pub file: Option<PathBuf>,
    /// Expire the value after this many seconds (X-TTL).
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,
    /// Content type stored with the value.
    #[arg(long, value_name = "TYPE")]
    pub content_type: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// `larder delete KEY`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The key.
    pub key: String,
    #[command(flatten)]
    pub target: Target,
}

/// Counts the bytes read through it and, on a terminal, shows how far it has come on stderr
/// (at most ten times a second).
struct Progress<R> {
    inner: R,
    done: u64,
    total: Option<u64>,
    shown: std::time::Instant,
    on: bool,
}

impl<R> Progress<R> {
    fn new(inner: R, total: Option<u64>) -> Progress<R> {
        let on = std::io::stderr().is_terminal();
        Progress { inner, done: 0, total, shown: std::time::Instant::now(), on }
    }

    fn show(&mut self, last: bool) {
        if !self.on || (!last && self.shown.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.shown = std::time::Instant::now();
        let line = match self.total {
            Some(t) if t > 0 => format!("{} of {} ({}%)", human_bytes(self.done), human_bytes(t), self.done * 100 / t),
            _ => human_bytes(self.done),
        };
        eprint!("\r{line}  {}", if last { "\n" } else { "" });
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.show(n == 0);
        Ok(n)
    }
}

/// `larder get`: the value is written as it arrives, so a value of any size takes little memory.
pub fn get(a: GetArgs) -> i32 {
    let mut resp = match send(&a.target, "GET", &key_url(&a.target, &a.key), &[], None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let status = resp.status().as_u16();
    let total = resp.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse().ok());
    let mut body = Progress::new(resp.body_mut().with_config().limit(u64::MAX).reader(), total);
    if status != 200 {
        let mut msg = Vec::new();
        let _ = body.inner.read_to_end(&mut msg);
        return answer(status, &msg);
    }
    let written = match &a.output {
        Some(path) => write_whole(path, &mut body),
        None => std::io::copy(&mut body, &mut std::io::stdout().lock()),
    };
    // A value cut short (the server found a chunk damaged mid-answer) is an error here too.
    written.map_or_else(|e| fail(format!("receiving the value: {e}")), |_| 0)
}

/// Writes what `body` yields to `path` through a temporary file beside it, renamed over `path`
/// only once the whole value is in: a value cut short never leaves a partial file behind. The
/// file gets the permissions of the one it replaces, or those of a new file. A path that is
/// not a regular file (`/dev/null`, a pipe) is written to directly.
fn write_whole(path: &std::path::Path, body: &mut impl Read) -> std::io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let permissions = match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return std::io::copy(body, &mut std::fs::File::create(path)?),
        Ok(m) => m.permissions(),
        // Masked by the umask, as any new file's.
        Err(_) => std::fs::Permissions::from_mode(0o666),
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::Builder::new().permissions(permissions).tempfile_in(dir)?;
    let n = std::io::copy(body, &mut tmp)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(n)
}

/// `larder put`: a file is sent as it is read, with its length; standard input as it comes
/// (chunked), so a value of any size takes little memory.
pub fn put(a: PutArgs) -> i32 {
    let (mut input, total): (Box<dyn Read>, Option<u64>) = match a.file.as_ref().filter(|p| p.as_os_str() != "-") {
        Some(path) => match std::fs::File::open(path).and_then(|f| Ok((f.metadata()?.len(), f))) {
            Ok((len, f)) => (Box::new(f), Some(len)),
            Err(e) => return fail(format!("reading the value: {e}")),
        },
        None => (Box::new(std::io::stdin().lock()), None),
    };
    let mut headers = Vec::new();
    if let Some(len) = total {
        headers.push(("Content-Length", len.to_string()));
    }
    if let Some(ttl) = a.ttl {
        headers.push(("X-TTL", ttl.to_string()));
    }
    if let Some(ct) = &a.content_type {
        headers.push(("Content-Type", ct.clone()));
    }
    let mut progress = Progress::new(&mut input, total);
    let sent =
        send(&a.target, "PUT", &key_url(&a.target, &a.key), &headers, Some(ureq::SendBody::from_reader(&mut progress)));
    let mut resp = match sent {
        Ok(r) => r,
        Err(code) => return code,
    };
    let mut msg = Vec::new();
    let _ = resp.body_mut().as_reader().read_to_end(&mut msg);
    answer(resp.status().as_u16(), &msg)
}

/// `larder delete`.
pub fn delete(a: DeleteArgs) -> i32 {
    match call(&a.target, "DELETE", &key_url(&a.target, &a.key)) {
        Ok((status, body)) => answer(status, &body),
        Err(code) => code,
    }
}
