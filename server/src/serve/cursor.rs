//! Page cursors: the opaque `cursor` / `next_cursor` bytes of the contract.
//!
//! A cursor says where the next page starts: the clock the first page was answered at
//! (`as_of_secs`; later pages read nothing created after it, so posts that arrive meanwhile
//! shift nothing) and the position of the last post returned. On the wire it is 58 bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | version, [`CURSOR_VERSION`] |
//! | 1 | flags: bit 0 = a position follows (clear: restart from the top of the window) |
//! | 2..10 | `as_of_secs`, i64 little-endian |
//! | 10..18 | position `created_at`, i64 little-endian |
//! | 18..26 | position `post_id`, i64 little-endian |
//! | 26..58 | HMAC-SHA256 of bytes 0..26 under the server's cursor secret |
//!
//! The MAC makes every altered, truncated or forged cursor detectable: the server answers it
//! with INVALID_ARGUMENT. Replicas behind one address must share the secret
//! (`--cursor-secret`); without one, a fixed built-in secret is used, which still catches
//! corruption and misuse but not a deliberate forgery by someone who reads this source.

use std::sync::OnceLock;

use ring::hmac;
use thunder_engine::PagePosition;

/// Version byte of the cursors this build writes and reads.
pub const CURSOR_VERSION: u8 = 1;

/// Encoded length of a cursor.
pub const CURSOR_BYTES: usize = PAYLOAD_BYTES + MAC_BYTES;

const PAYLOAD_BYTES: usize = 26;
const MAC_BYTES: usize = 32;
const FLAG_POSITION: u8 = 1;

/// The secret used when none is configured.
const BUILT_IN_SECRET: &[u8] = b"thunder.v1 page cursor (built-in secret; set --cursor-secret)";

/// Where a page starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The store clock the first page was answered at (unix seconds): later pages read no
    /// post created after it.
    pub as_of_secs: i64,
    /// Continue strictly after this post; `None` restarts from the newest post.
    pub after: Option<PagePosition>,
}

/// Why a cursor was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    /// Not the length of any cursor.
    #[error("{0} bytes, expected {CURSOR_BYTES}: pass next_cursor back unchanged")]
    Length(usize),
    /// A version this build does not read.
    #[error("version {0} is not supported (this server reads version {CURSOR_VERSION})")]
    Version(u8),
    /// The MAC does not match: altered, forged, or issued under another secret.
    #[error(
        "failed authentication: it was altered, forged, or issued by a server with \
         another --cursor-secret"
    )]
    Forged,
    /// Authenticated, but with flags this version does not define.
    #[error("unknown flags {0:#04x}")]
    Flags(u8),
}

/// The key cursors are signed with.
pub struct CursorKey(hmac::Key);

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

static GLOBAL_KEY: OnceLock<CursorKey> = OnceLock::new();

impl CursorKey {
    /// A key derived from `secret` (any length).
    pub fn from_secret(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The process's key: the one [`CursorKey::install`]ed at start-up, else the built-in one.
    pub fn global() -> &'static CursorKey {
        GLOBAL_KEY.get_or_init(|| Self::from_secret(BUILT_IN_SECRET))
    }

    /// Makes `secret` the process's key. Must run before the first request; false if a key
    /// was already in use.
    pub fn install(secret: &[u8]) -> bool {
        GLOBAL_KEY.set(Self::from_secret(secret)).is_ok()
    }

    /// The wire bytes of `cursor`.
    pub fn seal(&self, cursor: &Cursor) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(CURSOR_BYTES);
        bytes.push(CURSOR_VERSION);
        let position = cursor.after.unwrap_or(PagePosition {
            created_at: 0,
            post_id: 0,
        });
        bytes.push(if cursor.after.is_some() {
            FLAG_POSITION
        } else {
            0
        });
        bytes.extend_from_slice(&cursor.as_of_secs.to_le_bytes());
        bytes.extend_from_slice(&position.created_at.to_le_bytes());
        bytes.extend_from_slice(&position.post_id.to_le_bytes());
        let tag = hmac::sign(&self.0, &bytes);
        bytes.extend_from_slice(tag.as_ref());
        bytes
    }

    /// Reads and authenticates wire bytes.
    pub fn open(&self, bytes: &[u8]) -> Result<Cursor, CursorError> {
        if bytes.len() != CURSOR_BYTES {
            return Err(CursorError::Length(bytes.len()));
        }
        let (payload, tag) = bytes.split_at(PAYLOAD_BYTES);
        if payload[0] != CURSOR_VERSION {
            return Err(CursorError::Version(payload[0]));
        }
        hmac::verify(&self.0, payload, tag).map_err(|_| CursorError::Forged)?;
        let flags = payload[1];
        if flags & !FLAG_POSITION != 0 {
            return Err(CursorError::Flags(flags));
        }
        let word = |at: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&payload[at..at + 8]);
            i64::from_le_bytes(le)
        };
        Ok(Cursor {
            as_of_secs: word(2),
            after: (flags & FLAG_POSITION != 0).then(|| PagePosition {
                created_at: word(10),
                post_id: word(18),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor() -> Cursor {
        Cursor {
            as_of_secs: 1_700_000_000,
            after: Some(PagePosition {
                created_at: 1_699_999_000,
                post_id: -5,
            }),
        }
    }

    #[test]
    fn round_trips() {
        let key = CursorKey::from_secret(b"s");
        for c in [
            cursor(),
            Cursor {
                as_of_secs: i64::MIN,
                after: None,
            },
        ] {
            let bytes = key.seal(&c);
            assert_eq!(bytes.len(), CURSOR_BYTES);
            assert_eq!(key.open(&bytes), Ok(c));
        }
    }

    #[test]
    fn every_altered_byte_is_detected() {
        let key = CursorKey::from_secret(b"s");
        let bytes = key.seal(&cursor());
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut altered = bytes.clone();
                altered[i] ^= bit;
                let err = key.open(&altered).expect_err("altered cursor accepted");
                if i == 0 {
                    assert!(matches!(err, CursorError::Version(_)));
                } else {
                    assert_eq!(err, CursorError::Forged);
                }
            }
        }
    }

    #[test]
    fn wrong_length_other_secret_and_unknown_flags_are_refused() {
        let key = CursorKey::from_secret(b"s");
        let bytes = key.seal(&cursor());
        assert_eq!(key.open(&bytes[..10]), Err(CursorError::Length(10)));
        assert_eq!(key.open(&[]), Err(CursorError::Length(0)));
        assert_eq!(
            CursorKey::from_secret(b"other").open(&bytes),
            Err(CursorError::Forged)
        );
        // A correctly signed payload with an undefined flag.
        let mut payload = bytes[..PAYLOAD_BYTES].to_vec();
        payload[1] = 0x03;
        let tag = hmac::sign(&key.0, &payload);
        payload.extend_from_slice(tag.as_ref());
        assert_eq!(key.open(&payload), Err(CursorError::Flags(0x03)));
        assert!(
            CursorError::Length(3)
                .to_string()
                .contains("pass next_cursor back unchanged")
        );
    }
}
