//! Identifiers: bundle hashes (XXH64, Crockford Base32), other XXH64 digests, thread ids
//! (ULID) and log tags.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Crockford's Base32 alphabet: no I, L, O or U, so ids survive being read aloud or retyped.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Encodes the low `chars * 5` bits of `value`, most significant first.
fn crockford(value: u128, chars: usize) -> String {
    (0..chars).rev().map(|i| CROCKFORD[((value >> (i * 5)) & 31) as usize] as char).collect()
}

/// Decodes Crockford Base32, accepting lower case and the usual aliases (O→0, I/L→1).
fn decode_crockford(text: &str) -> Option<u128> {
    text.chars().try_fold(0u128, |acc, c| {
        let c = match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        };
        let digit = CROCKFORD.iter().position(|&d| d as char == c)?;
        Some((acc << 5) | digit as u128)
    })
}

/// A bundle's id: XXH64 (seed 0) of its bytes, as 13 Crockford Base32 characters.
///
/// 13 characters hold 65 bits, so the first character is always `0`–`F`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleHash(u64);

impl BundleHash {
    /// Length of the textual form.
    pub const LEN: usize = 13;

    /// Hashes bundle bytes.
    pub fn of(bytes: &[u8]) -> Self {
        BundleHash(twox_hash::XxHash64::oneshot(0, bytes))
    }

    /// The raw XXH64 value.
    pub fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for BundleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crockford(self.0 as u128, Self::LEN))
    }
}

impl FromStr for BundleHash {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::InvalidId {
            kind: "bundle hash",
            id: s.to_string(),
            expected: "13 Crockford Base32 characters, e.g. `C9NMV6V2TQT81`",
        };
        if s.len() != Self::LEN {
            return Err(bad());
        }
        let value = decode_crockford(s).ok_or_else(bad)?;
        let hash = u64::try_from(value).map(BundleHash).map_err(|_| bad())?;
        // Strict: only the text `Display` writes (in either case), not Crockford's aliases.
        if hash.to_string() != s.to_ascii_uppercase() {
            return Err(bad());
        }
        Ok(hash)
    }
}

/// An XXH64 digest of anything that is not a bundle (an agent request, an engine's
/// configuration), written like a bundle hash: 13 Crockford Base32 characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(u64);

impl Digest {
    /// XXH64 (seed 0) of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(twox_hash::XxHash64::oneshot(0, bytes))
    }

    /// Wraps a 64-bit value already computed by an XXH64 hasher.
    pub fn from_value(value: u64) -> Self {
        Digest(value)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crockford(self.0 as u128, BundleHash::LEN))
    }
}

/// A thread id as a person may give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdText {
    /// All of it.
    Whole(ThreadId),
    /// Its first characters (upper case).
    Prefix(String),
}

/// A thread's id: a ULID (26 Crockford Base32 characters, time-ordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId(ulid::Ulid);

impl ThreadId {
    /// A fresh id for a thread starting now.
    pub fn new() -> Self {
        ThreadId(ulid::Ulid::new())
    }

    /// Milliseconds since the Unix epoch at which the thread was created.
    pub fn timestamp_ms(self) -> u64 {
        self.0.timestamp_ms()
    }

    /// The id's 128 bits (a thread's trace id is these: see `telemetry`).
    pub fn to_u128(self) -> u128 {
        self.0.0
    }
}

impl Default for ThreadId {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadId {
    /// The fewest characters a prefix naming a thread may have.
    pub const MIN_PREFIX: usize = 4;

    /// What `text` names: a whole id, or the start of one (upper case); neither is an error.
    pub fn named(text: &str) -> Result<IdText, Error> {
        if let Ok(id) = text.parse() {
            return Ok(IdText::Whole(id));
        }
        let prefix = text.to_ascii_uppercase();
        let can_start = (Self::MIN_PREFIX..26).contains(&prefix.len())
            && prefix.starts_with(|c: char| ('0'..='7').contains(&c))
            && prefix.bytes().all(|b| CROCKFORD.contains(&b));
        if !can_start {
            return Err(Error::InvalidId {
                kind: "thread id",
                id: text.to_string(),
                expected: "a ULID (26 Crockford Base32 characters starting with 0-7, e.g. \
                           `01KQXKW18CT8G75T53R8F4G7YG`), or its first 4 or more",
            });
        }
        Ok(IdText::Prefix(prefix))
    }

    /// The id's text, written into `buf` (listings write 100,000 of them).
    pub fn encode<'a>(&self, buf: &'a mut [u8; 26]) -> &'a str {
        self.0.array_to_str(buf)
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.encode(&mut [0; 26]))
    }
}

impl FromStr for ThreadId {
    type Err = Error;

    /// Parses strictly: exactly the text [`Display`](fmt::Display) writes (upper or lower
    /// case). A ULID holds 128 bits in 130, so its first character is `0`–`7`; a text that
    /// would overflow, or that uses Crockford's aliases, names no thread and is refused
    /// rather than read as some other id. (The `ulid` decoder knows no aliases, so with the
    /// first character checked its answer is exact, and parsing allocates nothing: listings
    /// parse 100,000 ids.)
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::InvalidId {
            kind: "thread id",
            id: s.to_string(),
            expected: "a ULID: 26 Crockford Base32 characters starting with 0-7, e.g. \
                       `01KQXKW18CT8G75T53R8F4G7YG`",
        };
        if s.len() != 26 || !s.starts_with(|c: char| ('0'..='7').contains(&c)) {
            return Err(bad());
        }
        ulid::Ulid::from_string(s).map(ThreadId).map_err(|_| bad())
    }
}

