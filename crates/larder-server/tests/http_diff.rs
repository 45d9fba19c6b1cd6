//! The server's own HTTP/1.1 loop against hyper, differentially: a corpus of well-formed and
//! hostile requests is sent, byte for byte, to a server started with `--http-server hyper`
//! (every request answered by hyper, as before the loop existed) and to one with the default
//! (the loop takes the key API's plain requests and hands anything else to hyper). What each
//! sends back on each connection, and whether it closes it, must be the same: same statuses,
//! same headers (the date, and the times and versions that differ between two servers, made
//! alike first), same bytes.

mod common;

use common::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One connection's worth: what is written, with a pause between the pieces.
struct Script {
    name: &'static str,
    pieces: Vec<Vec<u8>>,
}

fn script(name: &'static str, raw: &[u8]) -> Script {
    Script { name, pieces: vec![raw.to_vec()] }
}

fn put(key: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut r = format!("PUT {key} HTTP/1.1\r\nHost: l\r\nContent-Length: {}\r\n{extra}\r\n", body.len()).into_bytes();
    r.extend_from_slice(body);
    r
}

fn get(key: &str, extra: &str) -> Vec<u8> {
    format!("GET {key} HTTP/1.1\r\nHost: l\r\n{extra}\r\n").into_bytes()
}

/// Everything the server sends on a connection given `s`, until it closes the connection
/// (noted) or goes quiet.
fn transcript(addr: std::net::SocketAddr, s: &Script) -> Vec<u8> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    for (i, piece) in s.pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
        if c.write_all(piece).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let started = Instant::now();
    let mut last = Instant::now();
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    loop {
        match c.read(&mut buf) {
            Ok(0) => {
                got.extend_from_slice(b"[closed]");
                break;
            }
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                last = Instant::now();
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                // Quiet long enough after the last byte (or, before any, after the requests).
                let quiet = if got.is_empty() { Duration::from_millis(1500) } else { Duration::from_millis(300) };
                if last.elapsed() >= quiet || started.elapsed() > Duration::from_secs(20) {
                    got.extend_from_slice(b"[open]");
                    break;
                }
            }
            Err(_) => {
                got.extend_from_slice(b"[reset]");
                break;
            }
        }
    }
    got
}

/// The transcript with what legitimately differs between two servers made alike: dates, and
/// the versions (ETags) each numbers in its own way, in order of appearance.
fn normalize(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).into_owned();
    let mut etags: Vec<String> = Vec::new();
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("date: ") {
            out.push_str("date: *\r\n");
        } else if lower.starts_with("last-modified: ") {
            out.push_str("last-modified: *\r\n");
        } else if let Some(v) = lower.strip_prefix("etag: ") {
            let v = v.trim().to_owned();
            let n = etags.iter().position(|e| *e == v).unwrap_or_else(|| {
                etags.push(v.clone());
                etags.len() - 1
            });
            out.push_str(&format!("etag: #{n}\r\n"));
        } else if let Some(at) = line.find("<D:getlastmodified>") {
            // A WebDAV listing's dates, to the second.
            let end = line.find("</D:getlastmodified>").unwrap_or(line.len());
            out.push_str(&format!("{}<D:getlastmodified>*{}", &line[..at], &line[end..]));
        } else {
            out.push_str(line);
        }
    }
    out
}

