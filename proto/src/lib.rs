//! thunder-proto: the `thunder.v1` gRPC contract of the in-network post store and the Kafka
//! event envelope, generated with tonic/prost from `proto/thunder/v1/in_network.proto`.
//!
//! Everything is re-exported at the crate root: the messages
//! ([`GetInNetworkPostsRequest`], [`LightPost`], [`InNetworkEvent`], …), the
//! [`in_network_posts_service_server`] / [`in_network_posts_service_client`] modules and the
//! [`in_network_event`] oneof module.
//!
//! With the `serde` feature every message and enum also implements `serde::Serialize` and
//! `serde::Deserialize` in the proto3 JSON mapping, as grpcurl prints it: field names in
//! lowerCamelCase (the original names are accepted too), 64-bit integers as strings (numbers
//! accepted), bytes as base64, default values left out, unknown fields refused.
#![deny(missing_docs)]

/// Generated code of package `thunder.v1`.
#[allow(missing_docs)]
pub mod v1 {
    tonic::include_proto!("thunder.v1");
    #[cfg(feature = "serde")]
    include!(concat!(env!("OUT_DIR"), "/thunder.v1.serde.rs"));
}

pub use v1::*;

pub mod shard;

/// Encoded `FileDescriptorSet` of `thunder.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("thunder_v1_descriptor");

/// Fully qualified gRPC service name (`thunder.v1.InNetworkPostsService`).
pub const SERVICE_NAME: &str = "thunder.v1.InNetworkPostsService";

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn event_round_trips() {
        let event = InNetworkEvent {
            event_variant: Some(in_network_event::EventVariant::TweetDeleteEvent(
                TweetDeleteEvent {
                    post_id: 7,
                    deleted_at: 9,
                },
            )),
        };
        let bytes = event.encode_to_vec();
        assert_eq!(InNetworkEvent::decode(bytes.as_slice()).ok(), Some(event));
    }

    #[test]
    fn service_name_matches_generated_code() {
        use tonic::server::NamedService;
        type Server = in_network_posts_service_server::InNetworkPostsServiceServer<Unimplemented>;
        assert_eq!(<Server as NamedService>::NAME, SERVICE_NAME);
    }

    struct Unimplemented;

    /// The proto3 JSON mapping, as grpcurl prints and reads it.
    #[cfg(feature = "serde")]
    #[test]
    fn json_is_the_proto3_mapping() {
        let post = LightPost {
            post_id: 1_900_000_000_000_000_001,
            author_id: 7,
            created_at: 1_700_000_000,
            is_reply: true,
            in_reply_to_post_id: Some(5),
            ..LightPost::default()
        };
        let answer = GetInNetworkPostsResponse {
            posts: vec![post],
            next_cursor: vec![0xff, 0x00, 0x10],
        };
        let json = serde_json::to_value(&answer).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "posts": [{
                    "postId": "1900000000000000001",
                    "authorId": "7",
                    "createdAt": "1700000000",
                    "inReplyToPostId": "5",
                    "isReply": true,
                }],
                "nextCursor": "/wAQ",
            })
        );
        let back: GetInNetworkPostsResponse = serde_json::from_value(json).expect("parses");
        assert_eq!(back, answer);
        // The original field names and numbers are accepted too; unknown fields are not.
        let event: InNetworkEvent = serde_json::from_str(
            r#"{"tweet_create_event": {"post_id": 3, "author_id": "4", "has_video": true}}"#,
        )
        .expect("parses");
        let Some(in_network_event::EventVariant::TweetCreateEvent(create)) = event.event_variant
        else {
            panic!("a create: {event:?}");
        };
        assert_eq!(
            (create.post_id, create.author_id, create.has_video),
            (3, 4, true)
        );
        assert!(serde_json::from_str::<TweetDeleteEvent>(r#"{"postId": "1", "typo": 2}"#).is_err());
    }

    #[tonic::async_trait]
    impl in_network_posts_service_server::InNetworkPostsService for Unimplemented {
        async fn get_in_network_posts(
            &self,
            _request: tonic::Request<GetInNetworkPostsRequest>,
        ) -> Result<tonic::Response<GetInNetworkPostsResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("test"))
        }
    }
}
