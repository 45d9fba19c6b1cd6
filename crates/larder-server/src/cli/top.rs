//! `larder top`: the status page's live view in a terminal, for one node or every node of a
//! cluster, refreshed every second (ratatui), or one frame printed for scripts (`--once`).
//! It reads what the page reads: `/_larder/stats`, the server's last second from
//! `/_larder/series`, and `/_larder/hot`.

use super::client::{fail, human_bytes, Target};
use clap::Args;
use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// `larder top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Print one frame and exit (waits for the server's first whole second if it has none).
    #[arg(long)]
    pub once: bool,
    /// Every node of a cluster, by the HTTP address of each (comma-separated, as
    /// --cluster-nodes; weights are ignored), instead of --url.
    #[arg(long, value_name = "LIST")]
    pub cluster_nodes: Option<String>,
    /// Hot keys shown for each door.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=50))]
    pub hot: u16,
    #[command(flatten)]
    pub target: Target,
}

/// What one node said.
struct Node {
    name: String,
    url: String,
    stats: Option<Value>,
    last: Option<Value>,
    hot: Option<Value>,
    error: Option<String>,
    /// The requests per second of its last minute, for a sparkline.
    rates: Vec<f64>,
    seen_t: u64,
    started_ms: u64,
}

/// `larder top`.
pub fn top(a: TopArgs) -> i32 {
    let urls: Vec<(String, String)> = match &a.cluster_nodes {
        None => {
            let url = a.target.url.trim_end_matches('/').to_string();
            let name = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest).to_string();
            vec![(name, url)]
        }
        Some(list) => match crate::cluster::parse_nodes(list) {
            Ok(nodes) => nodes
                .into_iter()
                .map(|n| {
                    let url = if n.name.contains("://") { n.name.clone() } else { format!("http://{}", n.name) };
                    (n.name, url)
                })
                .collect(),
            Err(e) => return fail(format!("--cluster-nodes: {e}")),
        },
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let mut nodes: Vec<Node> = urls
        .into_iter()
        .map(|(name, url)| Node {
            name,
            url,
            stats: None,
            last: None,
            hot: None,
            error: None,
            rates: Vec::new(),
            seen_t: 0,
            started_ms: 0,
        })
        .collect();
    if a.once {
        // A server up less than two seconds has no whole second yet: wait for one, briefly.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            nodes.iter_mut().for_each(|n| refresh(&agent, &a.target, n, a.hot));
            let waiting = nodes.iter().any(|n| n.error.is_none() && n.last.is_none());
            if !waiting || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        print!("{}", frame(&nodes, a.hot as usize, false));
        return if nodes.iter().all(|n| n.error.is_some()) { 1 } else { 0 };
    }
    match live(&agent, &a, &mut nodes) {
        Ok(()) => 0,
        Err(e) => fail(format!("the terminal: {e}")),
    }
}

