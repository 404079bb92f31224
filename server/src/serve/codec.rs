//! The `GetInNetworkPosts` codec: the request's two id lists are decoded straight into
//! buffers of their exact length (its other fields by prost); the answer is encoded straight
//! from the engine's [`LightPost`]s into tonic's response buffer, with no intermediate `Vec`
//! of proto messages and no `encoded_len` pass.
//!
//! The request decodes to what prost's `GetInNetworkPostsRequest::decode` gives, and is
//! refused exactly when prost refuses it (with prost's error); the answer's bytes are exactly
//! what prost writes for a `GetInNetworkPostsResponse` (field order, proto3 defaults omitted,
//! `optional` fields present when set), so any client decodes them. `tests` below check both
//! against prost.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint};
use thunder_engine::LightPost;
use thunder_proto::GetInNetworkPostsRequest;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Longest encoded `LightPost` message: eight int64 fields of at most 1 + 10 bytes and three
/// bools of 2 bytes. Below 128, so a post's length prefix is always one byte.
const MAX_POST_BYTES: usize = 8 * 11 + 3 * 2;
const _: () = assert!(MAX_POST_BYTES < 128);
/// A post's bytes as written: tag, one-byte length, fields.
const FRAME_BYTES: usize = 2 + MAX_POST_BYTES;
type Frame = [u8; FRAME_BYTES];

/// A `GetInNetworkPostsResponse` to encode: the store's posts, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostsAnswer {
    /// The posts, in answer order.
    pub posts: Vec<LightPost>,
    /// `next_cursor` (field 2); empty is not written (proto3 default).
    pub next_cursor: Vec<u8>,
}

/// `next_cursor`'s tag: field 2, length-delimited.
const NEXT_CURSOR_TAG: u8 = (2 << 3) | 2;

/// Bytes of a varint.
fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

impl PostsAnswer {
    /// Encoded size in bytes (what prost's `encoded_len` of the response would say).
    pub fn encoded_len(&self) -> usize {
        let mut frame = [0u8; FRAME_BYTES];
        let posts: usize = self
            .posts
            .iter()
            .map(|post| encode_post(post, &mut frame))
            .sum();
        posts + self.next_cursor_len()
    }

    fn next_cursor_len(&self) -> usize {
        match self.next_cursor.len() {
            0 => 0,
            n => 1 + varint_len(n as u64) + n,
        }
    }

    /// Appends the encoded response to `dst`; returns the bytes written.
    pub fn encode_to(&self, dst: &mut impl BufMut) -> usize {
        let mut frame = [0u8; FRAME_BYTES];
        let mut total = 0;
        for post in &self.posts {
            let len = encode_post(post, &mut frame);
            dst.put_slice(&frame[..len]);
            total += len;
        }
        if !self.next_cursor.is_empty() {
            dst.put_u8(NEXT_CURSOR_TAG);
            let mut n = self.next_cursor.len() as u64;
            while n >= 0x80 {
                dst.put_u8((n as u8) | 0x80);
                n >>= 7;
            }
            dst.put_u8(n as u8);
            dst.put_slice(&self.next_cursor);
            total += self.next_cursor_len();
        }
        total
    }
}

/// Writes `value` as a varint at `buf[at..]`; returns the new end.
#[inline(always)]
fn put_varint(buf: &mut Frame, mut at: usize, mut value: u64) -> usize {
    while value >= 0x80 {
        buf[at] = (value as u8) | 0x80;
        value >>= 7;
        at += 1;
    }
    buf[at] = value as u8;
    at + 1
}

