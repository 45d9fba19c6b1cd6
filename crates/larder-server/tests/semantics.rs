//! HTTP semantics as clients, curl and nginx see them: TTLs, content types, validators and
//! 304s, byte ranges, and conditional writes.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn max_age(r: &Resp) -> u64 {
    let cc = r.header("cache-control").expect("Cache-Control on a key with a TTL");
    cc.strip_prefix("max-age=").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("Cache-Control {cc:?}"))
}

#[test]
fn x_ttl_expires_keys_on_time_in_both_tiers() {
    for promote_after in ["1", "1000"] {
        let s = Server::start(&["--promote-after", promote_after]);
        let mut c = s.client();
        let sent = Instant::now();
        assert_eq!(c.request("PUT", "/t", &[("X-TTL", "1")], b"soon gone").status, 200);
        // The server stamped the PUT between `sent` and `stored`: the key must be served until
        // `sent` + 1 s (less the stamp's millisecond rounding) and gone by `stored` + 1.1 s
        // (100 ms after its TTL at the latest).
        let stored = sent.elapsed();
        loop {
            let asked = sent.elapsed();
            let r = c.get("/t");
            let answered = sent.elapsed();
            if r.status == 404 {
                // Store and expiry times are whole milliseconds: up to 1 ms early.
                assert!(answered >= Duration::from_millis(999), "gone {answered:?} after the PUT, before its TTL");
                break;
            }
            assert_eq!((r.status, &r.body[..]), (200, &b"soon gone"[..]));
            assert!(max_age(&r) <= 1);
            let limit = stored + Duration::from_millis(1100);
            assert!(asked < limit, "still served {asked:?} after the PUT (answered by {stored:?}), TTL 1 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = s.stats();
        assert_eq!(st["keys"].as_u64(), Some(0), "the expired entry was dropped when read: {st}");
        if promote_after == "1" {
            assert!(st["memory_hits"].as_u64().unwrap() > 0, "the memory tier served it before expiry");
        }
    }
}

#[test]
fn a_patch_touches_the_ttl_and_keeps_the_value_and_its_version_in_both_tiers() {
    for promote_after in ["1", "1000"] {
        let s = Server::start(&["--promote-after", promote_after, "--memcache-listen", "127.0.0.1:0"]);
        let mut c = s.client();
        let put = c.request("PUT", "/t", &[("X-TTL", "1"), ("Content-Type", "text/x-kept")], b"kept");
        let etag = put.header("etag").unwrap().to_string();
        c.get("/t"); // promotes it with --promote-after 1
        let r = c.get("/t");
        assert_eq!(r.header("x-cache"), Some(if promote_after == "1" { "MEMC" } else { "DISK" }));
        let mut m = common::mc::Mc::connect(&s);
        let cas_before = m.ask(b"gets t\r\n", "END\r\n");
        let touched = c.request("PATCH", "/t", &[("X-TTL", "60")], b"");
        assert_eq!((touched.status, touched.header("etag")), (200, Some(etag.as_str())));
        std::thread::sleep(Duration::from_millis(1300));
        let r = c.get("/t");
        assert_eq!((r.status, &r.body[..]), (200, &b"kept"[..]), "alive past its first TTL");
        assert_eq!(r.header("etag"), Some(etag.as_str()), "the same version");
        assert_eq!(r.header("content-type"), Some("text/x-kept"));
        assert!(max_age(&r) > 50);
        assert_eq!(m.ask(b"gets t\r\n", "END\r\n"), cas_before, "the same cas unique");
        // A touch to a short TTL expires it then; X-TTL 0 keeps it for good.
        assert_eq!(c.request("PATCH", "/t", &[("X-TTL", "1")], b"").status, 200);
        std::thread::sleep(Duration::from_millis(1300));
        assert_eq!(c.get("/t").status, 404, "expired on its new TTL");
        assert_eq!(c.request("PATCH", "/t", &[("X-TTL", "60")], b"").status, 404, "no life back for the expired");
        c.request("PUT", "/u", &[("X-TTL", "1")], b"u");
        assert_eq!(c.request("PATCH", "/u", &[("X-TTL", "0")], b"").status, 200);
        std::thread::sleep(Duration::from_millis(1300));
        let r = c.get("/u");
        assert_eq!(r.status, 200);
        assert!(
            !r.header("cache-control").unwrap_or("").contains("max-age"),
            "no expiry: {:?}",
            r.header("cache-control")
        );
        // Bad touches: a clear 400, and nothing changes.
        for (headers, body, says) in [
            (&[][..], &b""[..], "needs X-TTL"),
            (&[("X-TTL", "soon")][..], &b""[..], "X-TTL must be"),
            (&[("X-TTL", "5")][..], &b"a body"[..], "takes no body"),
            (&[("X-TTL", "5"), ("If-Match", "*")][..], &b""[..], "no preconditions"),
        ] {
            let r = c.request("PATCH", "/u", headers, body);
            assert_eq!(r.status, 400, "{says}");
            assert!(String::from_utf8_lossy(&r.body).contains(says), "{}", String::from_utf8_lossy(&r.body));
        }
        assert_eq!(c.get("/u").body, b"u");
        assert_eq!(c.request("PATCH", "/missing", &[("X-TTL", "5")], b"").status, 404);
    }
}

#[test]
fn a_put_with_x_ttl_keep_keeps_the_expiry_of_the_value_it_replaces() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let first = Instant::now();
    let etag = c.request("PUT", "/n", &[("X-TTL", "3")], b"1").header("etag").unwrap().to_string();
    std::thread::sleep(Duration::from_millis(1100));
    // A read-modify-write (an increment, say) that must not push the expiry back.
    let r = c.request("PUT", "/n", &[("X-TTL", "keep"), ("If-Match", &etag)], b"2");
    assert_eq!(r.status, 200);
    let r = c.get("/n");
    assert_eq!(&r.body[..], b"2");
    assert!(max_age(&r) <= 2, "the first value's expiry, not a new one");
    assert_eq!(c.request("PUT", "/n", &[("X-TTL", "keep"), ("If-Match", &etag)], b"3").status, 412);
    while first.elapsed() < Duration::from_millis(3100) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.get("/n").status, 404, "gone when the first value would have gone");
    // Nothing to keep: the server's default (here none).
    assert_eq!(c.request("PUT", "/fresh", &[("X-TTL", "keep")], b"f").status, 200);
    assert!(!c.get("/fresh").header("cache-control").unwrap_or("").contains("max-age"));
    let r = c.request("PUT", "/fresh", &[("X-TTL", "kept")], b"x");
    assert_eq!(r.status, 400);
    assert_eq!(c.get("/fresh").body, b"f");
}

