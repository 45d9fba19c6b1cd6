//! Black-box harness: runs the real `larder` binary on a loopback port in a temporary data
//! directory, and speaks HTTP/1.1 to it over plain sockets (so tests control every byte).

#![allow(dead_code)]

pub mod mc;
pub mod nginx;
pub mod origin;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server and the data directory it owns.
pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// The memcached protocol's address, when started with `--memcache-listen`.
    pub memcache: Option<SocketAddr>,
    pub dir: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server with extra `args` on a fresh data directory.
    pub fn start(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let mut s = Server::start_in(&dir, args);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server on `dir` with extra `args`.
    pub fn start_in(dir: &Path, args: &[&str]) -> Server {
        Server::start_env(dir, args, &[])
    }

    /// Starts a server on `dir` with extra `args` and environment variables.
    pub fn start_env(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Server {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let envs: Vec<(String, String)> = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (child, addr, memcache) = spawn(dir, &args, &envs);
        Server { child: Some(child), addr, memcache, dir: dir.to_path_buf(), args, envs, _tmp: None }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// The server's resident memory now, in bytes (Linux).
    pub fn rss(&self) -> u64 {
        let pid = self.child.as_ref().expect("running").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
        let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS line");
        kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("VmRSS in kB") << 10
    }

    /// Injects an I/O fault into the data directory (`/_larder/faults`, test builds only),
    /// e.g. `write nospace`; `None` clears every fault.
    pub fn fault(&self, rule: Option<&str>) {
        let mut c = self.client();
        let r = match rule {
            Some(rule) => c.request("POST", "/_larder/faults", &[], rule.as_bytes()),
            None => c.request("DELETE", "/_larder/faults", &[], b""),
        };
        assert_eq!(r.status, 200, "fault {rule:?}: {}", String::from_utf8_lossy(&r.body));
    }

    /// SIGTERM, and the exit status must be success.
    pub fn stop(&mut self) {
        self.signal_term();
        self.wait_exit_success();
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&mut self) {
        let child = self.child.as_ref().expect("running");
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }

    /// Waits for the process to end; it must exit 0.
    pub fn wait_exit_success(&mut self) {
        let mut child = self.child.take().expect("running");
        let status = wait_timeout(&mut child, Duration::from_secs(30));
        assert!(status.success(), "larder exited with {status} after SIGTERM");
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
    }

    /// Starts again on the same directory with other arguments.
    pub fn restart_with(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Starts again on the same directory with the same arguments.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        let (child, addr, memcache) = spawn(&self.dir, &self.args, &self.envs);
        self.memcache = memcache;
        self.child = Some(child);
        self.addr = addr;
    }

    /// `/_larder/stats` as JSON.
    pub fn stats(&self) -> serde_json::Value {
        let r = self.client().get("/_larder/stats");
        assert_eq!(r.status, 200);
        serde_json::from_slice(&r.body).expect("stats JSON")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("larder did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(dir: &Path, args: &[String], envs: &[(String, String)]) -> (Child, SocketAddr, Option<SocketAddr>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_larder"))
        // Nothing from the caller's environment changes what a test sees; fault injection
        // (/_larder/faults) is on, as test builds have it.
        .env_remove("LARDER_AUTH_TOKEN")
        .env_remove("RUST_LOG")
        .env("LARDER_FAULTS", "1")
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .arg("serve")
        // A free port, unless the test names its own (a cluster's nodes name each other).
        .args(if args.iter().any(|a| a == "--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn larder");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line); // kept draining so the server never blocks on stdout
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("larder did not report readiness");
    let addr = line.strip_prefix("larder listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let memcache = args.iter().any(|a| a.starts_with("--memcache-listen")).then(|| {
        let line = rx.recv_timeout(Duration::from_secs(10)).expect("larder did not report its memcached address");
        let m =
            line.strip_prefix("larder memcached protocol on ").unwrap_or_else(|| panic!("unexpected line {line:?}"));
        m.parse().unwrap()
    });
    (child, addr.parse().unwrap(), memcache)
}

/// A response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { r: BufReader::new(s.try_clone().unwrap()), w: s }
    }

    /// Sends a request and reads its response; any failure (a dropped connection included)
    /// fails the test. Use `try_request` where a closed connection is the expected outcome.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        self.try_request(method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Resp> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: larder\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            && (method == "PUT" || !body.is_empty())
        {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.w.write_all(&msg)?;
        self.read_response(method == "HEAD")
    }

    pub fn read_response(&mut self, head: bool) -> std::io::Result<Resp> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status line");
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').expect("header line");
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; if head { 0 } else { len }];
        self.r.read_exact(&mut body)?;
        Ok(Resp { status, headers, body })
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }
    pub fn put(&mut self, path: &str, body: &[u8]) -> Resp {
        self.request("PUT", path, &[], body)
    }
    pub fn delete(&mut self, path: &str) -> Resp {
        self.request("DELETE", path, &[], b"")
    }

    /// Writes raw bytes (for malformed requests).
    pub fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.w.write_all(bytes)
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Total size of the files in `dir` whose names end with `suffix`.
pub fn size_of(dir: &Path, suffix: &str) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Runs `f` while sampling the server's resident memory; returns `f`'s result and the peak
/// growth over the memory before it.
pub fn peak_growth<T>(s: &Server, f: impl FnOnce() -> T) -> (T, u64) {
    let before = s.rss();
    let (peak, done) = (std::sync::atomic::AtomicU64::new(before), std::sync::atomic::AtomicBool::new(false));
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(s.rss(), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    (out, peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(before))
}

/// A loopback port with it and the `span` after it free, for tests that run several servers
/// on consecutive ports (clusters). Below the kernel's ephemeral range (from 32768), so that
/// no outgoing connection takes one between the check and the servers' start; tests of one
/// binary running at once get different ranges.
pub fn free_ports(span: u16) -> u16 {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for i in 0..200u32 {
        let base = 20_000 + ((std::process::id() * 7 + call * 4_001 + i * 101) % 12_000) as u16;
        if (base..=base + span).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return base;
        }
    }
    panic!("no {span} free ports in a row");
}
