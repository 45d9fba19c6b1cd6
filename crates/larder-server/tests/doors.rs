//! One policy for every door: the same token, `--auth-reads` and `--read-only` decide the same
//! way over HTTP, memcached's text and meta commands, its binary protocol (raw and through
//! Dalli's SASL) and the read-through proxy; refusals lose nothing that was stored; flag
//! combinations that cannot be honoured are refused at start.

mod common;

use common::mc::Mc;
use common::origin::{Answer, Origin};
use common::Server;
use std::io::Write;
use std::process::Command;

const TOKEN: &str = "d00r-t0ken";

fn auth() -> (&'static str, String) {
    ("Authorization", format!("Bearer {TOKEN}"))
}

const AUTH_ERROR: u16 = 0x20;
const SERVER_ERROR: u16 = 0x84;

fn token_file(dir: &std::path::Path) -> String {
    let f = dir.join("token");
    std::fs::write(&f, TOKEN).unwrap();
    f.to_str().unwrap().to_string()
}

#[test]
fn with_a_token_no_memcached_command_reads_writes_or_flushes_without_the_credential() {
    let tmp = tempfile::tempdir().unwrap();
    let token = token_file(tmp.path());
    let s = Server::start_in(&tmp.path().join("data"), &["--auth-token", &token, "--memcache-listen", "127.0.0.1:0"]);
    let mut c = s.client();
    let a = auth();
    assert_eq!(c.request("PUT", "/victim", &[(a.0, &a.1)], b"original").status, 200);

    // Text and meta, anonymous: every command but the health ones is refused; the set is a
    // failed login, its data never stored.
    let mut m = Mc::connect(&s);
    assert_eq!(m.ask(b"get victim\r\n", "\r\n"), "CLIENT_ERROR unauthenticated\r\n");
    assert_eq!(m.ask(b"set victim 0 0 8\r\nattacker\r\n", "\r\n"), "CLIENT_ERROR bad authentication token format\r\n");
    assert_eq!(m.ask(b"set victim 0 0 14\r\nuser wrong-one\r\n", "\r\n"), "CLIENT_ERROR authentication failure\r\n");
    for line in [
        "flush_all",
        "delete victim",
        "incr victim 1",
        "touch victim 10",
        "gat 0 victim",
        "mg victim v",
        "md victim",
        "ma victim",
        "stats",
        "stats cachedump 1 0",
        "lru_crawler metadump all",
        "watch",
        "shutdown",
    ] {
        assert_eq!(m.ask(format!("{line}\r\n").as_bytes(), "\r\n"), "CLIENT_ERROR unauthenticated\r\n", "{line}");
    }
    // The HTTP door's flush, and the key dumps' counterparts, want the token too.
    assert_eq!(c.request("POST", "/_larder/flush", &[], b"").status, 401);
    assert_eq!(c.request("POST", "/_larder/flush", &[("authorization", "Bearer wrong")], b"").status, 401);
    // A refused meta set's data block is read past: the next command is answered in step.
    assert_eq!(m.ask(b"ms victim 8 T0\r\nattacker\r\nmn\r\n", "MN\r\n"), "CLIENT_ERROR unauthenticated\r\nMN\r\n");
    assert!(m.ask(b"version\r\n", "\r\n").starts_with("VERSION "), "health stays open");

    // Binary, anonymous and with a wrong password.
    let mut b = Mc::connect(&s);
    assert_eq!(b.binary(0x00, b"victim", &[], &[]).0, AUTH_ERROR, "get");
    assert_eq!(b.binary(0x01, b"victim", &[0; 8], b"attacker").0, AUTH_ERROR, "set");
    assert_eq!(b.binary(0x08, b"", &[], &[]).0, AUTH_ERROR, "flush");
    assert_eq!(b.binary(0x20, b"", &[], &[]), (0, b"PLAIN".to_vec()), "the mechanisms");
    assert_eq!(b.binary(0x21, b"PLAIN", &[], b"\0larder\0nope").0, AUTH_ERROR);
    assert_eq!(b.binary(0x21, b"CRAM-MD5", &[], TOKEN.as_bytes()).0, AUTH_ERROR, "only PLAIN");
    assert_eq!(b.binary(0x04, b"victim", &[], &[]).0, AUTH_ERROR, "delete");
    assert_eq!(b.binary(0x0b, b"", &[], &[]).0, 0, "version is health");
    // Before authenticating, nothing larger than a credential is held: a 2 KB body is refused
    // at once and read past.
    assert_eq!(b.binary(0x0a, b"", &[], &[b'x'; 2048]).0, 0x04, "a noop with a body");
    assert_eq!(b.binary(0x0b, b"", &[], &[]).0, 0, "in step after it");
    let long_get = format!("get {}", "k ".repeat(2000)); // no end yet
    m.0.write_all(long_get.as_bytes()).unwrap();
    assert!(m.closed(), "a line of keys past 2 KiB before the login closes the connection");
    let mut m = Mc::connect(&s);
    assert_eq!(c.get("/victim").body, b"original", "nothing an anonymous client sent changed the value");

    // With the credential: the text login, then everything works.
    assert_eq!(m.ask(format!("set x 0 0 {}\r\nme {TOKEN}\r\n", TOKEN.len() + 3).as_bytes(), "\r\n"), "STORED\r\n");
    assert_eq!(m.ask(b"get victim\r\n", "END\r\n"), "VALUE victim 0 8\r\noriginal\r\nEND\r\n");
    assert_eq!(m.ask(b"set k 0 0 2\r\nhi\r\n", "\r\n"), "STORED\r\n", "a set after the login is a set");
    assert_eq!(m.ask(b"mg k v\r\nmn\r\n", "MN\r\n"), "VA 2\r\nhi\r\nMN\r\n");
    // SASL PLAIN on the binary connection.
    assert_eq!(b.binary(0x21, b"PLAIN", &[], format!("\0larder\0{TOKEN}").as_bytes()), (0, b"Authenticated".to_vec()));
    let (status, value) = b.binary(0x00, b"k", &[], &[]);
    assert_eq!((status, value.as_slice()), (0, &b"hi"[..]));

    let stats = c.request("GET", "/_larder/stats", &[(a.0, &a.1)], b"");
    let stats: serde_json::Value = serde_json::from_slice(&stats.body).unwrap();
    assert!(stats["refusals"]["memcache_text"]["unauthenticated"].as_u64().unwrap() >= 10, "{}", stats["refusals"]);
    assert_eq!(stats["refusals"]["memcache_text"]["bad_credential"], 2);
    assert!(stats["refusals"]["memcache_binary"]["unauthenticated"].as_u64().unwrap() >= 4);
}

