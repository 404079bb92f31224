//! The `GetInNetworkPosts` codec: the request is decoded with prost; the answer is encoded
//! straight from the engine's [`LightPost`]s into tonic's response buffer, with no
//! intermediate `Vec` of proto messages and no `encoded_len` pass.
//!
//! The bytes are exactly what prost writes for a `GetInNetworkPostsResponse` (field order,
//! proto3 defaults omitted, `optional` fields present when set), so any client decodes them;
//! `tests` below check that byte for byte against prost.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use thunder_engine::LightPost;
use thunder_proto::GetInNetworkPostsRequest;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

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

/// The codec of the `GetInNetworkPosts` method: decodes the request with prost, encodes a
/// [`PostsAnswer`] and observes its size in `get_in_network_posts_response_bytes`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PostsCodec;

impl Codec for PostsCodec {
    type Encode = PostsAnswer;
    type Decode = GetInNetworkPostsRequest;
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
        crate::admin::metrics::Metrics::global()
            .response_bytes
            .observe(bytes as f64);
        Ok(())
    }
}

impl Decoder for PostsCodec {
    type Item = GetInNetworkPostsRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let len = src.remaining();
        // The message is normally one contiguous chunk: decoding from a plain slice makes
        // each varint's advance a slice step instead of a `BytesMut` offset update (2000
        // follow ids per full request).
        let decoded = if src.chunk().len() == len {
            let decoded = GetInNetworkPostsRequest::decode(src.chunk());
            src.advance(len);
            decoded
        } else {
            GetInNetworkPostsRequest::decode(&mut *src)
        };
        decoded
            .map(Some)
            .map_err(|e| Status::internal(format!("request does not decode: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::post_to_proto;
    use thunder_proto::GetInNetworkPostsResponse;

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
