//! The ring: the oldest volume is reused first, disk use stays bounded, and data from an
//! earlier turn of a slot never comes back, not even after a restart.

mod common;
use common::*;

#[test]
fn oldest_volume_is_evicted_first() {
    let s = Server::start(&["--volume-size", "1MiB", "--volume-count", "2"]);
    let mut c = s.client();
    let (a, b, cc) = (bytes(1, 700 << 10), bytes(2, 700 << 10), bytes(3, 700 << 10));
    assert_eq!(c.put("/a", &a).status, 200);
    assert_eq!(c.put("/b", &b).status, 200);
    assert_eq!(c.put("/c", &cc).status, 200);
    assert_eq!(c.get("/a").status, 404, "a lived in the slot c reused");
    assert_eq!(c.get("/b").body, b);
    assert_eq!(c.get("/c").body, cc);
}

#[test]
fn disk_use_stays_within_the_ring() {
    let s = Server::start(&["--volume-size", "1MiB", "--volume-count", "2"]);
    let mut c = s.client();
    let cap = 2u64 << 20;
    // About 5x the ring's capacity in small values.
    for i in 0..2500u32 {
        assert_eq!(c.put(&format!("/small/{i}"), &bytes(i as u64, 4000)).status, 200);
        if i % 250 == 0 {
            assert!(size_of(&s.dir, ".lrv") <= cap);
        }
    }
    let volumes = size_of(&s.dir, ".lrv");
    let all = size_of(&s.dir, "");
    assert!(volumes <= cap, "volume files use {volumes} > {cap}");
    // Hint files are an index: 24 bytes per record, here well under 1% of the volumes.
    assert!(all <= cap + cap / 100, "data directory uses {all}");
    assert_eq!(s.stats()["bytes_used"].as_u64(), Some(volumes));
    // The newest values are all there.
    for i in 2400..2500u32 {
        assert_eq!(c.get(&format!("/small/{i}")).body, bytes(i as u64, 4000));
    }
}

#[test]
fn earlier_turns_never_come_back_after_restart() {
    let mut s = Server::start(&["--volume-size", "64KiB", "--volume-count", "3"]);
    let mut c = s.client();
    // Turn 1: keys old/0..; then enough new keys to turn the ring twice more.
    for i in 0..40u32 {
        assert_eq!(c.put(&format!("/old/{i}"), &bytes(i as u64, 1000)).status, 200);
    }
    for i in 0..400u32 {
        assert_eq!(c.put(&format!("/new/{i}"), &bytes(1000 + i as u64, 1000)).status, 200);
    }
    let turned = s.stats()["rotations"].as_u64().unwrap();
    assert!(turned >= 6, "the ring turned {turned} times");
    for stop in ["term", "kill"] {
        if stop == "term" {
            s.stop()
        } else {
            s.kill()
        }
        s.restart();
        let mut c = s.client();
        for i in 0..40u32 {
            assert_eq!(c.get(&format!("/old/{i}")).status, 404, "old/{i} came back after {stop}");
        }
        let mut live = 0;
        for i in 0..400u32 {
            let r = c.get(&format!("/new/{i}"));
            if r.status == 200 {
                assert_eq!(r.body, bytes(1000 + i as u64, 1000));
                live += 1;
            }
        }
        assert!(live >= 100, "only {live} recent keys survived");
        assert!((390..400).all(|i| c.get(&format!("/new/{i}")).status == 200));
    }
}
