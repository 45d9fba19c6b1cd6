//! The HTTP API of DESIGN §2, as a client sees it: round trips, statuses, positions, limits.

mod common;
use common::*;

#[test]
fn put_get_head_delete_round_trip() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let r = c.put("/foo", b"hello world");
    assert_eq!(r.status, 200);
    let r = c.get("/foo");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello world"[..]));
    assert_eq!(r.header("x-cache"), Some("DISK"));
    assert_eq!(r.header("content-length"), Some("11"));
    let h = c.request("HEAD", "/foo", &[], b"");
    assert_eq!((h.status, h.header("content-length"), h.body.len()), (200, Some("11"), 0));
    assert_eq!(h.header("x-position"), r.header("x-position"));
    assert_eq!(c.delete("/foo").status, 200);
    assert_eq!(c.get("/foo").status, 404);
    assert_eq!(c.request("HEAD", "/foo", &[], b"").status, 404);
    assert_eq!(c.delete("/foo").status, 404);
}

#[test]
fn statuses_for_bad_requests_carry_a_message() {
    let s = Server::start(&["--max-value-size", "1KiB"]);
    let mut c = s.client();
    let r = c.request("POST", "/foo", &[], b"x");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("OPTIONS, GET, HEAD, PUT, PATCH, DELETE, PROPFIND, MKCOL"));
    assert!(!r.body.is_empty());
    for m in ["GET", "PUT", "DELETE"] {
        let r = c.request(m, "/", &[], b"");
        assert_eq!(r.status, 400, "{m} /");
        assert_eq!(r.body, b"empty key\n");
    }
    let r = c.get("/bad%zzkey");
    assert_eq!((r.status, r.body.as_slice()), (400, &b"badly percent-encoded key\n"[..]));
    assert_eq!(c.put(&format!("/{}", "k".repeat(1025)), b"v").status, 400);
    assert_eq!(c.put(&format!("/{}", "k".repeat(1024)), b"v").status, 200);
    let r = c.put("/_larder/mine", b"v");
    assert_eq!((r.status, r.body.as_slice()), (400, &b"keys under _larder/ are reserved\n"[..]));
    assert_eq!(c.delete("/_larder/stats").status, 400);
    let r = c.request("POST", "/_larder/stats", &[], b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    // The query string is not part of the key.
    assert_eq!(c.put("/q?x=1", b"query").status, 200);
    assert_eq!(c.get("/q").body, b"query");
}

#[test]
fn oversize_bodies_are_refused_before_being_read_and_store_nothing() {
    let s = Server::start(&["--max-value-size", "1KiB"]);
    let mut c = s.client();
    assert_eq!(c.put("/exact", &[7; 1024]).status, 200);
    // Declared too large: the answer comes without sending a byte of the body.
    c.raw(b"PUT /big HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n").unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 413);
    assert!(String::from_utf8_lossy(&r.body).contains("limit"));
    // Streamed (chunked, no length) past the limit.
    let mut c = s.client();
    c.raw(b"PUT /big2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    for _ in 0..3 {
        c.raw(b"200\r\n").unwrap();
        c.raw(&[1u8; 512]).unwrap();
        c.raw(b"\r\n").unwrap();
    }
    assert_eq!(c.read_response(false).unwrap().status, 413);
    let mut c = s.client();
    assert_eq!(c.get("/big").status, 404);
    assert_eq!(c.get("/big2").status, 404);
    assert_eq!(s.stats()["keys"], 1);
}

#[test]
fn values_and_keys_round_trip_verbatim() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let cases: &[(&str, &[u8])] = &[
        ("/empty", b""),
        ("/a/b/c/thumb.jpg", b"slashes"),
        ("/with%20space%20in%20it", b"spaces"),
        ("/%C3%A9t%C3%A9/%E6%97%A5%E6%9C%AC", "utf8 ✓".as_bytes()),
        ("/bin", &[0, 255, 13, 10, 0]),
    ];
    for (path, value) in cases {
        assert_eq!(c.put(path, value).status, 200, "{path}");
    }
    for (path, value) in cases {
        let r = c.get(path);
        assert_eq!((r.status, r.body.as_slice()), (200, *value), "{path}");
    }
    // The same key spelled with different (valid) encodings is the same key.
    assert_eq!(c.get("/%61/b/c/thumb.jpg").body, b"slashes");
}

