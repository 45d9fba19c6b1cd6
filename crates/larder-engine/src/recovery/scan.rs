//! The record scanner: walks a volume's records in order, verifying each, resynchronizing
//! past damage, and stopping at the first record of another generation. Recovery replays
//! with it, hint files are built with it, and `larder check` compares with it.

use crate::format::hint::HintEntry;
use crate::format::record::{self, DecodeError, Header, HEADER_LEN, MAX_KEY_LEN};
use crate::io;

const CHUNK: usize = 4 << 20;
/// The window's refill when values are not read: enough for the headers of many small records,
/// without copying the body of a large one.
const SKIM: usize = 64 << 10;

/// One record met by [`scan_volume`].
#[derive(Debug)]
pub enum ScanEvent<'a> {
    /// A record that verified.
    Valid {
        /// Record offset.
        offset: u64,
        /// Its header.
        header: Header,
        /// Its key.
        key: &'a [u8],
    },
    /// A record with a sound header and key but a damaged body, followed by valid records.
    Damaged {
        /// Record offset.
        offset: u64,
        /// Its header.
        header: Header,
        /// Its key.
        key: &'a [u8],
    },
}

impl ScanEvent<'_> {
    /// The record's key.
    pub fn key(&self) -> &[u8] {
        match self {
            ScanEvent::Valid { key, .. } | ScanEvent::Damaged { key, .. } => key,
        }
    }

    /// The record's header.
    pub fn header(&self) -> &Header {
        match self {
            ScanEvent::Valid { header, .. } | ScanEvent::Damaged { header, .. } => header,
        }
    }

    /// The record's offset in the volume.
    pub fn offset(&self) -> u64 {
        match self {
            ScanEvent::Valid { offset, .. } | ScanEvent::Damaged { offset, .. } => *offset,
        }
    }

    /// The record as a hint file describes it (`hash` is its seeded key hash): a put, or a
    /// drop for a tombstone or a damaged record; nothing for a chunk of a large value, which
    /// only its head names. Hint files are made of these, and `larder check` compares hint
    /// files with them.
    pub fn hint_entry(&self, hash: u64) -> Option<HintEntry> {
        if self.header().is_chunk() {
            return None;
        }
        let (offset, header, key, dropped) = match *self {
            ScanEvent::Valid { offset, header, key } => (offset, header, key, header.is_tombstone()),
            ScanEvent::Damaged { offset, header, key } => (offset, header, key, true),
        };
        let len = header.record_len() as u32;
        Some(if dropped {
            HintEntry::Drop { hash, offset, len, key: key.to_vec() }
        } else {
            HintEntry::Put { hash, offset, len, expiry_ms: header.expiry_ms, head: header.is_head() }
        })
    }
}

/// What a scan found.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScanOutcome {
    /// End of the last valid record: where appending may continue.
    pub valid_end: u64,
    /// Damaged records or unreadable stretches skipped between valid records.
    pub skipped: u64,
    /// Valid records seen.
    pub records: u64,
}

/// A window of file bytes, refilled in large chunks as the scan moves forward.
struct Window<'f> {
    file: &'f dyn io::FileIo,
    end: u64,
    refill: usize,
    start: u64,
    buf: Vec<u8>,
}

impl Window<'_> {
    /// The bytes from `pos`, at least `need` of them unless the scan range ends first.
    fn at(&mut self, pos: u64, need: usize) -> std::io::Result<&[u8]> {
        let have_end = self.start + self.buf.len() as u64;
        if pos < self.start || pos + need as u64 > have_end.min(self.end) || pos >= have_end {
            let len = (need.max(self.refill) as u64).min(self.end.saturating_sub(pos)) as usize;
            self.buf.resize(len, 0);
            let n = self.file.read_at_most(&mut self.buf, pos)?;
            self.buf.truncate(n);
            self.start = pos;
        }
        let from = (pos - self.start) as usize;
        Ok(&self.buf[from.min(self.buf.len())..])
    }
}

/// What to scan: records of `generation` (checksums salted with `salt`) from `start` to `end`.
#[derive(Debug, Clone, Copy)]
pub struct ScanRange {
    /// First byte of the first record.
    pub start: u64,
    /// End of the data (file length).
    pub end: u64,
    /// Generation the records must carry.
    pub generation: u32,
    /// The volume's checksum salt.
    pub salt: u32,
    /// Whether the last records may be a torn write (only in the volume being written). A
    /// damaged record at the end of a sealed volume is damage, not a torn write.
    pub torn_tail_possible: bool,
    /// Whether each value is read and its checksum checked. Recovery and `larder check` do. The
    /// hint writer, reading a volume this process wrote and synced, trusts a record whose header
    /// and key verify (`hcrc`) and reads only those: every read of the value checks it anyway,
    /// and copying each sealed volume back through the page cache cost a tenth of a 1 MiB PUT
    /// load's CPU.
    pub values_checked: bool,
}

