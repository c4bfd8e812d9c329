//! Generates the Talos machine API client and server from `proto/` at build time. The
//! `.proto` files are compiled by `protox` (a protobuf compiler written in Rust), so no
//! `protoc` is needed on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["machine/machine.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(files)?;
    Ok(())
}