fn position(r: &Resp) -> (u64, u64, u64) {
    let p: Vec<u64> = r.header("x-position").expect("x-position").split(',').map(|n| n.parse().unwrap()).collect();
    (p[0], p[1], p[2])
}

#[test]
fn positions_match_and_never_overlap() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let mut last: Option<(u64, u64, u64)> = None;
    for i in 0..50u64 {
        let value = bytes(i, (i * 37 % 500) as usize);
        let put = c.put(&format!("/k{i}"), &value);
        let pp = position(&put);
        let get = c.get(&format!("/k{i}"));
        assert_eq!(position(&get), pp);
        assert!(pp.2 >= value.len() as u64 + 2, "size counts the whole record");
        if let Some((v, o, n)) = last {
            assert!(pp.0 != v || pp.1 >= o + n, "{pp:?} overlaps {:?}", (v, o, n));
        }
        last = Some(pp);
    }
}

#[test]
fn admin_endpoints() {
    let s = Server::start(&["--volume-size", "1MiB", "--volume-count", "3"]);
    let mut c = s.client();
    let r = c.get("/_larder/health");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));
    c.put("/a", b"1");
    c.put("/b", b"2");
    let st = s.stats();
    for field in ["keys", "bytes_used", "capacity_bytes", "volumes", "active_volume"] {
        assert!(st[field].is_u64(), "{field} missing in {st}");
    }
    assert_eq!(st["keys"], 2);
    assert_eq!(st["capacity_bytes"], 3 << 20);
    assert_eq!(st["volumes"], 1);
    assert_eq!(st["active_volume"], 0);
    assert_eq!(st["bytes_used"].as_u64(), Some(size_of(&s.dir, ".lrv")));
    assert_eq!(c.get("/_larder/nothing").status, 404);
}

#[test]
fn header_and_uri_limits() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let long_uri = format!("/{}", "u".repeat(9000));
    assert_eq!(c.get(&long_uri).status, 414);
    let mut c = s.client();
    // A 15 KiB header block is within the 16 KiB default.
    let fine = "h".repeat(15_000);
    assert_eq!(c.request("PUT", "/hdr", &[("X-Big", &fine)], b"ok").status, 200);
    let big = "h".repeat(20_000);
    c.raw(format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes()).unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 431);
    // Both limits are configurable.
    let s = Server::start(&["--max-header-size", "2KiB", "--max-uri-size", "100"]);
    let mut c = s.client();
    assert_eq!(c.get(&format!("/{}", "u".repeat(150))).status, 414);
    assert_eq!(c.get(&format!("/{}", "u".repeat(90))).status, 404);
    c.raw(format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "h".repeat(3000)).as_bytes()).unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 431);
}

#[test]
fn idle_and_slow_header_connections_are_closed_on_their_own_clocks() {
    use std::time::Duration;
    let s = Server::start(&["--idle-timeout", "3s", "--header-timeout", "1s"]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"v").status, 200);
    // Idle longer than the header timeout but shorter than the idle timeout: still open.
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(c.try_request("GET", "/k", &[], b"").expect("connection kept").status, 200);
    // Idle past the idle timeout: closed; the next request sees EOF or a reset.
    std::thread::sleep(Duration::from_millis(4500));
    assert!(c.try_request("GET", "/k", &[], b"").is_err());
    // A request head that never completes is cut after the header timeout.
    let mut slow = s.client();
    slow.raw(b"GET /k HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let _ = slow.raw(b"X-Late: 1\r\n\r\n");
    assert!(slow.read_response(false).is_err(), "slow header block was served");
}
