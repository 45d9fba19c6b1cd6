//! The operator's window (issue 43) from outside: slow requests' traces (a read slowed by the
//! fault layer, a slow origin, a wait for the body budget, a client reading a large value
//! slowly) whose spans add up to the request's time and name where it waited, and nothing
//! kept under the threshold; the threshold changed at run time; hot keys per door; `larder
//! top --once` against a node and a 3-node ring, checked against the stats; and every
//! endpoint of the window under the policy (token, read-only, hostile query strings).

mod common;
use common::mc::Mc;
use common::origin::{Answer, Origin};
use common::{bytes, Server};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn json(s: &Server, path: &str) -> Value {
    let r = s.client().get(path);
    assert_eq!(r.status, 200, "{path}: {}", String::from_utf8_lossy(&r.body));
    serde_json::from_slice(&r.body).expect("JSON")
}

fn slow_traces(s: &Server) -> Vec<Value> {
    json(s, "/_larder/slow?n=64")["traces"].as_array().cloned().unwrap_or_default()
}

/// The kept trace of the request for `key` (by path or memcached key).
fn trace_of(s: &Server, key: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(t) = slow_traces(s).into_iter().find(|t| t["key"] == key) {
            return t;
        }
        assert!(Instant::now() < until, "no slow trace for {key}: {:?}", slow_traces(s));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The trace's top-level spans add up to its time within 10%, and the longest is `step`,
/// taking most of it.
fn check_spans(t: &Value, step: &str, at_least_ms: f64) {
    let total = t["total_us"].as_f64().unwrap();
    let spans = t["spans"].as_array().unwrap();
    let top: Vec<&Value> = spans.iter().filter(|s| s["depth"] == 0).collect();
    let covered: f64 = top.iter().map(|s| s["us"].as_f64().unwrap()).sum();
    assert!(total >= at_least_ms * 1e3, "{t}");
    assert!((covered - total).abs() <= total * 0.10, "spans cover {covered} µs of {total} µs: {t:#}");
    let longest = top.iter().max_by(|a, b| a["us"].as_f64().partial_cmp(&b["us"].as_f64()).unwrap()).unwrap();
    assert_eq!(longest["step"], step, "{t:#}");
    assert!(longest["us"].as_f64().unwrap() >= at_least_ms * 1e3 * 0.9, "{t:#}");
    // Spans are in the request's time: none starts before it or ends after it.
    for s in spans {
        let end = s["start_us"].as_f64().unwrap() + s["us"].as_f64().unwrap();
        assert!(end <= total + 1.0, "a span ends after the request: {t:#}");
    }
}

#[test]
fn a_read_slowed_by_the_disk_keeps_a_trace_naming_the_disk_and_fast_requests_leave_nothing() {
    let s = Server::start(&["--slow-request", "150ms", "--memory-capacity", "0", "--memcache-listen", "127.0.0.1:0"]);
    let mut c = s.client();
    for i in 0..50 {
        assert_eq!(c.put(&format!("/fast/{i}"), &bytes(i, 4096)).status, 200);
        assert_eq!(c.get(&format!("/fast/{i}")).status, 200);
    }
    let mut m = Mc::connect(&s);
    assert_eq!(m.ask(b"set mc 0 0 5\r\nhello\r\n", "\r\n"), "STORED\r\n");
    assert!(m.ask(b"get mc\r\n", "END\r\n").contains("hello"));
    assert_eq!(slow_traces(&s).len(), 0, "requests under the threshold keep no trace");
    assert_eq!(json(&s, "/_larder/stats")["slow"]["seen"], 0);

    s.fault(Some("read delay ms=300"));
    let r = c.get("/fast/7");
    assert_eq!((r.status, r.body == bytes(7, 4096)), (200, true));
    let t = trace_of(&s, "/fast/7");
    assert_eq!(
        (t["door"].as_str(), t["method"].as_str(), t["status"].as_str()),
        (Some("http"), Some("GET"), Some("200"))
    );
    check_spans(&t, "disk_read", 300.0);
    // The longest disk read is the one that waited (a first try that would have waited
    // returned at once, with nothing).
    let disk = t["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step"] == "disk_read")
        .max_by(|a, b| a["us"].as_f64().partial_cmp(&b["us"].as_f64()).unwrap())
        .unwrap()
        .clone();
    assert!(disk["bytes"].as_u64().unwrap() >= 4096, "the disk read's bytes: {disk}");

    // The same slow disk under memcached's door.
    assert!(m.ask(b"get mc\r\n", "END\r\n").contains("hello"));
    let t = trace_of(&s, "mc");
    assert_eq!((t["door"].as_str(), t["method"].as_str()), (Some("memcache_text"), Some("get")));
    check_spans(&t, "disk_read", 300.0);
    s.fault(None);
}

