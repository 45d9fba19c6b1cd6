//! `larder check`: a store's data directories verified offline, with a progress bar on a
//! terminal.

use super::client::{fail, human_bytes};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use larder_engine::check::{self, CheckProgress, CheckReport};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `larder check DATA_DIR...`: verify a store's data directories offline.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The data directories, all of one store (the server must be stopped).
    #[arg(required = true)]
    pub data_dir: Vec<PathBuf>,
    /// No progress bar even on a terminal.
    #[arg(long)]
    pub quiet: bool,
}

/// `larder check`.
pub fn check(a: CheckArgs) -> i32 {
    let progress = CheckProgress::default();
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} checking [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        b
    });
    let report = std::thread::scope(|s| {
        let worker = s.spawn(|| check::check_dirs(&a.data_dir, &progress));
        while !worker.is_finished() {
            if let Some(b) = &bar {
                b.set_length(progress.bytes_total.load(Ordering::Relaxed));
                b.set_position(progress.bytes_done.load(Ordering::Relaxed));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        worker.join().expect("the check panicked")
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match report {
        Ok(r) => {
            print!("{}", check_summary(&r));
            if r.clean() {
                0
            } else {
                1
            }
        }
        Err(e) => fail(e),
    }
}

fn check_summary(r: &CheckReport) -> String {
    let mut out = format!(
        "{} volumes, {} records, {} checked; {} hint files compared, {} sealed volumes without one\n",
        r.volumes,
        r.records,
        human_bytes(r.bytes),
        r.hints_checked,
        r.unhinted
    );
    if r.dictionaries > 0 {
        out.push_str(&format!("{} compression dictionaries, sound\n", r.dictionaries));
    }
    if r.coded_records > 0 {
        out.push_str(&format!("{} coded (compressed) records decoded and checked\n", r.coded_records));
    }
    let line = |kind: &str, f: &check::Finding| match f.offset {
        Some(o) => format!("{kind}: {} at offset {o}: {}\n", f.file.display(), f.what),
        None => format!("{kind}: {}: {}\n", f.file.display(), f.what),
    };
    for f in &r.corrupt {
        out.push_str(&line("CORRUPT", f));
    }
    for f in &r.hint_mismatches {
        out.push_str(&line("hint mismatch", f));
    }
    if let Some(t) = &r.torn_tail {
        out.push_str(&line("torn tail (a write cut short; the next start truncates it)", t));
    }
    for f in &r.notes {
        out.push_str(&line("note", f));
    }
    out.push_str(if r.clean() {
        "clean: every record verified\n"
    } else {
        "DAMAGED: recovery skips these records; their keys read as misses\n"
    });
    out
}
