//! memcached's own test suite against larder: the files of memcached 1.6.18's `t/` that
//! memcached itself passes when run against an external server (`T_MEMD_USE_DAEMON`), each on
//! a fresh larder started as memcached is by default where larder has a flag for it
//! (`-I 1m`: `--max-value-size 1MiB`). scripts/install-bench-deps.sh fetches the suite (the
//! source Debian 12 builds its memcached from) into target/memcached-1.6.18.
//!
//! Left out, with their reasons in docs/MEMCACHED.md: `issue_14.t`, `issue_42.t` and
//! `issue_163.t`, which read the slab allocator's accounting that larder does not have. The
//! files memcached itself fails or skips against an external server (extstore, TLS, UDP, unix
//! sockets, `-c`/`-m` flags of its own command line, …) are not run.

mod common;

use common::Server;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The files memcached 1.6.18 passes against an external memcached started with its defaults
/// (the ssl_* files, which skip themselves there, aside), but the three above; and binary.t,
/// which memcached built with unix sockets fails there only on its `domain_socket` setting.
const FILES: &[&str] = &[
    "binary-get.t",
    "binary-sasl.t",
    "binary.t",
    "bogus-commands.t",
    "cas.t",
    "chunked-items.t",
    "flags.t",
    "getandtouch.t",
    "getset.t",
    "incrdecr.t",
    "issue_104.t",
    "issue_108.t",
    "issue_140.t",
    "issue_152.t",
    "issue_192.t",
    "issue_260.t",
    "issue_29.t",
    "issue_3.t",
    "issue_41.t",
    "issue_68.t",
    "issue_70.t",
    "line-lengths.t",
    "malicious-commands.t",
    "misbehave.t",
    "multiversioning.t",
    "noreply.t",
    "proxy.t",
    "quit.t",
    "refhang.t",
    "slabhang.t",
    "stats-detail.t",
    "strtol-testing.t",
    "touch.t",
    "watcher_connid.t",
    "whitespace.t",
];

fn suite() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/memcached-1.6.18");
    assert!(
        root.join("t/lib/MemcachedTest.pm").exists(),
        "{} missing: scripts/install-bench-deps.sh fetches memcached's test suite",
        root.display()
    );
    root
}

#[test]
fn memcached_s_own_test_files_pass_against_larder() {
    let root = suite();
    let mut failed = Vec::new();
    for file in FILES {
        let s = Server::start(&["--memcache-listen", "127.0.0.1:0", "--max-value-size", "1MiB"]);
        let addr = s.memcache.expect("memcached address");
        let started = Instant::now();
        // Its output to a file: a pipe left unread while it runs would fill and stall it.
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new("perl")
            .arg(format!("t/{file}"))
            .current_dir(&root)
            .env("T_MEMD_USE_DAEMON", addr.to_string())
            .stdout(Stdio::from(log.reopen().unwrap()))
            .stderr(Stdio::from(log.reopen().unwrap()))
            .spawn()
            .expect("run perl (scripts/install-bench-deps.sh installs it)");
        // Bounded: a file that hangs fails, it does not stall the suite.
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = child.wait();
        let ok = status.is_some_and(|st| st.success());
        println!("{file}: {} in {:.1} s", if ok { "ok" } else { "FAILED" }, started.elapsed().as_secs_f64());
        if !ok {
            // The failing assertions, not the bytes of every value the file compared.
            let text = String::from_utf8_lossy(&std::fs::read(log.path()).unwrap()).into_owned();
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("not ok") || l.starts_with("#   Failed") || l.starts_with("# Looks"))
                .map(|l| l.chars().take(200).collect())
                .take(10)
                .collect();
            failed.push(format!("{file} ({status:?}):\n  {}", lines.join("\n  ")));
        }
    }
    assert!(failed.is_empty(), "memcached's test files that fail against larder:\n{}", failed.join("\n"));
}
