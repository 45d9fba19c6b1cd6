//! Large values over HTTP, for `compare`'s large workloads: a few keep-alive connections each
//! PUT or GET values of many MiB. Bodies are streamed from and into one fixed buffer, so the
//! loader never holds a value, and every GET's length is checked.

use anyhow::{bail, ensure, Context, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes moved and how long it took.
pub struct Moved {
    pub bytes: u64,
    pub requests: u64,
    pub secs: f64,
}

/// The bytes every large value is made of (the same for every server).
fn pattern() -> Vec<u8> {
    (0..1u64 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// Reads an answer's status line and headers; returns the status and Content-Length.
fn head(r: &mut BufReader<TcpStream>) -> Result<(u16, Option<u64>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
    let mut len = None;
    loop {
        line.clear();
        ensure!(r.read_line(&mut line)? > 0, "the connection closed in the headers");
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, len));
        }
        if let Some((name, value)) = l.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                len = value.trim().parse().ok();
            }
        }
    }
}

/// Reads and drops `len` bytes of body; returns how many came.
fn drain(r: &mut BufReader<TcpStream>, mut len: u64, buf: &mut [u8]) -> Result<u64> {
    let mut got = 0;
    while len > 0 {
        let want = buf.len().min(len as usize);
        let n = r.read(&mut buf[..want])?;
        ensure!(n > 0, "the body ended after {got} bytes");
        got += n as u64;
        len -= n as u64;
    }
    Ok(got)
}

/// One connection: `paths.len()` requests of `method` (PUT or GET) for values of `len` bytes.
fn connection(port: u16, method: &str, paths: &[String], len: u64) -> Result<u64> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::with_capacity(1 << 20, stream);
    let body = pattern();
    let mut buf = vec![0u8; 1 << 20];
    let mut moved = 0;
    for path in paths {
        if method == "PUT" {
            write!(w, "PUT {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len}\r\n\r\n")?;
            let mut left = len;
            while left > 0 {
                let n = left.min(body.len() as u64) as usize;
                w.write_all(&body[..n])?;
                left -= n as u64;
            }
            let (status, answer_len) = head(&mut r)?;
            drain(&mut r, answer_len.unwrap_or(0), &mut buf)?;
            ensure!((200..300).contains(&status), "PUT {path}: status {status}");
        } else {
            write!(w, "GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n")?;
            let (status, answer_len) = head(&mut r)?;
            ensure!(status == 200, "GET {path}: status {status}");
            ensure!(answer_len == Some(len), "GET {path}: Content-Length {answer_len:?}, not {len}");
            drain(&mut r, len, &mut buf)?;
        }
        moved += len;
    }
    Ok(moved)
}

/// Runs one connection per entry of `paths` at once (each making its requests in turn).
pub fn run(port: u16, method: &str, paths: Vec<Vec<String>>, len: u64) -> Result<Moved> {
    let started = Instant::now();
    let requests = paths.iter().map(|p| p.len() as u64).sum();
    let moved = std::thread::scope(|s| {
        let conns: Vec<_> = paths.iter().map(|p| s.spawn(move || connection(port, method, p, len))).collect();
        conns.into_iter().map(|c| c.join().expect("a loader thread panicked")).sum::<Result<u64>>()
    })?;
    let secs = started.elapsed().as_secs_f64();
    if moved != requests * len {
        bail!("moved {moved} bytes, not {}", requests * len);
    }
    Ok(Moved { bytes: moved, requests, secs })
}

/// Resident memory of the processes `pids` together (VmRSS), in bytes.
pub fn rss(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            let kib = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
            kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
        .sum::<u64>()
        << 10
}
