//! Conversions between the wire types (`thunder-proto`) and the engine's records: those of
//! `thunder_events::wire`, where the fields are listed once, under the names the server's
//! callers use.

pub use thunder_events::wire::{
    create_event_from_post, delete_from_event, post_from_create_event, post_from_proto,
    post_to_proto,
};