#[test]
fn ttls_survive_a_restart_and_max_age_and_default_ttl_apply() {
    let mut s = Server::start(&["--default-ttl", "1s"]);
    let mut c = s.client();
    let put = |c: &mut Client, path: &str, headers: &[(&str, &str)]| {
        let r = c.request("PUT", path, headers, b"v");
        assert_eq!(r.status, 200, "PUT {path}: {}", String::from_utf8_lossy(&r.body));
    };
    put(&mut c, "/ttl1", &[("X-TTL", "1")]);
    put(&mut c, "/hour", &[("X-TTL", "3600")]);
    put(&mut c, "/maxage1", &[("Cache-Control", "public, max-age=1")]);
    put(&mut c, "/both", &[("X-TTL", "3600"), ("Cache-Control", "max-age=1")]);
    put(&mut c, "/default", &[]);
    put(&mut c, "/never", &[("X-TTL", "0")]);
    let r = c.get("/hour");
    assert!((3590..=3600).contains(&max_age(&r)), "{:?}", r.header("cache-control"));
    assert_eq!(c.get("/never").header("cache-control"), Some("no-cache"), "no TTL: revalidate");
    assert!(max_age(&c.get("/both")) >= 3590, "X-TTL wins over max-age");
    // Bad TTLs are refused and change nothing.
    for bad in ["-1", "1.5", "soon", "99999999999999999999"] {
        let r = c.request("PUT", "/hour", &[("X-TTL", bad)], b"replaced");
        assert_eq!(r.status, 400, "X-TTL {bad:?}");
        assert!(String::from_utf8_lossy(&r.body).contains("X-TTL"), "one-line message");
    }
    let r = c.request("PUT", "/hour", &[("Cache-Control", "max-age=later")], b"replaced");
    assert_eq!(r.status, 400);
    assert_eq!(c.get("/hour").body, b"v");
    // max-age=0 means stale at once: the new value replaces the old and is already expired.
    put(&mut c, "/stale", &[("X-TTL", "0")]);
    put(&mut c, "/stale", &[("Cache-Control", "max-age=0")]);
    assert_eq!(c.get("/stale").status, 404);
    // An expired key is absent for DELETE too.
    put(&mut c, "/brief", &[("X-TTL", "1")]);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(c.delete("/brief").status, 404);

    s.stop();
    std::thread::sleep(Duration::from_millis(1500));
    s.restart();
    let mut c = s.client();
    for gone in ["/ttl1", "/maxage1", "/default"] {
        assert_eq!(c.get(gone).status, 404, "{gone} outlived its TTL across a restart");
    }
    for kept in ["/hour", "/both", "/never"] {
        assert_eq!(c.get(kept).status, 200, "{kept}");
    }
    assert!((3500..=3598).contains(&max_age(&c.get("/hour"))), "the expiry is stored, not the TTL: it kept counting");
}

