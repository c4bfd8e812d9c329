//! Encryption of etcd snapshots at rest (issue 36): AES-256-GCM through `ring`, in segments,
//! so a snapshot is encrypted and decrypted as it streams, never whole in memory.
//!
//! The format (a STREAM construction, as age and Tink's streaming AEAD use):
//!
//! ```text
//! MAGIC (35 bytes) | nonce prefix (7 random bytes) | segment 0 | segment 1 | ... | last segment
//! ```
//!
//! Each segment is [`SEGMENT`] bytes of the snapshot (the last one fewer, possibly none)
//! sealed with the key, its 16-byte tag appended. The nonce of segment `i` is the prefix,
//! `i` as 4 bytes big-endian, and one byte that is 1 for the last segment and 0 before:
//! segments cannot be reordered, dropped or the stream cut at a segment boundary without
//! the tag failing. The header (magic and prefix) is the associated data of every segment.
//!
//! The key is 32 bytes, held in a Secret as the 32 raw bytes, as base64 of them (`openssl
//! rand -base64 32`) or as 64 hex digits; it never leaves the Secret, a log or an error.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// What an encrypted snapshot starts with.
pub const MAGIC: &[u8] = b"ichor-etcd-snapshot aes-256-gcm v1\n";

/// Plaintext bytes per segment.
pub const SEGMENT: usize = 64 * 1024;

const PREFIX: usize = 7;
const TAG: usize = 16;
const HEADER: usize = MAGIC.len() + PREFIX;

/// A snapshot key. `Debug` shows nothing of it.
pub struct Key(LessSafeKey);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// Why a key or an encrypted snapshot is not usable (never quoting the key).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CryptError {
    #[error(
        "the encryption key is {len} bytes; it must be 32 bytes, as the raw bytes, base64 of them (`openssl rand -base64 32`) or 64 hex digits"
    )]
    KeyLength { len: usize },
    #[error("no random bytes for the nonce")]
    Random,
    #[error(
        "the object is not an encrypted snapshot of this format (its header is not `ichor-etcd-snapshot aes-256-gcm v1`)"
    )]
    NotEncrypted,
    #[error(
        "segment {segment} of the encrypted snapshot does not decrypt: a wrong key, or the object was altered, cut or reordered"
    )]
    Open { segment: u32 },
    #[error("the encrypted snapshot is cut short (it ends inside its header or a segment's tag)")]
    Truncated,
    #[error("the snapshot is too long to encrypt in this format")]
    TooLong,
}

impl Key {
    /// The key a Secret's value holds: 32 raw bytes, base64 of 32 bytes, or 64 hex digits.
    pub fn from_secret(value: &[u8]) -> Result<Key, CryptError> {
        let bytes = decode(value);
        if bytes.len() != 32 {
            return Err(CryptError::KeyLength { len: bytes.len() });
        }
        let unbound =
            UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| CryptError::KeyLength { len: 0 })?;
        Ok(Key(LessSafeKey::new(unbound)))
    }
}

fn decode(value: &[u8]) -> Vec<u8> {
    use base64::Engine;
    if value.len() == 32 {
        return value.to_vec();
    }
    let text = String::from_utf8_lossy(value);
    let text = text.trim();
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return (0..32)
            .filter_map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
    }
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|_| value.to_vec())
}

fn nonce(prefix: &[u8; PREFIX], counter: u32, last: bool) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..PREFIX].copy_from_slice(prefix);
    n[PREFIX..PREFIX + 4].copy_from_slice(&counter.to_be_bytes());
    n[NONCE_LEN - 1] = u8::from(last);
    Nonce::assume_unique_for_key(n)
}

/// Encrypts a snapshot pushed through it in pieces of any size.
pub struct Sealer<'k> {
    key: &'k Key,
    header: [u8; HEADER],
    prefix: [u8; PREFIX],
    counter: u32,
    started: bool,
    /// Plaintext not sealed yet (at most one segment).
    pending: Vec<u8>,
}

