//! Generates the `thunder.v1` messages and tonic stubs, the file descriptor set for reflection,
//! and (pbjson) the messages' serde implementations in the proto3 JSON mapping, compiled with
//! the `serde` feature. Uses the vendored `protoc`, so no system protobuf compiler is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Honour an explicit PROTOC; otherwise use the binary shipped by protoc-bin-vendored.
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out_dir.join("thunder_v1_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&["proto/thunder/v1/in_network.proto"], &["proto"])?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .build(&[".thunder.v1"])?;
    Ok(())
}
