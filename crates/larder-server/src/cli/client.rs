//! What every subcommand shares: where the server is and its token, the HTTP calls, exit
//! codes, and byte counts for people.

use crate::cluster::KEY_ENCODE;
use clap::Args;
use percent_encoding::utf8_percent_encode;
use std::time::Duration;

/// Where the server is, and how to authenticate.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:1234", env = "LARDER_URL")]
    pub url: String,
    /// Bearer token for servers started with --auth-token (or LARDER_AUTH_TOKEN).
    #[arg(long, env = "LARDER_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the status line and response headers to stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// A failure of the command itself (exit 2), as opposed to an error answer (exit 1).
pub fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("larder: {msg}");
    2
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

pub fn key_url(t: &Target, key: &str) -> String {
    let key = key.strip_prefix('/').unwrap_or(key);
    format!("{}/{}", t.url.trim_end_matches('/'), utf8_percent_encode(key, KEY_ENCODE))
}

/// Sends a request, its body streamed from `body` if any; `Err` with the exit code when the
/// server could not be reached.
pub fn send(
    t: &Target,
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Option<ureq::SendBody<'_>>,
) -> Result<ureq::http::Response<ureq::Body>, i32> {
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    if let Some(token) = &t.token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let agent = agent();
    let sent = match body {
        Some(b) => agent.run(req.body(b).map_err(fail)?),
        None => agent.run(req.body(()).map_err(fail)?),
    };
    let resp = sent.map_err(|e| fail(format!("{method} {url}: {e}")))?;
    if t.verbose {
        eprintln!("{:?} {}", resp.version(), resp.status());
        for (k, v) in resp.headers() {
            eprintln!("{k}: {}", String::from_utf8_lossy(v.as_bytes()));
        }
    }
    Ok(resp)
}

/// Sends a request without a body and reads the whole answer; `Err` with the exit code when
/// the server could not be reached.
pub fn call(t: &Target, method: &str, url: &str) -> Result<(u16, Vec<u8>), i32> {
    let mut resp = send(t, method, url, &[], None)?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    Ok((status, body))
}

/// Exit code for an answer: 0 for 2xx, else the server's one-line message and 1.
pub fn answer(status: u16, body: &[u8]) -> i32 {
    if (200..300).contains(&status) {
        return 0;
    }
    eprintln!("larder: {status} {}", String::from_utf8_lossy(body).trim_end());
    1
}

/// Bytes in binary units, e.g. `1.5 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_in_canonical_form() {
        let t = Target { url: "http://h:1/".into(), token: None, verbose: false };
        assert_eq!(key_url(&t, "img/a b%.jpg"), "http://h:1/img/a%20b%25.jpg");
        assert_eq!(key_url(&t, "/x~y_z-1"), "http://h:1/x~y_z-1");
        assert_eq!(key_url(&t, "ü"), "http://h:1/%C3%BC");
    }
}
