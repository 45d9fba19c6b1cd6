//! What a hostile client can make the server hold, and for how long, on every door: memory is
//! charged to `--max-body-memory` as bytes arrive (never for a length only declared), and each
//! unit of input has a total deadline (a head or command line, a body or data block at the
//! minimum rate). Its own test binary, so that no other test's server shares the machine's
//! memory while this one is measured.

mod common;

use common::{peak_growth, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const CROWD: usize = 100;
const BUDGET: u64 = 8 << 20;
/// What the server may hold beyond the budget for a crowd of a hundred connections: their
/// fixed per-connection buffers (32 KiB of input each, answers, task state) and allocator slack.
const ALLOWANCE: u64 = 24 << 20;

fn server() -> Server {
    Server::start(&[
        "--memcache-listen",
        "127.0.0.1:0",
        "--max-body-memory",
        "8MiB",
        "--header-timeout",
        "3s",
        "--min-body-rate",
        "64KiB",
        "--fsync",
        "never",
    ])
}

/// Opens `n` connections to `addr`, each sending `first` and then one byte of `more` every
/// `every`, until the server closes it or `until` passes. Returns how many the server closed,
/// and when the last was closed (from the start).
fn trickle(addr: SocketAddr, n: usize, first: &[u8], more: u8, every: Duration, until: Duration) -> (usize, Duration) {
    let start = Instant::now();
    let conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let c = TcpStream::connect(addr).unwrap();
            c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            c.set_nonblocking(false).unwrap();
            c
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                scope.spawn(move || {
                    if c.write_all(first).is_err() {
                        return Some(start.elapsed());
                    }
                    while start.elapsed() < until {
                        std::thread::sleep(every);
                        if c.write_all(&[more]).is_err() || closed(&c) {
                            return Some(start.elapsed());
                        }
                    }
                    None
                })
            })
            .collect();
        let ends: Vec<Duration> = handles.into_iter().filter_map(|h| h.join().unwrap()).collect();
        (ends.len(), ends.into_iter().max().unwrap_or_default())
    })
}

