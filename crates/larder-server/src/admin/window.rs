//! The operator's window over HTTP: the sampler that makes a second's figures from the
//! stats (the series the status page and `larder top` draw), `/_larder/series`,
//! `/_larder/hot`, `/_larder/slow` (whose POST changes the slow-request threshold), and the
//! strict reading of their query strings: anything they do not name is a 400.

use super::stats::{door_outcomes, gather, ratio};
use crate::app::App;
use crate::reply::{method_not_allowed, text, text_owned, Resp};
use crate::watch::latency::{quantile, BUCKETS};
use crate::watch::{hot, slow, Door, DOORS, OUTCOMES};
use hyper::{Method, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest query string an admin endpoint reads.
const QUERY_MAX: usize = 256;

/// A refused query string: 400 and why, in one line.
pub fn refuse(why: String) -> Resp {
    text_owned(StatusCode::BAD_REQUEST, format!("bad query string: {why}\n"))
}

/// A query string's parameters, each named in `allowed` at most once, with a short value of
/// letters, digits, `.`, `_` and `-` (nothing to decode, nothing to escape); else what is
/// wrong (see [`refuse`]).
pub fn params<'a>(query: Option<&'a str>, allowed: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let bad = Err;
    let Some(q) = query.filter(|q| !q.is_empty()) else { return Ok(Vec::new()) };
    if q.len() > QUERY_MAX {
        return bad(format!("longer than {QUERY_MAX} bytes"));
    }
    let mut out: Vec<(&str, &str)> = Vec::new();
    for pair in q.split('&') {
        let Some((name, value)) = pair.split_once('=') else {
            return bad("each parameter is name=value".into());
        };
        if !allowed.contains(&name) {
            return match allowed {
                [] => bad("this endpoint takes no parameters".into()),
                _ => bad(format!("it takes only {}", allowed.join(", "))),
            };
        }
        let fine = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
        if value.is_empty() || value.len() > 32 || !value.bytes().all(fine) {
            return bad(format!("{name} is 1 to 32 letters, digits, '.', '_' or '-'"));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return bad(format!("{name} given twice"));
        }
        out.push((name, value));
    }
    Ok(out)
}

fn param<'a>(p: &[(&'a str, &'a str)], name: &str) -> Option<&'a str> {
    p.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// A count parameter: 1 to `max`, `default` when absent.
fn count(p: &[(&str, &str)], name: &str, default: usize, max: usize) -> Result<usize, String> {
    match param(p, name) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(format!("{name} is 1 to {max}")),
        },
    }
}

fn json(v: serde_json::Value) -> Resp {
    let mut r = hyper::Response::new(crate::reply::Body::full(bytes::Bytes::from(v.to_string())));
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r.headers_mut().insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    r
}

/// `GET /_larder/series[?since=MS]`: the seconds after `since` (all kept, without it).
pub fn series(app: &App, query: Option<&str>) -> Resp {
    let p = match params(query, &["since"]) {
        Ok(p) => p,
        Err(why) => return refuse(why),
    };
    let since = match param(&p, "since").map(str::parse::<u64>) {
        None => 0,
        Some(Ok(ms)) => ms,
        Some(Err(_)) => return text(StatusCode::BAD_REQUEST, "bad query string: since is a time in ms\n"),
    };
    json(serde_json::json!({
        "started_ms": app.watch.started_ms,
        "now_ms": larder_engine::now_ms(),
        "interval_ms": 1000,
        "points": app.watch.points_since(since),
    }))
}

/// `GET /_larder/hot[?n=N&door=D]`: each door's most requested keys and largest values.
pub fn hot(app: &App, query: Option<&str>) -> Resp {
    let p = match params(query, &["n", "door"]) {
        Ok(p) => p,
        Err(why) => return refuse(why),
    };
    let n = match count(&p, "n", 10, 100) {
        Ok(n) => n,
        Err(why) => return refuse(why),
    };
    let doors = [Door::Http, Door::Proxy, Door::Memcache];
    let only = match param(&p, "door") {
        None => None,
        Some(d) => match DOORS.iter().position(|n| *n == d) {
            Some(i) => Some(doors[i]),
            None => {
                return text_owned(
                    StatusCode::BAD_REQUEST,
                    format!("bad query string: door is one of {}\n", DOORS.join(", ")),
                )
            }
        },
    };
    let mut out = serde_json::Map::new();
    let (mut memory, mut shown) = (0, 0);
    for d in doors.into_iter().filter(|d| only.is_none_or(|o| o == *d)) {
        shown += 1;
        let h = app.watch.hot(d);
        memory += h.memory_bytes();
        out.insert(
            DOORS[d as usize].into(),
            serde_json::json!({
                "keys": h.top(n).iter().map(|c| serde_json::json!({
                    "key": slow::shown(&c.key),
                    "requests": c.requests,
                    "error": c.error,
                    "cut": c.cut,
                })).collect::<Vec<_>>(),
                "largest": h.largest().iter().take(n).map(|(k, b)| serde_json::json!({"key": slow::shown(k), "bytes": b})).collect::<Vec<_>>(),
            }),
        );
    }
    json(serde_json::json!({
        "sample_every": hot::SAMPLE_EVERY,
        "half_life_seconds": hot::HALF_LIFE_TICKS,
        "memory_bytes": memory,
        "max_memory_bytes": hot::MAX_BYTES * shown,
        "doors": out,
    }))
}