/// Ids are written as their text in every record and message (JSON, YAML), and as their
/// number in binary formats (the listing index, postcard): reading 100,000 ids back from
/// text would cost more than the rest of the listing.
macro_rules! serde_as_text {
    ($($ty:ty: $raw:ty => $to_raw:expr, $from_raw:expr;)*) => {$(
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.collect_str(self)
                } else {
                    let to_raw: fn(&$ty) -> $raw = $to_raw;
                    serde::Serialize::serialize(&to_raw(self), s)
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if d.is_human_readable() {
                    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                    text.parse().map_err(serde::de::Error::custom)
                } else {
                    let from_raw: fn($raw) -> $ty = $from_raw;
                    Ok(from_raw(<$raw>::deserialize(d)?))
                }
            }
        }
    )*};
}

serde_as_text! {
    BundleHash: u64 => |hash| hash.0, BundleHash;
    ThreadId: u128 => |id| id.0.0, |raw| ThreadId(ulid::Ulid(raw));
}

/// Log tags: 8 Crockford Base32 characters (40 random bits) fixed at each call site, so that
/// `grep TAG` over the source finds the code that wrote a log line.
pub mod tag {
    /// Is `text` a well-formed tag?
    pub fn is_valid(text: &str) -> bool {
        text.len() == 8 && super::decode_crockford(text).is_some()
    }
}

/// Names people give things (workflows, schedules) become registry keys, folder names and CLI
/// arguments: 1-64 characters from `A-Z a-z 0-9 - _ .`, not starting with `-` or `.`.
pub fn validate_name(kind: &'static str, name: &str) -> crate::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(crate::Error::InvalidId {
            kind,
            id: name.to_string(),
            expected: "1-64 characters from A-Z a-z 0-9 - _ . not starting with - or .",
        })
    }
}

/// `bytes` random bytes from the operating system, as hex: secrets (API tokens, the web page's
/// CSRF token) and ids no one may guess.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // /dev/urandom is there on every system this runs on; if it were not, ULIDs' random bits
    // (from the same source, through `rand`) still make a value no one guesses.
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .is_err()
    {
        for chunk in buf.chunks_mut(16) {
            let random = ulid::Ulid::new().random().to_le_bytes();
            chunk.copy_from_slice(&random[..chunk.len()]);
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_hash_known_vectors() {
        // XXH64 (seed 0) reference values from the xxHash test suite.
        assert_eq!(BundleHash::of(b"").value(), 0xEF46DB3751D8E999);
        assert_eq!(BundleHash::of(b"a").value(), 0xD24EC4F1A98C6E5B);
        assert_eq!(BundleHash::of(b"abc").value(), 0x44BC2CF5AD770999);
        // 0xEF46DB3751D8E999 in 5-bit groups, most significant first (computed independently).
        assert_eq!(BundleHash::of(b"").to_string(), "EYHPV6X8XHTCS");
        assert_eq!(BundleHash(0).to_string(), "0000000000000");
        assert_eq!(BundleHash(u64::MAX).to_string(), "FZZZZZZZZZZZZ");
        assert_eq!(BundleHash(1).to_string(), "0000000000001");
        assert_eq!(BundleHash(32).to_string(), "0000000000010");
    }

    #[test]
    fn bundle_hash_round_trips_and_rejects_garbage() {
        for bytes in [&b""[..], b"a", b"abc", b"\0asm"] {
            let hash = BundleHash::of(bytes);
            let text = hash.to_string();
            assert_eq!(text.len(), 13);
            assert_eq!(text.parse::<BundleHash>().unwrap(), hash);
            assert_eq!(text.to_lowercase().parse::<BundleHash>().unwrap(), hash);
        }
        assert!("".parse::<BundleHash>().is_err());
        assert!("EX3DPDX8V3MC".parse::<BundleHash>().is_err(), "12 chars");
        assert!("EX3DPDX8V3MCUU".parse::<BundleHash>().is_err(), "14 chars");
        assert!("EX3DPDX8V3MCU".parse::<BundleHash>().is_err(), "U is not Crockford");
        assert!("ZZZZZZZZZZZZZ".parse::<BundleHash>().is_err(), "65 bits");
    }

    #[test]
    fn thread_ids_are_ulids() {
        let id = ThreadId::new();
        let text = id.to_string();
        assert_eq!(text.len(), 26);
        assert_eq!(text.parse::<ThreadId>().unwrap(), id);
        assert_eq!(
            "01KQXKW18CT8G75T53R8F4G7YG".parse::<ThreadId>().unwrap().to_string(),
            "01KQXKW18CT8G75T53R8F4G7YG"
        );
        assert!("01KQXKW18CT8G75T53R8F4G7Y".parse::<ThreadId>().is_err());
        assert!("not-a-thread-id-at-all-xxx".parse::<ThreadId>().is_err());
        // ULID time prefix: 01ARZ3NDEK is 1469922850259 ms (decoded independently).
        let t: ThreadId = "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
        assert_eq!(t.timestamp_ms(), 1469922850259);
    }

    #[test]
    fn tags() {
        assert!(tag::is_valid("4KNMR2PX"));
        assert!(!tag::is_valid("4KNMR2P"));
        assert!(!tag::is_valid("4KNMR2PU"));
    }
}