#[test]
fn dalli_authenticates_with_sasl_plain_and_is_refused_without_it() {
    let tmp = tempfile::tempdir().unwrap();
    let token = token_file(tmp.path());
    let s = Server::start_in(&tmp.path().join("data"), &["--auth-token", &token, "--memcache-listen", "127.0.0.1:0"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/dalli_sasl.rb");
    let out = Command::new("ruby")
        .args([script, &s.memcache.unwrap().to_string(), TOKEN])
        .output()
        .expect("run ruby (scripts/install-bench-deps.sh installs ruby and ruby-dalli)");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let mut c = s.client();
    assert_eq!(c.get("/from-dalli").body, b"with sasl", "Dalli's authenticated set is the HTTP key");
    assert_eq!(c.get("/not-from-dalli").status, 404, "the unauthenticated set stored nothing");
}

#[test]
fn read_only_refuses_every_write_on_every_door_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_in(&dir, &["--memcache-listen", "127.0.0.1:0"]);
    let mut c = s.client();
    for k in ["a", "n", "big"] {
        assert_eq!(c.put(&format!("/{k}"), if k == "n" { b"5" } else { b"value" }).status, 200);
    }
    s.stop();
    s.restart_with(&["--memcache-listen", "127.0.0.1:0", "--read-only"]);
    let mut c = s.client();
    assert_eq!(c.put("/a", b"other").status, 403);
    assert_eq!(c.request("PATCH", "/a", &[("X-TTL", "1")], b"").status, 403, "a touch is a write");
    assert_eq!(c.delete("/a").status, 403);
    assert_eq!(c.request("POST", "/_larder/flush", &[], b"").status, 403);

    let mut m = Mc::connect(&s);
    const RO: &str = "SERVER_ERROR this server is read-only\r\n";
    for cmd in [
        &b"set a 0 0 5\r\nother\r\n"[..],
        b"add z 0 0 1\r\nz\r\n",
        b"replace a 0 0 1\r\nz\r\n",
        b"append a 0 0 1\r\nz\r\n",
        b"prepend a 0 0 1\r\nz\r\n",
        b"cas a 0 0 1 1\r\nz\r\n",
        b"delete a\r\n",
        b"incr n 1\r\n",
        b"decr n 1\r\n",
        b"touch a 1\r\n",
        b"gat 1 a\r\n",
        b"flush_all\r\n",
        b"ms a 1\r\nz\r\n",
        b"md a\r\n",
        b"ma n\r\n",
        b"mg a v T1\r\n",
    ] {
        assert_eq!(m.ask(cmd, "\r\n"), RO, "{}", String::from_utf8_lossy(cmd));
    }
    assert_eq!(m.ask(b"get a n\r\n", "END\r\n"), "VALUE a 0 5\r\nvalue\r\nVALUE n 0 1\r\n5\r\nEND\r\n");
    let mut b = Mc::connect(&s);
    for (opcode, key, extras, value) in [
        (0x01u8, &b"a"[..], &[0u8; 8][..], &b"other"[..]),
        (0x04, b"a", &[], &[]),
        (0x05, b"n", &[0; 20], &[]),
        (0x08, b"", &[], &[]),
        (0x0e, b"a", &[], b"z"),
        (0x1c, b"a", &[0; 4], &[]),
    ] {
        let (status, msg) = b.binary(opcode, key, extras, value);
        assert_eq!((status, msg.as_slice()), (SERVER_ERROR, &b"this server is read-only"[..]), "opcode {opcode:#x}");
    }
    assert_eq!(b.binary(0x00, b"a", &[], &[]).0, 0, "reads are served");
    assert_eq!(c.get("/a").body, b"value");
    assert_eq!(c.get("/n").body, b"5");
    assert_eq!(s.stats()["keys"], 3, "nothing was added or removed");
}

#[test]
fn the_proxy_forwards_unsafe_methods_and_purges_only_with_write_rights() {
    let tmp = tempfile::tempdir().unwrap();
    let token = token_file(tmp.path());
    let o = Origin::start();
    o.set("/page", Answer::ok(b"cached", &[("cache-control", "max-age=600")]));
    let origin = o.url();
    let run = |extra: &[&str]| {
        let mut args = vec!["--origin", &origin];
        args.extend_from_slice(extra);
        Server::start(&args)
    };
    let a = auth();

    // A token: a POST without it is refused and reaches neither the origin nor the store.
    let s = run(&["--auth-token", &token]);
    let mut c = s.client();
    assert_eq!(c.get("/page").body, b"cached");
    assert_eq!(c.request("POST", "/page", &[], b"x").status, 401);
    assert_eq!(c.request("DELETE", "/page", &[("Authorization", "Bearer wrong")], b"").status, 401);
    assert_eq!(o.seen("/page").iter().filter(|r| r.method != "GET").count(), 0, "nothing forwarded");
    assert_eq!(c.get("/page").header("x-cache"), Some("HIT"), "nothing invalidated");
    assert_eq!(c.request("POST", "/_larder/purge?uri=127.0.0.1/page", &[], b"").status, 401);
    // With it: forwarded without larder's token, and the stored response invalidated.
    assert_eq!(c.request("POST", "/page", &[(a.0, &a.1)], b"x").status, 200);
    let post = o.seen("/page").into_iter().find(|r| r.method == "POST").expect("the POST reached the origin");
    assert_eq!(post.header("authorization"), None, "larder's token is not the origin's business");
    assert_eq!(c.get("/page").header("x-cache"), Some("MISS"), "invalidated by the POST");
    // The origin's own credential goes through; larder's then comes in Proxy-Authorization.
    let origin_auth = ("Authorization", "Basic b3JpZ2lu");
    assert_eq!(c.request("PUT", "/page", &[origin_auth], b"x").status, 401, "the origin's credential is not larder's");
    let proxy_auth = ("Proxy-Authorization", a.1.as_str());
    assert_eq!(c.request("PUT", "/page", &[origin_auth, proxy_auth], b"x").status, 200);
    let put = o.seen("/page").into_iter().find(|r| r.method == "PUT").expect("the PUT reached the origin");
    assert_eq!(put.header("authorization"), Some("Basic b3JpZ2lu"));
    assert_eq!(put.header("proxy-authorization"), None);
    // A credential that is not larder's token goes to the origin on reads.
    c.request("GET", "/page", &[("Authorization", "Basic b3JpZ2lu")], b"");
    let last = o.seen("/page").into_iter().last().unwrap();
    assert_eq!(last.header("authorization"), Some("Basic b3JpZ2lu"));
    drop(s);

    // Read-only: reads (and fills) are served; unsafe methods and purges are refused.
    let s = run(&["--read-only"]);
    let mut c = s.client();
    assert_eq!(c.get("/page").body, b"cached");
    let before = o.seen("/page").len();
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        assert_eq!(c.request(method, "/page", &[], b"").status, 403, "{method}");
    }
    assert_eq!(c.request("POST", "/_larder/purge?uri=127.0.0.1/page", &[], b"").status, 403);
    assert_eq!(o.seen("/page").len(), before, "nothing forwarded");
    assert_eq!(c.get("/page").header("x-cache"), Some("HIT"));
    let refusals = &s.stats()["refusals"];
    assert_eq!(refusals["proxy"]["read_only"], 4);
    assert_eq!(refusals["admin"]["read_only"], 1);
}