/// `GET /_larder/slow[?n=N]`: the last slow requests' traces, newest first.
/// `POST /_larder/slow?threshold=T`: the threshold from now on (`250ms`, `1s`, `0` for off).
pub fn slow(app: &App, method: &Method, query: Option<&str>) -> Resp {
    match *method {
        Method::GET | Method::HEAD => {
            let p = match params(query, &["n"]) {
                Ok(p) => p,
                Err(why) => return refuse(why),
            };
            let n = match count(&p, "n", 20, slow::KEEP) {
                Ok(n) => n,
                Err(why) => return refuse(why),
            };
            json(serde_json::json!({
                "threshold_ms": app.watch.slow.threshold().as_secs_f64() * 1e3,
                "seen": app.watch.slow.seen(),
                "traces": app.watch.slow.last(n).iter().map(slow::to_json).collect::<Vec<_>>(),
            }))
        }
        Method::POST => {
            let p = match params(query, &["threshold"]) {
                Ok(p) => p,
                Err(why) => return refuse(why),
            };
            let Some(t) = param(&p, "threshold") else {
                return text(StatusCode::BAD_REQUEST, "POST /_larder/slow?threshold=250ms (0: off)\n");
            };
            match parse_threshold(t) {
                Some(d) => {
                    app.watch.slow.set_threshold(d);
                    tracing::info!(millis = d.as_millis() as u64, "slow-request threshold changed");
                    text_owned(StatusCode::OK, format!("slow-request threshold: {}\n", shown_duration(d)))
                }
                None => text(
                    StatusCode::BAD_REQUEST,
                    "bad query string: threshold is 0, or a number with us, ms or s, at most 1h\n",
                ),
            }
        }
        _ => method_not_allowed("GET, HEAD, POST"),
    }
}

/// `0`, or a number followed by `us`, `ms` or `s`, from 1 ms to an hour: a lower threshold
/// would make every request a slow one.
fn parse_threshold(t: &str) -> Option<Duration> {
    if t == "0" {
        return Some(Duration::ZERO);
    }
    let (n, unit) = t.find(|c: char| !c.is_ascii_digit() && c != '.').map(|i| t.split_at(i))?;
    let n: f64 = n.parse().ok().filter(|n: &f64| n.is_finite())?;
    let secs = match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        _ => return None,
    };
    (0.001..=3600.0).contains(&secs).then(|| Duration::from_secs_f64(secs))
}

fn shown_duration(d: Duration) -> String {
    if d.is_zero() {
        "off".into()
    } else {
        format!("{}ms", d.as_secs_f64() * 1e3)
    }
}

