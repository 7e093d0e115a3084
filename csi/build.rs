//! Generates the CSI v1 message types and the Identity/Node service stubs
//! (server and client; the client is used by the tests, which talk to the
//! plugin the way kubelet does) from `proto/csi.proto` with
//! tonic-prost-build. The .proto files are parsed by `protox`, a protobuf
//! compiler written in Rust, so a fresh clone builds with Rust alone: no
//! `protoc` on PATH is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/csi.proto"], ["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The requests carrying credentials get hand-written Debug impls
        // that redact them (see src/proto.rs), so an accidental `{:?}`
        // can never print a secret.
        .skip_debug([
            "csi.v1.NodePublishVolumeRequest",
            "csi.v1.NodeStageVolumeRequest",
        ])
        .compile_fds(descriptors)?;
    Ok(())
}