/// Encodes one post as a field-1 entry of the response (tag, length, fields) into `buf`;
/// returns the bytes written.
#[inline]
fn encode_post(post: &LightPost, buf: &mut Frame) -> usize {
    let mut at = 2;
    let int64 = |buf: &mut Frame, at: &mut usize, field: u8, v: i64| {
        buf[*at] = field << 3;
        *at = put_varint(buf, *at + 1, v as u64);
    };
    for (field, value) in [(1, post.post_id), (2, post.author_id), (3, post.created_at)] {
        if value != 0 {
            int64(buf, &mut at, field, value);
        }
    }
    for (field, value) in [(4, post.in_reply_to_post_id), (5, post.in_reply_to_user_id)] {
        if let Some(v) = value {
            int64(buf, &mut at, field, v);
        }
    }
    for (field, value) in [(6u8, post.is_retweet), (7, post.is_reply)] {
        if value {
            buf[at] = field << 3;
            buf[at + 1] = 1;
            at += 2;
        }
    }
    for (field, value) in [(8, post.source_post_id), (9, post.source_user_id)] {
        if let Some(v) = value {
            int64(buf, &mut at, field, v);
        }
    }
    if post.has_video {
        buf[at] = 10 << 3;
        buf[at + 1] = 1;
        at += 2;
    }
    if let Some(v) = post.conversation_id {
        int64(buf, &mut at, 11, v);
    }
    buf[0] = (1 << 3) | 2; // field 1, length-delimited
    buf[1] = (at - 2) as u8; // at most MAX_POST_BYTES < 128: one varint byte
    at
}

/// The codec of the `GetInNetworkPosts` method: decodes the request ([`decode_request`]),
/// encodes a [`PostsAnswer`] and observes its size in `get_in_network_posts_response_bytes`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostsCodec;

impl Codec for PostsCodec {
    type Encode = PostsAnswer;
    type Decode = DecodedRequest;
    type Encoder = PostsCodec;
    type Decoder = PostsCodec;

    fn encoder(&mut self) -> Self::Encoder {
        PostsCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        PostsCodec
    }
}

impl Encoder for PostsCodec {
    type Item = PostsAnswer;
    type Error = Status;

    fn encode(&mut self, item: PostsAnswer, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.posts.len() * FRAME_BYTES);
        let bytes = item.encode_to(dst);
        crate::serve::metrics::ServeMetrics::global()
            .response_bytes
            .observe(bytes as f64);
        Ok(())
    }
}

impl Decoder for PostsCodec {
    type Item = DecodedRequest;
    type Error = Status;

    /// A call's request buffer starts at [`REQUEST_BUFFER_BYTES`].
    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(REQUEST_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
    }

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let len = src.remaining();
        // The message is normally one contiguous chunk; otherwise it is gathered first.
        let decoded = if src.chunk().len() == len {
            let decoded = decode_request(src.chunk());
            src.advance(len);
            decoded
        } else {
            decode_request(&src.copy_to_bytes(len))
        };
        decoded
            .map(|message| {
                Some(DecodedRequest {
                    message,
                    encoded_bytes: len,
                })
            })
            .map_err(|e| Status::internal(format!("request does not decode: {e}")))
    }
}

/// A decoded request and its size on the wire (for `get_in_network_posts_request_bytes`,
/// without an `encoded_len` pass over its ids).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedRequest {
    /// The request.
    pub message: GetInNetworkPostsRequest,
    /// Its protobuf-encoded size in bytes.
    pub encoded_bytes: usize,
}

impl DecodedRequest {
    /// `message` with its encoded size (for requests that did not come through the codec).
    pub fn new(message: GetInNetworkPostsRequest) -> Self {
        Self {
            encoded_bytes: message.encoded_len(),
            message,
        }
    }
}

/// The request buffer tonic allocates for each call. 2000 follow ids of full-size snowflake ids
/// (nine-byte varints) make an 18 KB request; tonic reserves room for the whole message beside
/// the first 16 KiB frame it already holds, so from its 8 KiB default (or 32 KiB) the buffer is
/// grown and the frame copied (17k to 33k instructions of the ~650k such a call costs). 64 KiB
/// holds any request up to 48 KiB as it arrives.
const REQUEST_BUFFER_BYTES: usize = 64 * 1024;
/// tonic's default (it only matters to streaming calls).
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// `following_user_ids`' and `exclude_tweet_ids`' field numbers.
const FOLLOWING_FIELD: u32 = 2;
const EXCLUDE_FIELD: u32 = 4;

/// Decodes `bytes` as prost's `GetInNetworkPostsRequest::decode` does, but reads the packed id
/// lists (2000 follow ids in a full request) into vectors reserved to their exact length with
/// a word-at-a-time varint decoder, where prost pushes one id at a time through a generic
/// `Buf` (growing the vector ten times). Every other field goes through prost's own
/// `merge_field`. A message the fast path does not read to its end is decoded again by prost,
/// whose answer (an error, for any message prost refuses) is returned.
pub fn decode_request(bytes: &[u8]) -> Result<GetInNetworkPostsRequest, prost::DecodeError> {
    let mut message = GetInNetworkPostsRequest::default();
    match merge_request(&mut message, bytes) {
        Some(()) => Ok(message),
        None => GetInNetworkPostsRequest::decode(bytes),
    }
}