#[test]
fn the_threshold_changes_at_run_time() {
    let s = Server::start(&["--slow-request", "0"]);
    let mut c = s.client();
    assert_eq!(json(&s, "/_larder/slow")["threshold_ms"], 0.0);
    assert_eq!(c.put("/k", b"v").status, 200);
    s.fault(Some("read delay ms=120"));
    assert_eq!(s.client().get("/k").status, 200);
    assert_eq!(slow_traces(&s).len(), 0, "off: nothing traced");
    let r = c.request("POST", "/_larder/slow?threshold=50ms", &[], b"");
    assert_eq!((r.status, String::from_utf8_lossy(&r.body).trim()), (200, "slow-request threshold: 50ms"));
    assert_eq!(json(&s, "/_larder/slow")["threshold_ms"], 50.0);
    assert_eq!(c.put("/k2", b"v").status, 200);
    assert_eq!(s.client().get("/k2").status, 200);
    let t = trace_of(&s, "/k2");
    check_spans(&t, "disk_read", 120.0);
    s.fault(None);
    for bad in ["threshold=5m", "threshold=", "threshold=-1ms", "threshold=10us", "n=1", "threshold=1ms&threshold=2ms"]
    {
        let r = c.request("POST", &format!("/_larder/slow?{bad}"), &[], b"");
        assert_eq!(r.status, 400, "{bad}");
    }
    assert_eq!(json(&s, "/_larder/slow")["threshold_ms"], 50.0, "a refused change changes nothing");
}

#[test]
fn a_slow_origin_is_named_in_the_trace() {
    let o = Origin::start();
    let mut a = Answer::ok(b"from the origin", &[("cache-control", "max-age=60")]);
    a.delay = Duration::from_millis(300);
    o.set("/slow", a);
    let s = Server::start(&["--origin", &o.url(), "--origin-read-timeout", "5s", "--slow-request", "150ms"]);
    let r = s.client().get("/slow");
    assert_eq!(r.status, 200);
    let t = trace_of(&s, "/slow");
    assert_eq!(t["door"], "proxy");
    check_spans(&t, "origin", 300.0);
    let hot = json(&s, "/_larder/hot?door=proxy");
    assert_eq!(hot["doors"]["proxy"]["largest"][0]["key"], "/slow");
}