/// Redraws every second until q, Esc or Ctrl-C.
fn live(agent: &ureq::Agent, a: &TopArgs, nodes: &mut [Node]) -> std::io::Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
    use ratatui::widgets::Paragraph;
    let mut terminal = ratatui::init();
    let r = (|| loop {
        nodes.iter_mut().for_each(|n| refresh(agent, &a.target, n, a.hot));
        let text = frame(nodes, a.hot as usize, true);
        terminal.draw(|f| f.render_widget(Paragraph::new(text.as_str()), f.area()))?;
        let until = Instant::now() + Duration::from_secs(1);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if event::poll(left)? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    r
}

fn get(agent: &ureq::Agent, t: &Target, url: &str) -> Result<Value, String> {
    let mut req = agent.get(url);
    if let Some(token) = &t.token {
        req = req.header("Authorization", &format!("Bearer {token}"));
    }
    let mut resp = req.call().map_err(|e| format!("unreachable: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().map_err(|e| format!("unreachable: {e}"))?;
    if status != 200 {
        return Err(format!("answered {status} {}", body.lines().next().unwrap_or("")));
    }
    serde_json::from_str(&body).map_err(|e| format!("not JSON: {e}"))
}

fn refresh(agent: &ureq::Agent, t: &Target, n: &mut Node, hot: u16) {
    let stats = match get(agent, t, &format!("{}/_larder/stats", n.url)) {
        Ok(s) => s,
        Err(e) => {
            n.error = Some(e);
            return;
        }
    };
    let started = stats["started_ms"].as_u64().unwrap_or(0);
    if started != n.started_ms {
        // A restart (or the first look): its seconds start again.
        (n.started_ms, n.seen_t, n.last) = (started, 0, None);
        n.rates.clear();
    }
    n.stats = Some(stats);
    n.error = None;
    if let Ok(series) = get(agent, t, &format!("{}/_larder/series?since={}", n.url, n.seen_t)) {
        for p in series["points"].as_array().into_iter().flatten() {
            n.rates.push(total_rate(p));
            n.seen_t = n.seen_t.max(p["t"].as_u64().unwrap_or(0));
            n.last = Some(p.clone());
        }
        let drop = n.rates.len().saturating_sub(60);
        n.rates.drain(..drop);
    }
    n.hot = get(agent, t, &format!("{}/_larder/hot?n={hot}", n.url)).ok();
}

const DOORS: [&str; 3] = ["http", "proxy", "memcache"];

fn total_rate(p: &Value) -> f64 {
    DOORS.iter().map(|d| p["doors"][d]["rate"].as_f64().unwrap_or(0.0)).sum()
}

/// A count per second, short: `950`, `12.3k`, `4.1M`.
fn per_s(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

/// Bytes per second, short and without a space (a column of its own): `950B`, `12.3KiB`.
fn short_bytes(v: f64) -> String {
    human_bytes(v as u64).replace(' ', "")
}

fn micros(us: u64) -> String {
    match us {
        0 => "-".into(),
        u if u >= 1_000_000 => format!("{:.2}s", u as f64 / 1e6),
        u if u >= 1000 => format!("{:.1}ms", u as f64 / 1e3),
        u => format!("{u}µs"),
    }
}

fn pct(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
}

fn spark(rates: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = rates.iter().cloned().fold(0.0, f64::max);
    rates.iter().map(|r| if max <= 0.0 { BARS[0] } else { BARS[((r / max) * 7.0).round() as usize] }).collect()
}

fn uptime(secs: f64) -> String {
    let s = secs as u64;
    match s {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// One frame: a line a node, then each node's doors, hot keys and largest values.
fn frame(nodes: &[Node], hot: usize, live: bool) -> String {
    let mut f = String::new();
    let when = httpdate::fmt_http_date(std::time::SystemTime::now());
    let _ = writeln!(
        f,
        "larder top · {} node{} · {when}{}",
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" },
        if live { " · q quits" } else { "" }
    );
    let _ = writeln!(
        f,
        "\n{:<22} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9} {:>9} {:>10} {:>10} {:>9}",
        "NODE", "UP", "REQ/S", "HIT", "MEMORY", "DISK", "IN/S", "OUT/S", "KEYS", "DISK USED", "SHARE"
    );
    for n in nodes {
        let Some(s) = n.stats.as_ref().filter(|_| n.error.is_none()) else {
            let _ = writeln!(f, "{:<22} {}", n.name, n.error.as_deref().unwrap_or("no answer"));
            continue;
        };
        let null = Value::Null;
        let p = n.last.as_ref().unwrap_or(&null);
        let used = s["bytes_used"].as_u64().unwrap_or(0);
        let cap = s["capacity_bytes"].as_u64().unwrap_or(0).max(1);
        let _ = writeln!(
            f,
            "{:<22} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9} {:>9} {:>10} {:>10} {:>9}",
            n.name,
            uptime(s["uptime_seconds"].as_f64().unwrap_or(0.0)),
            per_s(total_rate(p)),
            pct(&p["hit_ratio"]),
            pct(&p["memory_hit_ratio"]),
            pct(&p["disk_hit_ratio"]),
            short_bytes(p["bytes_in"].as_f64().unwrap_or(0.0)),
            short_bytes(p["bytes_out"].as_f64().unwrap_or(0.0)),
            s["keys"].as_u64().unwrap_or(0),
            format!("{:.0}%", used as f64 * 100.0 / cap as f64),
            s["cluster"]["share"].as_f64().map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
        );
    }
    for n in nodes.iter().filter(|n| n.error.is_none()) {
        let (Some(s), Some(p)) = (&n.stats, &n.last) else { continue };
        let b = &s["budget"];
        let _ = writeln!(
            f,
            "\n{}  {}\n  budget {} of {}, {} waiting · memory {} of {} ({}) · slow {} (over {} ms)",
            n.name,
            spark(&n.rates),
            human_bytes(b["used_bytes"].as_u64().unwrap_or(0)),
            human_bytes(b["capacity_bytes"].as_u64().unwrap_or(0)),
            b["waiting"].as_u64().unwrap_or(0),
            human_bytes(s["memory_bytes"].as_u64().unwrap_or(0)),
            human_bytes(s["memory_capacity"].as_u64().unwrap_or(0)),
            s["memory_policy"].as_str().unwrap_or("off"),
            s["slow"]["seen"].as_u64().unwrap_or(0),
            s["slow"]["threshold_ms"].as_f64().unwrap_or(0.0),
        );
        let _ = writeln!(
            f,
            "  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12}",
            "DOOR", "REQ/S", "HIT/S", "MISS/S", "WRITE/S", "ERR/S", "P50", "P99", "P99.9", "HITS"
        );
        for d in DOORS {
            let x = &p["doors"][d];
            let total = s["doors"][d]["requests"].as_u64().unwrap_or(0);
            if total == 0 {
                continue;
            }
            let r = |k: &str| x[k].as_f64().unwrap_or(0.0);
            let _ = writeln!(
                f,
                "  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12}",
                d,
                per_s(r("rate")),
                per_s(r("hit")),
                per_s(r("miss")),
                per_s(r("write")),
                per_s(r("client_error") + r("server_error")),
                micros(x["p50_us"].as_u64().unwrap_or(0)),
                micros(x["p99_us"].as_u64().unwrap_or(0)),
                micros(x["p999_us"].as_u64().unwrap_or(0)),
                s["doors"][d]["hit"].as_u64().unwrap_or(0),
            );
        }
        let Some(h) = &n.hot else { continue };
        for d in DOORS {
            let keys = h["doors"][d]["keys"].as_array().cloned().unwrap_or_default();
            if keys.is_empty() {
                continue;
            }
            let largest = h["doors"][d]["largest"].as_array().cloned().unwrap_or_default();
            let _ = writeln!(
                f,
                "  {:<44} {:>10}   {:<30} {:>10}",
                format!("HOT KEYS ({d})"),
                "REQUESTS",
                "LARGEST",
                "BYTES"
            );
            for i in 0..hot.min(keys.len().max(largest.len())) {
                let cut = |s: &str, w: usize| {
                    if s.chars().count() > w {
                        format!("{}…", s.chars().take(w - 1).collect::<String>())
                    } else {
                        s.to_string()
                    }
                };
                let (k, r) = keys.get(i).map_or((String::new(), String::new()), |k| {
                    (cut(k["key"].as_str().unwrap_or(""), 44), format!("~{}", k["requests"].as_u64().unwrap_or(0)))
                });
                let (lk, lb) = largest.get(i).map_or((String::new(), String::new()), |l| {
                    (cut(l["key"].as_str().unwrap_or(""), 30), human_bytes(l["bytes"].as_u64().unwrap_or(0)))
                });
                let _ = writeln!(f, "  {k:<44} {r:>10}   {lk:<30} {lb:>10}");
            }
        }
    }
    f
}