fn corpus() -> Vec<Script> {
    let big = common::bytes(7, 100 * 1024);
    let huge = common::bytes(8, 2_500_000);
    let mut split = put("/d/split", b"0123456789", "");
    let split_tail = split.split_off(split.len() - 6);
    let long_uri = format!("GET /d/{} HTTP/1.1\r\nHost: l\r\n\r\n", "u".repeat(9000));
    let big_head = format!("GET /d/a HTTP/1.1\r\nHost: l\r\nX-Pad: {}\r\n\r\n", "p".repeat(17 * 1024));
    let many: String = (0..40).map(|i| format!("X-H{i}: v\r\n")).collect();
    let too_many: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
    let mut scripts = vec![
        // Well-formed: the key API.
        script("put", &put("/d/a", b"hello world", "")),
        script("get", &get("/d/a", "")),
        script("head", b"HEAD /d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("head of a miss", b"HEAD /d/none HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("get of a miss", &get("/d/none", "")),
        script("range", &get("/d/a", "Range: bytes=1-3\r\n")),
        script("open range", &get("/d/a", "Range: bytes=6-\r\n")),
        script("suffix range", &get("/d/a", "Range: bytes=-2\r\n")),
        script("unsatisfiable range", &get("/d/a", "Range: bytes=50-60\r\n")),
        script("two ranges", &get("/d/a", "Range: bytes=0-1,3-4\r\n")),
        script("if-none-match star", &get("/d/a", "If-None-Match: *\r\n")),
        script("if-match wrong", &get("/d/a", "If-Match: \"nope\"\r\n")),
        script("if-modified-since", &get("/d/a", "If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT\r\n")),
        script("if-unmodified-since past", &get("/d/a", "If-Unmodified-Since: Fri, 01 Jan 2000 00:00:00 GMT\r\n")),
        script("if-range of another version", &get("/d/a", "If-Range: \"nope\"\r\nRange: bytes=1-3\r\n")),
        script("max-age put", &put("/d/cc", b"x", "Cache-Control: max-age=60\r\n")),
        script("max-age get", &get("/d/cc", "")),
        script("typed put", &put("/d/t", b"{}", "Content-Type: application/json\r\n")),
        script("typed get", &get("/d/t", "")),
        script("ttl put", &put("/d/ttl", b"x", "X-TTL: 3600\r\n")),
        script("ttl get", &get("/d/ttl", "")),
        script("bad ttl", &put("/d/ttl2", b"x", "X-TTL: soon\r\n")),
        script("put if-none-match on existing", &put("/d/a", b"new", "If-None-Match: *\r\n")),
        script("put if-match on missing", &put("/d/m", b"new", "If-Match: *\r\n")),
        script("empty put", &put("/d/empty", b"", "")),
        script("get empty", &get("/d/empty", "")),
        script("delete", b"DELETE /d/t HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("delete again", b"DELETE /d/t HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("delete with a body length 0", b"DELETE /d/ttl HTTP/1.1\r\nHost: l\r\nContent-Length: 0\r\n\r\n"),
        script("query ignored", &get("/d/a?x=1&y", "")),
        script("percent-encoded key", &get("/d/%61", "")),
        script("bad percent", &get("/d/%zz", "")),
        script("empty key", &get("/", "")),
        script("connection close", &get("/d/a", "Connection: close\r\n")),
        script("keep-alive said", &get("/d/a", "Connection: keep-alive\r\n")),
        script("forty headers", &get("/d/a", &many)),
        script("accept and user agent", &get("/d/a", "Accept: */*\r\nUser-Agent: t/1\r\n")),
        // Pipelined, and mixed with what only hyper takes.
        script("pipelined", &[get("/d/a", ""), put("/d/p", b"pp", ""), get("/d/p", ""), get("/d/none", "")].concat()),
        script("pipelined then close", &[get("/d/a", "Connection: close\r\n"), get("/d/p", "")].concat()),
        script("plain then webdav", &[get("/d/a", ""), b"OPTIONS /d/a HTTP/1.1\r\nHost: l\r\n\r\n".to_vec(), get("/d/p", "")].concat()),
        script("plain then admin", &[get("/d/a", ""), get("/_larder/health", ""), get("/d/p", "")].concat()),
        script("encoded admin", &[get("/%5Flarder/health", ""), get("/d/a", "")].concat()),
        script("patch touch", b"PATCH /d/a HTTP/1.1\r\nHost: l\r\nX-TTL: 0\r\n\r\n"),
        script("propfind", b"PROPFIND /d/ HTTP/1.1\r\nHost: l\r\nDepth: 0\r\n\r\n"),
        script("http/1.0", b"GET /d/a HTTP/1.0\r\n\r\n"),
        script("http/1.0 keep-alive", b"GET /d/a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d/p HTTP/1.0\r\n\r\n"),
        script("expect 100-continue", &put("/d/e", b"body!", "Expect: 100-continue\r\n")),
        script(
            "chunked put",
            b"PUT /d/c HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        script("chunked get", &get("/d/c", "")),
        script("100 KiB put", &put("/d/big", &big, "")),
        script("100 KiB get", &[get("/d/big", ""), get("/d/a", "")].concat()),
        script("2.5 MB put", &put("/d/huge", &huge, "")),
        script("2.5 MB get, pipelined", &[get("/d/huge", ""), get("/d/a", "")].concat()),
        script("2.5 MB range", &get("/d/huge", "Range: bytes=1000000-1000010\r\n")),
        Script { name: "body after a pause", pieces: vec![split, split_tail] },
        script("split body get", &get("/d/split", "")),
        Script { name: "head in pieces", pieces: vec![b"GET /d/a HT".to_vec(), b"TP/1.1\r\nHost: l\r\n\r\n".to_vec()] },
        // Hostile.
        script("content-length and chunked", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("two lengths that differ", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nhello"),
        script("two lengths alike", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        script("length with a sign", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: +5\r\n\r\nhello"),
        script("negative length", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: -1\r\n\r\n"),
        script("length past any value", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        script("gzip transfer-encoding", b"PUT /d/s HTTP/1.1\r\nHost: l\r\nTransfer-Encoding: gzip\r\n\r\n"),
        script("get with a body", &[b"GET /d/a HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\n\r\nhello".to_vec(), get("/d/p", "")].concat()),
        script("bare LF", b"GET /d/a HTTP/1.1\nHost: l\n\n"),
        script("obs-fold", b"GET /d/a HTTP/1.1\r\nHost: l\r\nX-A: b\r\n  c\r\n\r\n"),
        script("header without colon", b"GET /d/a HTTP/1.1\r\nHost l\r\n\r\n"),
        script("space before colon", b"GET /d/a HTTP/1.1\r\nHost : l\r\n\r\n"),
        script("NUL in a value", b"GET /d/a HTTP/1.1\r\nHost: l\x00x\r\n\r\n"),
        script("lowercase method", b"get /d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("unknown method", b"FOO /d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("two spaces", b"GET  /d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("URI too long", long_uri.as_bytes()),
        script("head too large", big_head.as_bytes()),
        script("too many headers", &get("/d/a", &too_many)),
        script("absolute form", b"GET http://l/d/a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("asterisk", b"GET * HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("fragment", b"GET /d/a#frag HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("non-ASCII target", "GET /d/é HTTP/1.1\r\nHost: l\r\n\r\n".as_bytes()),
        script("quote in target", b"GET /d/\"a HTTP/1.1\r\nHost: l\r\n\r\n"),
        script("HTTP/1.2", b"GET /d/a HTTP/1.2\r\nHost: l\r\n\r\n"),
        script("HTTP/2.0 line", b"GET /d/a HTTP/2.0\r\nHost: l\r\n\r\n"),
        script("HTTP/0.9", b"GET /d/a\r\n\r\n"),
        script("h2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        script("TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
        script("half a head, then close", b"GET /d/a HTTP/1.1\r\nHo"),
        script("upgrade", b"GET /d/a HTTP/1.1\r\nHost: l\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
        script("connection list", &get("/d/a", "Connection: keep-alive, close\r\n")),
        script("close in capitals", &[get("/d/a", "Connection: CLOSE\r\n"), get("/d/p", "")].concat()),
        script("smuggled after a plain one", &[get("/d/a", ""), b"PUT /d/s HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 7\r\n\r\n".to_vec()].concat()),
    ];
    // Refused before the body is read: hyper keeps the connection only if it holds the body.
    scripts.push(script(
        "7 KiB put refused",
        &[put("/d/r7", &vec![b'r'; 7 * 1024], "If-Match: *\r\n"), get("/d/a", "")].concat(),
    ));
    scripts.push(script(
        "30 KiB put refused",
        &[put("/d/r30", &vec![b'r'; 30 * 1024], "If-Match: *\r\n"), get("/d/a", "")].concat(),
    ));
    // Around the loop's limit for a request with a body (head and body together).
    let head_len = put("/d/edge", b"", "").len();
    scripts.push(script("8 KiB request", &put("/d/edge", &vec![b'e'; 8192 - head_len], "")));
    scripts.push(script("8 KiB + 1 request", &put("/d/edge", &vec![b'e'; 8193 - head_len], "")));
    // Content codings: a value that compresses, asked for by a client that accepts zstd (and
    // one that does not), a range and a HEAD of it; a body sent coded with zstd, and one sent
    // with a coding larder does not take.
    let text: Vec<u8> = (0..60).flat_map(|i| format!("<li class=\"entry\">package {i}</li>\n").into_bytes()).collect();
    let frame = zstd::bulk::compress(&text, 3).unwrap();
    scripts.push(script("compressible put", &put("/d/z", &text, "")));
    scripts.push(script("get accepting zstd", &get("/d/z", "Accept-Encoding: gzip, zstd\r\n")));
    scripts.push(script("get accepting gzip only", &get("/d/z", "Accept-Encoding: gzip\r\n")));
    scripts.push(script("get refusing zstd", &get("/d/z", "Accept-Encoding: zstd;q=0, gzip\r\n")));
    scripts.push(script("head accepting zstd", b"HEAD /d/z HTTP/1.1\r\nHost: l\r\nAccept-Encoding: zstd\r\n\r\n"));
    scripts.push(script("range accepting zstd", &get("/d/z", "Accept-Encoding: zstd\r\nRange: bytes=5-9\r\n")));
    scripts.push(script("put coded with zstd", &put("/d/zc", &frame, "Content-Encoding: zstd\r\n")));
    scripts.push(script("get of a value put coded", &get("/d/zc", "")));
    scripts.push(script("put coded with gzip", &put("/d/zg", b"\x1f\x8b", "Content-Encoding: gzip\r\n")));
    scripts.push(script("put coded with garbage", &put("/d/zg", b"not zstd", "Content-Encoding: zstd\r\n")));
    // Larger bodies, within a chunk.
    scripts.push(script("64 KiB put", &put("/d/k64", &vec![b'k'; 64 * 1024], "")));
    scripts.push(script("64 KiB + 1 put", &put("/d/k65", &vec![b'k'; 64 * 1024 + 1], "")));
    scripts
}

fn compare(args: &[&str]) {
    let hyper_args: Vec<&str> = args.iter().copied().chain(["--http-server", "hyper"]).collect();
    let by_hyper = Server::start(&hyper_args);
    let native = Server::start(args);
    let mut differ = Vec::new();
    for s in corpus() {
        let a = normalize(&transcript(by_hyper.addr, &s));
        let b = normalize(&transcript(native.addr, &s));
        if a != b {
            differ.push(format!("{}:\n--- hyper\n{a}\n--- native\n{b}\n", s.name));
        }
    }
    assert!(differ.is_empty(), "{} of the corpus answered differently:\n{}", differ.len(), differ.join("\n"));
}

#[test]
fn the_native_loop_answers_as_hyper_does() {
    compare(&["--promote-after", "1"]);
}

#[test]
fn with_compression_coded_answers_are_alike() {
    compare(&["--compression", "zstd", "--promote-after", "1"]);
}

#[test]
fn with_a_token_refusals_are_alike() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token = token.to_str().unwrap().to_owned();
    let by_hyper = Server::start(&["--auth-token", &token, "--auth-reads", "--http-server", "hyper"]);
    let native = Server::start(&["--auth-token", &token, "--auth-reads"]);
    for s in [
        script("no token", &put("/d/a", b"v", "")),
        script("wrong token", &put("/d/a", b"v", "Authorization: Bearer nope\r\n")),
        script("other scheme", &get("/d/a", "Authorization: Basic eDp5\r\n")),
        script("right token", &put("/d/a", b"v", "Authorization: Bearer s3cret\r\n")),
        script("30 KiB without", &[put("/d/b", &vec![b'b'; 30 * 1024], ""), get("/d/a", "")].concat()),
        script("4 KiB without", &[put("/d/b", &vec![b'b'; 4 * 1024], ""), get("/d/a", "")].concat()),
        script("read without", &get("/d/a", "")),
        script("read with", &get("/d/a", "Authorization: Bearer s3cret\r\n")),
    ] {
        let (a, b) = (normalize(&transcript(by_hyper.addr, &s)), normalize(&transcript(native.addr, &s)));
        assert_eq!(a, b, "{}", s.name);
    }
}

/// The server's `larder_http_handovers_total`, counting the scrape that asks (an admin
/// request, which hyper answers: so each scrape adds one).
fn handovers(s: &Server) -> u64 {
    let m = String::from_utf8(s.client().get("/_larder/metrics").body).unwrap();
    let line = m.lines().find(|l| l.starts_with("larder_http_handovers_total ")).expect("the handovers counter");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn plain_requests_stay_with_the_native_loop() {
    let s = Server::start(&[]);
    let before = handovers(&s);
    let plain = [
        put("/k/a", b"one", ""),
        get("/k/a", ""),
        b"HEAD /k/a HTTP/1.1\r\nHost: l\r\n\r\n".to_vec(),
        get("/k/a", "Range: bytes=0-1\r\nIf-None-Match: \"x\"\r\n"),
        get("/k/none", ""),
        b"DELETE /k/a HTTP/1.1\r\nHost: l\r\n\r\n".to_vec(),
    ]
    .concat();
    let t = normalize(&transcript(s.addr, &script("plain", &plain)));
    assert_eq!(t.matches("HTTP/1.1 ").count(), 6, "{t}");
    assert_eq!(handovers(&s), before + 1, "a plain request went to hyper:\n{t}");
    // The first request it does not take hands the connection over, once.
    let mixed = [get("/k/b", ""), b"OPTIONS /k/b HTTP/1.1\r\nHost: l\r\n\r\n".to_vec(), get("/k/b", "")].concat();
    let t = normalize(&transcript(s.addr, &script("mixed", &mixed)));
    assert_eq!(t.matches("HTTP/1.1 ").count(), 3, "{t}");
    assert_eq!(handovers(&s), before + 3);
}

/// Past `--max-connections`, an idle connection makes room for a newcomer: also one the loop
/// handed to hyper (whose wait for the claim must be hyper's, not the loop's left behind).
#[test]
fn a_handed_over_connection_still_makes_room() {
    let s = Server::start(&["--max-connections", "1"]);
    let mut a = TcpStream::connect(s.addr).unwrap();
    a.write_all(b"OPTIONS /k HTTP/1.1\r\nHost: l\r\n\r\n").unwrap();
    let mut buf = [0u8; 4096];
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(a.read(&mut buf).unwrap() > 0, "the OPTIONS is answered");
    // Quiet for longer than a connection must be before it is closed for a newcomer.
    std::thread::sleep(Duration::from_millis(1500));
    let mut b = s.client();
    assert_eq!(b.get("/k/none").status, 404, "the newcomer is served");
    a.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let started = Instant::now();
    let closed = loop {
        match a.read(&mut buf) {
            Ok(0) => break true,
            Err(e) if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break true,
            _ if started.elapsed() > Duration::from_secs(5) => break false,
            _ => {}
        }
    };
    assert!(closed, "the idle, handed-over connection was not closed for the newcomer");
}