/// Merges `bytes` into `message` field by field (prost's `Message::merge` loop); `None` at
/// the first thing that does not decode.
fn merge_request(message: &mut GetInNetworkPostsRequest, mut bytes: &[u8]) -> Option<()> {
    let ctx = DecodeContext::default();
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes).ok()?;
        let ids = match (tag, wire_type) {
            (FOLLOWING_FIELD, WireType::LengthDelimited) => &mut message.following_user_ids,
            (EXCLUDE_FIELD, WireType::LengthDelimited) => &mut message.exclude_tweet_ids,
            // Everything else, an unpacked id included, is prost's.
            _ => {
                message
                    .merge_field(tag, wire_type, &mut bytes, ctx.clone())
                    .ok()?;
                continue;
            }
        };
        let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
        let packed = bytes.get(..len)?;
        decode_packed(packed, ids)?;
        bytes = &bytes[len..];
    }
    Some(())
}

/// Continuation bits of eight varint bytes read as a little-endian word.
const CONTINUES: u64 = 0x8080_8080_8080_8080;

/// Appends the varints of `packed` (a packed repeated `uint64` field's payload) to `ids`;
/// `None` if one is malformed (runs past `packed`, or is longer than ten bytes, or has a tenth
/// byte above 1: what prost refuses).
fn decode_packed(packed: &[u8], ids: &mut Vec<u64>) -> Option<()> {
    let start = ids.len();
    let count = count_varints(packed);
    ids.reserve_exact(count);
    // Written by index into the reserved slots: no zero fill first (16 KB for 2000 ids), no
    // length or capacity update per id.
    let slots = ids.spare_capacity_mut().get_mut(..count)?;
    let mut n = 0;
    let mut rest = packed;
    // With sixteen bytes left, a varint's ten bytes at most are in the two words read.
    while let Some(bytes) = rest.first_chunk::<16>() {
        let words = u128::from_le_bytes(*bytes);
        let (value, len) = varint_of_words(words as u64, (words >> 64) as u64)?;
        slots.get_mut(n)?.write(value);
        n += 1;
        rest = &rest[len..];
    }
    while !rest.is_empty() {
        let (value, len) = varint_of_bytes(rest)?;
        slots.get_mut(n)?.write(value);
        n += 1;
        rest = &rest[len..];
    }
    if n != count {
        return None;
    }
    // SAFETY: the `count` spare slots just past `start` were reserved and each of them written
    // above (`n == count`).
    unsafe { ids.set_len(start + count) };
    Some(())
}

/// Varints in `bytes`: every varint ends at a byte whose continuation bit is clear.
fn count_varints(bytes: &[u8]) -> usize {
    let (words, tail) = bytes.as_chunks::<8>();
    // A word's end markers as one bit per byte, summed by a multiplication into the top byte
    // (no population count instruction in the baseline x86-64).
    let ends = |word: u64| {
        let ones = (!word & CONTINUES) >> 7;
        (ones.wrapping_mul(0x0101_0101_0101_0101) >> 56) as usize
    };
    words
        .iter()
        .map(|w| ends(u64::from_le_bytes(*w)))
        .sum::<usize>()
        + tail.iter().filter(|&&b| b < 0x80).count()
}

/// The varint starting at the first byte of `low` (the next eight bytes after it in `high`,
/// both little-endian) and its length.
#[inline(always)]
fn varint_of_words(low: u64, high: u64) -> Option<(u64, usize)> {
    let ends = !low & CONTINUES;
    if ends != 0 {
        // Up to eight bytes: the bits below the first end marker's, continuation bits cleared.
        let len = (ends.trailing_zeros() / 8 + 1) as usize;
        let mine = low & (ends ^ (ends - 1)) & !CONTINUES;
        return Some((gather_7_bit_groups(mine), len));
    }
    let value = gather_7_bit_groups(low & !CONTINUES);
    let (ninth, tenth) = (high & 0xff, (high >> 8) & 0xff);
    if ninth < 0x80 {
        Some((value | (ninth << 56), 9))
    } else if tenth < 2 {
        Some((value | ((ninth & 0x7f) << 56) | (tenth << 63), 10))
    } else {
        None
    }
}

