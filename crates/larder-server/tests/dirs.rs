//! Several `--data-dir`s in one server: volumes spread over both, a directory failing under
//! load (the fault endpoint) answers 503 for its keys while the other serves and takes every
//! write, stats report each directory, and `larder check` verifies them together.

mod common;
use common::{bytes, Server};
use std::path::Path;

/// Which directory holds the data of volume `slot`: 0 or 1.
fn dir_of(dirs: [&Path; 2], slot: u64) -> usize {
    let len = |d: &Path| std::fs::metadata(d.join(format!("vol-{slot:05}.lrv"))).map_or(0, |m| m.len());
    let holds: Vec<usize> = (0..2).filter(|&i| len(dirs[i]) > 64).collect();
    assert_eq!(holds.len(), 1, "slot {slot}");
    holds[0]
}

fn slot(position: Option<&str>) -> u64 {
    position.expect("X-Position").split(',').next().unwrap().parse().unwrap()
}

#[test]
fn a_failing_directory_answers_503_for_its_keys_and_the_other_takes_the_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let b_arg = b.to_str().unwrap();
    let args = ["--data-dir", b_arg, "--volume-size", "64KiB", "--volume-count", "8", "--memory-capacity", "0"];
    let mut s = Server::start_in(&a, &args);
    let mut c = s.client();
    let mut slots = Vec::new();
    for i in 0..60u64 {
        let r = c.put(&format!("/k/{i}"), &bytes(i, 4000));
        assert_eq!(r.status, 200);
        slots.push(slot(r.header("x-position")));
    }
    let st = s.stats();
    let dirs = st["dirs"].as_array().unwrap();
    assert_eq!(dirs.len(), 2);
    for d in dirs {
        assert_eq!(d["state"], "ok");
        assert!(d["volumes"].as_u64().unwrap() >= 2, "{d}");
    }
    let in_b: Vec<bool> = slots.iter().map(|&v| dir_of([&a, &b], v) == 1).collect();

    for rule in ["read eio", "write eio", "sync eio"] {
        s.fault(Some(&format!("dir=1 {rule}")));
    }
    for i in 0..60u64 {
        let r = c.get(&format!("/k/{i}"));
        if in_b[i as usize] {
            assert_eq!(r.status, 503, "k/{i} is in the failed directory");
            assert!(String::from_utf8_lossy(&r.body).lines().count() == 1);
        } else {
            assert_eq!(r.status, 200, "k/{i}");
            assert_eq!(r.body, bytes(i, 4000));
        }
    }
    for i in 0..40u64 {
        let r = c.put(&format!("/new/{i}"), &bytes(1000 + i, 4000));
        assert_eq!(r.status, 200, "PUT /new/{i}: {}", String::from_utf8_lossy(&r.body));
        let g = c.get(&format!("/new/{i}"));
        assert_eq!((g.status, g.body == bytes(1000 + i, 4000)), (200, true));
    }
    let st = s.stats();
    let states: Vec<&str> = st["dirs"].as_array().unwrap().iter().map(|d| d["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["ok", "failed"]);

    // Once the device is back and the server restarted, everything is there, and the
    // directories check clean together.
    s.fault(None);
    s.stop();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["check", "--quiet"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert!(out.status.success(), "check: {}", String::from_utf8_lossy(&out.stdout));
    s.restart();
    let mut c = s.client();
    for i in 0..60u64 {
        let r = c.get(&format!("/k/{i}"));
        assert_eq!((r.status, r.body == bytes(i, 4000)), (200, true), "k/{i}");
    }
    for i in 0..40u64 {
        assert_eq!(c.get(&format!("/new/{i}")).body, bytes(1000 + i, 4000));
    }
}

#[test]
fn strict_dirs_refuses_to_start_without_a_directory_that_held_volumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let b_arg = b.to_str().unwrap();
    let mut s = Server::start_in(&a, &["--data-dir", b_arg, "--volume-size", "64KiB", "--volume-count", "8"]);
    let mut c = s.client();
    for i in 0..40u64 {
        assert_eq!(c.put(&format!("/k/{i}"), &bytes(i, 4000)).status, 200);
    }
    s.stop();
    std::fs::rename(&b, tmp.path().join("b-away")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--listen", "127.0.0.1:0", "--strict-dirs", "--volume-size", "64KiB", "--volume-count", "8"])
        .arg("--data-dir")
        .arg(&a)
        .arg("--data-dir")
        .arg(&b)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing") && err.contains("--strict-dirs"), "{err}");

    // Without it: degraded, serving, and saying so.
    let s = Server::start_in(&a, &["--data-dir", b_arg, "--volume-size", "64KiB", "--volume-count", "8"]);
    let st = s.stats();
    assert_eq!(st["degraded"], true);
    assert!(st["dirs"].as_array().unwrap().iter().any(|d| d["state"] == "missing"));
    assert_eq!(s.client().put("/after", b"x").status, 200);
}
