//! Generates the kubelet.v1, CRI runtime.v1, pod-resources v1, device plugin v1beta1, plugin
//! registration v1 and CSI v1 code with a vendored protoc (and its well-known types), so
//! that no system protoc is needed.

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
    // The kubelet's plugin registration API (volume is each plugin's client; the test CSI
    // driver serves it, as node-driver-registrar does).
    tonic_prost_build::configure().compile_with_config(
        config(&protoc),
        &["proto/pluginregistration/v1/api.proto"],
        &["proto"],
    )?;
    // The CSI spec (volume is the client of a driver's Identity and Node services; the test
    // CSI driver serves them). It imports protobuf's well-known types.
    let well_known = protoc_bin_vendored::include_path()?;
    tonic_prost_build::configure().compile_with_config(
        config(&protoc),
        &[std::path::Path::new("proto/csi/v1/csi.proto")],
        &[std::path::Path::new("proto"), well_known.as_path()],
    )?;
    // The node agent is a CRI client only.
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(config(&protoc), &["proto/cri/api.proto"], &["proto"])?;
    Ok(())
}
