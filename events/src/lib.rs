//! thunder-events: the post events as they travel between Kafka, the wire and the store.
//!
//! - [`codec`]: a Kafka record's payload (one protobuf `InNetworkEvent`, no framing) to a store
//!   event and back; every event passes the contract checks ([`DecodeError::OutOfContractId`],
//!   [`DecodeError::ZeroId`]) in [`decode_event`].
//! - [`wire`]: the wire types of `thunder-proto` to the engine's records and back; the eleven
//!   fields of a post are listed once.
//! - [`kafka`] (feature `kafka`): the Kafka connection flags and client configuration, the
//!   security settings' checks, and the producer of event records.
//!
//! Without the `kafka` feature it links neither a Kafka client nor the server, so the fuzzers
//! and tools that only read or write events need nothing more.
#![deny(missing_docs)]

pub mod codec;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod wire;

pub use codec::{
    DecodeError, create_event, decode_event, delete_envelope, delete_event, light_post,
};
