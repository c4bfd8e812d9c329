//! Generates the Talos machine API client and server from `proto/` at build time (feature
//! `runtime`; the rules language alone needs none of it). The `.proto` files are compiled by
//! `protox` (a protobuf compiler written in Rust), so no `protoc` is needed on the machine.

#[cfg(feature = "runtime")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(
        [
            "machine/machine.proto",
            "machine/lifecycle.proto",
            "machine/image.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(files)?;
    Ok(())
}

#[cfg(not(feature = "runtime"))]
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
