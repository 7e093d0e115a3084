//! Generates the CSI v1 message types and the Identity/Node service stubs
//! (server and client; the client is used by the tests, which talk to the
//! plugin the way kubelet does) from `proto/csi.proto` with
//! tonic-prost-build. Needs `protoc` on PATH (Debian: protobuf-compiler) or
//! in `$PROTOC`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The request carrying credentials gets a hand-written Debug impl
        // that redacts them (see src/proto.rs), so an accidental `{:?}`
        // can never print a secret.
        .skip_debug(["csi.v1.NodePublishVolumeRequest"])
        .compile_protos(&["proto/csi.proto"], &["proto"])?;
    Ok(())
}