/// The eight 7-bit groups of `x` (one per byte, top bits clear) packed into its low 56 bits.
#[inline(always)]
fn gather_7_bit_groups(x: u64) -> u64 {
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

/// The varint at the start of `bytes` and its length, a byte at a time.
fn varint_of_bytes(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        if i == 9 && b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_events::wire::post_to_proto;
    use thunder_proto::{GetInNetworkPostsResponse, PerAuthorLimits, SeenFilter};

    /// xorshift64*: a repeatable stream of test values.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// An id whose varint is 1 to 10 bytes long, each length as likely.
        fn id(&mut self) -> u64 {
            let bits = 7 * (1 + self.below(10)) as u32;
            self.next() >> (64 - bits.min(64))
        }

        fn ids(&mut self, most: u64) -> Vec<u64> {
            let n = self.below(most + 1);
            (0..n).map(|_| self.id()).collect()
        }
    }

    /// A request with every field drawn at random (empty or absent often).
    fn random_request(rng: &mut Rng) -> GetInNetworkPostsRequest {
        let mut coin = || rng.below(2) == 0;
        let (a, b, c, d) = (coin(), coin(), coin(), coin());
        GetInNetworkPostsRequest {
            user_id: rng.id(),
            following_user_ids: rng.ids(40),
            max_results: rng.next() as u32 >> rng.below(32),
            exclude_tweet_ids: if a { rng.ids(20) } else { Vec::new() },
            algorithm: if b { "recent".into() } else { String::new() },
            debug: c,
            is_video_request: d,
            per_author_limits: (rng.below(2) == 0).then(|| PerAuthorLimits {
                max_posts_per_author: Some(rng.below(100) as u32),
                max_replies_reposts_per_author: None,
            }),
            seen_filter: (rng.below(3) == 0).then(|| SeenFilter {
                format: 1,
                seed: rng.next(),
                num_blocks: 1,
                bits: vec![rng.next() as u8; 32],
            }),
            cursor: vec![7; rng.below(3) as usize],
            min_created_at: (rng.below(2) == 0).then(|| rng.next() as i64),
            max_created_at: None,
        }
    }

    /// `decode_request` gives prost's answer: the same message, or an error where prost errs.
    fn assert_decodes_like_prost(bytes: &[u8]) {
        let ours = decode_request(bytes);
        let theirs = GetInNetworkPostsRequest::decode(bytes);
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{bytes:02x?}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{bytes:02x?}"),
            _ => panic!("ours {ours:?}, prost's {theirs:?} for {bytes:02x?}"),
        }
    }

    #[test]
    fn requests_decode_like_prost() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..3000 {
            let request = random_request(&mut rng);
            let bytes = request.encode_to_vec();
            assert_eq!(decode_request(&bytes).as_ref(), Ok(&request));
            assert_decodes_like_prost(&bytes);
            // Damaged copies: cut short, a byte changed, a byte dropped.
            if !bytes.is_empty() {
                let at = rng.below(bytes.len() as u64) as usize;
                assert_decodes_like_prost(&bytes[..at]);
                let mut changed = bytes.clone();
                changed[at] ^= 1 << rng.below(8);
                assert_decodes_like_prost(&changed);
                let mut dropped = bytes.clone();
                dropped.remove(at);
                assert_decodes_like_prost(&dropped);
            }
        }
    }

    #[test]
    fn id_lists_in_every_encoding_decode_like_prost() {
        let key = |field: u8, wire: u8| (field << 3) | wire;
        let packed = |field: u8, payload: &[u8]| {
            let mut bytes = vec![key(field, 2), payload.len() as u8];
            bytes.extend_from_slice(payload);
            bytes
        };
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let cases: Vec<Vec<u8>> = vec![
            // u64::MAX: ten bytes, the tenth 1; a tenth byte of 2 or an eleventh is refused.
            packed(2, &max),
            packed(
                2,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            ),
            packed(
                2,
                &[
                    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
                ],
            ),
            // The same read two words at a time (sixteen bytes or more left).
            packed(2, &[[0xff; 9].as_slice(), &[0x02], &[0x01; 8]].concat()),
            packed(2, &[[0x80; 10].as_slice(), &[0x00], &[0x01; 8]].concat()),
            packed(2, &[[0xff; 9].as_slice(), &[0x01], &[0x01; 8]].concat()),
            // Nine bytes; over-long zeros; a varint running past the payload.
            packed(
                2,
                &[0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x09, 0x05],
            ),
            packed(4, &[0x80, 0x00, 0x80, 0x80, 0x00, 0x01]),
            [packed(2, &[0x05, 0x81]), vec![0x01]].concat(),
            // Payload longer than the message.
            vec![key(2, 2), 0x05, 0x01, 0x02],
            // Unpacked ids, packed ones and the field twice: appended in order.
            [
                vec![key(2, 0), 0x2a],
                packed(2, &[0x01, 0x02]),
                vec![key(2, 0), 0x03],
            ]
            .concat(),
            [
                packed(4, &[0x07]),
                packed(2, &[0x08]),
                packed(4, &[0x09, 0x0a]),
            ]
            .concat(),
            // Wrong wire type (fixed64) for the list.
            vec![key(2, 1), 1, 2, 3, 4, 5, 6, 7, 8],
            // An empty list; an unknown field before it.
            packed(2, &[]),
            [vec![key(15, 0), 0x01], packed(2, &[0x01])].concat(),
        ];
        for bytes in cases {
            assert_decodes_like_prost(&bytes);
        }
        let decoded = decode_request(&packed(2, &max)).expect("decodes");
        assert_eq!(decoded.following_user_ids, [u64::MAX]);
        // Lengths 1 to 10 at every offset of the eight-byte word and in the slow tail.
        let mut rng = Rng(7);
        for _ in 0..2000 {
            let ids = rng.ids(12);
            let request = GetInNetworkPostsRequest {
                following_user_ids: ids.clone(),
                ..Default::default()
            };
            let decoded = decode_request(&request.encode_to_vec()).expect("decodes");
            assert_eq!(decoded.following_user_ids, ids);
            assert_eq!(decoded.following_user_ids.capacity(), ids.len());
        }
    }

    fn prost_bytes(posts: &[LightPost], next_cursor: &[u8]) -> Vec<u8> {
        GetInNetworkPostsResponse {
            posts: posts.iter().map(post_to_proto).collect(),
            next_cursor: next_cursor.to_vec(),
        }
        .encode_to_vec()
    }

    #[test]
    fn encodes_exactly_like_prost() {
        let extreme = LightPost {
            post_id: i64::MIN,
            author_id: -1,
            created_at: i64::MAX,
            in_reply_to_post_id: Some(0),
            in_reply_to_user_id: Some(-5),
            is_retweet: true,
            is_reply: true,
            source_post_id: Some(i64::MIN),
            source_user_id: Some(1),
            has_video: true,
            conversation_id: Some(i64::MAX),
        };
        let posts = [
            LightPost::original(1, 2, 3),
            LightPost::default(),
            extreme,
            LightPost {
                in_reply_to_post_id: Some(77),
                is_reply: true,
                conversation_id: Some(70),
                ..LightPost::original(1_900_000_000_000_000_000, 12345, 1_700_000_000)
            },
        ];
        // No cursor, a short one, and one whose length needs a two-byte varint.
        let cursors = [Vec::new(), vec![7u8; 58], vec![0xA5u8; 300]];
        for n in 0..=posts.len() {
            for cursor in &cursors {
                let answer = PostsAnswer {
                    posts: posts[..n].to_vec(),
                    next_cursor: cursor.clone(),
                };
                let mut ours = Vec::new();
                let written = answer.encode_to(&mut ours);
                let expected = prost_bytes(&posts[..n], cursor);
                assert_eq!(
                    ours,
                    expected,
                    "first {n} posts, cursor of {}",
                    cursor.len()
                );
                assert_eq!(answer.encoded_len(), expected.len());
                assert_eq!(written, expected.len());
                let decoded = GetInNetworkPostsResponse::decode(ours.as_slice()).expect("decodes");
                assert_eq!(decoded.posts.len(), n);
                assert_eq!(&decoded.next_cursor, cursor);
            }
        }
    }
}