#[test]
fn a_put_that_waits_for_the_body_budget_names_the_wait() {
    let s = Server::start(&["--fsync", "never", "--max-body-memory", "1MiB", "--slow-request", "300ms"]);
    let value = bytes(9, 1 << 20);
    std::thread::scope(|scope| {
        // Holds the bodies' room for about 1.6 s: 16 pieces, 100 ms apart.
        let first = scope.spawn(|| {
            let sock = TcpStream::connect(s.addr).unwrap();
            let mut w = sock.try_clone().unwrap();
            write!(w, "PUT /first HTTP/1.1\r\nHost: larder\r\nContent-Length: {}\r\n\r\n", value.len()).unwrap();
            for piece in value.chunks(64 << 10) {
                w.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            let mut status = String::new();
            BufReader::new(sock).read_line(&mut status).unwrap();
            status
        });
        std::thread::sleep(Duration::from_millis(300));
        let r = s.client().put("/second", &value);
        assert_eq!(r.status, 200);
        assert!(first.join().unwrap().contains(" 200 "));
    });
    let t = trace_of(&s, "/second");
    check_spans(&t, "budget_wait", 500.0);
    let first = trace_of(&s, "/first");
    assert!(first["spans"].as_array().unwrap().iter().all(|s| s["step"] != "budget_wait"), "{first:#}");
}

#[test]
fn a_large_value_read_slowly_by_its_client_names_the_send() {
    let s = Server::start(&["--chunk-size", "64KiB", "--slow-request", "150ms"]);
    let value = bytes(5, 16 << 20);
    assert_eq!(s.client().put("/large", &value).status, 200);
    // More than the loopback's buffers hold: the server waits for the client to read on.
    let mut sock = TcpStream::connect(s.addr).unwrap();
    write!(sock, "GET /large HTTP/1.1\r\nHost: larder\r\nConnection: close\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut sock, &mut got).unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200 ") && got.ends_with(&value[value.len() - 4096..]));
    let t = trace_of(&s, "/large");
    assert_eq!(t["method"], "GET", "{t:#}");
    check_spans(&t, "send", 300.0);
    let send = t["spans"].as_array().unwrap().iter().find(|s| s["step"] == "send").unwrap().clone();
    assert_eq!(send["bytes"], 16 << 20, "{t:#}");

    // A large value read at once, under the threshold, keeps nothing.
    assert_eq!(s.client().request("POST", "/_larder/slow?threshold=2s", &[], b"").status, 200);
    let seen = json(&s, "/_larder/stats")["slow"]["seen"].as_u64().unwrap();
    let r = s.client().get("/large");
    assert_eq!((r.status, r.body.len()), (200, 16 << 20));
    assert_eq!(json(&s, "/_larder/stats")["slow"]["seen"].as_u64().unwrap(), seen, "{:#?}", slow_traces(&s));
}

#[test]
fn hot_keys_and_largest_values_per_door() {
    let s = Server::start(&["--memcache-listen", "127.0.0.1:0"]);
    let mut c = s.client();
    assert_eq!(c.put("/big", &bytes(1, 300_000)).status, 200);
    for i in 0..20 {
        assert_eq!(c.put(&format!("/k{i}"), b"v").status, 200);
    }
    for round in 0..2000 {
        c.get("/k3");
        if round % 5 == 0 {
            c.get(&format!("/k{}", round / 5 % 20));
        }
    }
    c.get("/big");
    let mut m = Mc::connect(&s);
    assert_eq!(m.ask(b"set mc-hot 0 0 1\r\nx\r\n", "\r\n"), "STORED\r\n");
    for _ in 0..200 {
        m.ask(b"get mc-hot\r\n", "END\r\n");
    }
    let hot = json(&s, "/_larder/hot?n=3");
    let http = &hot["doors"]["http"];
    assert_eq!(http["keys"][0]["key"], "k3", "{hot:#}");
    // Sampled one in eight at random: about 2,000 requests (a 400 error is over 3 sigma), or
    // half as many if the counts halved (every 10 s) while the loop ran.
    let est = http["keys"][0]["requests"].as_u64().unwrap();
    assert!((1600..=2400).contains(&est) || (800..=1200).contains(&est), "{hot:#}");
    assert!(http["keys"][1]["requests"].as_u64().unwrap() < est / 4, "{hot:#}");
    assert_eq!(http["largest"][0], serde_json::json!({"key": "big", "bytes": 300_000}));
    assert_eq!(hot["doors"]["memcache"]["keys"][0]["key"], "mc-hot");
    let mem = hot["memory_bytes"].as_u64().unwrap();
    assert!(mem > 0 && mem <= hot["max_memory_bytes"].as_u64().unwrap());
    assert_eq!(json(&s, "/_larder/hot?door=memcache")["doors"].as_object().unwrap().len(), 1);
}

