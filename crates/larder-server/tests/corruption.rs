//! Bytes damaged on disk while the server is stopped: the damaged key becomes a miss (never an
//! older value and never the bad bytes), every other key is intact, and a damaged tail of the
//! active volume is cut off so the server starts. The tests that need recovery to scan the
//! active volume stop the server with SIGKILL: after a graceful stop the next start loads the
//! volume's checkpoint instead, trusting it as it trusts a sealed volume's hint file, and
//! damage under it is caught when read (as in the sealed-volume test).

mod common;
use common::*;
use std::os::unix::fs::FileExt;

fn position(r: &Resp) -> (u64, u64, u64) {
    let p: Vec<u64> = r.header("x-position").unwrap().split(',').map(|n| n.parse().unwrap()).collect();
    (p[0], p[1], p[2])
}

fn flip(dir: &std::path::Path, volume: u64, at: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.join(format!("vol-{volume:05}.lrv"))).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, at).unwrap();
    for x in &mut b {
        *x ^= 0x5a;
    }
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn damaged_value_in_the_middle_is_a_miss_and_nothing_older_resurfaces() {
    let mut s = Server::start(&["--volume-size", "1MiB"]);
    let mut c = s.client();
    for i in 0..20u64 {
        assert_eq!(c.put(&format!("/k{i}"), &bytes(i, 3000)).status, 200);
    }
    // k7 gets a newer value: the damage will hit that one, and the old one must not return.
    let p = position(&c.put("/k7", &bytes(700, 3000)));
    for i in 20..30u64 {
        assert_eq!(c.put(&format!("/k{i}"), &bytes(i, 3000)).status, 200);
    }
    s.kill(); // a crash: no checkpoint is written, so recovery scans the active volume
    flip(&s.dir, p.0, p.1 + p.2 - 500);
    s.restart();
    let mut c = s.client();
    assert_eq!(c.get("/k7").status, 404);
    for i in (0..30u64).filter(|&i| i != 7) {
        assert_eq!(c.get(&format!("/k{i}")).body, bytes(i, 3000), "k{i}");
    }
    let st = s.stats();
    assert_eq!(st["recovery"]["skipped"], 1, "{st}");
    assert_eq!(st["recovery"]["truncated_bytes"], 0);
}

#[test]
fn damaged_value_in_a_sealed_volume_is_caught_on_read() {
    let mut s = Server::start(&["--volume-size", "64KiB", "--volume-count", "4"]);
    let mut c = s.client();
    let p = position(&c.put("/victim", &bytes(1, 5000)));
    for i in 0..30u64 {
        assert_eq!(c.put(&format!("/k{i}"), &bytes(i + 10, 5000)).status, 200);
    }
    assert_ne!(s.stats()["active_volume"], p.0, "victim's volume must be sealed");
    s.stop(); // hints are written; recovery will trust them and not read the values
    flip(&s.dir, p.0, p.1 + p.2 - 100);
    s.restart();
    let mut c = s.client();
    assert_eq!(c.get("/victim").status, 404);
    assert_eq!(s.stats()["corrupt_reads"], 1);
    for i in 0..30u64 {
        let r = c.get(&format!("/k{i}"));
        assert!(r.status == 404 || r.body == bytes(i + 10, 5000), "k{i}");
    }
    assert_eq!(c.get("/k29").body, bytes(39, 5000));
}

#[test]
fn damaged_last_record_is_truncated_and_the_server_starts() {
    let mut s = Server::start(&[]);
    let mut c = s.client();
    for i in 0..10u64 {
        assert_eq!(c.put(&format!("/k{i}"), &bytes(i, 2000)).status, 200);
    }
    let last = position(&c.put("/last", &bytes(99, 2000)));
    s.kill();
    flip(&s.dir, last.0, last.1 + 60);
    s.restart();
    let mut c = s.client();
    assert_eq!(c.get("/last").status, 404);
    for i in 0..10u64 {
        assert_eq!(c.get(&format!("/k{i}")).body, bytes(i, 2000));
    }
    let st = s.stats();
    assert!(st["recovery"]["truncated_bytes"].as_u64().unwrap() >= last.2, "{st}");
    assert_eq!(std::fs::metadata(s.dir.join("vol-00000.lrv")).unwrap().len(), last.1);
    // Writing continues where the valid data ends.
    assert_eq!(position(&c.put("/after", b"x")).1, last.1);
    assert_eq!(c.get("/after").body, b"x");
}
