//! Generates the `thunder.v1` messages and tonic stubs, the file descriptor set for
//! reflection, and (pbjson-build, from that set) the messages' proto3 JSON mapping. Uses the
//! vendored `protoc`, so no system protobuf compiler is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Honour an explicit PROTOC; otherwise use the binary shipped by protoc-bin-vendored.
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_set = out_dir.join("thunder_v1_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_set)
        .compile_protos(&["proto/thunder/v1/in_network.proto"], &["proto"])?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor_set)?)?
        .build(&[".thunder.v1"])?;
    Ok(())
}
