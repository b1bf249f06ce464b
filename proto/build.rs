// Compiles proto/*.proto with protox (pure Rust) so no system protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["cosi.proto", "csi.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
