//! Access control: a bearer token for writes and admin endpoints (reads optionally),
//! health open for load balancers, and a read-only mode.

mod common;
use common::{Client, Server};
use std::process::Command;

const TOKEN: &str = "s3cret-token_42";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn req(c: &mut Client, method: &str, path: &str, auth: Option<&str>, body: &[u8]) -> u16 {
    let header = auth.map(bearer);
    let headers: Vec<(&str, &str)> = header.iter().map(|h| ("Authorization", h.as_str())).collect();
    c.request(method, path, &headers, body).status
}

#[test]
fn token_file_protects_writes_and_admin_but_not_reads_or_health() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("token");
    std::fs::write(&file, format!("  {TOKEN}  \nsecond line is ignored\n")).unwrap();
    let s = Server::start_in(&tmp.path().join("data"), &["--auth-token", file.to_str().unwrap()]);
    let mut c = s.client();

    let r = c.put("/k", b"v");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some(r#"Bearer realm="larder""#));
    assert!(String::from_utf8_lossy(&r.body).contains("Authorization: Bearer"));
    let wrong = c.request("PUT", "/k", &[("Authorization", "Bearer s3cret-token_43")], b"v");
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("www-authenticate").unwrap().contains("invalid_token"));
    assert_eq!(req(&mut c, "PUT", "/k", Some("s3cret-token_4"), b"v"), 401, "a prefix of the token");
    assert_eq!(req(&mut c, "PUT", "/k", Some(&format!("{TOKEN}x")), b"v"), 401, "the token and more");
    assert_eq!(c.request("PUT", "/k", &[("Authorization", TOKEN)], b"v").status, 401, "no scheme");
    assert_eq!(c.get("/k").status, 404, "the refused PUTs stored nothing");

    assert_eq!(req(&mut c, "PUT", "/k", Some(TOKEN), b"v"), 200);
    assert_eq!(c.request("PUT", "/k2", &[("Authorization", &format!("bearer  {TOKEN}"))], b"v").status, 200);
    assert_eq!(c.get("/k").status, 200, "reads are open by default");
    assert_eq!(c.request("HEAD", "/k", &[], b"").status, 200);
    assert_eq!(req(&mut c, "DELETE", "/k", None, b""), 401);
    assert_eq!(req(&mut c, "DELETE", "/k", Some(TOKEN), b""), 200);

    assert_eq!(c.get("/_larder/health").status, 200, "health needs no token");
    assert_eq!(c.get("/_larder/stats").status, 401);
    assert_eq!(c.get("/_larder/metrics").status, 401);
    assert_eq!(req(&mut c, "GET", "/_larder/stats", Some(TOKEN), b""), 200);
    assert_eq!(req(&mut c, "POST", "/_larder/faults", None, b"write eio"), 401, "fault injection too");
}

#[test]
fn token_from_the_environment_and_auth_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_env(&tmp.path().join("data"), &["--auth-reads"], &[("LARDER_AUTH_TOKEN", TOKEN)]);
    let mut c = s.client();
    assert_eq!(req(&mut c, "PUT", "/k", Some(TOKEN), b"v"), 200);
    assert_eq!(c.get("/k").status, 401);
    assert_eq!(c.request("HEAD", "/k", &[], b"").status, 401);
    assert_eq!(req(&mut c, "GET", "/k", Some(TOKEN), b""), 200);
    assert_eq!(req(&mut c, "GET", "/absent", Some(TOKEN), b""), 404);
    assert_eq!(c.get("/absent").status, 401, "no telling which keys exist without the token");
    assert_eq!(c.get("/_larder/health").status, 200);
}

#[test]
fn read_only_refuses_writes_with_403() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_in(&dir, &[]);
    assert_eq!(s.client().put("/k", b"v").status, 200);
    s.stop();
    let s = Server::start_in(&dir, &["--read-only"]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"other").status, 403);
    assert_eq!(c.delete("/k").status, 403);
    assert_eq!(c.get("/k").body, b"v");
}

#[test]
fn an_empty_token_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("token");
    std::fs::write(&file, "\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--listen", "127.0.0.1:0", "--auth-token"])
        .arg(&file)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no token"), "{err}");
}