/// Scans the records of `file` in `range`.
///
/// `on_event` sees valid records in order, and damaged ones in their place: at once in a
/// sealed volume, and in the active volume only once a later valid record shows they are not
/// a torn write (a torn write was never acknowledged, so the value before it stays).
pub fn scan_volume(
    file: &dyn io::FileIo,
    range: ScanRange,
    mut on_event: impl FnMut(ScanEvent<'_>),
) -> std::io::Result<ScanOutcome> {
    let ScanRange { start, end, generation, salt, torn_tail_possible, values_checked } = range;
    let refill = if values_checked { CHUNK } else { SKIM };
    let mut w = Window { file, end, refill, start: 0, buf: Vec::new() };
    let mut out = ScanOutcome { valid_end: start, ..Default::default() };
    let mut pending: Vec<(u64, Header, Vec<u8>)> = Vec::new();
    let mut pending_gaps = 0;
    let mut pos = start;
    while pos + HEADER_LEN as u64 <= end {
        let head = w.at(pos, HEADER_LEN + MAX_KEY_LEN)?;
        match record::decode_header(head, salt) {
            Ok(h) if h.generation != generation => break,
            Ok(h) => {
                let len = h.record_len();
                if pos + len > end {
                    break; // torn tail
                }
                // A chunk of a large value is read and verified by the reads that need it, through
                // its head; nothing here indexes it. Its header is enough to go on, and its body may
                // be a punched hole (the value died): free space, not damage.
                let header_only = h.is_chunk() || !values_checked;
                let key_end = HEADER_LEN + h.key_len as usize;
                let need = if header_only { key_end } else { len as usize };
                let rec = match header_only {
                    true if head.len() >= key_end => Ok(&head[..key_end]),
                    _ => w.at(pos, need),
                }?;
                if rec.len() < need {
                    break; // the file shrank under us (the ring reused the slot)
                }
                let verified = match header_only {
                    true => Ok(&rec[HEADER_LEN..key_end]),
                    false => record::decode(rec, salt).map(|r| r.key),
                };
                match verified {
                    Ok(key) => {
                        for (offset, header, key) in pending.drain(..) {
                            on_event(ScanEvent::Damaged { offset, header, key: &key });
                        }
                        out.skipped += pending_gaps;
                        pending_gaps = 0;
                        on_event(ScanEvent::Valid { offset: pos, header: h, key });
                        out.records += 1;
                        pos += h.padded_len();
                        out.valid_end = pos;
                    }
                    Err(_) => {
                        let key = &rec[HEADER_LEN..HEADER_LEN + h.key_len as usize];
                        if torn_tail_possible {
                            pending.push((pos, h, key.to_vec()));
                            pending_gaps += 1;
                        } else {
                            on_event(ScanEvent::Damaged { offset: pos, header: h, key });
                            out.skipped += 1;
                        }
                        pos += h.padded_len();
                    }
                }
            }
            Err(DecodeError::Short) => break,
            Err(_) => match resync(&mut w, pos + record::ALIGN, end, (generation, salt), values_checked)? {
                Some(next) => {
                    pending_gaps += 1;
                    pos = next;
                }
                None => break,
            },
        }
    }
    if !torn_tail_possible {
        out.skipped += pending_gaps;
    }
    Ok(out)
}

/// The next 8-aligned offset after a damaged stretch where a whole valid record of
/// `generation` starts, if any.
fn resync(
    w: &mut Window<'_>,
    from: u64,
    end: u64,
    (generation, salt): (u32, u32),
    values_checked: bool,
) -> std::io::Result<Option<u64>> {
    let mut p = from;
    while p + HEADER_LEN as u64 <= end {
        let b = w.at(p, HEADER_LEN + MAX_KEY_LEN)?;
        if record::starts_like_record(b) {
            if let Ok(h) = record::decode_header(b, salt) {
                if h.generation == generation && p + h.record_len() <= end {
                    // A salted header is enough where the scan takes one (a chunk's body may be a hole).
                    let len = h.record_len() as usize;
                    if h.is_chunk() || !values_checked || record::decode(w.at(p, len)?, salt).is_ok() {
                        return Ok(Some(p));
                    }
                }
            }
        }
        p += record::ALIGN;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    fn rec(key: &[u8], value: &[u8], generation: u32) -> Vec<u8> {
        let mut b = Vec::new();
        let h =
            Header { flags: 0, key_len: 0, value_len: 0, meta_len: 0, generation, stored_ms: 0, expiry_ms: 0, crc: 0 };
        record::encode_into(&mut b, &h, key, b"", value, SALT);
        b
    }

    const SALT: u32 = 77;

    fn scan_bytes(bytes: &[u8], generation: u32) -> (ScanOutcome, Vec<String>) {
        scan_bytes_as(bytes, generation, true)
    }

    fn scan_bytes_as(bytes: &[u8], generation: u32, torn_tail_possible: bool) -> (ScanOutcome, Vec<String>) {
        scan_bytes_with(bytes, generation, torn_tail_possible, true)
    }

    fn scan_bytes_with(
        bytes: &[u8],
        generation: u32,
        torn_tail_possible: bool,
        values_checked: bool,
    ) -> (ScanOutcome, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let f =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.path().join("v")).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        let mut seen = Vec::new();
        let range =
            ScanRange { start: 0, end: bytes.len() as u64, generation, salt: SALT, torn_tail_possible, values_checked };
        let out = scan_volume(&f, range, |ev| {
            seen.push(match ev {
                ScanEvent::Valid { key, .. } => format!("ok {}", String::from_utf8_lossy(key)),
                ScanEvent::Damaged { key, .. } => format!("bad {}", String::from_utf8_lossy(key)),
            })
        })
        .unwrap();
        (out, seen)
    }

    #[test]
    fn damaged_value_between_valid_records_is_reported_in_place() {
        let (a, mut b, c) = (rec(b"a", b"1111", 1), rec(b"b", b"2222", 1), rec(b"c", b"3333", 1));
        b[HEADER_LEN + 2] ^= 0xff;
        let all = [a.clone(), b.clone(), c.clone()].concat();
        let (out, seen) = scan_bytes(&all, 1);
        assert_eq!(seen, ["ok a", "bad b", "ok c"]);
        assert_eq!((out.valid_end, out.skipped, out.records), (all.len() as u64, 1, 2));
    }

    #[test]
    fn damaged_header_is_skipped_by_resync() {
        let (a, mut b, c) = (rec(b"a", b"1111", 1), rec(b"b", &[5; 300], 1), rec(b"c", b"3333", 1));
        b[14] ^= 0x7f; // key length
        let (out, seen) = scan_bytes(&[a, b, c].concat(), 1);
        assert_eq!(seen, ["ok a", "ok c"]);
        assert_eq!(out.skipped, 1);
    }

    #[test]
    fn torn_or_damaged_tail_is_not_reported_and_ends_valid_data() {
        let (a, b) = (rec(b"a", b"1111", 1), rec(b"b", &[5; 300], 1));
        let mut torn = [a.clone(), b.clone()].concat();
        torn.truncate(a.len() + 100);
        let (out, seen) = scan_bytes(&torn, 1);
        assert_eq!((seen.as_slice(), out.valid_end), (&["ok a".to_string()][..], a.len() as u64));
        let mut bad_tail = [a.clone(), b].concat();
        let at = bad_tail.len() - 20;
        bad_tail[at] ^= 1;
        let (out, seen) = scan_bytes(&bad_tail, 1);
        assert_eq!((seen.len(), out.valid_end, out.skipped), (1, a.len() as u64, 0));
        // In a sealed volume the same damage is damage: its key must be dropped.
        let (out, seen) = scan_bytes_as(&bad_tail, 1, false);
        assert_eq!(seen, ["ok a", "bad b"]);
        assert_eq!(out.skipped, 1);
    }

    #[test]
    fn a_record_hidden_in_a_value_is_never_taken_for_one() {
        // A client stores bytes that form a perfect record of key "victim" (under some other
        // salt): after damage before it, resync must not find it.
        let mut forged = Vec::new();
        let h = Header {
            flags: 0,
            key_len: 0,
            value_len: 0,
            meta_len: 0,
            generation: 1,
            stored_ms: 0,
            expiry_ms: 0,
            crc: 0,
        };
        record::encode_into(&mut forged, &h, b"victim", b"", b"forged", SALT ^ 0xdead);
        let (mut a, c) = (rec(b"8bytekey", &forged, 1), rec(b"c", b"3", 1)); // value 8-aligned
        a[14] ^= 0x7f; // damage a's header: the scan must resync
        let (_, seen) = scan_bytes(&[a, c].concat(), 1);
        assert_eq!(seen, ["ok c"]);
    }

    #[test]
    fn a_scan_by_headers_takes_a_record_whose_key_verifies_and_still_resyncs_past_damaged_headers() {
        // The hint writer's scan: values are not read, so damage in one is the reads' to find.
        let big = vec![7u8; 3 * SKIM + 5];
        let (a, mut b, mut c, d) =
            (rec(b"a", &big, 1), rec(b"b", b"2222", 1), rec(b"c", &[5; 300], 1), rec(b"d", &big, 1));
        b[HEADER_LEN + 2] ^= 0xff; // b's value
        c[14] ^= 0x7f; // c's key length: its header no longer verifies
        let all = [a, b, c, d].concat();
        let (out, seen) = scan_bytes_with(&all, 1, false, false);
        assert_eq!(seen, ["ok a", "ok b", "ok d"]);
        assert_eq!((out.valid_end, out.records, out.skipped), (all.len() as u64, 3, 1));
        let (_, seen) = scan_bytes_with(&all, 1, false, true);
        assert_eq!(seen, ["ok a", "bad b", "ok d"]);
    }

    #[test]
    fn another_generation_ends_the_scan() {
        let all = [rec(b"a", b"1", 2), rec(b"old", b"2", 1), rec(b"c", b"3", 2)].concat();
        let (_, seen) = scan_bytes(&all, 2);
        assert_eq!(seen, ["ok a"]);
    }
}
