//! Starting and stopping: the listening socket, the store's recovery in the background (the
//! socket answers 503 meanwhile), the accept loop, and the stop on SIGTERM or SIGINT (the
//! listener closed, connections drained within `--shutdown-timeout`, the store closed).

use crate::admin;
use crate::app::App;
use crate::config::Settings;
use crate::conn;
use crate::metrics::Metrics;
use larder_engine::{RecoveryProgress, Store, StoreConfig};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Raises the open-file limit to its hard maximum: each connection is a descriptor.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, so call it
/// before anything that a signal should not interrupt.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("installing a SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("installing a SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Runs the server until SIGTERM or SIGINT; returns after data is durable.
pub async fn run(settings: Settings) -> Result<(), String> {
    raise_fd_limit();
    let signal = shutdown_signal()?;
    let addr = settings.listen;
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let listener = socket.listen(4096).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;

    // Fault injection needs a test build *and* an explicit opt-in, so that a release build
    // made with dev-dependency features never exposes it by accident.
    let faults = larder_engine::faults::available().then(|| std::env::var("LARDER_FAULTS").ok()).flatten();
    if let Some(mode) = &faults {
        tracing::warn!(mode, "fault injection is on (/_larder/faults): for tests only");
    }
    let track = faults.as_deref() == Some("track");
    let app = Arc::new(App {
        store: OnceLock::new(),
        settings: settings.clone(),
        policy: crate::guard::Policy::new(&settings),
        faults: faults.is_some(),
        metrics: Metrics::install()?,
        watch: crate::watch::Watch::new(settings.slow_request),
        progress: RecoveryProgress::default(),
        started: Instant::now(),
        shutting_down: AtomicBool::new(false),
        body_budget: crate::guard::budget::Budget::new(settings.max_body_memory),
        uploads: tokio::sync::Semaphore::new(crate::app::MAX_STREAMED_UPLOADS),
    });
    // After the metrics recorder is installed: the proxy takes its histogram's handle.
    crate::proxy::start(&settings)?;
    // Recovery runs while the socket already answers (503 until ready).
    let (ready_tx, mut ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let s = &app.settings;
            let cfg = StoreConfig {
                dirs: s.data_dir.clone(),
                strict_dirs: s.strict_dirs,
                volume_size: s.volume_size,
                volume_count: s.volume_count,
                max_value_size: s.max_value_size,
                chunk_size: s.chunk_size,
                fsync: s.fsync,
                memory: s.memory.clone(),
                reinsert_min_hits: s.reinsert_min_hits,
                expiry_cap: crate::guard::ring::foreign_cap(s),
                max_downtime: s.max_downtime,
                verify_cas: s.verify_cas,
                compression: s.compression,
                ..StoreConfig::new(&s.data_dir[0])
            };
            // Test builds only: log writes from the start, for a simulated power cut.
            if track {
                for dir in &s.data_dir {
                    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| larder_engine::faults::track(dir)) {
                        tracing::error!(error = %e, "cannot track the data directory for power cuts");
                    }
                }
            }
            let r = Store::open_observed(cfg, &app.progress).map(|store| {
                log_recovered(&store, app.started.elapsed());
                let _ = app.store.set(store);
            });
            let dirs: Vec<String> = s.data_dir.iter().map(|d| d.display().to_string()).collect();
            let _ = ready_tx.send(r.map_err(|e| format!("cannot open the store in {}: {e}", dirs.join(", "))));
        });
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let memcache = match settings.memcache_listen {
        Some(addr) => {
            let l = crate::memcache::bind(addr).await?;
            let local = l.local_addr().map_err(|e| e.to_string())?;
            Some((local, tokio::spawn(crate::memcache::run(app.clone(), l, shutdown_rx.clone()))))
        }
        None => None,
    };
    let conns = Arc::new(Mutex::new(conn::Conns::default()));
    let clock = tokio::spawn(conn::coarse_clock());
    let sampler = tokio::spawn(admin::sampler(app.clone()));
    let background = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last_report = Instant::now();
            loop {
                tick.tick().await;
                if app.store.get().is_none() && last_report.elapsed() >= RECOVERY_REPORT_EVERY {
                    last_report = Instant::now();
                    let status = admin::recovery_status(&app.progress, app.started.elapsed());
                    tracing::info!(target: "larder::lifecycle", "recovering: {status}");
                }
                app.metrics.upkeep();
            }
        })
    };
    let mut connections = JoinSet::new();
    let admit = |stream: TcpStream, connections: &mut JoinSet<()>| {
        conn::admit(&app, &conns, &shutdown_rx, stream, connections);
    };
    tokio::pin!(signal);
    let mut waiting_ready = true;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => admit(stream, &mut connections),
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            r = &mut ready_rx, if waiting_ready => {
                waiting_ready = false;
                match r {
                    Ok(Ok(())) => {
                        println!("larder listening on {local}");
                        if let Some((m, _)) = &memcache {
                            println!("larder memcached protocol on {m}");
                        }
                    }
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err("store task ended unexpectedly".into()),
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = &mut signal => break,
        }
    }
    // Connections the kernel completed but nobody accepted yet would be reset when the
    // listener closes: take them in and answer them too (for at most 100 ms, so that a flood
    // of connects cannot hold the stop up).
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
            Ok(Ok((stream, _))) => admit(stream, &mut connections),
            _ => break,
        }
    }
    drop(listener);
    // From here on every answer closes its connection (only now: a client told to reconnect
    // before the listener closed could land in its queue and be reset), and health says so.
    app.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!(target: "larder::lifecycle", connections = connections.len(), "stopping: finishing requests in flight");
    // The drain is the server's own (this signal, `conn::serve_connection`, the JoinSet), not
    // hyper-util's `GracefulShutdown`, for two things that does not do:
    // - Its `shutdown` calls hyper's `graceful_shutdown` on every connection at once. On an
    //   HTTP/1 connection between requests that closes it on the spot, even when the next
    //   request is already sent or half read (hyper counts a request only once its head is
    //   parsed; hyperium/hyper#3792), and that request is lost: tried with hyper-util 0.1.21
    //   and hyper 1.12, the SIGTERM test in tests/operations.rs failed with `connection
    //   closed` in 10 runs of 11. Here a connection is closed only once it has been quiet
    //   between requests for a second, and what arrives meanwhile is answered with
    //   `Connection: close`. `GracefulConnection` is sealed, so the call cannot be deferred
    //   by wrapping the connection.
    // - It only waits: past `--shutdown-timeout`, what is left must still be ended, and that
    //   needs the connections' tasks, which the JoinSet holds and waits for anyway.
    let _ = shutdown_tx.send(true);
    let limit = app.settings.shutdown_timeout;
    let drained = tokio::time::timeout(limit, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = connections.len(), "connections still busy after {limit:?}; closing them");
        connections.abort_all();
    }
    if let Some((_, m)) = memcache {
        let _ = m.await; // it drains its connections within the same timeout
    }
    clock.abort();
    sampler.abort();
    background.abort();
    if waiting_ready {
        // Still recovering: wait for it so the store is closed cleanly.
        let _ = ready_rx.await;
    }
    let app2 = app.clone();
    let closing = Instant::now();
    tokio::task::spawn_blocking(move || app2.store.get().map(|s| s.close()).transpose())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("closing the store: {e}"))?;
    tracing::info!(target: "larder::lifecycle", millis = closing.elapsed().as_millis() as u64, "stopped: data synced, checkpoint written");
    Ok(())
}

/// How often a recovery in progress is logged.
const RECOVERY_REPORT_EVERY: Duration = Duration::from_secs(2);

fn log_recovered(store: &Store, elapsed: Duration) {
    let s = store.stats();
    let r = s.recovery;
    tracing::info!(
        target: "larder::lifecycle",
        keys = s.keys,
        volumes = r.volumes,
        hint_loads = r.hint_loads,
        checkpoint_loads = r.checkpoint_loads,
        scans = r.scans,
        tail_bytes_scanned = r.tail_bytes_scanned,
        truncated_bytes = r.truncated_bytes,
        millis = elapsed.as_millis() as u64,
        "recovered"
    );
}
