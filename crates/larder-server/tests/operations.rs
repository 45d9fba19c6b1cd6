//! What operators rely on, through the real binary: the Prometheus counters after a known
//! workload, a SIGTERM under load that drops no accepted request and leaves a checkpoint the
//! next start loads instead of scanning, `larder check` finding a flipped byte, and the client
//! subcommands.

mod common;
use common::*;
use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The samples of a Prometheus text exposition, keyed `name{label="v",...}` with the labels
/// sorted, so a test names a series without caring how the exporter orders labels.
fn scrape(s: &Server) -> HashMap<String, f64> {
    let r = s.client().get("/_larder/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = String::from_utf8(r.body).unwrap();
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let key = match series.split_once('{') {
            None => series.to_string(),
            Some((name, labels)) => {
                let mut l: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                l.sort_unstable();
                format!("{name}{{{}}}", l.join(","))
            }
        };
        out.insert(key, value.parse::<f64>().unwrap_or_else(|_| panic!("value of {line}")));
    }
    out
}

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no series {key}; have {:?}", m.keys().collect::<Vec<_>>()))
}

#[test]
fn metrics_count_a_scripted_workload() {
    let s = Server::start(&["--promote-after", "2"]);
    let mut c = s.client();
    let mut sent_bodies = 0usize; // bytes of response bodies received (HEAD has none)
    let mut run = |c: &mut Client, method: &str, path: &str, body: &[u8], status: u16| {
        let r = c.request(method, path, &[], body);
        assert_eq!(r.status, status, "{method} {path}");
        sent_bodies += r.body.len();
        r
    };
    for (i, len) in [100, 200, 300].into_iter().enumerate() {
        run(&mut c, "PUT", &format!("/m/{i}"), &bytes(i as u64, len), 200);
    }
    // A value read from disk twice is promoted: the third read is a memory hit.
    let tiers: Vec<_> =
        (0..3).map(|_| run(&mut c, "GET", "/m/0", b"", 200).header("x-cache").unwrap().to_string()).collect();
    assert_eq!(tiers, ["DISK", "DISK", "MEMC"]);
    run(&mut c, "GET", "/m/1", b"", 200);
    run(&mut c, "GET", "/absent", b"", 404);
    run(&mut c, "GET", "/absent/too", b"", 404);
    run(&mut c, "HEAD", "/m/1", b"", 200);
    run(&mut c, "DELETE", "/m/2", b"", 200);
    run(&mut c, "DELETE", "/m/2", b"", 404);
    run(&mut c, "PUT", "/bad%zzkey", b"", 400);
    // Scrapes and stats are not counted as traffic.
    let _ = s.stats();

    let m = scrape(&s);
    let requests = |method: &str, status: u16| {
        sample(&m, &format!("larder_http_requests_total{{method=\"{method}\",status=\"{status}\"}}"))
    };
    assert_eq!(requests("PUT", 200), 3.0);
    assert_eq!(requests("PUT", 400), 1.0);
    assert_eq!(requests("GET", 200), 4.0);
    assert_eq!(requests("GET", 404), 2.0);
    assert_eq!(requests("HEAD", 200), 1.0);
    assert_eq!(requests("DELETE", 200), 1.0);
    assert_eq!(requests("DELETE", 404), 1.0);
    assert_eq!(m.keys().filter(|k| k.starts_with("larder_http_requests_total")).count(), 7, "no other series");
    assert_eq!(sample(&m, "larder_cache_hits_total{tier=\"disk\"}"), 3.0);
    assert_eq!(sample(&m, "larder_cache_hits_total{tier=\"memc\"}"), 1.0);
    assert_eq!(sample(&m, "larder_cache_misses_total"), 2.0);
    assert_eq!(sample(&m, "larder_http_received_bytes_total"), 600.0);
    assert_eq!(sample(&m, "larder_http_sent_bytes_total"), sent_bodies as f64);
    assert_eq!(sample(&m, "larder_puts_total"), 3.0);
    assert_eq!(sample(&m, "larder_deletes_total"), 1.0);
    assert_eq!(sample(&m, "larder_index_keys"), 2.0);
    assert_eq!(sample(&m, "larder_memory_entries"), 1.0);
    assert_eq!(sample(&m, "larder_promotions_total"), 1.0);
    assert_eq!(sample(&m, "larder_checksum_failures_total"), 0.0);
    assert_eq!(sample(&m, "larder_index_collision_reads_total"), 0.0);
    assert_eq!(sample(&m, "larder_index_false_evictions_total"), 0.0);
    // A few keys: a few of the 4096 tables, each of a few slots and the 128-slot tail.
    let index = sample(&m, "larder_index_bytes");
    assert!(index > 0.0 && index < 8192.0, "index bytes {index}");
    assert_eq!(sample(&m, "larder_ready"), 1.0);
    assert_eq!(sample(&m, "larder_disk_capacity_bytes"), 16.0 * (1u64 << 30) as f64);
    assert!(sample(&m, "larder_disk_used_bytes") > 600.0);
    // Latency histograms with explicit buckets, one per method; every GET is in +Inf.
    assert_eq!(sample(&m, "larder_http_request_duration_seconds_count{method=\"GET\"}"), 6.0);
    assert_eq!(sample(&m, "larder_http_request_duration_seconds_bucket{le=\"+Inf\",method=\"GET\"}"), 6.0);
    assert!(m.contains_key("larder_http_request_duration_seconds_bucket{le=\"0.001\",method=\"PUT\"}"));
    assert!(sample(&m, "larder_http_request_duration_seconds_sum{method=\"PUT\"}") > 0.0);
    // fdatasync latency comes from the engine (the 1 s background sync ran by now, or not).
    std::thread::sleep(Duration::from_millis(1500));
    let m = scrape(&s);
    assert!(sample(&m, "larder_fsync_duration_seconds_count") >= 1.0);

    // The JSON stats agree with the metrics.
    let st = s.stats();
    assert_eq!(
        (st["hits"].as_u64(), st["memory_hits"].as_u64(), st["disk_hits"].as_u64()),
        (Some(4), Some(1), Some(3))
    );
    assert_eq!(st["misses"], 2);
    assert_eq!(st["hit_ratio"].as_f64(), Some(4.0 / 6.0));
    assert_eq!(st["bytes_in"], 600);
    assert_eq!(st["bytes_out"], sent_bodies as u64);
}

