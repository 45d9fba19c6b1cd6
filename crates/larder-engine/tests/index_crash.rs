//! SIGKILL while the index grows a table and while recovery loads it: the process dies with
//! a shard's lock held, or halfway through applying what recovery gathered, and the next open
//! still answers every acknowledged write. The store runs in a child process (this test binary
//! again, with `LARDER_CHILD` naming the part to play), held at a pause point when killed.

use larder_engine::{pause, FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn config(dir: &Path) -> StoreConfig {
    // Small volumes: the keys span several, so a reopen loads hint files and scans.
    StoreConfig { volume_size: 1 << 20, volume_count: 16, fsync: FsyncPolicy::Never, ..StoreConfig::new(dir) }
}

fn value(i: u64) -> Vec<u8> {
    format!("value of {i}: {}", "x".repeat((i % 50) as usize)).into_bytes()
}

/// Runs this binary's test `name` as a child playing `part` on `dir`; calls `on_line` with
/// each line it prints until `on_line` says to kill it (true), then kills it with SIGKILL.
fn child(name: &str, part: &str, dir: &Path, mut on_line: impl FnMut(&str) -> bool) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("LARDER_CHILD", part)
        .env("LARDER_CHILD_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    for line in out.lines() {
        if on_line(&line.unwrap()) {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
            return;
        }
    }
    panic!("the child ended before it was killed: {:?}", c.wait());
}

fn role() -> Option<(String, std::path::PathBuf)> {
    Some((std::env::var("LARDER_CHILD").ok()?, std::env::var("LARDER_CHILD_DIR").ok()?.into()))
}

/// The child: writes keys, reporting each acknowledged one, until a table's growth holds the
/// writer; then reports that and waits to be killed.
#[test]
fn killed_while_a_table_grows() {
    if let Some((part, dir)) = role() {
        assert_eq!(part, "grow");
        let store = std::sync::Arc::new(Store::open(config(&dir)).unwrap());
        let mut out = std::io::stdout().lock();
        // Some thousands of keys first, then hold the next growth of any table.
        for i in 0..30_000u64 {
            store.put(format!("k{i}").as_bytes(), &value(i), &PutOptions::default()).unwrap();
            writeln!(out, "acked {i}").unwrap();
        }
        let held = pause::arm("index.grow", b"");
        let writer = store.clone();
        std::thread::spawn(move || {
            for j in 30_000u64.. {
                writer.put(format!("k{j}").as_bytes(), &value(j), &PutOptions::default()).unwrap();
            }
        });
        assert!(held.wait_arrived(Duration::from_secs(30)), "no table grew");
        writeln!(out, "held").unwrap();
        out.flush().unwrap();
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("killed while held");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked = 0;
    child("killed_while_a_table_grows", "grow", dir.path(), |line| {
        // The harness prints the test's name first, on the same line.
        if let Some((_, n)) = line.split_once("acked ") {
            acked = n.parse::<u64>().unwrap() + 1;
        }
        line.ends_with("held")
    });
    assert_eq!(acked, 30_000);
    let store = Store::open(config(dir.path())).unwrap();
    assert!(store.stats().recovery.scans >= 1, "the active volume had no checkpoint");
    for i in 0..acked {
        let got = store.get(format!("k{i}").as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(got.map(|v| v.data.to_vec()), Some(value(i)), "k{i}");
    }
    assert_eq!(store.stats().false_evictions, 0);
}

/// The child: opens a store with hint files and held halfway through loading them; killed
/// there, the store opens again with every key.
#[test]
fn killed_while_recovery_loads_the_index() {
    if let Some((part, dir)) = role() {
        assert_eq!(part, "load");
        let held = pause::arm("recovery.apply", b"");
        std::thread::spawn(move || {
            assert!(held.wait_arrived(Duration::from_secs(30)), "recovery never applied");
            let mut out = std::io::stdout().lock();
            writeln!(out, "held").unwrap();
            out.flush().unwrap();
            std::thread::sleep(Duration::from_secs(60));
        });
        let _store = Store::open(config(&dir));
        unreachable!("killed while recovering");
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(config(dir.path())).unwrap();
        for i in 0..50_000u64 {
            store.put(format!("k{i}").as_bytes(), &value(i), &PutOptions::default()).unwrap();
        }
        assert!(store.stats().rotations >= 2, "hint files to load");
    }
    // The harness prints the test's name first, on the same line.
    child("killed_while_recovery_loads_the_index", "load", dir.path(), |line| line.ends_with("held"));
    let store = Store::open(config(dir.path())).unwrap();
    let r = store.stats().recovery;
    assert!(r.hint_loads >= 2 && r.checkpoint_loads == 1, "{r:?}");
    assert_eq!(store.stats().keys, 50_000);
    for i in 0..50_000u64 {
        let got = store.get(format!("k{i}").as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(got.map(|v| v.data.to_vec()), Some(value(i)), "k{i}");
    }
}
