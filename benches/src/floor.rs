//! The serving floor: thunder's gRPC serving path with no store behind it.
//!
//! [`Floor`] answers `GetInNetworkPosts` calls through the server's own transport, layers and
//! response codec ([`thunder_server::lifecycle::start_with`], [`thunder_server::serve::codec`]), but
//! with answers built once at start: each is the store's real answer to a request frame
//! (as `thunder-cli frame` writes it), kept as posts and encoded again on every call. What a
//! call costs there is what tonic, h2 and the codec alone cost to send that answer; thunder's
//! CPU per answer divided by the floor's is the server's distance to it
//! (`scripts/serve-bench.sh --floor`).
//!
//! A call gets the answer of the frame whose request has as many followed ids and the same
//! first followed id (the full, small and empty frames all differ there); any other call gets
//! an empty answer.

use std::future::Future;

use anyhow::Context;
use prost::Message;
use thunder_engine::PostStore;
use thunder_proto::GetInNetworkPostsRequest;
use thunder_server::ServiceError;
use thunder_server::serve::codec::{DecodedRequest, PostsAnswer};
use thunder_server::serve::grpc::AnswerPosts;
use thunder_server::serve::request::ValidatedRequest;
use thunder_server::serve::service::Answer;

/// The shape a call is matched by: the number of followed ids and the first one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    following: usize,
    first: Option<u64>,
}

impl Shape {
    fn of(request: &GetInNetworkPostsRequest) -> Self {
        Self {
            following: request.following_user_ids.len(),
            first: request.following_user_ids.first().copied(),
        }
    }
}

/// Pre-built answers, served by shape with no store (see the module docs).
#[derive(Debug, Default)]
pub struct Floor {
    answers: Vec<(Shape, PostsAnswer)>,
    empty: PostsAnswer,
}

impl Floor {
    /// The store's answers to `requests` (validated and run as the server runs them, with no
    /// deadline). The store is not kept.
    pub fn build(
        store: &PostStore,
        requests: &[GetInNetworkPostsRequest],
    ) -> Result<Self, ServiceError> {
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            let validated = ValidatedRequest::from_request(request)?;
            let outcome = validated.execute(store);
            let next_cursor = validated.next_cursor(&outcome);
            let answer = PostsAnswer {
                posts: outcome.posts,
                next_cursor,
            };
            answers.push((Shape::of(request), answer));
        }
        Ok(Self {
            answers,
            empty: PostsAnswer::default(),
        })
    }

    /// The answer a call with `request` gets.
    pub fn answer_to(&self, request: &GetInNetworkPostsRequest) -> &PostsAnswer {
        let shape = Shape::of(request);
        self.answers
            .iter()
            .find(|(s, _)| *s == shape)
            .map_or(&self.empty, |(_, answer)| answer)
    }

    /// Each pre-built answer's posts and encoded bytes, in build order.
    pub fn sizes(&self) -> Vec<(usize, usize)> {
        self.answers
            .iter()
            .map(|(_, a)| (a.posts.len(), a.encoded_len()))
            .collect()
    }
}

impl AnswerPosts for Floor {
    /// A copy of the pre-built answer (the codec takes its answer by value and encodes it).
    fn answer(
        &self,
        request: tonic::Request<DecodedRequest>,
    ) -> impl Future<Output = Result<Answer, ServiceError>> + Send {
        let answer = self.answer_to(&request.get_ref().message).clone();
        std::future::ready(Ok(Answer {
            posts: answer,
            level: 0,
        }))
    }
}

/// The request in a gRPC length-prefixed message: 1 byte "not compressed", a 4-byte
/// big-endian length, the protobuf bytes (what `thunder-cli frame` writes).
pub fn parse_frame(frame: &[u8]) -> anyhow::Result<GetInNetworkPostsRequest> {
    let (header, message) = frame
        .split_at_checked(5)
        .context("frame shorter than its 5-byte header")?;
    anyhow::ensure!(header[0] == 0, "compressed frames are not supported");
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    anyhow::ensure!(
        usize::try_from(len).ok() == Some(message.len()),
        "frame says {len} message bytes, holds {}",
        message.len()
    );
    GetInNetworkPostsRequest::decode(message).context("frame's message does not decode")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_of(request: &GetInNetworkPostsRequest) -> Vec<u8> {
        let message = request.encode_to_vec();
        let mut frame = vec![0];
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(&message);
        frame
    }

    #[test]
    fn parses_frames_and_refuses_bad_ones() {
        let request = GetInNetworkPostsRequest {
            user_id: 7,
            following_user_ids: vec![1, 2, 3],
            ..Default::default()
        };
        let frame = frame_of(&request);
        assert_eq!(parse_frame(&frame).expect("parses"), request);
        assert!(parse_frame(&frame[..3]).is_err(), "short header");
        assert!(
            parse_frame(&frame[..frame.len() - 1]).is_err(),
            "short body"
        );
        let mut compressed = frame.clone();
        compressed[0] = 1;
        assert!(parse_frame(&compressed).is_err(), "compressed");
        let mut garbage = frame;
        garbage.truncate(5);
        garbage.extend_from_slice(&[0xff; 4]);
        garbage[4] = 4;
        assert!(parse_frame(&garbage).is_err(), "undecodable message");
    }
}
