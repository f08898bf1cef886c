//! Generates the kubelet.v1, CRI runtime.v1, pod-resources v1 and device plugin v1beta1 code with a vendored protoc, so that no
//! system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let config = |protoc: &std::path::Path| {
        let mut config = prost_build::Config::new();
        config.protoc_executable(protoc);
        config
    };
    tonic_prost_build::configure().compile_with_config(
        config(&protoc),
        &["proto/kubelet/v1/kubelet.proto"],
        &["proto"],
    )?;
    // The kubelet's pod-resources API (served by pod-sync; the tests are its client).
    tonic_prost_build::configure().compile_with_config(
        config(&protoc),
        &["proto/podresources/v1/api.proto"],
        &["proto"],
    )?;
    // The kubelet's device plugin API (pod-sync serves Registration and is each plugin's
    // client; the test device plugin is the other way round).
    tonic_prost_build::configure().compile_with_config(
        config(&protoc),
        &["proto/deviceplugin/v1beta1/api.proto"],
        &["proto"],
    )?;
    // The node agent is a CRI client only.
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(config(&protoc), &["proto/cri/api.proto"], &["proto"])?;
    Ok(())
}