/// What the sampler remembers from one second to the next.
struct Before {
    at: Instant,
    engine: Option<[u64; 9]>,
    doors: [(&'static str, [u64; OUTCOMES.len()]); 3],
    latency: [[u64; BUCKETS]; 3],
    bytes: [u64; 2],
}

/// Makes a second's figures every second until the server stops, from the stats (on the
/// blocking pool: they ask the file system for free space).
pub async fn sampler(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut before: Option<Before> = None;
    loop {
        tick.tick().await;
        let stats = gather(&app).await;
        let now = snapshot(&app, stats.as_ref());
        if let Some(b) = &before {
            app.watch.push_point(point(&app, b, &now, stats.as_ref()));
        }
        before = Some(now);
    }
}

fn snapshot(app: &App, s: Option<&larder_engine::Stats>) -> Before {
    let m = crate::memcache::counters();
    Before {
        at: Instant::now(),
        engine: s.map(|s| {
            [
                s.hits,
                s.memory_hits,
                s.misses,
                s.puts,
                s.deletes,
                s.reinserted,
                s.disk_reads,
                s.coalesced_reads,
                s.promotions,
            ]
        }),
        doors: door_outcomes(app),
        latency: [Door::Http, Door::Proxy, Door::Memcache].map(|d| app.watch.latency(d)),
        bytes: [
            app.metrics.bytes_in.load(Ordering::Relaxed) + m.bytes_read.load(Ordering::Relaxed),
            app.metrics.bytes_out.load(Ordering::Relaxed) + m.bytes_written.load(Ordering::Relaxed),
        ],
    }
}

/// A second's figures: rates from the differences of two snapshots, levels as they are now.
fn point(app: &App, b: &Before, now: &Before, s: Option<&larder_engine::Stats>) -> serde_json::Value {
    let secs = now.at.duration_since(b.at).as_secs_f64().max(1e-3);
    let rate = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs;
    let mut doors = serde_json::Map::new();
    for i in 0..3 {
        let (name, counts) = now.doors[i];
        let old = b.doors[i].1;
        let lat: [u64; BUCKETS] = std::array::from_fn(|k| now.latency[i][k].saturating_sub(b.latency[i][k]));
        let mut d = serde_json::Map::new();
        d.insert("rate".into(), rate(counts.iter().sum(), old.iter().sum()).into());
        for (k, o) in OUTCOMES.iter().enumerate() {
            d.insert((*o).into(), rate(counts[k], old[k]).into());
        }
        for (q, label) in [(0.5, "p50_us"), (0.9, "p90_us"), (0.99, "p99_us"), (0.999, "p999_us")] {
            d.insert(label.into(), quantile(&lat, q).into());
        }
        doors.insert(name.into(), d.into());
    }
    let mut p = serde_json::json!({
        "t": larder_engine::now_ms(),
        "seconds": secs,
        "doors": doors,
        "bytes_in": rate(now.bytes[0], b.bytes[0]),
        "bytes_out": rate(now.bytes[1], b.bytes[1]),
        "budget_used_bytes": app.body_budget.bodies_used().0,
        "budget_capacity_bytes": app.body_budget.bodies_used().1,
        "waiting": app.body_budget.waiting(),
        "recovering": s.is_none(),
    });
    if let (Some(s), Some(e), Some(o)) = (s, now.engine, b.engine) {
        let d = |i: usize| e[i].saturating_sub(o[i]);
        let (hits, memory, misses) = (d(0), d(1), d(2));
        let reads = hits + misses;
        let extra = serde_json::json!({
            "hits_memory": memory as f64 / secs,
            "hits_disk": hits.saturating_sub(memory) as f64 / secs,
            "misses": misses as f64 / secs,
            // A second with no reads has no ratio (null), not a ratio of 0.
            "hit_ratio": (reads > 0).then(|| ratio(hits, reads)),
            "memory_hit_ratio": (reads > 0).then(|| ratio(memory, reads)),
            "disk_hit_ratio": (reads > 0).then(|| ratio(hits.saturating_sub(memory), reads)),
            "puts": d(3) as f64 / secs,
            "deletes": d(4) as f64 / secs,
            "reinserted": d(5) as f64 / secs,
            "disk_reads": d(6) as f64 / secs,
            "coalesced_reads": d(7) as f64 / secs,
            "promotions": d(8) as f64 / secs,
            "keys": s.keys,
            "bytes_used": s.bytes_used,
            "capacity_bytes": s.capacity_bytes,
            "memory_bytes": s.memory_bytes,
            "memory_capacity": s.memory_capacity,
        });
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_are_read_strictly() {
        assert_eq!(params(None, &["n"]).ok(), Some(vec![]));
        assert_eq!(params(Some("n=5&door=http"), &["n", "door"]).ok(), Some(vec![("n", "5"), ("door", "http")]));
        for hostile in [
            "x=1",
            "n",
            "n=",
            "n=1&n=2",
            "n=%3Cscript%3E",
            "n=<script>",
            "n=1;rm",
            "n=../../etc",
            "&",
            "n=1&",
            "door=http%00",
            &"n=1&".repeat(80),
        ] {
            let r = params(Some(hostile), &["n", "door"]);
            assert!(r.is_err(), "{hostile}");
        }
        assert!(params(Some("a=1"), &[]).is_err());
    }

    #[test]
    fn thresholds_parse() {
        assert_eq!(parse_threshold("0"), Some(Duration::ZERO));
        assert_eq!(parse_threshold("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_threshold("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_threshold("1500us"), Some(Duration::from_micros(1500)));
        for bad in ["", "ms", "5", "5m", "2h", "7200s", "-1ms", "1e3ms", "NaNs", "200us", "0.5ms", "0ms"] {
            assert_eq!(parse_threshold(bad), None, "{bad}");
        }
    }
}