#[test]
fn content_type_is_stored_with_the_value() {
    let mut s = Server::start(&[]);
    let mut c = s.client();
    assert_eq!(c.request("PUT", "/p.png", &[("Content-Type", "image/png")], b"\x89PNG").status, 200);
    assert_eq!(c.request("PUT", "/h", &[("Content-Type", "text/html; charset=utf-8")], b"<p>").status, 200);
    assert_eq!(c.put("/raw", b"bytes").status, 200);
    assert_eq!(c.request("PUT", "/blank", &[("Content-Type", "")], b"v").status, 200);
    let long = "x/".to_string() + &"y".repeat(1100);
    let r = c.request("PUT", "/long", &[("Content-Type", &long)], b"v");
    assert_eq!(r.status, 400, "a content type over 1 KiB is refused");
    assert_eq!(c.get("/long").status, 404);
    s.stop();
    s.restart();
    let mut c = s.client();
    for (path, ct) in [
        ("/p.png", "image/png"),
        ("/h", "text/html; charset=utf-8"),
        ("/raw", "application/octet-stream"),
        ("/blank", "application/octet-stream"),
    ] {
        for tier in ["DISK", "DISK", "MEMC"] {
            // promote-after 2: the third read is from memory
            let r = c.get(path);
            assert_eq!((r.header("content-type"), r.header("x-cache")), (Some(ct), Some(tier)), "GET {path}");
        }
        assert_eq!(c.request("HEAD", path, &[], b"").header("content-type"), Some(ct), "HEAD {path}");
    }
}

#[test]
fn validators_answer_304_and_change_with_the_value() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let put = c.put("/v", b"version one");
    let r = c.get("/v");
    let etag = r.header("etag").expect("ETag").to_string();
    assert_eq!(put.header("etag"), Some(etag.as_str()), "the PUT answers the stored value's ETag");
    assert!(etag.starts_with('"') && etag.ends_with('"'), "a strong tag: {etag}");
    let lm = r.header("last-modified").expect("Last-Modified").to_string();
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    // Disk, then memory: the same validators.
    for _ in 0..3 {
        let again = c.get("/v");
        assert_eq!((again.header("etag"), again.header("last-modified")), (Some(etag.as_str()), Some(lm.as_str())));
    }
    for (name, value) in [
        ("If-None-Match", etag.clone()),
        ("If-None-Match", format!("\"other\", W/{etag}")),
        ("If-None-Match", "*".to_string()),
        ("If-Modified-Since", lm.clone()),
        ("If-Modified-Since", "Fri, 01 Jan 2100 00:00:00 GMT".to_string()),
    ] {
        for method in ["GET", "HEAD"] {
            let r = c.request(method, "/v", &[(name, &value)], b"");
            assert_eq!(r.status, 304, "{method} with {name}: {value}");
            assert!(r.body.is_empty());
            assert_eq!(r.header("etag"), Some(etag.as_str()));
        }
    }
    for (name, value) in [("If-None-Match", "\"other\""), ("If-Modified-Since", "Sat, 01 Jan 2000 00:00:00 GMT")] {
        let r = c.request("GET", "/v", &[(name, value)], b"");
        assert_eq!((r.status, &r.body[..]), (200, &b"version one"[..]), "{name}: {value}");
    }
    // If-None-Match decides when both are sent.
    let r = c.request("GET", "/v", &[("If-None-Match", "\"other\""), ("If-Modified-Since", &lm)], b"");
    assert_eq!(r.status, 200);
    c.put("/v", b"version one"); // the same bytes, stored again: a new version
    let r = c.request("GET", "/v", &[("If-None-Match", &etag)], b"");
    assert_eq!(r.status, 200);
    assert_ne!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(c.request("GET", "/absent", &[("If-None-Match", "*")], b"").status, 404);
}