/// Whether the server closed the connection (an answer before the close is read past).
fn closed(c: &TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let gone = loop {
        match (&*c).read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    c.set_nonblocking(false).unwrap();
    gone
}

/// An unrelated 100 KB PUT, timed.
fn unrelated_put(addr: SocketAddr, key: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut c = common::Client::connect(addr);
    let status = c.put(key, &common::bytes(7, 100_000)).status;
    (status, started.elapsed())
}

/// The hostile crowd's shapes, one per door it applies to: what each connection sends first,
/// and the byte it then trickles.
fn crowds(s: &Server) -> Vec<(&'static str, SocketAddr, Vec<u8>, u8)> {
    let mc = s.memcache.unwrap();
    let mut long_get = b"get ".to_vec();
    while long_get.len() < (2 << 20) - 64 {
        long_get.extend_from_slice(b"key-of-some-length ");
    }
    let mut binary_set = vec![0x80, 0x01, 0, 1, 8, 0, 0, 0];
    binary_set.extend_from_slice(&(1 + 8 + 500_000u32).to_be_bytes());
    binary_set.extend_from_slice(&[0; 12]);
    binary_set.extend_from_slice(&[0; 8]);
    binary_set.push(b'k');
    vec![
        ("memcached: 2 MiB partial get lines", mc, long_get, b'k'),
        ("memcached: trickled data blocks", mc, b"set big 0 0 1000000\r\n".to_vec(), b'x'),
        ("memcached binary: trickled set bodies", mc, binary_set, b'x'),
        ("memcached: a trickled command line", mc, b"get ".to_vec(), b'k'),
        (
            "HTTP: trickled bodies",
            s.addr,
            b"PUT /slow HTTP/1.1\r\nHost: l\r\nContent-Length: 1000000\r\n\r\n".to_vec(),
            b'x',
        ),
        ("HTTP: a trickled head", s.addr, b"GET /slow HTTP/1.1\r\nHost: l\r\n".to_vec(), b'x'),
        (
            "WebDAV: trickled PROPFIND bodies",
            s.addr,
            b"PROPFIND / HTTP/1.1\r\nHost: l\r\nDepth: 0\r\nContent-Length: 60000\r\n\r\n".to_vec(),
            b' ',
        ),
    ]
}

#[test]
fn hostile_crowds_on_every_door_stay_within_the_budget_are_closed_by_their_deadlines_and_others_are_served() {
    let s = server();
    let mut c = s.client();
    assert_eq!(c.put("/warm", &common::bytes(1, 100_000)).status, 200);
    for (i, (what, addr, first, more)) in crowds(&s).into_iter().enumerate() {
        let ((closed, last, put), growth) = peak_growth(&s, || {
            std::thread::scope(|scope| {
                let crowd = scope
                    .spawn(|| trickle(addr, CROWD, &first, more, Duration::from_millis(500), Duration::from_secs(30)));
                // While they trickle (their first bytes are in), someone else stores a value.
                std::thread::sleep(Duration::from_millis(700));
                let put = unrelated_put(s.addr, &format!("/unrelated/{i}"));
                let (closed, last) = crowd.join().unwrap();
                (closed, last, put)
            })
        });
        eprintln!(
            "{what}: RSS growth {} MiB, {closed} closed, the last after {last:?}; unrelated PUT {put:?}",
            growth >> 20
        );
        assert_eq!(put.0, 200, "{what}: the unrelated PUT");
        assert!(put.1 < Duration::from_secs(2), "{what}: the unrelated PUT took {:?}", put.1);
        assert_eq!(closed, CROWD, "{what}: every trickling client is closed by its deadline");
        // The deadlines here: a head in 3 s; a body at 64 KiB/s after a 5 s grace.
        assert!(last < Duration::from_secs(15), "{what}: the last was closed after {last:?}");
        assert!(growth < BUDGET + ALLOWANCE, "{what}: RSS grew {} MiB", growth >> 20);
        let r = c.get(&format!("/unrelated/{i}"));
        assert_eq!((r.status, r.body.len()), (200, 100_000));
    }
    assert_eq!(s.stats()["keys"], 1 + 7, "no trickled value was stored");
    let closes = &s.stats()["deadline_closes"];
    assert!(closes["http"]["body"].as_u64().unwrap() >= CROWD as u64, "{closes}");
    assert!(closes["memcache_text"]["body"].as_u64().unwrap() >= CROWD as u64, "{closes}");
    assert!(closes["memcache_text"]["head"].as_u64().unwrap() >= CROWD as u64, "{closes}");
    assert!(closes["memcache_binary"]["body"].as_u64().unwrap() >= CROWD as u64, "{closes}");
}

#[test]
fn a_body_trickled_through_the_proxy_is_cut_at_its_deadline_and_others_are_served() {
    let o = common::origin::Origin::start();
    o.set("/form", common::origin::Answer::ok(b"posted", &[]));
    o.set("/page", common::origin::Answer::ok(b"page", &[("cache-control", "max-age=60")]));
    let url = o.url();
    let s = Server::start(&["--origin", &url, "--min-body-rate", "64KiB"]);
    let started = Instant::now();
    let statuses: Vec<String> = std::thread::scope(|scope| {
        let crowd: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    let mut c = TcpStream::connect(s.addr).unwrap();
                    // Each wait for an answer is also the pause between two trickled bytes.
                    c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
                    c.write_all(b"POST /form HTTP/1.1\r\nHost: example.org\r\nContent-Length: 100000\r\n\r\nx")
                        .unwrap();
                    let mut answer = [0u8; 64];
                    let n = loop {
                        match c.read(&mut answer) {
                            Ok(n) => break n,
                            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                                if c.write_all(b"x").is_err() {
                                    break 0;
                                }
                            }
                            Err(_) => break 0,
                        }
                    };
                    String::from_utf8_lossy(&answer[..n]).lines().next().unwrap_or("").to_string()
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let mut c = s.client();
        let t = Instant::now();
        let r = c.get("/page");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"page"[..]));
        assert!(t.elapsed() < Duration::from_secs(2), "a GET meanwhile took {:?}", t.elapsed());
        crowd.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    eprintln!("20 trickled POSTs through the proxy: {statuses:?} after {took:?}");
    assert!(took < Duration::from_secs(15), "closed after {took:?}");
    assert!(statuses.iter().all(|l| l.starts_with("HTTP/1.1 408")), "{statuses:?}");
    assert_eq!(s.stats()["deadline_closes"]["proxy"]["body"], 20);
    assert!(o.seen("/form").iter().all(|r| r.body.len() < 100_000), "no trickled body reached the origin whole");
}

