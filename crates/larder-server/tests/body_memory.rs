//! Request bodies held in memory are bounded across connections (`--max-body-memory`): past
//! the budget a request waits before its body is read (backpressure), it is never dropped or
//! refused for load. A thousand clients uploading 1 MiB each, slowly, at once, would
//! otherwise hold a GiB. Its own test binary, so that no other test's server shares the
//! machine's memory while this one is measured.

mod common;
use common::{bytes, Server};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const CLIENTS: usize = 1000;
const VALUE: usize = 1 << 20;
const BUDGET: u64 = 64 << 20;

/// Uploads `value` in 64 KiB pieces, `pause` apart; returns the status.
fn slow_upload(addr: std::net::SocketAddr, key: &str, value: &[u8], pause: Duration) -> u16 {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut w = s.try_clone().unwrap();
    write!(w, "PUT {key} HTTP/1.1\r\nHost: larder\r\nContent-Length: {}\r\n\r\n", value.len()).unwrap();
    for piece in value.chunks(64 << 10) {
        w.write_all(piece).unwrap();
        std::thread::sleep(pause);
    }
    let mut status = String::new();
    BufReader::new(s).read_line(&mut status).unwrap();
    status.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status line")
}

#[test]
fn a_thousand_slow_uploads_stay_within_the_body_budget_and_all_are_stored() {
    // Room for the test's own sockets besides the server's.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur = lim.rlim_max.min(65536);
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };

    let budget = BUDGET.to_string();
    let s = Server::start(&[
        "--fsync",
        "never",
        "--memory-capacity",
        "0",
        "--volume-size",
        "256MiB",
        "--volume-count",
        "8",
        "--max-body-memory",
        &budget,
    ]);
    let mut c = s.client();
    assert_eq!(c.put("/warm", &bytes(0, VALUE)).status, 200);
    let idle = s.rss();

    let values: Vec<Vec<u8>> = (0..8).map(|i| bytes(i + 1, VALUE)).collect();
    let peak = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(s.rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let uploads: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (addr, value) = (s.addr, &values[i % values.len()]);
                std::thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn_scoped(scope, move || {
                        slow_upload(addr, &format!("/up/{i}"), value, Duration::from_millis(10))
                    })
                    .expect("spawn an uploader")
            })
            .collect();
        for (i, u) in uploads.into_iter().enumerate() {
            assert_eq!(u.join().unwrap(), 200, "upload {i}");
        }
        done.store(true, Ordering::Relaxed);
    });
    let peak = peak.into_inner();
    eprintln!("idle RSS {} MiB, peak {} MiB, budget {} MiB", idle >> 20, peak >> 20, BUDGET >> 20);
    assert!(peak < BUDGET + idle + (64 << 20), "peak RSS {} MiB over budget + idle + 64 MiB", peak >> 20);
    for i in [0, 1, 499, 998, 999] {
        let r = c.get(&format!("/up/{i}"));
        assert!(r.status == 200 && r.body == values[i % values.len()], "upload {i} stored wrong");
    }
    assert_eq!(s.stats()["puts"].as_u64().unwrap(), CLIENTS as u64 + 1);
}

/// A PUT waiting for room moves no bytes, for longer than the idle timeout here: the server is
/// the one holding it up, so its connection stays open and the PUT is stored once room frees.
#[test]
fn a_put_waiting_for_room_outlasts_the_idle_timeout() {
    let s = Server::start(&["--fsync", "never", "--idle-timeout", "1s", "--max-body-memory", "1MiB"]);
    let value = bytes(9, VALUE);
    std::thread::scope(|scope| {
        // Holds the whole budget for about 3 s: 16 pieces, 200 ms apart.
        let first = scope.spawn(|| slow_upload(s.addr, "/first", &value, Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(300));
        // Sends its headers and body at once, then waits for room for over 2 s.
        let mut c = s.client();
        let r = c.put("/second", &value);
        assert_eq!(r.status, 200, "the waiting PUT was not stored");
        assert_eq!(first.join().unwrap(), 200);
    });
    let mut c = s.client();
    assert!(c.get("/second").body == value && c.get("/first").body == value);
}
