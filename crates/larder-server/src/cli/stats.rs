//! `larder stats`: the server's figures as a table, or its JSON.

use super::client::{answer, call, fail, human_bytes, Target};
use clap::Args;

/// `larder stats`: the server's figures as a table.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Print the JSON as the server sent it.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `larder stats`.
pub fn stats(a: StatsArgs) -> i32 {
    let url = format!("{}/_larder/stats", a.target.url.trim_end_matches('/'));
    let (status, body) = match call(&a.target, "GET", &url) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if status != 200 {
        return answer(status, &body);
    }
    if a.json {
        println!("{}", String::from_utf8_lossy(&body));
        return 0;
    }
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => {
            print!("{}", stats_table(&v));
            0
        }
        Err(e) => fail(format!("the server's stats are not JSON: {e}")),
    }
}

/// The stats as a table of sections, figures right-aligned.
fn stats_table(v: &serde_json::Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let pct = |k: &str| format!("{:.1}%", v[k].as_f64().unwrap_or(0.0) * 100.0);
    let of = |used: u64, cap: u64| {
        let share = if cap == 0 { 0.0 } else { used as f64 * 100.0 / cap as f64 };
        format!("{} of {} ({share:.0}%)", human_bytes(used), human_bytes(cap))
    };
    let r = &v["recovery"];
    let rn = |k: &str| r[k].as_u64().unwrap_or(0);
    let sections: Vec<(&str, Vec<(&str, String)>)> = vec![
        (
            "store",
            vec![
                ("keys", n("keys").to_string()),
                ("disk", of(n("bytes_used"), n("capacity_bytes"))),
                ("volumes", format!("{} of {} (active: {})", n("volumes"), n("volume_count"), n("active_volume"))),
                ("memory tier", of(n("memory_bytes"), n("memory_capacity"))),
                ("memory entries", n("memory_entries").to_string()),
            ],
        ),
        (
            "traffic",
            vec![
                ("hits", format!("{} ({} memory, {} disk)", n("hits"), n("memory_hits"), n("disk_hits"))),
                ("misses", n("misses").to_string()),
                ("hit ratio", format!("{} ({} memory)", pct("hit_ratio"), pct("memory_hit_ratio"))),
                ("puts / deletes", format!("{} / {}", n("puts"), n("deletes"))),
                ("bytes in / out", format!("{} / {}", human_bytes(n("bytes_in")), human_bytes(n("bytes_out")))),
                ("coalesced reads", n("coalesced_reads").to_string()),
            ],
        ),
        (
            "ring",
            vec![
                ("volumes sealed", n("rotations").to_string()),
                ("volumes evicted", n("volumes_evicted").to_string()),
                ("entries evicted", n("evicted_entries").to_string()),
                ("reinserted", format!("{} ({})", n("reinserted"), human_bytes(n("reinserted_bytes")))),
            ],
        ),
        (
            "health",
            vec![
                ("checksum failures", n("corrupt_reads").to_string()),
                (
                    "data directories",
                    v["dirs"]
                        .as_array()
                        .map(|ds| {
                            let state = |d: &serde_json::Value| d["state"].as_str().unwrap_or("?").to_string();
                            let line = |d: &serde_json::Value| {
                                let path = d["path"].as_str().unwrap_or("?");
                                format!("{path} {} ({})", state(d), human_bytes(d["bytes_used"].as_u64().unwrap_or(0)))
                            };
                            ds.iter().map(line).collect::<Vec<_>>().join(", ")
                        })
                        .unwrap_or_default(),
                ),
                (
                    "failures (write/sync/read)",
                    format!("{} / {} / {}", n("write_failures"), n("sync_failures"), n("read_failures")),
                ),
                (
                    "last recovery",
                    format!(
                        "{} ms: {} volumes, {} from hints, {} from the checkpoint, {} scanned",
                        rn("millis"),
                        rn("volumes"),
                        rn("hint_loads"),
                        rn("checkpoint_loads"),
                        rn("scans")
                    ),
                ),
            ],
        ),
    ];
    let width = sections.iter().flat_map(|(_, rows)| rows.iter().map(|(k, _)| k.len())).max().unwrap_or(0);
    let mut out = String::new();
    for (title, rows) in sections {
        out.push_str(title);
        out.push('\n');
        for (k, val) in rows {
            out.push_str(&format!("  {k:<width$}  {val}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_table_reads_the_json() {
        let v = serde_json::json!({"keys": 3, "bytes_used": 2048, "capacity_bytes": 4096, "hits": 5,
            "memory_hits": 2, "disk_hits": 3, "hit_ratio": 0.5, "recovery": {"millis": 7, "checkpoint_loads": 1}});
        let t = stats_table(&v);
        assert!(t.contains("keys") && t.contains("  3\n"), "{t}");
        assert!(t.contains("2.0 KiB of 4.0 KiB (50%)"), "{t}");
        assert!(t.contains("5 (2 memory, 3 disk)"), "{t}");
        assert!(t.contains("50.0%"), "{t}");
        assert!(t.contains("7 ms: 0 volumes, 0 from hints, 1 from the checkpoint"), "{t}");
    }
}