impl<'k> Sealer<'k> {
    pub fn new(key: &'k Key) -> Result<Sealer<'k>, CryptError> {
        let mut prefix = [0u8; PREFIX];
        SystemRandom::new()
            .fill(&mut prefix)
            .map_err(|_| CryptError::Random)?;
        let mut header = [0u8; HEADER];
        header[..MAGIC.len()].copy_from_slice(MAGIC);
        header[MAGIC.len()..].copy_from_slice(&prefix);
        Ok(Sealer {
            key,
            header,
            prefix,
            counter: 0,
            started: false,
            pending: Vec::with_capacity(SEGMENT),
        })
    }

    /// Seals what is pending (one segment at most) onto `out`, in place there.
    fn seal(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), CryptError> {
        let n = nonce(&self.prefix, self.counter, last);
        let start = out.len();
        out.extend_from_slice(&self.pending);
        self.pending.clear();
        let tag = self
            .key
            .0
            .seal_in_place_separate_tag(n, Aad::from(&self.header[..]), &mut out[start..])
            .map_err(|_| CryptError::TooLong)?;
        out.extend_from_slice(tag.as_ref());
        self.counter = self.counter.checked_add(1).ok_or(CryptError::TooLong)?;
        Ok(())
    }

    /// Appends to `out` the ciphertext `plain` completes (a segment is sealed only once
    /// more follows it, so the last one is known as such). Holds at most one segment.
    pub fn push(&mut self, mut plain: &[u8], out: &mut Vec<u8>) -> Result<(), CryptError> {
        if !self.started {
            out.extend_from_slice(&self.header);
            self.started = true;
        }
        while !plain.is_empty() {
            if self.pending.len() == SEGMENT {
                self.seal(false, out)?;
            }
            let take = (SEGMENT - self.pending.len()).min(plain.len());
            self.pending.extend_from_slice(&plain[..take]);
            plain = &plain[take..];
        }
        Ok(())
    }

    /// Appends the last segment.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), CryptError> {
        self.push(&[], out)?;
        self.seal(true, out)
    }
}

/// Decrypts an encrypted snapshot pushed through it in pieces of any size.
pub struct Opener<'k> {
    key: &'k Key,
    header: Vec<u8>,
    counter: u32,
    /// Ciphertext not opened yet.
    pending: Vec<u8>,
}

impl<'k> Opener<'k> {
    pub fn new(key: &'k Key) -> Opener<'k> {
        Opener {
            key,
            header: Vec::with_capacity(HEADER),
            counter: 0,
            pending: Vec::with_capacity(SEGMENT + TAG),
        }
    }

    /// Opens what is pending (one sealed segment at most) onto `out`.
    fn open(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), CryptError> {
        let mut prefix = [0u8; PREFIX];
        prefix.copy_from_slice(&self.header[MAGIC.len()..]);
        let n = nonce(&prefix, self.counter, last);
        let plain = self
            .key
            .0
            .open_in_place(n, Aad::from(&self.header[..]), &mut self.pending)
            .map_err(|_| CryptError::Open {
                segment: self.counter,
            })?;
        out.extend_from_slice(plain);
        self.pending.clear();
        self.counter = self.counter.checked_add(1).ok_or(CryptError::TooLong)?;
        Ok(())
    }

    /// Appends to `out` the plaintext of the segments `cipher` completes (one is opened only
    /// once more follows it). Holds at most one sealed segment.
    pub fn push(&mut self, mut cipher: &[u8], out: &mut Vec<u8>) -> Result<(), CryptError> {
        if self.header.len() < HEADER {
            let take = (HEADER - self.header.len()).min(cipher.len());
            self.header.extend_from_slice(&cipher[..take]);
            cipher = &cipher[take..];
            let seen = self.header.len().min(MAGIC.len());
            if self.header[..seen] != MAGIC[..seen] {
                return Err(CryptError::NotEncrypted);
            }
        }
        while !cipher.is_empty() {
            if self.pending.len() == SEGMENT + TAG {
                self.open(false, out)?;
            }
            let take = (SEGMENT + TAG - self.pending.len()).min(cipher.len());
            self.pending.extend_from_slice(&cipher[..take]);
            cipher = &cipher[take..];
        }
        Ok(())
    }

    /// Opens the last segment.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<(), CryptError> {
        if self.header.len() < HEADER || self.pending.len() < TAG {
            return Err(CryptError::Truncated);
        }
        self.open(true, out)
    }
}