/// Several clients PUT and GET over keep-alive connections as fast as they can while the
/// server gets SIGTERM. Every request sent on an accepted connection must get its whole
/// answer: the in-flight ones and the ones that arrive during the drain are answered with
/// `Connection: close`, after which the listener is gone and a reconnect is refused. The
/// restart then loads the active volume from the checkpoint (no scan) and serves every
/// acknowledged value.
#[test]
fn sigterm_under_load_drops_nothing_and_restarts_from_the_checkpoint() {
    let mut s = Server::start(&["--volume-size", "1MiB", "--volume-count", "64"]);
    let addr = s.addr;
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop_seen = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..6u64)
        .map(|t| {
            let (acked, failures, stop_seen) = (acked.clone(), failures.clone(), stop_seen.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut mine: HashMap<String, u64> = HashMap::new();
                let mut order: Vec<String> = Vec::new();
                for i in 0u64.. {
                    let key = format!("/load/{t}/{}", i % 40);
                    let seed = t << 32 | i;
                    let (method, r) = if i % 3 == 2 && !order.is_empty() {
                        let key = order[i as usize % order.len()].clone();
                        ("GET", c.try_request("GET", &key, &[], b"").map(|r| (key, r)))
                    } else {
                        let v = bytes(seed, 1000 + (i as usize * 37) % 2000);
                        ("PUT", c.try_request("PUT", &key, &[], &v).map(|r| (key, r)))
                    };
                    let (key, r) = match r {
                        Ok(ok) => ok,
                        Err(e) => {
                            failures.lock().unwrap().push(format!("{method} on client {t}: {e}"));
                            return;
                        }
                    };
                    match (method, r.status) {
                        ("PUT", 200) => {
                            if mine.insert(key.clone(), seed).is_none() {
                                order.push(key.clone());
                            }
                            acked.lock().unwrap().insert(key, seed);
                        }
                        ("GET", 200) => {
                            let want = mine[&key];
                            if r.body != bytes(want, 1000 + ((want & 0xFFFF_FFFF) as usize * 37) % 2000) {
                                failures.lock().unwrap().push(format!("GET {key}: not the acknowledged value"));
                            }
                        }
                        _ => failures.lock().unwrap().push(format!("{method} {key}: status {}", r.status)),
                    }
                    if r.header("connection") == Some("close") {
                        stop_seen.store(true, Ordering::Relaxed);
                        // The server is stopping: the listener is closed, so no new connection
                        // is taken in to be dropped.
                        match std::net::TcpStream::connect(addr) {
                            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
                            other => {
                                failures.lock().unwrap().push(format!("reconnect after close: {other:?}"));
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // A keep-alive connection that sits idle through the stop: it must not hold the stop up
    // (closed once quiet for a second, long before the 30 s shutdown timeout), and it must
    // be closed cleanly, not reset.
    let mut idle = Client::connect(addr);
    assert_eq!(idle.get("/load/none").status, 404);
    let started = Instant::now();
    while acked.lock().unwrap().len() < 200 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500)); // well into the load
    s.signal_term();
    let stopping = Instant::now();
    s.wait_exit_success();
    let stop_took = stopping.elapsed();
    assert!(stop_took < Duration::from_secs(10), "the stop took {stop_took:?}");
    match idle.read_response(false) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        other => panic!("the idle connection was not closed cleanly: {other:?}"),
    }
    for t in threads {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "requests failed: {failures:?}");
    assert!(stop_seen.load(Ordering::Relaxed), "clients saw the server stop");
    let acked = acked.lock().unwrap();
    assert!(acked.len() >= 200, "{} keys acknowledged", acked.len());

    s.restart();
    let st = s.stats();
    let r = &st["recovery"];
    assert_eq!(r["scans"], 0, "no volume was scanned: {st}");
    assert_eq!(r["checkpoint_loads"], 1, "{st}");
    assert!(r["hint_loads"].as_u64().unwrap() >= 1, "sealed volumes load from their hint files: {st}");
    let mut c = s.client();
    for (key, &seed) in acked.iter() {
        let g = c.get(key);
        assert_eq!(g.status, 200, "{key} lost");
        assert!(g.body == bytes(seed, 1000 + ((seed & 0xFFFF_FFFF) as usize * 37) % 2000), "{key} differs");
    }
    assert_eq!(st["keys"], acked.len() as u64);
}

fn larder(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_larder"))
        .env_remove("LARDER_AUTH_TOKEN")
        .env_remove("LARDER_URL")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run larder")
}

#[test]
fn check_finds_a_flipped_byte_in_a_sealed_volume() {
    let mut s = Server::start(&["--volume-size", "64KiB", "--volume-count", "16"]);
    let mut c = s.client();
    let first = c.put("/victim", &bytes(1, 3000));
    let pos: Vec<u64> = first.header("x-position").unwrap().split(',').map(|p| p.parse().unwrap()).collect();
    for i in 0..100u64 {
        assert_eq!(c.put(&format!("/fill/{i}"), &bytes(i + 10, 2000)).status, 200);
    }
    assert_ne!(s.stats()["active_volume"], pos[0], "the victim's volume is sealed");
    s.stop();
    let dir = s.dir.to_str().unwrap().to_string();

    let clean = larder(&["check", &dir]);
    let out = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{out}{}", String::from_utf8_lossy(&clean.stderr));
    assert!(out.contains("clean: every record verified"), "{out}");
    assert!(!out.contains("hint mismatch"), "{out}");

    // The last byte of the victim's value, inside its checksummed record.
    let vol = s.dir.join(format!("vol-{:05}.lrv", pos[0]));
    let at = pos[1] + pos[2] - 1;
    let mut data = std::fs::read(&vol).unwrap();
    data[at as usize] ^= 0x20;
    std::fs::write(&vol, &data).unwrap();
    let damaged = larder(&["check", &dir]);
    let out = String::from_utf8_lossy(&damaged.stdout);
    assert_eq!(damaged.status.code(), Some(1), "{out}");
    let expect = format!("CORRUPT: {} at offset {}: record of key \"victim\"", vol.display(), pos[1]);
    assert!(out.contains(&expect), "{out}");
    assert!(out.contains("hint mismatch"), "the sealed hint still names the record: {out}");

    // A running server's directory is refused rather than read under its writes.
    s.restart();
    let busy = larder(&["check", &dir]);
    assert_eq!(busy.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("in use"));
    // …and the server answers the damaged key as a miss, never with the flipped bytes.
    assert_eq!(s.client().get("/victim").status, 404);
}

#[test]
fn client_subcommands_round_trip() {
    let s = Server::start(&[]);
    let url = format!("http://{}", s.addr);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("v.bin");
    let value = bytes(7, 5000);
    std::fs::write(&file, &value).unwrap();

    let put = larder(&["put", "dir/a b.bin", file.to_str().unwrap(), "--url", &url, "--content-type", "image/png"]);
    assert_eq!(put.status.code(), Some(0), "{}", String::from_utf8_lossy(&put.stderr));
    // The key went out percent-encoded.
    let r = s.client().get("/dir/a%20b.bin");
    assert_eq!((r.status, r.header("content-type")), (200, Some("image/png")));
    let get = larder(&["get", "dir/a b.bin", "--url", &url]);
    assert_eq!(get.status.code(), Some(0));
    assert!(get.stdout == value);

    let stats = larder(&["stats", "--url", &url]);
    let table = String::from_utf8_lossy(&stats.stdout);
    assert_eq!(stats.status.code(), Some(0));
    assert!(table.lines().any(|l| l.trim_start().starts_with("keys") && l.trim_end().ends_with(" 1")), "{table}");
    assert!(table.contains("hit ratio"), "{table}");

    assert_eq!(larder(&["delete", "dir/a b.bin", "--url", &url]).status.code(), Some(0));
    let gone = larder(&["get", "dir/a b.bin", "--url", &url]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("404"));
    let unreachable = larder(&["get", "k", "--url", "http://127.0.0.1:1"]);
    assert_eq!(unreachable.status.code(), Some(2));
}
