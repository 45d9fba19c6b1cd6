//! The endpoints under `/_larder/`: health (with the recovery's progress while the store
//! opens), Prometheus metrics, the JSON stats, and the fault injection of test builds.

pub mod page;
mod stats;
mod window;

pub use window::sampler;

use crate::app::App;
use crate::reply::{method_not_allowed, text, text_owned, Body, Resp};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::RecoveryProgress;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `/_larder/faults`, in builds with the engine's fault layer only (tests): POST a rule such
/// as `write nospace` to make the data directory's I/O fail (`dir=N write eio` for the Nth
/// `--data-dir`, from 0), or `power-cut` (with the server started with `LARDER_FAULTS=track`)
/// to simulate a power loss; DELETE clears faults; GET says how many operations a `delay`
/// rule holds at the moment (`delayed N`). Off unless the environment variable
/// `LARDER_FAULTS` is set too.
pub async fn faults(app: &App, req: Request<Incoming>) -> Resp {
    use larder_engine::faults;
    if !app.faults {
        return text(StatusCode::NOT_FOUND, "no such admin endpoint\n");
    }
    let dirs = &app.settings.data_dir;
    match *req.method() {
        Method::POST => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n")),
            };
            let spec = String::from_utf8_lossy(&body);
            if spec.trim() == "power-cut" {
                // Undo every write not yet synced; from now on all I/O on the directories
                // fails. It waits for every I/O call in flight: not on an async worker.
                let dirs = dirs.clone();
                let cut = tokio::task::spawn_blocking(move || {
                    dirs.iter().try_fold(faults::CutReport::default(), |sum, d| {
                        faults::power_cut(d)
                            .map(|r| faults::CutReport { changes: sum.changes + r.changes, files: sum.files + r.files })
                    })
                })
                .await;
                return match cut.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))) {
                    Ok(r) => text_owned(StatusCode::OK, format!("undid {} changes in {} files\n", r.changes, r.files)),
                    Err(e) => text_owned(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                };
            }
            let (dir, spec) = match spec.trim().strip_prefix("dir=").map(|r| r.split_once(' ').unwrap_or((r, ""))) {
                Some((n, rest)) => match n.parse::<usize>().ok().and_then(|n| dirs.get(n)) {
                    Some(d) => (d, rest),
                    None => return text_owned(StatusCode::BAD_REQUEST, format!("no data directory number {n}\n")),
                },
                None => (&dirs[0], spec.trim()),
            };
            match faults::Rule::parse(spec).map(|r| faults::inject(dir, r)) {
                Ok(Ok(())) => text(StatusCode::OK, "injected\n"),
                Ok(Err(e)) => text_owned(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                Err(e) => text_owned(StatusCode::BAD_REQUEST, format!("{e}\n")),
            }
        }
        Method::DELETE => {
            dirs.iter().for_each(|d| faults::clear(d));
            text(StatusCode::OK, "cleared\n")
        }
        // How many operations a delay rule holds right now: a test waits for a read to be in
        // the air rather than sleeping and hoping.
        Method::GET => text_owned(StatusCode::OK, format!("delayed {}\n", faults::delayed())),
        _ => method_not_allowed("GET, POST, DELETE"),
    }
}

