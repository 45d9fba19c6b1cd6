//! Read-through mode (`--origin`) against a scripted origin on loopback: what is stored and for
//! how long, Age, Vary, the request and response directives, validation, stale content, one
//! origin fetch per key, invalidation and purge. docs/HTTP-CACHING.md maps each RFC 9111
//! requirement to the test here that shows it.

mod common;

use common::origin::{http_date, Answer, Origin};
use common::{Client, Resp, Server};
use std::time::Duration;

fn proxy(origin: &Origin, extra: &[&str]) -> Server {
    let url = origin.url();
    let mut args = vec!["--origin", url.as_str(), "--origin-read-timeout", "5s"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn get(c: &mut Client, path: &str, headers: &[(&str, &str)]) -> Resp {
    c.request("GET", path, headers, b"")
}

fn x_cache(r: &Resp) -> &str {
    r.header("x-cache").unwrap_or("")
}

/// Waits until `done` holds (checked every 5 ms, for at most 10 s): for an event the test can
/// observe but not be told of, such as a request reaching the origin.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn freshness_comes_from_s_maxage_max_age_expires_or_the_heuristic_and_age_is_sent() {
    let o = Origin::start();
    o.set("/max-age", Answer::ok(b"a", &[("cache-control", "max-age=60")]));
    o.set("/s-maxage", Answer::ok(b"b", &[("cache-control", "max-age=0, s-maxage=60")]));
    o.set("/expires", Answer::ok(b"c", &[("date", &http_date(0)), ("expires", &http_date(-60))]));
    o.set("/heuristic", Answer::ok(b"d", &[("date", &http_date(0)), ("last-modified", &http_date(100_000))]));
    o.set("/aged", Answer::ok(b"e", &[("cache-control", "max-age=60"), ("age", "30")]));
    o.set("/too-old", Answer::ok(b"f", &[("cache-control", "max-age=60"), ("age", "90")]));
    o.set("/nothing", Answer::ok(b"g", &[]));
    o.set("/bad-expires", Answer::ok(b"h", &[("date", &http_date(0)), ("expires", "0")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    for path in ["/max-age", "/s-maxage", "/expires", "/heuristic", "/aged"] {
        let first = get(&mut c, path, &[]);
        assert_eq!((first.status, x_cache(&first)), (200, "MISS"), "{path}");
        let again = get(&mut c, path, &[]);
        assert_eq!((again.status, x_cache(&again)), (200, "HIT"), "{path}: {:?}", again.headers);
        assert_eq!(again.body, first.body);
        assert_eq!(o.count(path), 1, "{path}: one origin request");
        assert!(again.header("age").is_some(), "{path}: Age is sent");
    }
    let aged = get(&mut c, "/aged", &[]);
    let age: u64 = aged.header("age").unwrap().parse().unwrap();
    assert!((30..40).contains(&age), "the origin's Age is carried on: {age}");
    for path in ["/too-old", "/nothing", "/bad-expires"] {
        get(&mut c, path, &[]);
        let again = get(&mut c, path, &[]);
        assert_ne!(x_cache(&again), "HIT", "{path} is not fresh");
        assert_eq!(o.count(path), 2, "{path}");
    }
}

#[test]
fn what_is_not_stored_is_passed_through_and_each_request_reaches_the_origin() {
    let o = Origin::start();
    o.set("/no-store", Answer::ok(b"a", &[("cache-control", "no-store, max-age=60")]));
    o.set("/private", Answer::ok(b"b", &[("cache-control", "private, max-age=60")]));
    o.set(
        "/cookie",
        Answer::ok(b"c", &[("cache-control", "max-age=60, no-cache=\"set-cookie\""), ("set-cookie", "a=b")]),
    );
    o.set("/vary-star", Answer::ok(b"d", &[("cache-control", "max-age=60"), ("vary", "*")]));
    o.set("/302", Answer::with(302, b"e", &[("location", "/x")]));
    o.set("/500", Answer::with(500, b"f", &[]));
    o.set("/authorized", Answer::ok(b"g", &[("cache-control", "max-age=60")]));
    o.set("/authorized-public", Answer::ok(b"h", &[("cache-control", "public, max-age=60")]));
    o.set("/404", Answer::with(404, b"i", &[("cache-control", "max-age=60")]));
    o.set("/302-fresh", Answer::with(302, b"j", &[("location", "/x"), ("cache-control", "max-age=60")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    o.set("/cdn-private", Answer::ok(b"l", &[("cdn-cache-control", "private"), ("cache-control", "max-age=60")]));
    for path in ["/no-store", "/private", "/vary-star", "/302", "/500", "/cdn-private"] {
        for _ in 0..2 {
            let r = get(&mut c, path, &[]);
            assert_ne!(x_cache(&r), "HIT", "{path}");
        }
        assert_eq!(o.count(path), 2, "{path}: not stored");
    }
    let auth = [("authorization", "Bearer x")];
    get(&mut c, "/authorized", &auth);
    get(&mut c, "/authorized", &[]);
    assert_eq!(o.count("/authorized"), 2, "a response to a request with Authorization is not stored");
    get(&mut c, "/authorized-public", &auth);
    let r = get(&mut c, "/authorized-public", &auth);
    assert_eq!((x_cache(&r), o.count("/authorized-public")), ("HIT", 1), "unless it says public");
    o.set("/500-fresh", Answer::with(500, b"m", &[("cache-control", "max-age=60")]));
    o.set("/cdn", Answer::ok(b"n", &[("cdn-cache-control", "max-age=60"), ("cache-control", "no-store")]));
    for path in ["/404", "/302-fresh", "/500-fresh", "/cdn"] {
        get(&mut c, path, &[]);
        let r = get(&mut c, path, &[]);
        assert_eq!((x_cache(&r), o.count(path)), ("HIT", 1), "{path} with explicit freshness is stored");
    }
    // A response that sets a cookie is stored (RFC 9111 leaves it to the origin), but a field
    // named by no-cache="…" is never served from the store.
    let first = get(&mut c, "/cookie", &[]);
    assert_eq!(first.header("set-cookie"), Some("a=b"), "the response fetched goes on whole");
    let again = get(&mut c, "/cookie", &[]);
    assert_eq!((x_cache(&again), again.header("set-cookie")), ("HIT", None));
    // A request's no-store keeps its response out of the store.
    o.set("/asked-no-store", Answer::ok(b"k", &[("cache-control", "max-age=60")]));
    get(&mut c, "/asked-no-store", &[("cache-control", "no-store")]);
    get(&mut c, "/asked-no-store", &[]);
    assert_eq!(o.count("/asked-no-store"), 2);
}

#[test]
fn response_directives_no_cache_proxy_revalidate_and_duplicates_are_obeyed() {
    let o = Origin::start();
    let mut a = Answer::ok(b"checked", &[("cache-control", "max-age=60, no-cache"), ("etag", "\"n\"")]);
    a.not_modified = Some(vec![("etag".into(), "\"n\"".into())]);
    o.set("/no-cache", a);
    o.set("/dup", Answer::ok(b"d", &[("cache-control", "max-age=60, max-age=120")]));
    o.set("/pr", Answer::ok(b"p", &[("cache-control", "max-age=1, proxy-revalidate")]));
    let s = proxy(&o, &["--stale-if-error", "1h", "--origin-connect-timeout", "1s"]);
    let mut c = s.client();
    assert_eq!(x_cache(&get(&mut c, "/no-cache", &[])), "MISS");
    let r = get(&mut c, "/no-cache", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("REVALIDATED", &b"checked"[..]), "no-cache: validated before each use");
    assert_eq!(o.seen("/no-cache")[1].header("if-none-match"), Some("\"n\""));
    // A reload (max-age=0): one conditional request, then the stored body.
    let r = get(&mut c, "/no-cache", &[("cache-control", "max-age=0")]);
    assert_eq!((x_cache(&r), o.count("/no-cache")), ("REVALIDATED", 3));
    get(&mut c, "/dup", &[]);
    assert_ne!(x_cache(&get(&mut c, "/dup", &[])), "HIT", "two different max-age: stale");
    get(&mut c, "/pr", &[]);
    std::thread::sleep(Duration::from_millis(1100));
    o.stop();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(get(&mut c, "/pr", &[]).status, 502, "proxy-revalidate: never stale for a shared cache");
}

#[test]
fn origin_timeouts_answer_504_and_connections_are_reused() {
    let o = Origin::start();
    for i in 0..20 {
        o.set(&format!("/k{i}"), Answer::ok(b"v", &[("cache-control", "max-age=60")]));
    }
    let mut slow = Answer::ok(b"late", &[("cache-control", "max-age=60")]);
    slow.delay = Duration::from_millis(1500);
    o.set("/slow", slow);
    let url = o.url();
    let s = Server::start(&["--origin", url.as_str(), "--origin-read-timeout", "300ms"]);
    let mut c = s.client();
    for i in 0..20 {
        assert_eq!(get(&mut c, &format!("/k{i}"), &[]).status, 200);
    }
    assert!(o.connections() <= 2, "20 misses over {} origin connections: pooled", o.connections());
    let started = std::time::Instant::now();
    let r = get(&mut c, "/slow", &[]);
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert!(started.elapsed() < Duration::from_millis(1200), "answered at the read timeout");
    let m = c.request("GET", "/_larder/metrics", &[], b"");
    let text = String::from_utf8_lossy(&m.body);
    assert!(text.contains("larder_proxy_origin_errors_total 1"), "{text}");
    assert!(text.contains("larder_origin_duration_seconds_count"), "{text}");
}

#[test]
fn request_directives_bound_what_the_cache_may_answer() {
    let o = Origin::start();
    o.set("/r", Answer::ok(b"body", &[("cache-control", "max-age=2"), ("etag", "\"v1\"")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    assert_eq!(x_cache(&get(&mut c, "/r", &[])), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/r", &[("cache-control", "max-age=60")])), "HIT");
    assert_eq!(x_cache(&get(&mut c, "/r", &[("cache-control", "min-fresh=1")])), "HIT");
    let n = o.count("/r");
    // no-cache, Pragma: no-cache, max-age=0 and a min-fresh past the lifetime all go to the origin.
    for h in [
        ("cache-control", "no-cache"),
        ("pragma", "no-cache"),
        ("cache-control", "max-age=0"),
        ("cache-control", "min-fresh=5"),
    ] {
        let r = get(&mut c, "/r", &[h]);
        assert_ne!(x_cache(&r), "HIT", "{h:?}");
    }
    assert_eq!(o.count("/r"), n + 4);
    // The revalidation carried the stored validator.
    assert_eq!(o.seen("/r").last().unwrap().header("if-none-match"), Some("\"v1\""));
    // only-if-cached: a miss is 504, a stored response is served.
    let miss = get(&mut c, "/absent", &[("cache-control", "only-if-cached")]);
    assert_eq!(miss.status, 504);
    assert_eq!(o.count("/absent"), 0);
    assert_eq!(x_cache(&get(&mut c, "/r", &[("cache-control", "only-if-cached")])), "HIT");
    // max-stale lets a stale response be served; without it the cache revalidates.
    std::thread::sleep(Duration::from_millis(3100));
    let n = o.count("/r");
    let stale = get(&mut c, "/r", &[("cache-control", "max-stale=60")]);
    assert_eq!((stale.status, x_cache(&stale), o.count("/r")), (200, "STALE", n));
    let stale = get(&mut c, "/r", &[("cache-control", "max-stale")]);
    assert_eq!(x_cache(&stale), "STALE");
    get(&mut c, "/r", &[]);
    assert_eq!(o.count("/r"), n + 1);
}

#[test]
fn a_304_refreshes_the_stored_header_fields_and_serves_the_stored_body() {
    let o = Origin::start();
    let mut a = Answer::ok(b"the body", &[("cache-control", "max-age=1"), ("etag", "\"e1\""), ("x-version", "1")]);
    a.not_modified = Some(vec![
        ("cache-control".into(), "max-age=60".into()),
        ("etag".into(), "\"e1\"".into()),
        ("x-version".into(), "2".into()),
    ]);
    o.set("/v", a);
    let s = proxy(&o, &[]);
    let mut c = s.client();
    assert_eq!(get(&mut c, "/v", &[]).header("x-version"), Some("1"));
    std::thread::sleep(Duration::from_millis(1100));
    let r = get(&mut c, "/v", &[]);
    assert_eq!((r.status, x_cache(&r), &r.body[..]), (200, "REVALIDATED", &b"the body"[..]));
    assert_eq!(r.header("x-version"), Some("2"), "the 304's fields replace the stored ones");
    assert_eq!(o.seen("/v")[1].header("if-none-match"), Some("\"e1\""));
    // Fresh again for the 304's max-age: a hit, with the refreshed fields, across a restart too.
    let r = get(&mut c, "/v", &[]);
    assert_eq!((x_cache(&r), r.header("x-version")), ("HIT", Some("2")));
    let mut s = s;
    s.stop();
    s.restart();
    let r = s.client().request("GET", "/v", &[], b"");
    assert_eq!((x_cache(&r), r.header("x-version"), &r.body[..]), ("HIT", Some("2"), &b"the body"[..]));
    assert_eq!(o.count("/v"), 2);
    let m = s.client().request("GET", "/_larder/metrics", &[], b"");
    let text = String::from_utf8_lossy(&m.body);
    assert!(text.contains("larder_proxy_requests_total{cache=\"hit\"}"), "{text}");
}

#[test]
fn client_conditionals_and_ranges_are_answered_from_the_cache() {
    let o = Origin::start();
    let lm = http_date(1000);
    o.set(
        "/c",
        Answer::ok(b"0123456789", &[("cache-control", "max-age=60"), ("etag", "\"t\""), ("last-modified", &lm)]),
    );
    let s = proxy(&o, &[]);
    let mut c = s.client();
    let r = get(&mut c, "/c", &[("if-none-match", "\"t\"")]);
    assert_eq!((r.status, x_cache(&r)), (304, "MISS"), "a miss is stored, then the client's condition judged");
    let r = get(&mut c, "/c", &[("if-none-match", "W/\"t\", \"u\"")]);
    assert_eq!((r.status, r.header("etag")), (304, Some("\"t\"")));
    assert_eq!(get(&mut c, "/c", &[("if-none-match", "\"u\"")]).status, 200);
    assert_eq!(get(&mut c, "/c", &[("if-modified-since", &lm)]).status, 304);
    let r = get(&mut c, "/c", &[("range", "bytes=2-4")]);
    assert_eq!((r.status, &r.body[..], r.header("content-range")), (206, &b"234"[..], Some("bytes 2-4/10")));
    let r = get(&mut c, "/c", &[("range", "bytes=-3"), ("if-range", "\"t\"")]);
    assert_eq!((r.status, &r.body[..]), (206, &b"789"[..]));
    let r = get(&mut c, "/c", &[("range", "bytes=2-4"), ("if-range", "\"old\"")]);
    assert_eq!((r.status, &r.body[..]), (200, &b"0123456789"[..]), "If-Range for another version: the whole");
    assert_eq!(get(&mut c, "/c", &[("range", "bytes=20-")]).status, 416);
    let h = c.request("HEAD", "/c", &[], b"");
    assert_eq!((h.status, h.header("content-length"), x_cache(&h)), (200, Some("10"), "HIT"));
    assert_eq!(o.count("/c"), 1);
    // A range on a miss is cut from the whole response the cache fetches and stores.
    o.set("/m", Answer::ok(b"abcdefghij", &[("cache-control", "max-age=60")]));
    let r = get(&mut c, "/m", &[("range", "bytes=5-")]);
    assert_eq!((r.status, &r.body[..], x_cache(&r)), (206, &b"fghij"[..], "MISS"));
    assert_eq!(o.seen("/m")[0].header("range"), None);
    assert_eq!(get(&mut c, "/m", &[]).body, b"abcdefghij");
}

#[test]
fn responses_that_vary_are_stored_per_variant() {
    let o = Origin::start();
    o.set("/v", Answer::ok(b"varied", &[("cache-control", "max-age=60"), ("vary", "Accept-Language")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    let en = [("accept-language", "en")];
    let fr = [("accept-language", "fr")];
    assert_eq!(x_cache(&get(&mut c, "/v", &en)), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/v", &fr)), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/v", &[])), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/v", &en)), "HIT");
    assert_eq!(x_cache(&get(&mut c, "/v", &fr)), "HIT");
    assert_eq!(x_cache(&get(&mut c, "/v", &[])), "HIT");
    assert_eq!(o.count("/v"), 3);
    let langs: Vec<_> = o.seen("/v").iter().map(|s| s.header("accept-language").map(str::to_string)).collect();
    assert_eq!(langs, vec![Some("en".into()), Some("fr".into()), None], "each variant fetched with its fields");
}

/// A client can make any field hop-by-hop by naming it in `Connection`: `Accept` then never
/// reaches the origin, which answers as to a request without it. That answer must be stored as
/// the variant of no `Accept`, not as the one the client's `Accept` names, or every later JSON
/// client would get the HTML as a hit.
#[test]
fn a_variant_is_selected_by_the_fields_the_origin_received() {
    let o = Origin::start();
    let answer = |body: &[u8], kind: &str| {
        Answer::ok(body, &[("cache-control", "max-age=60"), ("vary", "Accept"), ("content-type", kind)])
    };
    o.set("/x", answer(b"<html>", "text/html"));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    let json = ("accept", "application/json");
    let r = get(&mut c, "/x", &[json, ("connection", "accept")]);
    assert_eq!((x_cache(&r), &r.body[..]), ("MISS", &b"<html>"[..]));
    assert_eq!(o.seen("/x")[0].header("accept"), None, "Accept was hop-by-hop: not forwarded");
    o.set("/x", answer(b"{}", "application/json"));
    let r = get(&mut c, "/x", &[json]);
    assert_eq!((x_cache(&r), &r.body[..]), ("MISS", &b"{}"[..]), "the HTML is not the JSON variant");
    assert_eq!(o.seen("/x")[1].header("accept"), Some("application/json"));
    // Each response is the variant of what its origin request carried.
    let r = get(&mut c, "/x", &[json]);
    assert_eq!((x_cache(&r), &r.body[..]), ("HIT", &b"{}"[..]));
    let r = get(&mut c, "/x", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("HIT", &b"<html>"[..]));
    let r = get(&mut c, "/x", &[json, ("connection", "accept")]);
    assert_eq!((x_cache(&r), &r.body[..]), ("HIT", &b"<html>"[..]), "as the origin would have answered it");
    assert_eq!(o.count("/x"), 2);
}

/// Field values need not be UTF-8 (obs-text): `x\xe8` and `x\xe9` are two languages, and a
/// lossy conversion must not make them one variant. Sent over a raw socket, byte for byte.
#[test]
fn selecting_values_are_compared_as_the_bytes_sent() {
    let o = Origin::start();
    let answer = |body: &[u8]| Answer::ok(body, &[("cache-control", "max-age=60"), ("vary", "Accept-Language")]);
    o.set("/lang", answer(b"e acute"));
    let s = proxy(&o, &[]);
    let ask = |lang: &[u8]| {
        let mut c = s.client();
        let mut req = b"GET /lang HTTP/1.1\r\nHost: larder\r\nAccept-Language: ".to_vec();
        req.extend_from_slice(lang);
        req.extend_from_slice(b"\r\n\r\n");
        c.raw(&req).unwrap();
        let r = c.read_response(false).unwrap();
        (x_cache(&r).to_string(), String::from_utf8(r.body).unwrap())
    };
    assert_eq!(ask(b"x\xe9"), ("MISS".into(), "e acute".into()));
    o.set("/lang", answer(b"e grave"));
    assert_eq!(ask(b"x\xe8"), ("MISS".into(), "e grave".into()), "another value: another variant");
    assert_eq!(ask(b"x\xe9"), ("HIT".into(), "e acute".into()));
    assert_eq!(ask(b"x\xe8"), ("HIT".into(), "e grave".into()));
    // Normalised as bytes too: the spaces around commas do not count.
    assert_eq!(ask(b"x\xe8 ,\t\xff"), ("MISS".into(), "e grave".into()));
    assert_eq!(ask(b"x\xe8,\xff"), ("HIT".into(), "e grave".into()));
    let sent: Vec<_> = o.seen("/lang").iter().map(|r| r.header_bytes("accept-language").unwrap().to_vec()).collect();
    assert_eq!(sent, [&b"x\xe9"[..], b"x\xe8", b"x\xe8 ,\t\xff"], "forwarded as they came");
}

#[test]
fn a_304_for_one_variant_never_vouches_for_another() {
    let o = Origin::start();
    let mut a = Answer::ok(b"v", &[("cache-control", "max-age=1"), ("vary", "accept-language"), ("etag", "\"x\"")]);
    a.not_modified = Some(vec![("etag".into(), "\"x\"".into()), ("cache-control".into(), "max-age=60".into())]);
    o.set("/v", a.clone());
    let s = proxy(&o, &[]);
    let addr = s.addr;
    get(&mut s.client(), "/v", &[("accept-language", "en")]);
    get(&mut s.client(), "/v", &[("accept-language", "fr")]);
    std::thread::sleep(Duration::from_millis(1100));
    // Both variants are stale; the French request joins the English one's revalidation.
    a.delay = Duration::from_millis(400);
    o.set("/v", a);
    let en = std::thread::spawn(move || get(&mut Client::connect(addr), "/v", &[("accept-language", "en")]));
    std::thread::sleep(Duration::from_millis(100));
    let fr = get(&mut s.client(), "/v", &[("accept-language", "fr")]);
    assert_eq!(x_cache(&en.join().unwrap()), "REVALIDATED");
    assert_eq!(fr.status, 200);
    let langs: Vec<_> =
        o.seen("/v")[2..].iter().map(|r| r.header("accept-language").unwrap_or("").to_string()).collect();
    assert!(langs.contains(&"fr".to_string()), "the French variant was validated on its own: {langs:?}");
}

#[test]
fn unsafe_methods_go_to_the_origin_and_invalidate_what_is_stored() {
    let o = Origin::start();
    o.set("/doc", Answer::ok(b"v1", &[("cache-control", "max-age=60")]));
    o.set("/other", Answer::ok(b"o", &[("cache-control", "max-age=60")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    get(&mut c, "/doc", &[]);
    get(&mut c, "/other", &[]);
    assert_eq!(x_cache(&get(&mut c, "/doc", &[])), "HIT");
    o.set("/doc", Answer::with(201, b"made", &[("content-location", "/other")]));
    let r = c.request("POST", "/doc", &[("content-type", "text/plain")], b"new body");
    assert_eq!((r.status, &r.body[..], x_cache(&r)), (201, &b"made"[..], "PASS"));
    let seen = o.seen("/doc");
    let post = seen.iter().find(|s| s.method == "POST").unwrap();
    assert_eq!((post.body.as_slice(), post.header("content-type")), (&b"new body"[..], Some("text/plain")));
    assert_eq!(post.header("via"), Some("1.1 larder"));
    o.set("/doc", Answer::ok(b"v2", &[("cache-control", "max-age=60")]));
    let r = get(&mut c, "/doc", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("MISS", &b"v2"[..]));
    assert_eq!(x_cache(&get(&mut c, "/other", &[])), "MISS", "Content-Location on the same host is invalidated");
    // An error answer invalidates nothing; other methods pass with their bodies.
    o.set("/doc", Answer::with(500, b"no", &[]));
    c.request("DELETE", "/doc", &[], b"");
    o.set("/doc", Answer::ok(b"v3", &[("cache-control", "max-age=60")]));
    assert_eq!(get(&mut c, "/doc", &[]).body, b"v2");
    let r = c.request("PATCH", "/doc", &[], b"p");
    assert_eq!(r.status, 200);
    assert_eq!(get(&mut c, "/doc", &[]).body, b"v3");
    // A Host that is not a host[:port] could make two URIs one cache key; two are one too many.
    let mut raw = Client::connect(s.addr);
    raw.raw(b"GET / HTTP/1.1\r\nHost: a.example/evil\r\n\r\n").unwrap();
    assert_eq!(raw.read_response(false).unwrap().status, 400);
    assert_eq!(c.request("GET", "/", &[("host", "b.example")], b"").status, 400);
    let r = c.request("BREW", "/pot", &[], b"");
    assert_eq!((r.status, x_cache(&r)), (404, "PASS"));
    assert_eq!(o.seen("/pot")[0].method, "BREW");
}

#[test]
fn stale_while_revalidate_answers_at_once_and_refreshes_behind() {
    let o = Origin::start();
    o.set("/swr", Answer::ok(b"old", &[("cache-control", "max-age=1, stale-while-revalidate=60")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    get(&mut c, "/swr", &[]);
    std::thread::sleep(Duration::from_millis(1100));
    let mut slow = Answer::ok(b"new", &[("cache-control", "max-age=60")]);
    slow.delay = Duration::from_millis(500);
    o.set("/swr", slow);
    let started = std::time::Instant::now();
    let r = get(&mut c, "/swr", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("STALE", &b"old"[..]));
    assert!(started.elapsed() < Duration::from_millis(400), "served without waiting for the origin");
    std::thread::sleep(Duration::from_millis(900));
    let r = get(&mut c, "/swr", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("HIT", &b"new"[..]));
    assert_eq!(o.count("/swr"), 2);
}

#[test]
fn stale_if_error_serves_stale_when_the_origin_is_down_and_must_revalidate_does_not() {
    let o = Origin::start();
    o.set("/sie", Answer::ok(b"kept", &[("cache-control", "max-age=1, stale-if-error=60")]));
    o.set("/default", Answer::ok(b"kept too", &[("cache-control", "max-age=1")]));
    o.set("/strict", Answer::ok(b"strict", &[("cache-control", "max-age=1, must-revalidate, stale-if-error=60")]));
    o.set("/5xx", Answer::ok(b"before", &[("cache-control", "max-age=1, stale-if-error=60")]));
    let s = proxy(&o, &["--stale-if-error", "1h", "--origin-connect-timeout", "1s"]);
    let mut c = s.client();
    for p in ["/sie", "/default", "/strict", "/5xx"] {
        get(&mut c, p, &[]);
    }
    std::thread::sleep(Duration::from_millis(1100));
    o.set("/5xx", Answer::with(503, b"down", &[]));
    let r = get(&mut c, "/5xx", &[]);
    assert_eq!((r.status, x_cache(&r), &r.body[..]), (200, "STALE", &b"before"[..]), "a 503 from the origin");
    o.stop();
    std::thread::sleep(Duration::from_millis(100));
    let r = get(&mut c, "/sie", &[]);
    assert_eq!((r.status, x_cache(&r), &r.body[..]), (200, "STALE", &b"kept"[..]));
    let r = get(&mut c, "/default", &[]);
    assert_eq!((r.status, x_cache(&r)), (200, "STALE"), "--stale-if-error's default");
    let r = get(&mut c, "/strict", &[]);
    assert_eq!(r.status, 502, "must-revalidate: never stale, {:?}", r.headers);
    assert_eq!(get(&mut c, "/never-seen", &[]).status, 502);
}

#[test]
fn concurrent_misses_for_one_key_share_one_origin_request() {
    let o = Origin::start();
    let body = common::bytes(7, 300_000);
    let mut a = Answer::ok(&body, &[("cache-control", "max-age=60")]);
    a.delay = Duration::from_millis(700);
    o.set("/hot", a);
    let s = proxy(&o, &[]);
    let addr = s.addr;
    let threads: Vec<_> = (0..16)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let range = format!("bytes={}-{}", i * 1000, i * 1000 + 99);
                let h: Vec<(&str, &str)> = if i % 4 == 3 { vec![("range", range.as_str())] } else { vec![] };
                (i, get(&mut c, "/hot", &h))
            })
        })
        .collect();
    for t in threads {
        let (i, r) = t.join().unwrap();
        if i % 4 == 3 {
            assert_eq!((r.status, &r.body[..]), (206, &body[i * 1000..i * 1000 + 100]), "member {i}");
        } else {
            assert_eq!((r.status, r.body.len()), (200, body.len()), "member {i}");
            assert!(r.body == body, "member {i}: the bytes");
        }
    }
    assert_eq!(o.count("/hot"), 1, "one origin request for 16 concurrent misses");
    let m = s.client().request("GET", "/_larder/metrics", &[], b"");
    assert!(String::from_utf8_lossy(&m.body).contains("larder_proxy_coalesced_total 15"));
    // A response that may not be shared (private) is never handed to the requests that
    // joined its fetch: each of them fetches its own.
    let mut private = Answer::ok(b"yours only", &[("cache-control", "private, max-age=60")]);
    private.delay = Duration::from_millis(300);
    o.set("/account", private);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let cookie = format!("session={i}");
                get(&mut Client::connect(addr), "/account", &[("cookie", cookie.as_str())])
            })
        })
        .collect();
    for t in threads {
        let r = t.join().unwrap();
        assert_eq!((r.status, x_cache(&r)), (200, "PASS"));
    }
    let mut cookies: Vec<_> = o.seen("/account").iter().map(|s| s.header("cookie").unwrap().to_string()).collect();
    cookies.sort();
    assert_eq!(cookies, ["session=0", "session=1", "session=2", "session=3"], "one origin request each");
    // An origin error that holds nothing of anyone's is shared: one origin request in an outage.
    let mut down = Answer::with(503, b"down", &[]);
    down.delay = Duration::from_millis(300);
    o.set("/down", down);
    let threads: Vec<_> =
        (0..4).map(|_| std::thread::spawn(move || get(&mut Client::connect(addr), "/down", &[]))).collect();
    for t in threads {
        assert_eq!(t.join().unwrap().status, 503);
    }
    assert_eq!(o.count("/down"), 1);
    // Responses that cannot be stored are not waited on: each request goes on its own.
    let mut slow = Answer::ok(b"private", &[("cache-control", "private")]);
    slow.delay = Duration::from_millis(300);
    o.set("/mine", slow);
    get(&mut s.client(), "/mine", &[]);
    let started = std::time::Instant::now();
    let threads: Vec<_> =
        (0..4).map(|_| std::thread::spawn(move || get(&mut Client::connect(addr), "/mine", &[]))).collect();
    for t in threads {
        assert_eq!(x_cache(&t.join().unwrap()), "PASS");
    }
    assert!(started.elapsed() < Duration::from_millis(1000), "passed in parallel: {:?}", started.elapsed());
}

#[test]
fn purge_drops_a_stored_response_behind_the_admin_token() {
    let o = Origin::start();
    o.set("/p?q=1", Answer::ok(b"x", &[("cache-control", "max-age=60"), ("vary", "accept")]));
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let s = proxy(&o, &["--auth-token", token.to_str().unwrap()]);
    let mut c = s.client();
    get(&mut c, "/p?q=1", &[("accept", "a")]);
    get(&mut c, "/p?q=1", &[("accept", "b")]);
    assert_eq!(x_cache(&get(&mut c, "/p?q=1", &[("accept", "b")])), "HIT");
    assert_eq!(c.request("POST", "/_larder/purge?uri=larder/p%3Fq%3D1", &[], b"").status, 401);
    let auth = [("authorization", "Bearer s3cret")];
    let r = c.request("POST", "/_larder/purge?uri=larder/p%3Fq%3D1", &auth, b"");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(x_cache(&get(&mut c, "/p?q=1", &[("accept", "a")])), "MISS", "every variant is gone");
    assert_eq!(x_cache(&get(&mut c, "/p?q=1", &[("accept", "b")])), "MISS");
    assert_eq!(c.request("POST", "/_larder/purge?uri=larder/nothing", &auth, b"").status, 404);
    assert_eq!(c.request("POST", "/_larder/purge", &auth, b"").status, 400);
}

/// A purge while the URI is being fetched: the fetch may bring what the purge is for (the
/// origin sent it before it changed), so it is not stored, and the next request goes to the
/// origin again.
#[test]
fn a_purge_during_a_fetch_keeps_that_fetch_out_of_the_store() {
    let o = Origin::start();
    o.set("/news", Answer::ok(b"before", &[("cache-control", "max-age=60")]));
    o.hold("/news");
    let s = proxy(&o, &[]);
    let addr = s.addr;
    let fetching = std::thread::spawn(move || get(&mut Client::connect(addr), "/news", &[]));
    wait_until("the fetch reaches the origin", || o.count("/news") == 1);
    let r = s.client().request("POST", "/_larder/purge?uri=larder/news", &[], b"");
    let said = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!((r.status, said.as_str()), (200, "purged: the fetch under way will not be stored\n"));
    o.release("/news");
    let r = fetching.join().unwrap();
    assert_eq!((r.status, &r.body[..]), (200, &b"before"[..]), "its own client is answered");
    o.set("/news", Answer::ok(b"after", &[("cache-control", "max-age=60")]));
    let r = get(&mut s.client(), "/news", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("MISS", &b"after"[..]), "the purged fetch was not stored");
    let r = get(&mut s.client(), "/news", &[]);
    assert_eq!((x_cache(&r), &r.body[..]), ("HIT", &b"after"[..]), "a fetch after the purge is");
    assert_eq!(o.count("/news"), 2);
}

/// GETs `path` on a connection of its own and reads the body as it comes, keeping only its
/// length and CRC32: (status, X-Cache, length, crc).
fn stream_get(addr: std::net::SocketAddr, path: &str) -> (u16, String, u64, u32) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: larder\r\n\r\n").unwrap();
    let mut r = BufReader::with_capacity(1 << 20, s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (mut len, mut x) = (0u64, String::new());
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').unwrap();
        if n.eq_ignore_ascii_case("content-length") {
            len = v.trim().parse().unwrap();
        }
        if n.eq_ignore_ascii_case("x-cache") {
            x = v.trim().to_string();
        }
    }
    let (mut crc, mut left, mut buf) = (crc32fast::Hasher::new(), len, vec![0; 1 << 20]);
    while left > 0 {
        let n = r.read(&mut buf[..left.min(1 << 20) as usize]).unwrap();
        assert!(n > 0, "the body ended {left} bytes short");
        crc.update(&buf[..n]);
        left -= n as u64;
    }
    (status, x, len, crc.finalize())
}

#[test]
fn a_gibibyte_origin_object_streams_to_eight_clients_with_one_fetch_and_bounded_memory() {
    let o = Origin::start();
    let body = common::bytes(3, 1 << 30);
    let crc = crc32fast::hash(&body);
    let mut a = Answer::ok(&body, &[("cache-control", "max-age=600"), ("etag", "\"big\"")]);
    a.delay = Duration::from_millis(300); // every client asks before the head arrives
    o.set("/gib", a);
    drop(body);
    // A ring of 9 × 512 MiB: a quarter of it holds 1 GiB.
    let s = proxy(&o, &["--volume-size", "512MiB", "--volume-count", "9", "--memory-capacity", "0"]);
    let addr = s.addr;
    let (results, growth) = common::peak_growth(&s, || {
        let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(move || stream_get(addr, "/gib"))).collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect::<Vec<_>>()
    });
    for (status, x, len, got) in results {
        assert_eq!((status, x.as_str(), len, got), (200, "MISS", 1 << 30, crc));
    }
    assert_eq!(o.count("/gib"), 1, "one origin request for eight clients");
    println!("server RSS growth streaming 1 GiB from the origin to 8 clients: {} MiB", growth >> 20);
    assert!(growth < 128 << 20, "memory grew by {} MiB", growth >> 20);
    // It was stored as it streamed: the next client is answered from the store.
    let ((status, x, len, got), growth) = common::peak_growth(&s, || stream_get(addr, "/gib"));
    assert_eq!((status, x.as_str(), len, got), (200, "HIT", 1 << 30, crc));
    assert!(growth < 64 << 20, "memory grew by {} MiB serving the stored copy", growth >> 20);
    assert_eq!(o.count("/gib"), 1);
}

/// Sets a socket's receive buffer (which stops the kernel growing it on its own).
fn set_receive_buffer(s: &std::net::TcpStream, size: usize) {
    use std::os::fd::AsRawFd;
    let size = size as libc::c_int;
    let set = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_RCVBUF");
}

/// Sends `GET path` on a connection of its own and reads nothing: a client that stopped
/// reading. Its receive buffer is fixed at 256 KiB, so that the kernel does not grow it to hold
/// the whole body, yet above loopback's 64 KiB segments (a window smaller than a segment
/// reopens only when the server probes it, seconds later).
fn stalled_get(addr: std::net::SocketAddr, path: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    set_receive_buffer(&s, 256 << 10);
    write!(s, "GET {path} HTTP/1.1\r\nHost: larder\r\n\r\n").unwrap();
    s
}

/// Reads a connection until the server closes it: the bytes received. Fails if it stays open
/// and silent for 10 s.
fn read_until_closed(mut s: std::net::TcpStream) -> usize {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut n, mut buf) = (0, vec![0; 1 << 16]);
    loop {
        match s.read(&mut buf) {
            Ok(0) => return n,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return n,
            Err(e) => panic!("the connection stayed open after {n} bytes: {e}"),
        }
    }
}

/// A counter of `/_larder/metrics` (0 until it appears).
fn metric(s: &Server, name: &str) -> u64 {
    let m = s.client().request("GET", "/_larder/metrics", &[], b"");
    let text = String::from_utf8_lossy(&m.body).to_string();
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0)
}

/// A flight moves at the pace of its members: each holds a few slices of the body, so memory
/// stays bounded whatever its size. A client that stops reading must not hold the others and
/// the store for the origin's read timeout (60 s here, the default) as it used to, one timeout
/// after another: once it has taken nothing for 2 s it is detached, its own answer cut, and
/// the others go on.
#[test]
fn members_that_stop_reading_are_detached_and_the_others_and_the_store_go_on() {
    let o = Origin::start();
    // Far more than the socket buffers and a member's slices hold.
    let body = common::bytes(11, 16 << 20);
    let crc = crc32fast::hash(&body);
    o.set("/wide", Answer::ok(&body, &[("cache-control", "max-age=60")]));
    o.hold("/wide");
    let url = o.url();
    let s = Server::start(&["--origin", url.as_str()]);
    let addr = s.addr;
    let mut stalled = vec![stalled_get(addr, "/wide")];
    wait_until("the first request leads the fetch", || o.count("/wide") == 1);
    stalled.push(stalled_get(addr, "/wide"));
    stalled.push(stalled_get(addr, "/wide"));
    let reader = std::thread::spawn(move || stream_get(addr, "/wide"));
    wait_until("the others joined the fetch", || metric(&s, "larder_proxy_coalesced_total") == 3);
    let released = std::time::Instant::now();
    o.release("/wide");
    let (status, x, len, got) = reader.join().unwrap();
    let took = released.elapsed();
    println!("the member that reads had the whole body {took:?} after the origin answered");
    assert_eq!((status, x.as_str(), len, got), (200, "MISS", body.len() as u64, crc));
    assert!(took < Duration::from_secs(15), "the reader waited {took:?} on members that do not read");
    let (status, x, len, got) = stream_get(addr, "/wide");
    assert_eq!((status, x.as_str(), len, got), (200, "HIT", body.len() as u64, crc), "stored all the same");
    assert_eq!(o.count("/wide"), 1);
    for (i, c) in stalled.into_iter().enumerate() {
        let n = read_until_closed(c);
        assert!(n < body.len(), "member {i} that stopped reading was cut, not finished late: {n} bytes");
    }
}

/// Issue 39: an `Age` whose member carries parameters counts by its number (so a response that
/// is 7200 s old is never served fresh for 3600 s); one that is no non-negative integer (a
/// float, a sign, a prefix) is no Age at all (RFC 9111 §5.1); of several, the first counts.
#[test]
fn an_age_is_read_as_rfc_9111_asks() {
    let o = Origin::start();
    let cases: [(&str, &[&str], bool); 9] = [
        ("/param", &["7200;foo=bar"], false),
        ("/numeric-param", &["7200;foo=111"], false),
        ("/float", &["7200.0"], true),
        ("/negative", &["-7200"], true),
        ("/letters", &["abc"], true),
        ("/suffix", &["7200, 0"], false),
        ("/prefix", &["0, 7200"], true),
        ("/two-lines", &["7200", "0"], false),
        ("/large", &["2147483648"], false),
    ];
    for (path, ages, _) in &cases {
        let mut h = vec![("date", http_date(0)), ("cache-control", "max-age=3600".to_string())];
        h.extend(ages.iter().map(|a| ("age", a.to_string())));
        let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
        o.set(path, Answer::ok(b"x", &h));
    }
    let s = proxy(&o, &[]);
    let mut c = s.client();
    for (path, ages, fresh) in cases {
        get(&mut c, path, &[]);
        let r = get(&mut c, path, &[]);
        assert_eq!(x_cache(&r) == "HIT", fresh, "{path} with Age {ages:?}: {}", x_cache(&r));
    }
}

/// Issue 39: a 304 updates every field of the stored response it validates (RFC 9111 §3.2),
/// a new ETag, Content-MD5, Content-Encoding and Content-Range included, Content-Length
/// excepted; and it is taken as it comes, never followed by a second, unconditional request.
#[test]
fn a_304_with_a_new_etag_and_other_fields_updates_the_stored_response() {
    let o = Origin::start();
    let old = [
        ("cache-control", "max-age=1"),
        ("etag", "\"abcdef\""),
        ("content-md5", "rL0Y20zC+Fzt72VPzMSk2A=="),
        ("content-encoding", "arizqhypgxofwne"),
        ("content-range", "apetixmbqfujync"),
        ("x-test", "a"),
    ];
    let mut a = Answer::ok(b"the body", &old);
    a.not_modified = Some(
        [
            ("cache-control", "max-age=3600"),
            ("etag", "\"ghijkl\""),
            ("content-md5", "N7UdGUp1E+RbVvZSTy1R8g=="),
            ("content-encoding", "askcumewogyqias"),
            ("content-range", "aqgwmcsiyoeukaq"),
            ("content-length", "99"),
            ("x-test", "b"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect(),
    );
    o.set("/u", a);
    let s = proxy(&o, &[]);
    let mut c = s.client();
    assert_eq!(get(&mut c, "/u", &[]).header("etag"), Some("\"abcdef\""));
    std::thread::sleep(Duration::from_millis(1100));
    for round in ["REVALIDATED", "HIT"] {
        let r = get(&mut c, "/u", &[]);
        assert_eq!((r.status, x_cache(&r), &r.body[..]), (200, round, &b"the body"[..]));
        assert_eq!(r.header("etag"), Some("\"ghijkl\""), "{round}");
        assert_eq!(r.header("content-md5"), Some("N7UdGUp1E+RbVvZSTy1R8g=="), "{round}");
        assert_eq!(r.header("content-encoding"), Some("askcumewogyqias"), "{round}");
        assert_eq!(r.header("content-range"), Some("aqgwmcsiyoeukaq"), "{round}");
        assert_eq!(r.header("x-test"), Some("b"), "{round}");
        assert_eq!(r.header("content-length"), Some("8"), "{round}: the stored body's length");
    }
    assert_eq!(o.count("/u"), 2, "the fetch, then one conditional request");
    assert_eq!(o.seen("/u")[1].header("if-none-match"), Some("\"abcdef\""));
}

/// Issue 39: `Surrogate-Control` addressed to larder (to every surrogate, or by its token
/// `;larder`, which larder names in `Surrogate-Capability` on its requests) takes precedence
/// over `Cache-Control` here, a `max-age` there making a `no-store` response storable; one
/// addressed to another device is not larder's. It is removed before the response goes on,
/// fetched, stored or passed through. `CDN-Cache-Control` is obeyed likewise and forwarded
/// (RFC 9213: another CDN down the path may obey it too).
#[test]
fn surrogate_control_addressed_to_larder_rules_here_and_goes_no_further() {
    let o = Origin::start();
    o.set("/mine", Answer::ok(b"a", &[("surrogate-control", "max-age=3600;larder"), ("cache-control", "no-store")]));
    o.set("/all", Answer::ok(b"b", &[("surrogate-control", "max-age=3600"), ("cache-control", "no-store")]));
    o.set("/theirs", Answer::ok(b"c", &[("surrogate-control", "max-age=3600;other"), ("cache-control", "no-store")]));
    o.set(
        "/theirs-aged",
        Answer::ok(b"d", &[("date", &http_date(0)), ("surrogate-control", "max-age=3600;other"), ("age", "7200")]),
    );
    o.set("/nostore", Answer::ok(b"e", &[("surrogate-control", "no-store;larder"), ("cache-control", "max-age=60")]));
    o.set("/cdn", Answer::ok(b"f", &[("cdn-cache-control", "max-age=3600"), ("cache-control", "no-store")]));
    let s = proxy(&o, &[]);
    let mut c = s.client();
    for (path, stored) in
        [("/mine", true), ("/all", true), ("/theirs", false), ("/theirs-aged", false), ("/nostore", false)]
    {
        let first = get(&mut c, path, &[]);
        let again = get(&mut c, path, &[]);
        assert_eq!(x_cache(&again) == "HIT", stored, "{path}: {}", x_cache(&again));
        for r in [&first, &again] {
            assert_eq!(r.header("surrogate-control"), None, "{path}: removed ({})", x_cache(r));
        }
        let cap = o.seen(path)[0].header("surrogate-capability").map(str::to_string);
        assert_eq!(cap.as_deref(), Some("larder=\"Surrogate/1.0\""), "{path}");
    }
    get(&mut c, "/cdn", &[]);
    let r = get(&mut c, "/cdn", &[]);
    assert_eq!((x_cache(&r), r.header("cdn-cache-control")), ("HIT", Some("max-age=3600")));
    // Passed through (an unsafe method): removed too.
    o.set("/post", Answer::ok(b"g", &[("surrogate-control", "max-age=60")]));
    let r = c.request("POST", "/post", &[], b"x");
    assert_eq!((x_cache(&r), r.header("surrogate-control")), ("PASS", None));
}
