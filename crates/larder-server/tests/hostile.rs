//! Hostile and broken clients: short bodies, bad escapes, request smuggling, pipelining,
//! crowds of idle connections and the connection limit. (Header and URI limits and the
//! slow-header and idle timeouts are in api.rs.)

mod common;
use common::Server;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

/// Everything the server sends until it closes the connection (or `limit` passes).
fn read_all(c: &mut TcpStream, limit: Duration) -> (String, bool) {
    c.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    let closed = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ").map(|(i, _)| text[i + 9..i + 12].parse().unwrap()).collect()
}

#[test]
fn a_body_shorter_than_its_content_length_stores_nothing() {
    let s = Server::start(&["--idle-timeout", "2s"]);
    // The client gives up half way (closes its side).
    let mut c = connect(&s);
    c.write_all(b"PUT /cut HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n").unwrap();
    c.write_all(&[b'a'; 500]).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let (answer, closed) = read_all(&mut c, Duration::from_secs(10));
    assert!(closed);
    assert!(!answer.contains(" 200 "), "a cut body was acknowledged: {answer}");
    // The client stalls half way: the idle timeout ends it.
    let mut c = connect(&s);
    c.write_all(b"PUT /stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n").unwrap();
    c.write_all(&[b'b'; 999]).unwrap();
    let started = Instant::now();
    let (answer, closed) = read_all(&mut c, Duration::from_secs(10));
    assert!(closed && started.elapsed() < Duration::from_secs(8), "stalled upload not closed");
    assert!(!answer.contains(" 200 "), "{answer}");
    let mut client = s.client();
    assert_eq!(client.get("/cut").status, 404);
    assert_eq!(client.get("/stalled").status, 404);
    assert_eq!(s.stats()["keys"], 0);
}

#[test]
fn invalid_percent_encoding_is_400_on_every_method() {
    let s = Server::start(&[]);
    let mut c = s.client();
    for path in ["/bad%zz", "/trailing%", "/half%4", "/%g0", "/ok/%%41"] {
        for method in ["GET", "HEAD", "PUT", "DELETE"] {
            let r = c.request(method, path, &[], if method == "PUT" { b"v" } else { b"" });
            assert_eq!(r.status, 400, "{method} {path}");
        }
    }
    assert_eq!(s.stats()["keys"], 0);
}

