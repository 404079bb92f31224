//! thunder-proto: the `thunder.v1` gRPC contract of the in-network post store and the Kafka
//! event envelope, generated with tonic/prost from `proto/thunder/v1/in_network.proto`.
//!
//! Everything is re-exported at the crate root: the messages
//! ([`GetInNetworkPostsRequest`], [`LightPost`], [`InNetworkEvent`], …), the
//! [`in_network_posts_service_server`] / [`in_network_posts_service_client`] modules and the
//! [`in_network_event`] oneof module.
#![deny(missing_docs)]

/// Generated code of package `thunder.v1`.
#[allow(missing_docs)]
pub mod v1 {
    tonic::include_proto!("thunder.v1");
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
