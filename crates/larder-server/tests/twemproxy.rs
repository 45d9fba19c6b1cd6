//! larder nodes behind twemproxy (Debian's nutcracker, with deploy/twemproxy/nutcracker.yml:
//! ketama, auto_eject_hosts), driven through it with pymemcache by
//! tests/clients/twemproxy_rejoin.py:
//!
//! - placement: for twemproxy's `fnv1a_64` and `md5` key hashes, 10,000 keys set through the
//!   proxy are on the node `larder owner` names, nodes told the ring count no foreign write,
//!   and `larder flush --cluster` empties every node;
//! - rejoin: a node killed while the keys are written again, restarted once ejected, rejoins,
//!   then fails a second time. With docs/CLUSTER.md's flags for this router (ring awareness,
//!   `--foreign-ttl`, `--max-downtime 0s`) no read is stale; without them, reads are (the
//!   test can fail).
//!
//! nutcracker, python3 and pymemcache are installed by scripts/install-bench-deps.sh; without
//! them this test fails.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

const NUTCRACKER: &str = "/usr/sbin/nutcracker";

fn scenario(args: &[&str]) -> serde_json::Value {
    assert!(Path::new(NUTCRACKER).exists(), "{NUTCRACKER} is missing: scripts/install-bench-deps.sh installs it");
    let dir = tempfile::tempdir().unwrap();
    let manifest = env!("CARGO_MANIFEST_DIR");
    let script = format!("{manifest}/tests/clients/twemproxy_rejoin.py");
    let template = format!("{manifest}/../../deploy/twemproxy/nutcracker.yml");
    // The proxy, its stats, three memcached and three HTTP ports.
    let base = common::free_ports(24).to_string();
    // Debian's python3, where python3-pymemcache is installed.
    let out = Command::new("/usr/bin/python3")
        .args([&script, env!("CARGO_BIN_EXE_larder"), NUTCRACKER, &template, dir.path().to_str().unwrap(), &base])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run /usr/bin/python3");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed:\n{said}{}", String::from_utf8_lossy(&out.stdout));
    let last = String::from_utf8(out.stdout).unwrap().lines().last().unwrap_or_default().to_string();
    println!("{args:?}: {last}\n{said}");
    serde_json::from_str(&last).unwrap()
}

#[test]
fn larder_places_keys_where_twemproxy_sends_them() {
    let r = scenario(&["placement"]);
    for hash in ["fnv1a_64", "md5"] {
        let h = &r[hash];
        assert_eq!(h["on_owner"], 10_000, "{hash}: keys not on the node larder names: {h}");
        assert_eq!(h["foreign_writes"], serde_json::json!([0, 0, 0]), "{hash}: {h}");
        assert!(h["per_node"].as_array().unwrap().iter().all(|n| n.as_u64().unwrap() > 2_000), "{hash}: {h}");
        assert_eq!(h["after_flush"], 0, "{hash}: keys left after larder flush --cluster: {h}");
    }
}

#[test]
fn a_node_that_was_ejected_rejoins_without_stale_reads() {
    let safe = scenario(&["rejoin", "safe"]);
    assert!(safe["victim_keys"].as_u64().unwrap() > 2_000, "{safe}");
    assert_eq!(safe["stale_after_rejoin"], 0, "{safe}");
    // The node came back empty, and was read from: every one of its keys a miss.
    assert_eq!(safe["missing_after_rejoin"], safe["victim_keys"], "{safe}");
    assert_eq!(safe["stale_after_second_failure"], 0, "{safe}");
    // The outage's writes of the victim's keys were foreign on the nodes that took them.
    let foreign: u64 = safe["foreign_writes"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(foreign >= safe["victim_keys"].as_u64().unwrap(), "{safe}");
    // Without the flags, the same run serves values from before the outage as current.
    let plain = scenario(&["rejoin", "plain"]);
    assert!(plain["stale_after_rejoin"].as_u64().unwrap() > 1_000, "{plain}");
    assert!(plain["stale_after_second_failure"].as_u64().unwrap() > 1_000, "{plain}");
}