#[test]
fn content_length_with_transfer_encoding_never_runs_a_smuggled_request() {
    let s = Server::start(&[]);
    let mut c = connect(&s);
    // Per RFC 9112 §6.1 the body is the chunked one ("hello"); what follows it must not be
    // taken as a second request on this connection, which is closed after the answer.
    c.write_all(
        b"PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\nDELETE /victim HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let (answer, closed) = read_all(&mut c, Duration::from_secs(10));
    assert!(closed, "connection left open after a request with both framings");
    let st = statuses(&answer);
    assert_eq!(st.len(), 1, "more than one answer: {answer}");
    assert!(st[0] == 200 || st[0] == 400, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    let mut client = s.client();
    if st[0] == 200 {
        assert_eq!(client.get("/k").body, b"hello", "processed by Transfer-Encoding alone");
    }
    // The smuggled DELETE never ran.
    assert_eq!(client.put("/victim", b"x").status, 200);
    let mut c = connect(&s);
    c.write_all(
        b"PUT /k2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n\
          0\r\n\r\nDELETE /victim HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let (answer, closed) = read_all(&mut c, Duration::from_secs(10));
    assert!(closed && statuses(&answer).len() == 1, "{answer}");
    assert_eq!(client.get("/victim").status, 200, "a smuggled DELETE ran");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let s = Server::start(&[]);
    let mut c = connect(&s);
    let mut batch = Vec::new();
    batch.extend_from_slice(b"PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none");
    batch.extend_from_slice(b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n");
    batch.extend_from_slice(b"PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo");
    batch.extend_from_slice(b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n");
    batch.extend_from_slice(b"DELETE /p HTTP/1.1\r\nHost: x\r\n\r\n");
    batch.extend_from_slice(b"GET /p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    c.write_all(&batch).unwrap();
    let (answer, closed) = read_all(&mut c, Duration::from_secs(10));
    assert!(closed);
    assert_eq!(statuses(&answer), vec![200, 200, 200, 200, 200, 404], "{answer}");
    let one = answer.find("\r\n\r\none").expect("first GET body");
    let two = answer.find("\r\n\r\ntwo").expect("second GET body");
    assert!(one < two, "{answer}");
}

/// Opens `n` connections that never send a byte.
fn idle_crowd(s: &Server, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| connect(s)).collect()
}

/// Whether the server has closed `c` (EOF or reset within `wait`).
fn was_closed(c: &TcpStream, wait: Duration) -> bool {
    c.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 1];
    let mut r = c;
    match r.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

#[test]
fn eight_hundred_idle_connections_do_not_delay_a_new_client() {
    let s = Server::start(&[]);
    let mut crowd = idle_crowd(&s, 800);
    // Half of them have made a request and are idle in keep-alive.
    for c in crowd.iter_mut().take(400) {
        c.write_all(b"GET /_larder/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    }
    for c in crowd.iter_mut().take(400) {
        let mut buf = [0u8; 512];
        assert!(c.read(&mut buf).unwrap() > 0);
    }
    let started = Instant::now();
    let mut c = s.client();
    assert_eq!(c.put("/fresh", b"value").status, 200);
    assert_eq!(c.get("/fresh").body, b"value");
    let took = started.elapsed();
    println!("new client served in {took:?} beside 800 idle connections");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn past_the_limit_never_used_connections_go_first_then_idle_ones_then_refuse() {
    let s = Server::start(&["--max-connections", "20"]);
    // 10 connections that made a request and wait in keep-alive, then 10 never used.
    let mut used: Vec<TcpStream> = idle_crowd(&s, 10);
    for c in &mut used {
        c.write_all(b"GET /_larder/health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 512];
        assert!(c.read(&mut buf).unwrap() > 0);
    }
    std::thread::sleep(Duration::from_millis(100));
    let never = idle_crowd(&s, 10);
    // Only connections quiet for a second are closed for a newcomer.
    std::thread::sleep(Duration::from_millis(1300));
    // The limit is reached: each new client is served, and a never-used one makes room.
    let mut newcomers = Vec::new();
    for i in 0..5 {
        let mut c = s.client();
        assert_eq!(c.put(&format!("/k{i}"), b"v").status, 200);
        newcomers.push(c); // stays open and idle, counted against the limit
    }
    let closed_never = never.iter().filter(|c| was_closed(c, Duration::from_millis(300))).count();
    let closed_used = used.iter().filter(|c| was_closed(c, Duration::from_millis(50))).count();
    assert_eq!((closed_never, closed_used), (5, 0), "never-used connections are closed first");
    // Connections busy with a request (headers begun) are never closed to make room; with
    // every one busy, a new client gets a 503.
    std::thread::sleep(Duration::from_millis(1300)); // the newcomers are quiet now too
    let mut busy = Vec::new();
    for _ in 0..30 {
        let mut c = connect(&s);
        c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n").unwrap();
        busy.push(c);
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut late = connect(&s);
    let (answer, closed) = read_all(&mut late, Duration::from_secs(5));
    assert!(closed, "{answer}");
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("too many connections"), "{answer:?}");
    // The 15 quiet ones made room for 15 busy ones, and no busy one was closed for another;
    // the other busy ones were refused.
    let mut refused = 0;
    for c in &mut busy {
        let (answer, closed) = read_all(c, Duration::from_millis(100));
        if closed {
            assert!(answer.starts_with("HTTP/1.1 503"), "a busy connection was closed: {answer:?}");
            refused += 1;
        } else {
            assert!(answer.is_empty(), "{answer:?}");
        }
    }
    assert_eq!(refused, 10, "busy connections refused");
}