/// The window's endpoints, the page and `larder top` under the policy: the token guards every
/// figure (not the page's own files, which hold none); `--read-only` leaves them readable; a
/// hostile query string is a 400 on each.
#[test]
fn the_window_passes_the_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "window-token-43\n").unwrap();
    let s = Server::start_in(&tmp.path().join("data"), &["--auth-token", token_file.to_str().unwrap()]);
    let mut c = s.client();
    let auth = [("Authorization", "Bearer window-token-43")];
    let figures = ["/_larder/stats", "/_larder/series", "/_larder/hot", "/_larder/slow", "/_larder/metrics"];
    for path in figures {
        assert_eq!(c.get(path).status, 401, "{path} without the token");
        assert_eq!(c.request("GET", path, &[("Authorization", "Bearer wrong")], b"").status, 401, "{path}");
        assert_eq!(c.request("GET", path, &auth, b"").status, 200, "{path} with the token");
    }
    assert_eq!(c.request("POST", "/_larder/slow?threshold=1s", &[], b"").status, 401);
    assert_eq!(c.request("POST", "/_larder/slow?threshold=1s", &auth, b"").status, 200);
    for page in ["/_larder/", "/_larder/ui.js", "/_larder/ui.css"] {
        let r = c.get(page);
        assert_eq!(r.status, 200, "{page}");
        let csp = r.header("content-security-policy").expect("a CSP");
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
        // SVG's namespace is a name, not a place the page goes to.
        let text = String::from_utf8_lossy(&r.body).replace("http://www.w3.org/2000/svg", "");
        assert!(!text.contains("http://") && !text.contains("https://"), "{page} names another host");
    }
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["top", "--once", "--url", &format!("http://{}", s.addr)])
        .env_remove("LARDER_AUTH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(top.status.code(), Some(1), "top without the token");
    assert!(String::from_utf8_lossy(&top.stdout).contains("answered 401"));
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["top", "--once", "--url", &format!("http://{}", s.addr)])
        .env("LARDER_AUTH_TOKEN", "window-token-43")
        .output()
        .unwrap();
    assert_eq!(top.status.code(), Some(0), "{}", String::from_utf8_lossy(&top.stdout));

    let hostile = [
        "x=1",
        "n=%3Cscript%3Ealert(1)%3C/script%3E",
        "n=1&n=2",
        "since=1;drop",
        "door=../../etc/passwd",
        "n=99999999999999999999",
        "n=0",
        "door=nosuch",
        "%00=1",
        &"n=1&".repeat(100),
    ];
    for path in [
        "/_larder/",
        "/_larder/ui.js",
        "/_larder/stats",
        "/_larder/series",
        "/_larder/hot",
        "/_larder/slow",
        "/_larder/metrics",
    ] {
        for q in hostile {
            let r = c.request("GET", &format!("{path}?{q}"), &auth, b"");
            assert_eq!(r.status, 400, "{path}?{q}: {}", String::from_utf8_lossy(&r.body));
            let msg = String::from_utf8_lossy(&r.body);
            assert!(msg.starts_with("bad query string") && msg.lines().count() == 1, "{msg}");
        }
    }
    // Nothing stored was lost to any of it.
    assert_eq!(c.request("PUT", "/kept", &auth, b"v").status, 200);
    assert_eq!(c.request("GET", "/kept", &auth, b"").body, b"v");

    let ro = Server::start(&["--read-only"]);
    let mut c = ro.client();
    for path in figures.iter().chain(&["/_larder/"]) {
        assert_eq!(c.get(path).status, 200, "{path} is readable under --read-only");
    }
    assert_eq!(c.put("/k", b"v").status, 403);
    // Reading is all `--read-only` leaves: the threshold is not changed by a client.
    assert_eq!(c.request("POST", "/_larder/slow?threshold=1ms", &[], b"").status, 403);
    assert_eq!(json(&ro, "/_larder/slow")["threshold_ms"], 100.0);
}

