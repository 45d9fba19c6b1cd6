//! Numbers as memcached reads them: with the C library's `strtoull` and `strtoll`, quirks
//! included (a `-` taken by the unsigned reader, values kept to their low 32 bits), so that
//! a client sees the answers memcached would give it.

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strtoull(s, &end, 10)`: the value (negated modulo 2^64 after a `-`), the index of
/// `end`, and whether it overflowed (`ERANGE`).
fn strtoull(s: &[u8]) -> (u64, usize, bool) {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits = i;
    let (mut v, mut over) = (0u64, false);
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        match v.checked_mul(10).and_then(|v| v.checked_add((d - b'0') as u64)) {
            Some(n) => v = n,
            None => over = true,
        }
        i += 1;
    }
    if i == digits {
        return (0, 0, false); // no digits: nothing consumed
    }
    if over {
        return (u64::MAX, i, true);
    }
    (if neg { v.wrapping_neg() } else { v }, i, false)
}

/// C's `strtoll(s, &end, 10)`, as [`strtoull`].
fn strtoll(s: &[u8]) -> (i64, usize, bool) {
    let (mut i, mut neg) = (0, false);
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    if let Some(&c @ (b'-' | b'+')) = s.get(i) {
        neg = c == b'-';
        i += 1;
    }
    let digits = i;
    let (mut v, mut over) = (0i128, false);
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        v = v * 10 + (d - b'0') as i128;
        over |= v > i64::MAX as i128 + 1;
        i += 1;
    }
    if i == digits {
        return (0, 0, false);
    }
    let v = if neg { -v } else { v };
    match i64::try_from(v) {
        Ok(n) if !over => (n, i, false),
        _ => (if neg { i64::MIN } else { i64::MAX }, i, true),
    }
}

/// The end test of memcached's `safe_strto*`: something was read, and what follows is a space
/// or the end.
fn ends_well(s: &[u8], end: usize) -> bool {
    end != 0 && s.get(end).is_none_or(|&b| is_c_space(b))
}

/// memcached's `safe_strtoull`: a 64-bit unsigned number; a `-` anywhere in the word is
/// refused only when the value reads as negative signed.
pub fn safe_strtoull(s: &[u8]) -> Option<u64> {
    let (v, end, over) = strtoull(s);
    if over || !ends_well(s, end) || ((v as i64) < 0 && s.contains(&b'-')) {
        return None;
    }
    Some(v)
}

/// memcached's `safe_strtoul`: as [`safe_strtoull`], kept to its low 32 bits.
pub fn safe_strtoul(s: &[u8]) -> Option<u32> {
    safe_strtoull(s).map(|v| v as u32)
}

/// memcached's `safe_strtol`: a signed number, kept to its low 32 bits (sign-extended).
pub fn safe_strtol(s: &[u8]) -> Option<i64> {
    let (v, end, over) = strtoll(s);
    (!over && ends_well(s, end)).then_some(v as i32 as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_the_c_library_reads_them() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b"+7"), Some(7));
        assert_eq!(safe_strtoull(b"7x"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"12\r\n"), Some(12));
        assert_eq!(safe_strtoul(b"4294967296"), Some(0));
        assert_eq!(safe_strtol(b"-5"), Some(-5));
        assert_eq!(safe_strtol(b"4294967297"), Some(1));
        assert_eq!(safe_strtol(b"99999999999999999999"), None);
    }
}
