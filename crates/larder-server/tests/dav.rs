//! The WebDAV door (RFC 4918's subset that key-value clients use): OPTIONS, PROPFIND of keys
//! and of implicit collections, listings only when honest, MKCOL, the methods refused with
//! 405 and `Allow`, and hostile bodies and headers refused with a 4xx that changes nothing.
//! The real clients (sccache, rclone) are driven in build_caches.rs.

mod common;

use common::Server;

const ALLPROP: &[u8] = br#"<?xml version="1.0" encoding="utf-8"?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>"#;

type Header<'a> = (&'a str, &'a str);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `response` elements of a 207 body, each as its text.
fn responses(body: &[u8]) -> Vec<String> {
    let t = text(body);
    t.split("<D:response>").skip(1).map(|r| r.split("</D:response>").next().unwrap().to_string()).collect()
}

fn href(response: &str) -> &str {
    response.split("<D:href>").nth(1).unwrap().split("</D:href>").next().unwrap()
}

#[test]
fn options_and_propfind_describe_keys_and_collections() {
    let s = Server::start(&[]);
    let mut c = s.client();
    let r = c.request("OPTIONS", "/", &[], b"");
    assert_eq!((r.status, r.header("dav")), (200, Some("1")));
    assert_eq!(r.header("allow"), Some("OPTIONS, GET, HEAD, PUT, PATCH, DELETE, PROPFIND, MKCOL"));

    assert_eq!(c.request("PUT", "/dir/a%20b.txt", &[("Content-Type", "text/plain")], b"hello").status, 200);
    let etag = c.get("/dir/a%20b.txt").header("etag").unwrap().to_string();
    let r = c.request("PROPFIND", "/dir/a%20b.txt", &[("Depth", "0")], ALLPROP);
    assert_eq!(r.status, 207, "{}", text(&r.body));
    assert_eq!(r.header("content-type"), Some("application/xml; charset=utf-8"));
    let all = responses(&r.body);
    assert_eq!(all.len(), 1);
    let one = &all[0];
    assert_eq!(href(one), "/dir/a%20b.txt", "the href is the path asked for");
    for want in [
        "<D:resourcetype/>".to_string(),
        "<D:getcontentlength>5</D:getcontentlength>".into(),
        format!("<D:getetag>{etag}</D:getetag>"),
        "<D:getcontenttype>text/plain</D:getcontenttype>".into(),
        "<D:getlastmodified>".into(),
        "HTTP/1.1 200 OK".into(),
    ] {
        assert!(one.contains(&want), "{want} in {one}");
    }
    // A key is not a collection whatever the depth; an empty body asks for every property.
    let r = c.request("PROPFIND", "/dir/a%20b.txt", &[("Depth", "1")], b"");
    assert_eq!((r.status, responses(&r.body).len()), (207, 1));
    let r = c.request("PROPFIND", "/dir/a%20b.txt", &[], b"");
    assert_eq!(r.status, 207, "Depth: infinity on a key is the key");
    assert_eq!(c.request("PROPFIND", "/dir/missing", &[("Depth", "0")], b"").status, 404);

    // Collections: the root and every path ending in `/`, whether or not keys are under it.
    for path in ["/", "/dir/", "/nothing/here/"] {
        let r = c.request("PROPFIND", path, &[("Depth", "0")], ALLPROP);
        assert_eq!(r.status, 207, "{path}");
        let all = responses(&r.body);
        assert_eq!(all.len(), 1);
        assert_eq!(href(&all[0]), path);
        assert!(all[0].contains("<D:resourcetype><D:collection/></D:resourcetype>"), "{}", all[0]);
        assert!(all[0].contains("<D:getlastmodified>"), "OpenDAL needs a date on collections too");
    }
    // Named properties: those a resource lacks come back under 404, in their namespace.
    let ask = br#"<?xml version="1.0"?><d:propfind xmlns:d="DAV:" xmlns:oc="http://owncloud.org/ns"><d:prop><d:getcontentlength/><oc:checksums/></d:prop></d:propfind>"#;
    let r = c.request("PROPFIND", "/dir/a%20b.txt", &[("Depth", "0")], ask);
    let one = &responses(&r.body)[0];
    assert!(
        one.contains("<D:prop><D:getcontentlength>5</D:getcontentlength></D:prop><D:status>HTTP/1.1 200 OK"),
        "{one}"
    );
    assert!(one.contains(r#"<x:checksums xmlns:x="http://owncloud.org/ns"/></D:prop><D:status>HTTP/1.1 404 Not Found"#));
    let r =
        c.request("PROPFIND", "/dir/a%20b.txt", &[("Depth", "0")], br#"<propfind xmlns="DAV:"><propname/></propfind>"#);
    assert!(responses(&r.body)[0].contains("<D:getcontentlength/>"), "names only");
}

#[test]
fn a_collection_is_listed_only_when_the_listing_is_whole() {
    let s = Server::start(&["--dav-list-limit", "20"]);
    let mut c = s.client();
    for k in ["d/a", "d/b&c", "d/sub/x", "d/sub/y", "d/sub/deeper/z", "other", "d2/q"] {
        assert_eq!(c.put(&format!("/{k}"), k.as_bytes()).status, 200);
    }
    c.put("/d/gone", b"x");
    c.delete("/d/gone");
    let r = c.request("PROPFIND", "/d/", &[("Depth", "1")], b"");
    assert_eq!(r.status, 207, "{}", text(&r.body));
    let all = responses(&r.body);
    let hrefs: Vec<&str> = all.iter().map(|r| href(r)).collect();
    assert_eq!(hrefs, ["/d/", "/d/a", "/d/b%26c", "/d/sub/"], "members only, each once, deleted keys gone");
    assert!(all[1].contains("<D:getcontentlength>3</D:getcontentlength>"));
    assert!(all[3].contains("<D:collection/>"));
    let root = c.request("PROPFIND", "/", &[("Depth", "1")], b"");
    let hrefs: Vec<String> = responses(&root.body).iter().map(|r| href(r).to_string()).collect();
    assert_eq!(hrefs, ["/", "/d/", "/d2/", "/other"]);

    // Depth: infinity on a collection is refused as RFC 4918 allows; so is a missing Depth.
    for depth in [Some("infinity"), None] {
        let h: Vec<(&str, &str)> = depth.map(|d| ("Depth", d)).into_iter().collect();
        let r = c.request("PROPFIND", "/d/", &h, b"");
        assert_eq!(r.status, 403);
        assert!(text(&r.body).contains("<D:propfind-finite-depth/>"));
    }

    // Past the limit the listing is refused, never cut short; Depth 0 still answers.
    for i in 0..20 {
        c.put(&format!("/d/more{i}"), b"m");
    }
    let r = c.request("PROPFIND", "/d/", &[("Depth", "1")], b"");
    assert_eq!(r.status, 507, "{}", text(&r.body));
    assert!(text(&r.body).contains("--dav-list-limit 20"), "{}", text(&r.body));
    assert_eq!(text(&r.body).lines().count(), 1);
    assert_eq!(c.request("PROPFIND", "/d/", &[("Depth", "0")], b"").status, 207);

    // 0 refuses every listing, even of an empty store.
    let s = Server::start(&["--dav-list-limit", "0"]);
    let r = s.client().request("PROPFIND", "/", &[("Depth", "1")], b"");
    assert_eq!(r.status, 507, "{}", text(&r.body));
}

#[test]
fn a_listing_answer_has_a_bound_whatever_the_client_names() {
    let s = Server::start(&["--dav-list-limit", "100000"]);
    let mut c = s.client();
    // Each member echoes every foreign property named, in its namespace: 64 of the longest
    // names the parser takes, over 4000 members, would be past 16 MiB.
    let ns = format!("urn:{}", "n".repeat(250));
    let props: String = (0..64).map(|i| format!("<x:{}{i}/>", "p".repeat(250))).collect();
    let body = format!(r#"<D:propfind xmlns:D="DAV:" xmlns:x="{ns}"><D:prop>{props}</D:prop></D:propfind>"#);
    assert_eq!(c.request("PROPFIND", "/k0", &[("Depth", "0")], body.as_bytes()).status, 404);
    assert_eq!(c.put("/k0", b"v").status, 200);
    let one = c.request("PROPFIND", "/k0", &[("Depth", "0")], body.as_bytes());
    assert_eq!(one.status, 207);
    assert!(one.body.len() < 64 << 10, "one resource's answer: {} bytes", one.body.len());
    for i in 1..600 {
        c.put(&format!("/k{i}"), b"v");
    }
    let r = c.request("PROPFIND", "/", &[("Depth", "1")], body.as_bytes());
    assert_eq!(r.status, 507, "{}", text(&r.body[..200.min(r.body.len())]));
    assert!(text(&r.body).contains("larger than 16 MiB"));
}

#[test]
fn mkcol_and_the_methods_larder_does_not_take() {
    let s = Server::start(&[]);
    let mut c = s.client();
    assert_eq!(c.request("MKCOL", "/new/", &[], b"").status, 201);
    let r = c.request("MKCOL", "/new2", &[], b"");
    assert_eq!(r.status, 403, "a collection is a path ending in /");
    assert!(text(&r.body).contains("ending in /"));
    assert_eq!(c.put("/file", b"v").status, 200);
    assert_eq!(c.put("/slash/", b"w").status, 200);
    let r = c.request("MKCOL", "/slash/", &[], b"");
    assert_eq!(r.status, 405, "a value is stored there");
    assert!(r.header("allow").is_some());
    assert_eq!(c.request("MKCOL", "/x/", &[("Content-Type", "text/xml")], b"<a/>").status, 415);
    for m in ["COPY", "MOVE", "PROPPATCH", "LOCK", "UNLOCK", "POST", "TRACE"] {
        let r = c.request(m, "/file", &[("Destination", "http://larder/copy")], b"");
        assert_eq!(r.status, 405, "{m}");
        assert_eq!(r.header("allow"), Some("OPTIONS, GET, HEAD, PUT, PATCH, DELETE, PROPFIND, MKCOL"), "{m}");
    }
    assert_eq!(c.get("/copy").status, 404);
    assert_eq!(c.get("/file").body, b"v");
    assert_eq!(s.stats()["keys"], 2, "MKCOL stores nothing");
}

#[test]
fn hostile_webdav_input_gets_a_clear_4xx_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"kept").status, 200);
    let bomb = br#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;"><!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">]><D:propfind xmlns:D="DAV:"><D:prop><D:getetag>&lol2;</D:getetag></D:prop></D:propfind>"#;
    let xxe = br#"<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><D:propfind xmlns:D="DAV:"><D:prop><D:getetag>&x;</D:getetag></D:prop></D:propfind>"#;
    let deep = format!(
        r#"<D:propfind xmlns:D="DAV:"><D:prop>{}{}</D:prop></D:propfind>"#,
        "<a>".repeat(5000),
        "</a>".repeat(5000)
    );
    let wide = format!(r#"<D:propfind xmlns:D="DAV:"><D:prop>{}</D:prop></D:propfind>"#, "<D:p/>".repeat(1000));
    let cases: Vec<(&[u8], &[Header], u16, &str)> = vec![
        (bomb, &[("Depth", "0")], 400, "DOCTYPE"),
        (xxe, &[("Depth", "0")], 400, "DOCTYPE"),
        (deep.as_bytes(), &[("Depth", "0")], 400, "deeper"),
        (wide.as_bytes(), &[("Depth", "0")], 400, "at most"),
        (b"<D:propfind xmlns:D=\"DAV:\"><D:allprop>", &[("Depth", "0")], 400, "malformed XML"),
        (b"<propfind><allprop/></propfind>", &[("Depth", "0")], 400, "DAV:propfind"),
        (b"", &[("Depth", "2")], 400, "Depth must be"),
        (b"", &[("Depth", "1, 0")], 400, "Depth must be"),
        (b"", &[("Depth", "-1")], 400, "Depth must be"),
    ];
    for (body, headers, status, says) in cases {
        for path in ["/k", "/"] {
            let r = c.request("PROPFIND", path, headers, body);
            assert_eq!(r.status, status, "{path} {headers:?} {says} {}", text(&r.body));
            assert!(text(&r.body).contains(says), "{says}: {}", text(&r.body));
            assert_eq!(text(&r.body).lines().count(), 1, "one line: {}", text(&r.body));
        }
    }
    // A body over the limit: refused from its declared length, before it is read; and as it
    // arrives, chunked.
    let huge = vec![b' '; 100 << 10];
    let r = c.request("PROPFIND", "/k", &[("Depth", "0")], &huge);
    assert_eq!(r.status, 413);
    let mut c = s.client();
    let mut chunked = b"PROPFIND /k HTTP/1.1\r\nHost: x\r\nDepth: 0\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        chunked.extend_from_slice(format!("{:x}\r\n", 8 << 10).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 8 << 10));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    c.raw(&chunked).unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 413);
    let mut c = s.client();
    assert_eq!(c.get("/k").body, b"kept");
    assert_eq!(s.stats()["keys"], 1);
}