#[test]
fn byte_ranges_of_small_and_large_values() {
    let s = Server::start(&["--max-value-size", "4MiB"]);
    let mut c = s.client();
    let big = bytes(7, 3 << 20);
    let small = bytes(8, 5000);
    assert_eq!(c.put("/big", &big).status, 200);
    assert_eq!(c.put("/small", &small).status, 200);
    assert_eq!(c.put("/empty", b"").status, 200);
    for (path, v) in [("/big", &big), ("/small", &small)] {
        let len = v.len();
        for (spec, a, b) in [
            ("bytes=0-99", 0, 99),
            ("bytes=100-", 100, len - 1),
            ("bytes=-100", len - 100, len - 1),
            ("bytes=4000-4999999", 4000, len - 1),
            ("bytes=65530-65545", 65530, 65545), // across a 64 KiB block boundary of /big
        ] {
            if a >= len {
                continue;
            }
            for _ in 0..3 {
                let r = c.request("GET", path, &[("Range", spec)], b"");
                assert_eq!(r.status, 206, "{path} {spec}");
                assert_eq!(r.header("content-range"), Some(format!("bytes {a}-{b}/{len}").as_str()));
                assert_eq!(r.body, &v[a..=b], "{path} {spec}");
                assert_eq!(r.header("content-length"), Some((b - a + 1).to_string().as_str()));
            }
        }
        let r = c.request("GET", path, &[("Range", "bytes=5000000-")], b"");
        assert_eq!(r.status, 416, "{path}");
        assert_eq!(r.header("content-range"), Some(format!("bytes */{len}").as_str()));
        // Several ranges, another unit or bad syntax: the whole value.
        for ignored in ["bytes=0-1,5-9", "items=0-5", "bytes=9-1"] {
            let r = c.request("GET", path, &[("Range", ignored)], b"");
            assert_eq!((r.status, r.body.len()), (200, len), "{path} {ignored}");
        }
        // HEAD ignores Range.
        let r = c.request("HEAD", path, &[("Range", "bytes=0-9")], b"");
        assert_eq!((r.status, r.header("content-length")), (200, Some(len.to_string().as_str())));
    }
    assert_eq!(c.request("GET", "/empty", &[("Range", "bytes=0-")], b"").status, 416);
    assert_eq!(c.request("GET", "/empty", &[("Range", "bytes=-1")], b"").status, 416);
    // If-Range: the range for the version named, the whole value for anything else (a stale
    // or weak tag, or a date, which has whole seconds and cannot tell two versions apart).
    let first = c.get("/big");
    let (etag, lm) = (first.header("etag").unwrap().to_string(), first.header("last-modified").unwrap().to_string());
    let r = c.request("GET", "/big", &[("Range", "bytes=10-19"), ("If-Range", &etag)], b"");
    assert_eq!((r.status, &r.body[..]), (206, &big[10..20]));
    for other in ["\"stale\"".to_string(), format!("W/{etag}"), lm.clone()] {
        let r = c.request("GET", "/big", &[("Range", "bytes=10-19"), ("If-Range", &other)], b"");
        assert_eq!((r.status, r.body.len()), (200, big.len()), "If-Range: {other}");
    }
    // If-Match on a GET: parts of one version only.
    let r = c.request("GET", "/big", &[("Range", "bytes=0-9"), ("If-Match", &etag)], b"");
    assert_eq!((r.status, &r.body[..]), (206, &big[..10]));
    let r = c.request("GET", "/big", &[("Range", "bytes=0-9"), ("If-Match", "\"stale\"")], b"");
    assert_eq!(r.status, 412);
    let r = c.request("GET", "/big", &[("If-Unmodified-Since", "Sat, 01 Jan 2000 00:00:00 GMT")], b"");
    assert_eq!(r.status, 412);
    let r = c.request("GET", "/big", &[("If-Unmodified-Since", &lm)], b"");
    assert_eq!((r.status, r.body.len()), (200, big.len()));
    // Ranges of a value the memory tier holds (promote-after 2).
    assert_eq!(c.put("/fresh", &small).status, 200);
    for tier in ["DISK", "DISK", "MEMC"] {
        let r = c.get("/fresh");
        assert_eq!(r.header("x-cache"), Some(tier));
    }
    let r = c.request("GET", "/fresh", &[("Range", "bytes=-10")], b"");
    assert_eq!((r.status, r.header("x-cache"), &r.body[..]), (206, Some("MEMC"), &small[small.len() - 10..]));
}