fn top_once(args: &[&str]) -> String {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_larder")).arg("top").arg("--once").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// The figures of a door's row: `http  REQ/S HIT/S … HITS`.
fn door_row<'a>(frame: &'a str, node: &str, door: &str) -> Vec<&'a str> {
    let block =
        frame.split("\n\n").find(|b| b.starts_with(node)).unwrap_or_else(|| panic!("no block for {node}:\n{frame}"));
    let line = block.lines().find(|l| l.trim_start().starts_with(&format!("{door} "))).expect("a door's row");
    line.split_whitespace().collect()
}

#[test]
fn top_once_shows_rates_hit_ratios_and_hot_keys_that_match_the_stats() {
    let s = Server::start(&["--memcache-listen", "127.0.0.1:0"]);
    let url = format!("http://{}", s.addr);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut c = s.client();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.put(&format!("/k{}", i % 50), b"value");
                c.get("/hot/one");
                c.get(&format!("/k{}", i % 50));
                i += 1;
            }
        });
        s.client().put("/hot/one", b"x");
        std::thread::sleep(Duration::from_millis(2500));
        let frame = std::panic::catch_unwind(|| top_once(&["--url", &url]));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let frame = frame.expect("larder top --once");
        let row = door_row(&frame, &s.addr.to_string(), "http");
        let rate: f64 = row[1].trim_end_matches('k').parse().unwrap();
        assert!(rate > 0.0, "a rate under load:\n{frame}");
        assert!(frame.contains("HOT KEYS (http)"), "{frame}");
        let hot_line = frame.lines().skip_while(|l| !l.contains("HOT KEYS (http)")).nth(1).unwrap();
        assert!(hot_line.trim_start().starts_with("hot/one"), "the hottest key first:\n{frame}");
    });
    // At rest, the cumulative figures are the stats' own.
    std::thread::sleep(Duration::from_millis(200));
    let frame = top_once(&["--url", &url]);
    let stats = json(&s, "/_larder/stats");
    let row = door_row(&frame, &s.addr.to_string(), "http");
    assert_eq!(row.last().unwrap().parse::<u64>().unwrap(), stats["doors"]["http"]["hit"].as_u64().unwrap(), "{frame}");
    let node = frame.lines().find(|l| l.starts_with(&s.addr.to_string())).unwrap();
    let cols: Vec<&str> = node.split_whitespace().collect();
    assert_eq!(cols[8].parse::<u64>().unwrap(), stats["keys"].as_u64().unwrap(), "KEYS:\n{frame}");
    assert!(cols[3].ends_with('%'), "a hit ratio:\n{frame}");
}

#[test]
fn top_once_shows_every_node_of_a_ring() {
    let base = common::free_ports(3);
    let names: Vec<String> = (1..=3).map(|k| format!("127.0.0.1:{}", base + k)).collect();
    let list = names.join(",");
    let nodes: Vec<Server> = names
        .iter()
        .map(|n| {
            Server::start(&["--listen", n, "--cluster-nodes", &list, "--cluster-self", n, "--cluster-hash", "nginx"])
        })
        .collect();
    for (i, n) in nodes.iter().enumerate() {
        for k in 0..=i * 10 {
            assert_eq!(n.client().put(&format!("/n{i}-{k}"), b"v").status, 200);
        }
    }
    let frame = top_once(&["--cluster-nodes", &list]);
    assert!(frame.contains("3 nodes"), "{frame}");
    let mut share = 0.0;
    for (i, name) in names.iter().enumerate() {
        let line = frame.lines().find(|l| l.starts_with(name.as_str())).unwrap_or_else(|| panic!("{name}:\n{frame}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[8].parse::<u64>().unwrap(), (i * 10 + 1) as u64, "KEYS of {name}:\n{frame}");
        let stats = json(&nodes[i], "/_larder/stats");
        let s = stats["cluster"]["share"].as_f64().unwrap();
        assert_eq!(cols[10], format!("{:.1}%", s * 100.0), "{frame}");
        share += s;
    }
    assert!((share - 1.0).abs() < 1e-6, "the shares add up to the whole ring");
    // A node down is shown as such; the others still are.
    drop(nodes);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["top", "--once", "--cluster-nodes", &list])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "every node down");
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("unreachable").count(), 3);
}