#[test]
fn flag_combinations_that_cannot_be_honoured_are_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let cases: [(&[&str], &str); 4] = [
        (&["--auth-reads"], "--auth-reads needs a token"),
        (&["--cluster-nodes", "=5", "--cluster-self", ""], "node \"=5\" has no name"),
        (
            &["--origin", "http://127.0.0.1:9", "--memcache-listen", "127.0.0.1:0"],
            "--memcache-listen cannot be combined with --origin",
        ),
        (&["--origin", "http://127.0.0.1:9", "--verify-cas"], "--verify-cas cannot be combined with --origin"),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_larder"))
            .arg("serve")
            .args(["--data-dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("LARDER_AUTH_TOKEN")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn webdav_methods_pass_the_same_policy_as_the_key_api() {
    let tmp = tempfile::tempdir().unwrap();
    let token = token_file(tmp.path());
    let dir = tmp.path().join("data");
    let mut s = Server::start_in(&dir, &["--auth-token", &token, "--memcache-listen", "127.0.0.1:0"]);
    let mut c = s.client();
    let a = auth();
    let (with, wrong) = ([(a.0, a.1.as_str()), ("Depth", "0")], [("Authorization", "Bearer nope"), ("Depth", "0")]);
    assert_eq!(c.request("PUT", "/k", &[(a.0, &a.1)], b"v").status, 200);
    // Reads (PROPFIND, OPTIONS) are open as GET is; MKCOL writes.
    assert_eq!(c.request("PROPFIND", "/k", &[("Depth", "0")], b"").status, 207);
    assert_eq!(c.request("OPTIONS", "/k", &[], b"").status, 200);
    assert_eq!(c.request("MKCOL", "/d/", &[], b"").status, 401);
    assert_eq!(c.request("MKCOL", "/d/", &wrong, b"").status, 401);
    assert_eq!(c.request("MKCOL", "/d/", &with, b"").status, 201);
    assert_eq!(c.request("PATCH", "/k", &[("X-TTL", "60")], b"").status, 401, "a touch is a write");
    assert_eq!(c.request("PATCH", "/k", &[(a.0, &a.1), ("X-TTL", "60")], b"").status, 200);
    // A listing enumerates keys: it needs the token, as memcached's key dumps and stats do.
    let list_with = [(a.0, a.1.as_str()), ("Depth", "1")];
    assert_eq!(c.request("PROPFIND", "/", &[("Depth", "1")], b"").status, 401);
    assert_eq!(c.request("PROPFIND", "/", &[("Depth", "1"), ("Authorization", "Bearer nope")], b"").status, 401);
    assert_eq!(c.request("PROPFIND", "/", &list_with, b"").status, 207);
    assert_eq!(c.request("PROPFIND", "/k", &[("Depth", "1")], b"").status, 207, "a key is no listing");
    let mut m = Mc::connect(&s);
    assert_eq!(m.ask(b"lru_crawler metadump all\r\n", "\r\n"), "CLIENT_ERROR unauthenticated\r\n");
    s.stop();
    s.restart_with(&["--auth-token", &token, "--auth-reads"]);
    let mut c = s.client();
    for m in ["PROPFIND", "OPTIONS"] {
        let r = c.request(m, "/k", &[("Depth", "0")], b"");
        assert_eq!((r.status, r.header("www-authenticate").is_some()), (401, true), "{m}");
        assert_eq!(c.request(m, "/k", &wrong, b"").status, 401, "{m}");
        assert!(matches!(c.request(m, "/k", &with, b"").status, 200 | 207), "{m}");
    }
    // A refused PROPFIND's body is not parsed: a hostile one gets the same 401.
    assert_eq!(
        c.request("PROPFIND", "/", &[("Depth", "0")], b"<!DOCTYPE x [<!ENTITY a SYSTEM \"file:///\">]>").status,
        401
    );
    s.stop();
    s.restart_with(&["--read-only"]);
    let mut c = s.client();
    assert_eq!(c.request("MKCOL", "/e/", &[], b"").status, 403);
    assert_eq!(c.request("PROPFIND", "/k", &[("Depth", "0")], b"").status, 207);
    assert_eq!(c.get("/k").body, b"v");
    assert_eq!(s.stats()["refusals"]["http"]["read_only"], 1);
}

fn cas_key(value: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(value).iter().map(|b| format!("{b:02x}")).collect();
    format!("bazel/cas/{hex}")
}

#[test]
fn verify_cas_refuses_wrong_content_on_every_door_and_keeps_what_was_stored() {
    let s = Server::start(&["--verify-cas", "--memcache-listen", "127.0.0.1:0", "--chunk-size", "65536"]);
    let mut c = s.client();
    let good = b"a build output".to_vec();
    let key = cas_key(&good);
    let r = c.put(&format!("/{key}"), b"tampered output");
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("SHA-256"), "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(c.get(&format!("/{key}")).status, 404, "nothing stored");
    assert_eq!(c.put(&format!("/{key}"), &good).status, 200);
    assert_eq!(c.put(&format!("/{key}"), b"tampered output").status, 400);
    // Streamed (past a chunk): checked as it arrives, refused at its end.
    let big = common::bytes(7, 300_000);
    let big_key = cas_key(&big);
    let mut bad = big.clone();
    bad[299_999] ^= 1;
    assert_eq!(c.put(&format!("/{big_key}"), &bad).status, 400);
    assert_eq!(c.get(&format!("/{big_key}")).status, 404);
    assert_eq!(c.put(&format!("/{big_key}"), &big).status, 200);
    // Action results are not content-addressed.
    assert_eq!(c.put(&format!("/bazel/ac/{}", &key[10..]), b"any").status, 200);

    let mut m = Mc::connect(&s);
    let set = format!("set {key} 0 0 3\r\nbad\r\n");
    assert!(m.ask(set.as_bytes(), "\r\n").starts_with("CLIENT_ERROR the value's SHA-256 is "));
    assert!(m.ask(format!("append {key} 0 0 1\r\nx\r\n").as_bytes(), "\r\n").starts_with("CLIENT_ERROR "));
    assert!(m.ask(format!("ms {key} 3 T0\r\nbad\r\n").as_bytes(), "\r\n").starts_with("CLIENT_ERROR "));
    let five = cas_key(b"5");
    assert_eq!(m.ask(format!("set {five} 0 0 1\r\n5\r\n").as_bytes(), "\r\n"), "STORED\r\n");
    assert!(m.ask(format!("incr {five} 1\r\n").as_bytes(), "\r\n").starts_with("CLIENT_ERROR "));
    let mut b = Mc::connect(&s);
    assert_eq!(b.binary(0x01, key.as_bytes(), &[0; 8], b"bad").0, 0x04, "binary set: invalid arguments");
    assert_eq!(b.binary(0x0e, key.as_bytes(), &[], b"x").0, 0x04, "binary append");

    assert_eq!(c.get(&format!("/{key}")).body, good, "every refused write left the value");
    assert_eq!(c.get(&format!("/{big_key}")).body, big);
    assert_eq!(c.get(&format!("/{five}")).body, b"5");
    assert_eq!(s.stats()["cas_refused"], 9);
    let metrics = String::from_utf8(c.get("/_larder/metrics").body).unwrap();
    assert!(metrics.contains("larder_cas_refused_total 9"), "{metrics}");
}