#[test]
fn conditional_puts_and_deletes() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let create = [("If-None-Match", "*")];
    assert_eq!(c.request("PUT", "/c", &create, b"first").status, 200);
    let r = c.request("PUT", "/c", &create, b"second");
    assert_eq!(r.status, 412);
    assert!(String::from_utf8_lossy(&r.body).starts_with("precondition failed"), "one-line message");
    assert_eq!(c.get("/c").body, b"first");
    let first = c.get("/c").header("etag").unwrap().to_string();
    let put = c.request("PUT", "/c", &[("If-Match", &first)], b"second");
    assert_eq!(put.status, 200);
    let second = put.header("etag").unwrap().to_string();
    // A stale tag, a weak tag and a missing key all fail If-Match; nothing is stored.
    for tag in [first.clone(), format!("W/{second}")] {
        assert_eq!(c.request("PUT", "/c", &[("If-Match", &tag)], b"third").status, 412, "If-Match {tag}");
    }
    assert_eq!(c.request("PUT", "/absent", &[("If-Match", "*")], b"x").status, 412);
    assert_eq!(c.get("/absent").status, 404);
    assert_eq!(c.get("/c").body, b"second");
    for _ in 0..3 {
        c.get("/c"); // into memory: the check still sees the current version
    }
    assert_eq!(c.request("DELETE", "/c", &[("If-Match", &first)], b"").status, 412);
    assert_eq!(c.get("/c").body, b"second");
    assert_eq!(c.request("DELETE", "/c", &[("If-Match", &second)], b"").status, 200);
    assert_eq!(c.get("/c").status, 404);
    assert_eq!(c.request("PUT", "/c", &create, b"again").status, 200, "absent again after the delete");
    let old = [("If-Unmodified-Since", "Sat, 01 Jan 2000 00:00:00 GMT")];
    assert_eq!(c.request("PUT", "/c", &old, b"late").status, 412, "stored after that date");
    let later = [("If-Unmodified-Since", "Fri, 01 Jan 2100 00:00:00 GMT")];
    assert_eq!(c.request("PUT", "/c", &later, b"again").status, 200);

    // A write bound to fail is refused before its body is sent: the client waits for
    // `100 Continue` and gets the 412 instead.
    let mut raw = s.client();
    raw.raw(
        b"PUT /c HTTP/1.1\r\nHost: x\r\nIf-None-Match: *\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n",
    )
    .unwrap();
    let r = raw.read_response(false).unwrap();
    assert_eq!(r.status, 412, "no 100 Continue for a write that cannot succeed");
    assert_eq!(c.get("/c").body, b"again");
}

/// Runs curl with `args` against `url`; returns (status, headers as lowercase lines, what
/// curl wrote to stdout: the body, or with `-I` the header block again).
fn curl(args: &[&str], url: &str) -> (u16, Vec<String>, Vec<u8>) {
    let dump = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "10", "-D"])
        .arg(dump.path())
        .args(args)
        .arg(url)
        .output()
        .expect("curl is needed for this test (scripts/install-bench-deps.sh installs it)");
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    let head = std::fs::read_to_string(dump.path()).unwrap();
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers = lines.filter(|l| !l.is_empty()).map(str::to_ascii_lowercase).collect();
    (status, headers, out.stdout)
}

fn has(headers: &[String], line: &str) -> bool {
    headers.iter().any(|h| h == &line.to_ascii_lowercase())
}

fn header<'a>(headers: &'a [String], name: &str) -> &'a str {
    let prefix = format!("{name}: ");
    headers.iter().find_map(|h| h.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name} in {headers:?}"))
}

