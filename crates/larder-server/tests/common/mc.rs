//! A memcached client over a plain socket, for tests that control every byte: text lines
//! and binary requests.

use super::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A memcached connection, text or binary.
pub struct Mc(pub TcpStream);

impl Mc {
    pub fn connect(s: &Server) -> Mc {
        let t = TcpStream::connect(s.memcache.expect("memcached address")).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Mc(t)
    }

    /// Sends `bytes` and reads until the answers end with `end`.
    pub fn ask(&mut self, bytes: &[u8], end: &str) -> String {
        String::from_utf8(self.ask_bytes(bytes, end)).expect("text answers")
    }

    pub fn ask_bytes(&mut self, bytes: &[u8], end: &str) -> Vec<u8> {
        self.0.write_all(bytes).unwrap();
        self.read_bytes_until(end)
    }

    pub fn read_until(&mut self, end: &str) -> String {
        String::from_utf8(self.read_bytes_until(end)).expect("text answers")
    }

    pub fn read_bytes_until(&mut self, end: &str) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while !got.ends_with(end.as_bytes()) {
            let n = self.0.read(&mut buf).unwrap_or_else(|e| panic!("{e}; so far {:?}", String::from_utf8_lossy(&got)));
            assert!(n > 0, "closed; so far {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    pub fn closed(&mut self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends one binary request and reads its answer: (status, value).
    pub fn binary(&mut self, opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> (u16, Vec<u8>) {
        self.0.write_all(&binary_request(opcode, key, extras, value)).unwrap();
        let mut head = [0u8; 24];
        self.0.read_exact(&mut head).unwrap();
        assert_eq!(head[0], 0x81, "a response");
        let status = u16::from_be_bytes([head[6], head[7]]);
        let body_len = u32::from_be_bytes(head[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; body_len];
        self.0.read_exact(&mut body).unwrap();
        let skip = head[4] as usize + u16::from_be_bytes([head[2], head[3]]) as usize;
        (status, body[skip..].to_vec())
    }
}

pub fn binary_request(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.push(extras.len() as u8);
    p.extend_from_slice(&[0, 0, 0]);
    p.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    p.extend_from_slice(&[0; 12]);
    p.extend_from_slice(extras);
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}
