//! `--compression`: every door reads back exactly what was stored, before and after a graceful
//! restart and a kill -9, under another setting too; validators and ranges work on the value
//! itself; flags that cannot be honoured refuse to start; `larder check` decodes coded records.

mod common;
use common::mc::Mc;
use common::*;
use std::process::Command;

/// Markup of `len` bytes, about as compressible as a rendered page.
fn page(len: usize, seed: u32) -> Vec<u8> {
    let mut s = String::new();
    let mut i = seed;
    while s.len() < len {
        i = i.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        s.push_str(&format!("<tr><td class=\"pkg\">lib{}</td><td>{}.{}</td></tr>\n", i % 977, i % 13, i % 101));
    }
    s.truncate(len);
    s.into_bytes()
}

/// What the test stores: pages of several sizes (one longer than a chunk), a JPEG-looking
/// value and random bytes, a short one.
fn values() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = [300usize, 4096, 50_000, 200_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("/page/{n}"), page(n, i as u32)))
        .collect();
    let mut jpeg = b"\xff\xd8\xff\xe0".to_vec();
    jpeg.extend(bytes(1, 8000));
    v.push(("/img/photo.jpg".into(), jpeg));
    v.push(("/bin/noise".into(), bytes(2, 4096)));
    v.push(("/short".into(), b"tiny".to_vec()));
    v
}

fn check_all(s: &Server, vals: &[(String, Vec<u8>)], when: &str) {
    let mut c = s.client();
    for (k, v) in vals {
        let r = c.get(k);
        assert_eq!((r.status, r.body.len()), (200, v.len()), "{when}: GET {k}");
        assert!(r.body == *v, "{when}: GET {k} gave other bytes");
    }
    // The memcached door reads the same values (keys without the leading slash).
    let mut m = Mc::connect(s);
    for (k, v) in vals.iter().filter(|(_, v)| v.len() < 60_000) {
        let answer = m.ask_bytes(format!("get {}\r\n", &k[1..]).as_bytes(), "END\r\n");
        let flags = if k == "/from-mc" { 5 } else { 0 };
        let head = format!("VALUE {} {flags} {}\r\n", &k[1..], v.len());
        assert!(
            answer.starts_with(head.as_bytes()),
            "{when}: get {k}: {:?}",
            String::from_utf8_lossy(&answer[..40.min(answer.len())])
        );
        assert!(answer[head.len()..head.len() + v.len()] == v[..], "{when}: get {k} gave other bytes");
    }
}