/// The other admin endpoints: `health` (open to all, see the routing), `metrics`, `stats`,
/// the status page (open too: its files hold no figures) and the window's `series`, `hot`
/// and `slow` (whose POST sets the slow-request threshold).
pub async fn endpoint(app: &Arc<App>, method: &Method, what: &[u8], query: Option<&str>) -> Resp {
    if what == b"slow" {
        return window::slow(app, method, query);
    }
    match *method {
        Method::GET | Method::HEAD => {}
        Method::PUT | Method::DELETE => return text(StatusCode::BAD_REQUEST, "keys under _larder/ are reserved\n"),
        _ => return method_not_allowed("GET, HEAD"),
    }
    // Health is for load balancers, which may add what they like; every other endpoint reads
    // its query string strictly (none of these takes one).
    if what != b"health" && !matches!(what, b"series" | b"hot") {
        if let Err(why) = window::params(query, &[]) {
            return window::refuse(why);
        }
    }
    match what {
        _ if page::is_asset(what) => page::asset(what),
        b"series" => window::series(app, query),
        b"hot" => window::hot(app, query),
        b"health" => match app.store.get() {
            _ if app.stopping() => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
            Some(_) => text(StatusCode::OK, "ok\n"),
            None => text_owned(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("recovering: {}\n", recovery_status(&app.progress, app.started.elapsed())),
            ),
        },
        b"metrics" => {
            let stats = stats::gather(app).await;
            if let Some(p) = crate::proxy::state() {
                crate::proxy::render_metrics(&p.counters);
            }
            crate::guard::render_metrics(&app.policy);
            crate::memcache::render_metrics();
            let text = app.metrics.render(stats.as_ref());
            let mut r = Response::new(Body::full(Bytes::from(text)));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            r
        }
        b"stats" => {
            let Some(s) = stats::gather(app).await else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n");
            };
            let body = stats::json(app, &s);
            let mut r = Response::new(Body::full(Bytes::from(body.to_string())));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        _ => text(StatusCode::NOT_FOUND, "no such admin endpoint\n"),
    }
}

/// `POST /_larder/flush[?delay=SECONDS]`: memcached's `flush_all` for HTTP clients and for
/// `larder flush`: every value stored before now (or before the delay's end, from then on)
/// reads as absent. The caller has been admitted for `Permission::Flush`.
pub async fn flush(app: &Arc<App>, method: &Method, query: Option<&str>) -> Resp {
    if *method != Method::POST {
        return method_not_allowed("POST");
    }
    if app.store.get().is_none() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n");
    }
    let delay = match query.unwrap_or("").split('&').find_map(|p| p.strip_prefix("delay=")) {
        None => 0,
        Some(d) => match d.parse::<u64>() {
            Ok(d) if d <= 30 * 86_400 => d,
            _ => return text(StatusCode::BAD_REQUEST, "delay is a number of seconds, at most 30 days\n"),
        },
    };
    match crate::storeio::blocking(app, move |s| s.flush_all(Duration::from_secs(delay))).await {
        Ok(()) => text(StatusCode::OK, "flushed\n"),
        Err(e) => {
            tracing::error!(error = %e, "flush failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "flush failed: the store could not save it\n")
        }
    }
}

/// One line on a recovery in progress: volumes and records done, share of the bytes read and
/// the time left at the rate so far.
pub fn recovery_status(p: &RecoveryProgress, elapsed: Duration) -> String {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (done, total) = (load(&p.bytes_done), load(&p.bytes_total));
    let mut line = format!(
        "{}/{} volumes, {} records, {:.0}% of {} MiB read",
        load(&p.volumes_done),
        load(&p.volumes_total),
        load(&p.records),
        if total == 0 { 0.0 } else { done as f64 * 100.0 / total as f64 },
        total >> 20
    );
    if done > 0 && total > done {
        let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
        line.push_str(&format!(", about {left:.0} s left"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_status_reports_share_and_time_left() {
        let p = RecoveryProgress::default();
        p.volumes_total.store(4, Ordering::Relaxed);
        p.volumes_done.store(1, Ordering::Relaxed);
        p.bytes_total.store(400 << 20, Ordering::Relaxed);
        p.bytes_done.store(100 << 20, Ordering::Relaxed);
        p.records.store(123_456, Ordering::Relaxed);
        // A quarter read in 2 s: three quarters left take 6 s more at that rate.
        assert_eq!(
            recovery_status(&p, Duration::from_secs(2)),
            "1/4 volumes, 123456 records, 25% of 400 MiB read, about 6 s left"
        );
        assert_eq!(
            recovery_status(&RecoveryProgress::default(), Duration::ZERO),
            "0/0 volumes, 0 records, 0% of 0 MiB read"
        );
    }
}