/// Whether `start` (an object's first bytes) is the start of an encrypted snapshot.
pub fn is_encrypted(start: &[u8]) -> bool {
    let n = start.len().min(MAGIC.len());
    n > 0 && start[..n] == MAGIC[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_secret(b"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=").unwrap()
    }

    fn seal(plain: &[u8], piece: usize) -> Vec<u8> {
        let k = key();
        let mut s = Sealer::new(&k).unwrap();
        let mut out = Vec::new();
        for p in plain.chunks(piece.max(1)) {
            s.push(p, &mut out).unwrap();
        }
        s.finish(&mut out).unwrap();
        out
    }

    fn open(cipher: &[u8], piece: usize) -> Result<Vec<u8>, CryptError> {
        let k = key();
        let mut o = Opener::new(&k);
        let mut out = Vec::new();
        for p in cipher.chunks(piece.max(1)) {
            o.push(p, &mut out)?;
        }
        o.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn round_trips_in_pieces_of_any_size_and_sizes_at_segment_edges() {
        for len in [
            0,
            1,
            SEGMENT - 1,
            SEGMENT,
            SEGMENT + 1,
            3 * SEGMENT,
            200_000,
        ] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            for piece in [1000, SEGMENT, 8 * 1024 * 1024] {
                let c = seal(&plain, piece);
                let segments = len.div_ceil(SEGMENT).max(1);
                assert_eq!(c.len(), HEADER + len + TAG * segments, "{len}/{piece}");
                assert!(is_encrypted(&c));
                assert_eq!(open(&c, 777).unwrap(), plain, "{len}/{piece}");
            }
        }
    }

    #[test]
    fn a_wrong_key_an_altered_or_cut_stream_fails() {
        let plain = vec![7u8; 3 * SEGMENT + 10];
        let c = seal(&plain, 4096);
        let other = Key::from_secret(&[9u8; 32]).unwrap();
        let mut o = Opener::new(&other);
        let mut out = Vec::new();
        let r = o.push(&c, &mut out).and_then(|_| o.finish(&mut out));
        assert_eq!(r, Err(CryptError::Open { segment: 0 }));
        let mut altered = c.clone();
        altered[HEADER + SEGMENT + 40] ^= 1;
        assert_eq!(open(&altered, 5000), Err(CryptError::Open { segment: 1 }));
        // Cut at a segment boundary: the new end is not sealed as the last one.
        let cut = &c[..HEADER + 2 * (SEGMENT + TAG)];
        assert_eq!(open(cut, 5000), Err(CryptError::Open { segment: 1 }));
        assert_eq!(open(&c[..10], 5000), Err(CryptError::Truncated));
        assert_eq!(
            open(b"not encrypted at all", 5),
            Err(CryptError::NotEncrypted)
        );
    }

    #[test]
    fn keys_come_raw_base64_or_hex_and_are_never_shown() {
        assert!(Key::from_secret(&[1u8; 32]).is_ok());
        assert!(Key::from_secret(&[b'a'; 64]).is_ok());
        assert!(Key::from_secret(b" MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n").is_ok());
        let err = Key::from_secret(b"hunter2").unwrap_err();
        assert!(err.to_string().contains("must be 32 bytes"), "{err}");
        assert!(!err.to_string().contains("hunter2"));
        assert_eq!(format!("{:?}", key()), "Key(<redacted>)");
    }
}