#[test]
fn every_door_reads_back_what_was_stored_under_any_setting_and_after_a_crash() {
    let args = ["--compression", "zstd", "--chunk-size", "64KiB", "--memcache-listen", "127.0.0.1:0"];
    let mut s = Server::start(&args);
    let vals = values();
    let mut c = s.client();
    for (k, v) in &vals {
        assert_eq!(c.put(k, v).status, 200, "PUT {k}");
    }
    // A value set over the memcached door is coded too, and read over HTTP.
    let mc_value = page(3000, 77);
    let mut m = Mc::connect(&s);
    let mut set = format!("set from-mc 5 0 {}\r\n", mc_value.len()).into_bytes();
    set.extend_from_slice(&mc_value);
    set.extend_from_slice(b"\r\n");
    assert_eq!(m.ask(&set, "\r\n"), "STORED\r\n");
    let mut vals = vals;
    vals.push(("/from-mc".into(), mc_value.clone()));
    check_all(&s, &vals, "as written");

    let st = s.stats();
    let z = &st["compression"];
    assert_eq!(z["codec"], "zstd");
    assert_eq!(z["coded_puts"], 4, "three pages and the memcached one: {z}");
    assert_eq!(z["raw_probed"], 2, "the JPEG and the noise: {z}");
    let (logical, stored) = (z["coded_logical_bytes"].as_u64().unwrap(), z["coded_stored_bytes"].as_u64().unwrap());
    assert!(stored * 3 < logical, "{stored} of {logical}");
    // What the ring holds, by coding: the coded values (the large one's chunks each once) and
    // the three stored as sent, as in the metrics.
    let held = &z["held"];
    assert_eq!((held["zstd"]["values"].as_u64(), held["raw"]["values"].as_u64()), (Some(4 + 4), Some(3)), "{held}");
    let raw_bytes: usize = vals
        .iter()
        .filter(|(k, _)| ["/img/photo.jpg", "/bin/noise", "/short"].contains(&k.as_str()))
        .map(|(_, v)| v.len())
        .sum();
    assert_eq!(held["raw"]["logical_bytes"].as_u64(), Some(raw_bytes as u64));
    let metrics = String::from_utf8_lossy(&c.get("/_larder/metrics").body).into_owned();
    assert!(metrics.contains(&format!("larder_held_logical_bytes{{coding=\"raw\"}} {raw_bytes}")), "{metrics}");

    // Validators and ranges are the value's: a 304 for its ETag, a range of its bytes.
    let r = c.get("/page/4096");
    let etag = r.header("etag").unwrap().to_string();
    let again = c.request("GET", "/page/4096", &[("If-None-Match", &etag)], b"");
    assert_eq!(again.status, 304);
    let part = c.request("GET", "/page/4096", &[("Range", "bytes=1000-1999")], b"");
    assert_eq!((part.status, &part.body[..]), (206, &vals[1].1[1000..2000]));
    let head = c.request("HEAD", "/page/50000", &[], b"");
    assert_eq!(head.header("content-length"), Some("50000"));
    let flags = m.ask(b"mg from-mc f s v\r\n", "\r\n");
    assert!(flags.starts_with("VA 3000 f5 s3000"), "{flags}");

    // kill -9 (the restart scans the volume), restarted without compression; then a
    // graceful restart with lz4.
    s.kill();
    s.restart_with(&["--memcache-listen", "127.0.0.1:0"]);
    assert_eq!(s.stats()["recovery"]["scans"], 1);
    check_all(&s, &vals, "after kill -9, restarted with --compression none");
    let etag_after = s.client().get("/page/4096").header("etag").unwrap().to_string();
    assert_eq!(etag_after, etag, "the ETag does not depend on how the value is stored");
    s.stop();
    s.restart_with(&["--compression", "lz4", "--memcache-listen", "127.0.0.1:0"]);
    check_all(&s, &vals, "after a graceful restart with --compression lz4");
    assert_eq!(s.stats()["corrupt_reads"], 0);
    s.stop();

    let out = Command::new(env!("CARGO_BIN_EXE_larder")).args(["check"]).arg(&s.dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // Four values, and the four chunks of the one longer than a chunk.
    assert!(text.contains("8 coded (compressed) records decoded and checked"), "{text}");
}

#[test]
fn settings_that_cannot_be_honoured_refuse_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, says) in [
        (&["--compression-level", "5"][..], "need --compression"),
        (&["--compression", "none", "--compression-min-size", "1KiB"][..], "need --compression"),
        (&["--compression", "lz4", "--compression-level", "3"][..], "lz4 has no levels"),
        (&["--compression", "zstd", "--compression-level", "30"][..], "not a zstd level"),
        (&["--compression", "gzip"][..], "unknown codec"),
        (&["--compression", "lz4", "--compression-dictionary", "auto"][..], "needs --compression zstd"),
        (&["--compression-dictionary", "auto"][..], "needs --compression zstd"),
        (&["--compression", "zstd", "--compression-dictionary-depth", "2"][..], "need --compression-dictionary auto"),
        (&["--compression", "zstd", "--compression-dictionary", "yes"][..], "use auto or none"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_larder"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(tmp.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Acceptance 1 of issue 42 on real files (`bench/compression.py --check`): HTML and JSON that
/// Debian's packages install store in at most 0.35x their bytes with zstd, PNG and JPEG images
/// in at most 1.01x, and every file reads back
/// byte-identical over HTTP and the memcached protocol, as written, after a graceful restart
/// and after kill -9.
#[test]
fn files_debian_installs_store_in_a_third_and_read_back_whole() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("python3")
        .arg(root.join("bench/compression.py"))
        .args(["--per-group", "400", "--check", "--larder", env!("CARGO_BIN_EXE_larder"), "--out"])
        .arg(out.path().join("corpus.md"))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("every file byte-identical"), "{stdout}");
}

