//! Generated gRPC code for the `notify.v1` API in `proto/notify/v1/notify.proto`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Messages and services of package `notify.v1`.
pub mod v1 {
    tonic::include_proto!("notify.v1");
}

/// Encoded `FileDescriptorSet` of the API (including imports), for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/notify_descriptor.bin"));
