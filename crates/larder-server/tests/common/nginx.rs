//! Debian's nginx in the foreground for a test, its every file in one directory: the tests
//! give the `server` blocks (an origin serving files, a `proxy_cache` in front of larder).
//! scripts/install-bench-deps.sh installs nginx (the test command runs it); without it the
//! test fails.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

/// A running nginx, killed when dropped.
pub struct Nginx {
    child: Child,
    pub port: u16,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx with `servers` (its `server` blocks, which listen on `port`) inside an `http` block
/// that keeps every file nginx writes in `dir`.
pub fn start(dir: &Path, port: u16, servers: &str) -> Nginx {
    let conf = format!(
        r#"daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp;
  proxy_temp_path {d}/tmp;
  fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp;
  scgi_temp_path {d}/tmp;
{servers}
}}
"#,
        d = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let bin = std::env::var("NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into());
    let child = Command::new(&bin)
        .args(["-p", dir.to_str().unwrap(), "-c", dir.join("nginx.conf").to_str().unwrap(), "-e"])
        .arg(dir.join("error.log"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin} ({e}); scripts/install-bench-deps.sh installs nginx"));
    let n = Nginx { child, port };
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(n);
    panic!("nginx did not start: {}", std::fs::read_to_string(dir.join("error.log")).unwrap_or_default());
}