/// A GET that accepts zstd gets a value stored as a Zstandard frame as it is, with its own
/// ETag; every other client gets the value; both carry `Vary`. Ranges are of the value;
/// either tag names the version for a write's `If-Match`. On both HTTP servers.
#[test]
fn clients_that_accept_zstd_get_the_stored_frame_and_others_the_value() {
    for http in ["native", "hyper"] {
        let s = Server::start(&["--compression", "zstd", "--http-server", http, "--memory-capacity", "64MiB"]);
        let mut c = s.client();
        let v = page(4096, 3);
        assert_eq!(c.put("/p", &v).status, 200);
        let mut jpeg = b"\xff\xd8\xff\xe0".to_vec();
        jpeg.extend(bytes(5, 4000));
        assert_eq!(c.put("/img", &jpeg).status, 200);
        let zstd = [("Accept-Encoding", "gzip, zstd")];
        // Twice: from disk, then from the memory tier (where it is not decoded at all).
        let mut tags = Vec::new();
        for round in 0..3 {
            let z = c.request("GET", "/p", &zstd, b"");
            assert_eq!(
                (z.status, z.header("content-encoding"), z.header("vary")),
                (200, Some("zstd"), Some("accept-encoding")),
                "{http} {round}"
            );
            assert!(z.body.len() < v.len() / 2);
            assert_eq!(zstd::bulk::decompress(&z.body, v.len()).unwrap(), v, "{http} {round}: the frame is the value");
            let id = c.get("/p");
            assert_eq!(
                (id.status, id.header("content-encoding"), id.header("vary")),
                (200, None, Some("accept-encoding"))
            );
            assert!(id.body == v);
            let (zt, it) = (z.header("etag").unwrap().to_string(), id.header("etag").unwrap().to_string());
            assert_ne!(zt, it, "the two representations have their own tags");
            assert!(zt.ends_with("-zstd\""), "{zt}");
            tags.push((zt, it, z.header("x-cache").map(str::to_string)));
        }
        assert_eq!(tags[2].2.as_deref(), Some("MEMC"), "{http}: served from memory: {tags:?}");
        let (zt, it) = (tags[0].0.clone(), tags[0].1.clone());
        // Revalidation: a 304 only for the tag of the representation the client would get.
        let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("If-None-Match", &zt)], b"");
        assert_eq!((r.status, r.header("etag")), (304, Some(zt.as_str())), "{http}");
        let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("If-None-Match", &it)], b"");
        assert_eq!((r.status, r.header("content-encoding")), (200, Some("zstd")), "{http}");
        let r = c.request("GET", "/p", &[("If-None-Match", &it)], b"");
        assert_eq!(r.status, 304);
        let r = c.request("GET", "/p", &[("If-None-Match", &zt)], b"");
        assert_eq!((r.status, r.body.len()), (200, v.len()));
        // HEAD describes the representation a GET would carry.
        let h = c.request("HEAD", "/p", &zstd, b"");
        let coded_len = c.request("GET", "/p", &zstd, b"").body.len().to_string();
        assert_eq!(
            (h.header("content-encoding"), h.header("content-length")),
            (Some("zstd"), Some(coded_len.as_str()))
        );
        let h = c.request("HEAD", "/p", &[], b"");
        assert_eq!((h.header("content-encoding"), h.header("content-length")), (None, Some("4096")));
        // A range is of the value, whatever the client accepts.
        let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("Range", "bytes=10-19")], b"");
        assert_eq!((r.status, r.header("content-encoding"), &r.body[..]), (206, None, &v[10..20]));
        // A ranged revalidation is of the value itself, whatever the client accepts.
        let r =
            c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("Range", "bytes=0-9"), ("If-None-Match", &it)], b"");
        assert_eq!((r.status, r.header("etag")), (304, Some(it.as_str())), "{http}");
        let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("Range", "bytes=0-9"), ("If-Match", &it)], b"");
        assert_eq!(r.status, 206, "{http}");
        // If-Match on a GET compares the representation; on a write, either names the version.
        let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd"), ("If-Match", &it)], b"");
        assert_eq!(r.status, 412);
        let r = c.request("PUT", "/p", &[("If-Match", &zt)], &page(4096, 4));
        assert_eq!(r.status, 200, "{http}");
        // A value stored raw does not vary.
        let r = c.request("GET", "/img", &zstd, b"");
        assert_eq!((r.status, r.header("content-encoding"), r.header("vary")), (200, None, None));
        assert!(r.body == jpeg);
    }
    // Stored with lz4 (no content coding to send): always the value, never Vary.
    let s = Server::start(&["--compression", "lz4"]);
    let mut c = s.client();
    assert_eq!(c.put("/p", &page(4096, 3)).status, 200);
    let r = c.request("GET", "/p", &[("Accept-Encoding", "zstd, lz4")], b"");
    assert_eq!((r.header("content-encoding"), r.header("vary"), r.body.len()), (None, None, 4096));
}

