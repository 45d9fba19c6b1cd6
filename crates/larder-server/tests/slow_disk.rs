//! The server on a slow disk: reads of files under the data directory are held for a while
//! by the fault layer (`read delay ms=N` through `/_larder/faults`), as a cold page on a busy
//! device would be. Two promises must hold there, which a fast page cache hides:
//! - a GET sent after a PUT's or DELETE's `200` never answers the older value, even while a
//!   read of that older value, begun before the write, is still in the air;
//! - nothing slow runs on the async workers: DELETEs that must read a record first and stats
//!   and metrics requests leave memory hits answering at once.

mod common;
use common::{bytes, Server};
use std::time::{Duration, Instant};

fn body(r: &common::Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// A server whose async runtime has two workers, as on a two-core machine, whatever the
/// machine: work that blocks a worker shows up as stalled requests there.
fn server(args: &[&str]) -> (tempfile::TempDir, Server) {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_env(&tmp.path().join("data"), args, &[("TOKIO_WORKER_THREADS", "2")]);
    (tmp, s)
}

/// Waits until at least `n` operations are held by the delay rule (a read is in the air).
fn wait_delayed(s: &Server, n: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let r = s.client().get("/_larder/faults");
        let held: usize = body(&r).trim().strip_prefix("delayed ").and_then(|v| v.parse().ok()).expect("delayed N");
        if held >= n {
            return;
        }
        assert!(Instant::now() < until, "no read was held by the delay");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_get_after_a_write_never_answers_the_value_a_read_in_the_air_is_fetching() {
    let (_tmp, s) = server(&["--fsync", "never"]);
    let (old, new) = (bytes(1, 256 << 10), bytes(2, 256 << 10));
    let mut c = s.client();
    assert_eq!(c.put("/k", &old).status, 200);
    assert_eq!(c.put("/d", &old).status, 200);
    s.fault(Some("read delay ms=1500"));

    // PUT: a first GET reads the old value slowly; the PUT is acknowledged meanwhile; a GET
    // sent after that must answer the new value.
    let first = {
        let mut c = s.client();
        std::thread::spawn(move || c.get("/k"))
    };
    wait_delayed(&s, 1); // the first GET's read is in the air
    assert_eq!(c.put("/k", &new).status, 200);
    let after = s.client().get("/k");
    assert_eq!(after.status, 200);
    assert!(after.body == new, "a GET after the PUT's 200 answered the older value");
    let first = first.join().unwrap();
    assert!(first.status == 200 && (first.body == old || first.body == new));

    // DELETE: the same, and the answer is 404.
    let first = {
        let mut c = s.client();
        std::thread::spawn(move || c.get("/d"))
    };
    wait_delayed(&s, 1);
    let r = c.delete("/d");
    assert_eq!(r.status, 200, "{}", body(&r));
    let after = s.client().get("/d");
    assert_eq!(after.status, 404, "a GET after the DELETE's 200 answered the deleted value");
    assert_eq!(first.join().unwrap().status, 200);
    s.fault(None);
    assert_eq!(s.client().get("/k").body, new);
}

#[test]
fn deletes_and_stats_on_a_slow_disk_never_hold_up_memory_hits() {
    let (_tmp, s) = server(&["--fsync", "never", "--promote-after", "1"]);
    let mut c = s.client();
    assert_eq!(c.put("/hot", b"in memory").status, 200);
    c.get("/hot");
    assert_eq!(c.get("/hot").header("x-cache"), Some("MEMC"));
    for i in 0..200 {
        assert_eq!(c.put(&format!("/del/{i}"), &bytes(i, 4096)).status, 200);
    }
    // Every read of a record, and every look at the free space (stats), now takes 300 ms.
    s.fault(Some("read delay ms=300"));
    let until = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|scope| {
        for part in 0..2 {
            let mut c = s.client();
            scope.spawn(move || {
                let mut i = part;
                while Instant::now() < until && i < 200 {
                    assert_eq!(c.delete(&format!("/del/{i}")).status, 200);
                    i += 2;
                }
            });
        }
        let mut admin = s.client();
        scope.spawn(move || {
            while Instant::now() < until {
                assert_eq!(admin.get("/_larder/stats").status, 200);
                assert_eq!(admin.get("/_larder/metrics").status, 200);
            }
        });
        let mut slowest = Duration::ZERO;
        let mut hits = 0;
        while Instant::now() < until {
            let t = Instant::now();
            let r = c.get("/hot");
            slowest = slowest.max(t.elapsed());
            assert_eq!((r.status, r.header("x-cache")), (200, Some("MEMC")));
            hits += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(slowest < Duration::from_millis(50), "a memory hit took {slowest:?} (of {hits})");
    });
    s.fault(None);
    assert!(s.stats()["deletes"].as_u64().unwrap() >= 2, "the DELETEs ran meanwhile");
}