/// A command's data block holds room in the budget; the next command of the same pipeline must
/// not start out holding it (a get of a large value waits for room of its own: with the room
/// of the set before it still held, a small budget would wait on itself forever).
#[test]
fn pipelined_commands_never_wait_on_the_room_of_the_one_before() {
    let s = Server::start(&["--memcache-listen", "127.0.0.1:0", "--max-body-memory", "64KiB", "--chunk-size", "64KiB"]);
    let big = common::bytes(3, 300_000);
    assert_eq!(s.client().put("/big", &big).status, 200);
    let mut m = TcpStream::connect(s.memcache.unwrap()).unwrap();
    m.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut batch = b"set k 0 0 40000\r\n".to_vec();
    batch.extend_from_slice(&[b'v'; 40000]);
    batch.extend_from_slice(b"\r\nget big\r\n");
    m.write_all(&batch).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while !got.ends_with(b"END\r\n") {
        let n = m.read(&mut buf).expect("answered, not stuck waiting for room");
        assert!(n > 0, "closed");
        got.extend_from_slice(&buf[..n]);
    }
    let head = b"STORED\r\nVALUE big 0 300000\r\n";
    assert!(got.starts_with(head));
    assert_eq!(&got[head.len()..head.len() + big.len()], &big[..]);
}

#[test]
fn declared_lengths_over_the_limit_are_answered_at_once_and_never_read() {
    let s = Server::start(&["--memcache-listen", "127.0.0.1:0", "--max-value-size", "1MiB"]);
    let mut m = TcpStream::connect(s.memcache.unwrap()).unwrap();
    m.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let ask = |m: &mut TcpStream, bytes: &[u8], want: &str| {
        m.write_all(bytes).unwrap();
        let mut got = vec![0u8; want.len()];
        m.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8_lossy(&got), want, "{}", String::from_utf8_lossy(bytes));
    };
    // Past memcached's own bound: a bad line, at once; what follows is read as commands.
    ask(&mut m, b"set k 0 0 2147483647\r\nab\r\n", "CLIENT_ERROR bad command line format\r\nERROR\r\n");
    ask(&mut m, b"ms k 2147483647\r\n", "CLIENT_ERROR bad command line format\r\n");
    // Past the value limit: answered before the data is sent (which is then read past).
    ask(&mut m, b"set k 0 0 2000000\r\n", "SERVER_ERROR object too large for cache\r\n");
    m.write_all(&vec![b'x'; 2_000_000]).unwrap();
    ask(&mut m, b"\r\nmn\r\n", "MN\r\n");
    // The binary protocol's limit is the chunk size (docs/MEMCACHED.md): one byte more is
    // "too large", answered at once, and not stored.
    let mut b = TcpStream::connect(s.memcache.unwrap()).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let value = 1usize << 20;
    let mut p = vec![0x80, 0x01, 0, 1, 8, 0, 0, 0];
    p.extend_from_slice(&((1 + 8 + value + 1) as u32).to_be_bytes());
    p.extend_from_slice(&[0; 12]);
    p.extend_from_slice(&[0; 8]);
    p.push(b'k');
    b.write_all(&p).unwrap();
    let mut head = [0u8; 24];
    b.read_exact(&mut head).unwrap();
    assert_eq!(u16::from_be_bytes([head[6], head[7]]), 0x03, "too large, before the value is sent");
    let mut c = s.client();
    assert_eq!(c.get("/k").status, 404);
}