/// nginx's `proxy_cache` in front keeps the two representations apart by `Vary`: a client
/// that accepts zstd and one that does not each get theirs, from larder and then from nginx's
/// cache. nginx is installed by scripts/install-bench-deps.sh; without it this test fails.
#[test]
fn a_cache_in_front_keeps_the_coded_and_the_plain_answer_apart() {
    let s = Server::start(&["--compression", "zstd"]);
    let v = page(8192, 8);
    assert_eq!(s.client().put("/doc/page.html", &v).status, 200);
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1);
    let d = dir.path().display();
    let servers = format!(
        r#"  proxy_cache_path {d}/cache keys_zone=front:1m;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://{larder};
      proxy_http_version 1.1;
      proxy_cache front;
      proxy_cache_valid 200 10m;
      proxy_ignore_headers Cache-Control Expires;
      add_header X-Front $upstream_cache_status;
    }}
  }}"#,
        larder = s.addr
    );
    let nginx = common::nginx::start(dir.path(), port, &servers);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut front = Client::connect(addr);
    let mut seen = Vec::new();
    for (round, accepts) in [(0, true), (0, false), (1, true), (1, false), (2, false), (2, true)] {
        let headers: &[(&str, &str)] = if accepts { &[("Accept-Encoding", "zstd")] } else { &[] };
        let r = front.request("GET", "/doc/page.html", headers, b"");
        assert_eq!(r.status, 200);
        if accepts {
            assert_eq!(r.header("content-encoding"), Some("zstd"), "round {round}");
            assert_eq!(zstd::bulk::decompress(&r.body, v.len()).unwrap(), v, "round {round}");
        } else {
            assert_eq!(r.header("content-encoding"), None, "round {round}: a plain client got the coded answer");
            assert!(r.body == v, "round {round}");
        }
        seen.push((accepts, r.header("x-front").unwrap_or("-").to_string()));
    }
    drop(nginx);
    assert_eq!(&seen[..2].iter().map(|s| s.1.as_str()).collect::<Vec<_>>(), &["MISS", "MISS"], "{seen:?}");
    assert!(seen[2..].iter().all(|s| s.1 == "HIT"), "each representation cached on its own: {seen:?}");
}

