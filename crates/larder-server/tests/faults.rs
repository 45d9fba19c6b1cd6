//! The server under injected I/O faults (through `/_larder/faults`, which test builds have)
//! and on a real full file system (a small tmpfs, when running as root).

mod common;
use common::{bytes, Server};
use std::path::Path;
use std::process::Command;

fn body(r: &common::Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[test]
fn write_faults_answer_507_or_500_keep_old_values_and_clear_without_a_restart() {
    let s = Server::start(&["--fsync", "never"]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"old").status, 200);

    s.fault(Some("write nospace"));
    let r = c.put("/k", b"new");
    assert_eq!(r.status, 507, "{}", body(&r));
    assert!(body(&r).contains("No space left on device"), "{}", body(&r));
    assert_eq!(c.put("/fresh", b"x").status, 507);
    assert_eq!(c.delete("/k").status, 507);
    let g = c.get("/k");
    assert_eq!((g.status, g.body.as_slice()), (200, &b"old"[..]), "reads go on during the fault");
    assert_eq!(c.get("/fresh").status, 404);

    s.fault(None);
    s.fault(Some("write eio"));
    let r = c.put("/k", b"new");
    assert_eq!(r.status, 500, "{}", body(&r));
    assert!(body(&r).contains("Input/output error"), "{}", body(&r));

    s.fault(None);
    assert_eq!(c.put("/k", b"new").status, 200, "writes resume once the fault clears");
    assert_eq!(c.get("/k").body, b"new");
    assert!(s.stats()["write_failures"].as_u64().unwrap() >= 4);
}

#[test]
fn an_unreadable_data_directory_answers_503_not_404() {
    let s = Server::start(&["--memory-capacity", "0"]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"value").status, 200);
    s.fault(Some("read eio file=vol-"));
    for method in ["GET", "HEAD"] {
        let r = c.request(method, "/k", &[], b"");
        assert_eq!(r.status, 503, "{method} with a failing device");
    }
    assert_eq!(c.get("/absent").status, 404, "a key the index does not know is still a plain miss");
    s.fault(None);
    assert_eq!(c.get("/k").body, b"value");
}

#[test]
fn a_failed_fsync_fails_the_put_and_the_old_value_stays() {
    let s = Server::start(&["--fsync", "always"]);
    let mut c = s.client();
    assert_eq!(c.put("/k", b"durable").status, 200);
    s.fault(Some("sync eio"));
    let r = c.put("/k", b"not durable");
    assert_eq!(r.status, 500, "{}", body(&r));
    assert!(body(&r).contains("fdatasync failed"), "{}", body(&r));
    assert_eq!(c.delete("/k").status, 500);
    assert_eq!(c.get("/k").body, b"durable");
    s.fault(None);
    assert_eq!(c.put("/k", b"durable again").status, 200);
    assert_eq!(c.get("/k").body, b"durable again");
}

#[test]
fn bad_fault_specs_are_400() {
    let s = Server::start(&[]);
    let r = s.client().request("POST", "/_larder/faults", &[], b"write sometimes");
    assert_eq!(r.status, 400);
    assert!(body(&r).contains("expected nospace"), "{}", body(&r));
}

struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Mounts a tmpfs of `size` at `at`; `None` (with the reason) where that is not allowed.
fn mount_tmpfs(at: &Path, size: &str) -> Option<Mount> {
    if !is_root() {
        println!("not root: the real disk-full test falls back to the injected ENOSPC path");
        return None;
    }
    let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(at).output();
    match out {
        Ok(o) if o.status.success() => Some(Mount(at.to_path_buf())),
        Ok(o) => panic!("mount -t tmpfs failed as root: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("cannot run mount: {e}"),
    }
}

/// Fills the server until PUTs get 507; returns the keys stored before that.
fn fill_until_full(s: &Server, prefix: &str, value: &[u8]) -> Vec<String> {
    let mut c = s.client();
    let mut stored = Vec::new();
    for i in 0..10_000 {
        let key = format!("/{prefix}{i}");
        let r = c.put(&key, value);
        match r.status {
            200 => stored.push(key),
            507 => return stored,
            other => panic!("PUT {key}: {other} {}", body(&r)),
        }
    }
    panic!("never ran out of space");
}

#[test]
fn a_full_disk_answers_507_and_writes_resume_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let value = bytes(7, 60_000);
    let Some(_mount) = mount_tmpfs(tmp.path(), "4m") else {
        // Without root: the same walk through the injected fault.
        let s = Server::start(&["--fsync", "never"]);
        assert_eq!(s.client().put("/before", &value).status, 200);
        s.fault(Some("write nospace"));
        assert_eq!(s.client().put("/after", &value).status, 507);
        assert_eq!(s.client().get("/before").body, value);
        s.fault(None);
        assert_eq!(s.client().put("/after", &value).status, 200);
        return;
    };
    // Something else takes 1.5 MiB of the 4 MiB; larder's ring (8 × 512 KiB) would fit alone.
    let hog = tmp.path().join("hog");
    std::fs::write(&hog, vec![1u8; 1536 << 10]).unwrap();
    let dir = tmp.path().join("data");
    let s = Server::start_in(&dir, &["--volume-size", "512KiB", "--volume-count", "8", "--fsync", "never"]);
    let stored = fill_until_full(&s, "a", &value);
    println!("tmpfs full after {} PUTs of {} bytes", stored.len(), value.len());
    assert!(stored.len() >= 20, "only {} PUTs fitted", stored.len());
    let mut c = s.client();
    for key in &stored {
        let r = c.get(key);
        assert_eq!((r.status, r.body == value), (200, true), "{key} after the disk filled");
    }
    assert_eq!(c.put("/again", &value).status, 507, "still full");
    // Space comes back: writes resume without a restart, and the ring turns (each turn
    // empties its oldest volume) for many times the file system's size.
    std::fs::remove_file(&hog).unwrap();
    let mut last = String::new();
    for i in 0..250 {
        last = format!("/b{i}");
        let r = c.put(&last, &value);
        assert_eq!(r.status, 200, "PUT {last} after space returned: {}", body(&r));
    }
    assert_eq!(c.get(&last).body, value);
    let st = s.stats();
    assert!(st["rotations"].as_u64().unwrap() >= 16, "the ring turned {} times", st["rotations"]);
    assert!(st["bytes_used"].as_u64().unwrap() <= 4 << 20);
}

#[test]
fn a_ring_larger_than_the_disk_turns_early_instead_of_failing() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(_mount) = mount_tmpfs(tmp.path(), "3m") else { return };
    // Once the ring has wrapped, a full device makes it turn early: emptying its oldest
    // volume makes the room (with nothing older to free, it is a plain 507, as above).
    let dir = tmp.path().join("data");
    let s = Server::start_in(&dir, &["--volume-size", "512KiB", "--volume-count", "4", "--fsync", "never"]);
    let value = bytes(3, 60_000);
    let mut c = s.client();
    // The ring (2 MiB) fits; fill it through a turn, then take the free space from under it.
    for i in 0..60 {
        assert_eq!(c.put(&format!("/w{i}"), &value).status, 200);
    }
    let hog = tmp.path().join("hog");
    let free = fs_free(tmp.path());
    std::fs::write(&hog, vec![1u8; free.saturating_sub(100 << 10) as usize]).unwrap();
    for i in 0..60 {
        let r = c.put(&format!("/x{i}"), &value);
        assert_eq!(r.status, 200, "PUT /x{i} with the device full and older volumes to free: {}", body(&r));
    }
    assert_eq!(c.get("/x59").body, value);
}

fn fs_free(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs writes into the struct we pass; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut st), 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }
}
