//! Compiles the protos with protox, a pure-Rust protobuf compiler, so a build
//! needs nothing outside cargo.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/batcher/v1/batcher.proto";
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("batcher_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // Type names (prost::Name) let the JSON mapping find each message's
    // descriptor.
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    // Our codec: a request that cannot be decoded is INVALID_ARGUMENT.
    tonic_prost_build::configure()
        .codec_path("crate::service::codec::BatcherCodec")
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