/// A PUT coded with zstd is stored as sent: a client that accepts zstd gets those bytes, any
/// other the value; other codings are refused with 415 before anything is stored. With
/// compression off, on both HTTP servers.
#[test]
fn a_value_put_coded_with_zstd_is_kept_as_sent() {
    for http in ["native", "hyper"] {
        let s = Server::start(&["--http-server", http, "--chunk-size", "64KiB", "--memcache-listen", "127.0.0.1:0"]);
        let mut c = s.client();
        let v = page(10_000, 21);
        let frame = zstd::bulk::compress(&v, 19).unwrap();
        let r = c.request("PUT", "/sent", &[("Content-Encoding", "zstd"), ("Content-Type", "text/html")], &frame);
        assert_eq!(r.status, 200, "{http}: {}", String::from_utf8_lossy(&r.body));
        let plain = c.get("/sent");
        assert!(plain.body == v, "{http}");
        assert_eq!((plain.header("content-type"), plain.header("etag")), (Some("text/html"), r.header("etag")));
        let z = c.request("GET", "/sent", &[("Accept-Encoding", "zstd")], b"");
        assert_eq!((z.header("content-encoding"), &z.body[..]), (Some("zstd"), &frame[..]), "{http}: as sent");
        // The memcached door reads the value.
        let mut m = Mc::connect(&s);
        let answer = m.ask_bytes(b"get sent\r\n", "END\r\n");
        assert!(answer.starts_with(b"VALUE sent 0 10000\r\n") && answer[20..20 + v.len()] == v[..], "{http}");
        for (coding, body, status) in [
            ("gzip", &b"\x1f\x8b whatever"[..], 415),
            ("zstd, gzip", &frame[..], 415),
            ("zstd", &b"not a frame"[..], 400),
            ("zstd", &zstd::bulk::compress(&vec![b'a'; 70_000], 3).unwrap()[..], 413),
        ] {
            let r = c.request("PUT", "/refused", &[("Content-Encoding", coding)], body);
            assert_eq!(r.status, status, "{http} {coding}: {}", String::from_utf8_lossy(&r.body));
            if status == 415 {
                assert_eq!(r.header("accept-encoding"), Some("zstd"));
            }
        }
        assert_eq!(c.get("/refused").status, 404, "{http}: nothing refused was stored");
        // Identity is no coding at all.
        let r = c.request("PUT", "/plain", &[("Content-Encoding", "identity")], b"as is");
        assert_eq!((r.status, c.get("/plain").body), (200, b"as is".to_vec()));
    }
}

/// `--compression-dictionary auto`: a prefix's values train a dictionary (seen in the stats);
/// the values it codes reach every client decoded (no client holds the dictionary: no
/// `Content-Encoding`, no `Vary`), over HTTP and memcached, after a graceful restart and a
/// kill -9, and `larder check` decodes them.
#[test]
fn values_coded_with_a_trained_dictionary_reach_every_client_decoded() {
    let args = [
        "--compression",
        "zstd",
        "--compression-dictionary",
        "auto",
        "--compression-dictionary-sample",
        "16KiB",
        "--memory-capacity",
        "64MiB",
        "--memcache-listen",
        "127.0.0.1:0",
    ];
    let mut s = Server::start(&args);
    let mut c = s.client();
    let doc = |i: u32| page(700 + (i as usize * 131) % 1500, i);
    for i in 0..60 {
        assert_eq!(c.put(&format!("/api/{i}"), &doc(i)).status, 200);
    }
    let dicts = |s: &Server| s.stats()["compression"]["dictionaries"].clone();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dicts(&s)["trained"] != 1 {
        assert!(std::time::Instant::now() < until, "no dictionary: {}", dicts(&s));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let d = dicts(&s)["each"][0].clone();
    assert_eq!((d["prefix"].as_str(), d["retired"].as_bool()), (Some("api"), Some(false)), "{d}");
    let mut vals: Vec<(String, Vec<u8>)> = (100..130).map(|i| (format!("/api/{i}"), doc(i))).collect();
    for (k, v) in &vals {
        assert_eq!(c.put(k, v).status, 200);
    }
    assert_eq!(dicts(&s)["each"][0]["values"], 30);
    let decoded = |s: &Server, vals: &[(String, Vec<u8>)], when: &str| {
        let mut c = s.client();
        for (k, v) in vals {
            let r = c.request("GET", k, &[("Accept-Encoding", "zstd")], b"");
            assert_eq!((r.status, r.header("content-encoding"), r.header("vary")), (200, None, None), "{when} {k}");
            assert!(r.body == *v, "{when} {k}");
        }
        check_all(s, vals, when);
    };
    decoded(&s, &vals, "from memory, held coded");
    s.stop();
    s.restart();
    decoded(&s, &vals, "after a graceful restart");
    let late = ("/api/late".to_string(), doc(999));
    assert_eq!(s.client().put(&late.0, &late.1).status, 200);
    vals.push(late);
    s.kill();
    s.restart();
    decoded(&s, &vals, "after kill -9");
    assert_eq!(s.stats()["compression"]["decode_failures"], 0);
    s.stop();
    let out = Command::new(env!("CARGO_BIN_EXE_larder")).args(["check"]).arg(&s.dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 compression dictionaries, sound"), "{text}");
}
