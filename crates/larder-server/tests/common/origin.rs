//! A test origin whose answers a test scripts: for each path, a status, header fields, a body
//! and a delay; it records every request it receives (header values as the bytes sent), and
//! can hold the answers to a path until the test releases them. HTTP/1.1 with keep-alive, one
//! thread per connection, on loopback.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One scripted answer.
#[derive(Clone, Default)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
    /// Answer 304 (with these headers) to a request carrying If-None-Match or If-Modified-Since.
    pub not_modified: Option<Vec<(String, String)>>,
}

impl Answer {
    pub fn ok(body: &[u8], headers: &[(&str, &str)]) -> Answer {
        Answer::with(200, body, headers)
    }

    pub fn with(status: u16, body: &[u8], headers: &[(&str, &str)]) -> Answer {
        Answer {
            status,
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: body.to_vec(),
            ..Answer::default()
        }
    }
}

/// A request as the origin received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// Names and values as received (a value need not be UTF-8).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// The first value of `name`, if it is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of `name`, as received.
    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }
}

#[derive(Default)]
struct State {
    answers: HashMap<String, Answer>,
    seen: Vec<Seen>,
    connections: usize,
    /// Targets whose answers wait for `Origin::release`.
    held: HashSet<String>,
}

/// How long a held answer waits at most, so that a test that never releases still ends.
const HOLD_LIMIT: Duration = Duration::from_secs(30);

pub struct Origin {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Signalled when a hold is released.
    released: Arc<Condvar>,
    stop: Arc<AtomicBool>,
}

impl Origin {
    pub fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let released = Arc::new(Condvar::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, rel, sp) = (state.clone(), released.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                st.lock().unwrap().connections += 1;
                let (st, rel, sp) = (st.clone(), rel.clone(), sp.clone());
                std::thread::spawn(move || serve(conn, st, rel, sp));
            }
        });
        Origin { addr, state, released, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Scripts the answer for `target` (path and query).
    pub fn set(&self, target: &str, a: Answer) {
        self.state.lock().unwrap().answers.insert(target.to_string(), a);
    }

    /// Holds the answers to `target`: a request for it is recorded (see `seen`) and then waits,
    /// before its scripted answer is read, until `release` (at most 30 s). A test knows a
    /// request reached the origin, and has it wait for as long as it needs, without sleeping.
    pub fn hold(&self, target: &str) {
        self.state.lock().unwrap().held.insert(target.to_string());
    }

    /// Lets the requests held for `target` be answered, with the answer scripted by then.
    pub fn release(&self, target: &str) {
        self.state.lock().unwrap().held.remove(target);
        self.released.notify_all();
    }

    /// Requests received for `target`.
    pub fn seen(&self, target: &str) -> Vec<Seen> {
        self.state.lock().unwrap().seen.iter().filter(|s| s.target == target).cloned().collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    pub fn count(&self, target: &str) -> usize {
        self.seen(target).len()
    }

    /// Stops answering: new connections are refused (the listener closes).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.state.lock().unwrap().held.clear();
        self.released.notify_all();
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(conn: TcpStream, state: Arc<Mutex<State>>, released: Arc<Condvar>, stop: Arc<AtomicBool>) {
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).unwrap_or(0) == 0 || stop.load(Ordering::Relaxed) {
            return;
        }
        let line = String::from_utf8_lossy(&line);
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = Vec::new();
        loop {
            let mut h = Vec::new();
            if r.read_until(b'\n', &mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_ascii_end();
            if h.is_empty() {
                break;
            }
            if let Some(colon) = h.iter().position(|&b| b == b':') {
                let name = String::from_utf8_lossy(&h[..colon]).trim().to_string();
                headers.push((name, h[colon + 1..].trim_ascii().to_vec()));
            }
        }
        let len = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let seen = Seen { method: method.clone(), target: target.clone(), headers, body };
        let conditional = seen.header("if-none-match").is_some() || seen.header("if-modified-since").is_some();
        let answer = {
            let mut s = state.lock().unwrap();
            s.seen.push(seen);
            let deadline = std::time::Instant::now() + HOLD_LIMIT;
            while s.held.contains(&target) {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                s = released.wait_timeout(s, left).unwrap().0;
            }
            s.answers.get(&target).cloned()
        };
        let mut a = answer.unwrap_or_else(|| Answer::with(404, b"no such path\n", &[]));
        std::thread::sleep(a.delay);
        if let (true, Some(h)) = (conditional, a.not_modified.clone()) {
            a = Answer { status: 304, headers: h, body: Vec::new(), ..Answer::default() };
        }
        let mut out = format!("HTTP/1.1 {} X\r\n", a.status);
        for (n, v) in &a.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        let bodyless = method == "HEAD" || a.status == 304 || a.status == 204;
        if a.status != 304 && a.status != 204 {
            out.push_str(&format!("content-length: {}\r\n", a.body.len()));
        }
        out.push_str("\r\n");
        if w.write_all(out.as_bytes()).is_err() || (!bodyless && w.write_all(&a.body).is_err()) {
            return;
        }
    }
}

/// An HTTP date `secs_ago` seconds before now (negative: in the future).
pub fn http_date(secs_ago: i64) -> String {
    let now = std::time::SystemTime::now();
    let t = if secs_ago >= 0 {
        now - Duration::from_secs(secs_ago as u64)
    } else {
        now + Duration::from_secs((-secs_ago) as u64)
    };
    httpdate::fmt_http_date(t)
}