#[test]
fn curl_head_range_and_revalidation() {
    let s = Server::start(&[]);
    let base = format!("http://{}", s.addr);
    let value = bytes(11, 1000);
    let mut c = s.client();
    let r = c.request("PUT", "/doc.html", &[("Content-Type", "text/html"), ("X-TTL", "600")], &value);
    assert_eq!(r.status, 200);

    let (status, h, _) = curl(&["-I"], &format!("{base}/doc.html"));
    assert_eq!(status, 200);
    for line in ["content-type: text/html", "content-length: 1000", "accept-ranges: bytes", "x-cache: DISK"] {
        assert!(has(&h, line), "curl -I: no {line:?} in {h:?}");
    }
    assert!(header(&h, "cache-control").starts_with("max-age=59"));
    let etag = header(&h, "etag").to_string();
    header(&h, "last-modified");

    let (status, h, body) = curl(&["-r", "0-99"], &format!("{base}/doc.html"));
    assert_eq!(status, 206);
    assert!(has(&h, "content-range: bytes 0-99/1000") && has(&h, "content-length: 100"), "{h:?}");
    assert_eq!(body, &value[..100]);

    let (status, h, body) = curl(&["-H", &format!("If-None-Match: {etag}")], &format!("{base}/doc.html"));
    assert_eq!(status, 304);
    assert!(body.is_empty());
    assert_eq!(header(&h, "etag"), etag);
}

/// nginx from Debian's packages, as the project's scripts install it.
fn nginx_binary() -> &'static str {
    let path = "/usr/sbin/nginx";
    assert!(Path::new(path).exists(), "nginx is needed for this test: run scripts/install-bench-deps.sh");
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// nginx in front of one larder, proxying without a cache, as a browser-facing edge would.
struct Nginx {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(upstream: std::net::SocketAddr) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let p = dir.path().display();
        let conf = format!(
            "user root;\nworker_processes 1;\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
               upstream larder {{ server {upstream}; keepalive 8; }}\n\
               server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
                 proxy_pass http://larder;\n      proxy_http_version 1.1;\n\
                 proxy_set_header Connection \"\";\n      client_max_body_size 1m;\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new(nginx_binary())
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .spawn()
            .expect("start nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {:?}",
                std::fs::read_to_string(dir.path().join("error.log"))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { child, port, _dir: dir }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn revalidation_passes_through_nginx_unchanged() {
    let s = Server::start(&[]);
    let nginx = Nginx::start(s.addr);
    let mut c = Client::connect(format!("127.0.0.1:{}", nginx.port).parse().unwrap());
    let value = bytes(12, 20_000);
    assert_eq!(c.request("PUT", "/page", &[("Content-Type", "text/html")], &value).status, 200);
    let first = c.get("/page");
    assert_eq!((first.status, &first.body[..]), (200, &value[..]));
    let etag = first.header("etag").expect("ETag through nginx").to_string();
    let lm = first.header("last-modified").expect("Last-Modified through nginx").to_string();
    assert_eq!(first.header("content-type"), Some("text/html"));
    // What a browser sends when it revalidates its copy.
    let r = c.request("GET", "/page", &[("If-None-Match", &etag), ("If-Modified-Since", &lm)], b"");
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    // A date after Last-Modified: larder answers 304 (RFC 9110: modified no later than the
    // date), while nginx's own check (`if_modified_since exact`) would not; so this 304 is
    // larder's, passed through.
    let r = c.request("GET", "/page", &[("If-Modified-Since", "Fri, 01 Jan 2100 00:00:00 GMT")], b"");
    assert_eq!((r.status, r.header("etag")), (304, Some(etag.as_str())));
    // A changed value: the stale tag gets the new body and a new tag.
    let newer = bytes(13, 20_000);
    assert_eq!(c.put("/page", &newer).status, 200);
    let r = c.request("GET", "/page", &[("If-None-Match", &etag)], b"");
    assert_eq!((r.status, &r.body[..]), (200, &newer[..]));
    assert_ne!(r.header("etag"), Some(etag.as_str()));
    // Ranges pass through too.
    let r = c.request("GET", "/page", &[("Range", "bytes=100-199")], b"");
    assert_eq!((r.status, &r.body[..]), (206, &newer[100..200]));
}
