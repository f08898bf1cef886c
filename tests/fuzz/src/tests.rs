//! Replays the committed corpus (seeds and the inputs of past findings) through each
//! target without libFuzzer, and writes the wire seeds.

use super::*;
use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no seeds", dir.display());
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    for path in corpus(target) {
        let data = std::fs::read(&path).expect("read a corpus file");
        eprintln!("{}", path.display());
        run(&data);
    }
}

#[test]
fn manifest_corpus_replays() {
    replay("manifest", manifest);
}

#[test]
fn validate_corpus_replays() {
    replay("validate", validate);
}

#[test]
fn wire_corpus_replays() {
    replay("wire", wire);
}

#[test]
fn the_example_pod_is_accepted() {
    let web = include_bytes!("../../../deploy/examples/web.yaml");
    let pod = manifest::decode_pod(web).expect("decodes");
    manifest::static_pod(pod, Origin::File("/m/web.yaml"), NODE).expect("is valid");
}

/// One valid message of each kind, prefixed with its selector byte in [`wire`].
fn wire_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let web = manifest::decode_pod(include_bytes!("../../../deploy/examples/web.yaml"))
        .expect("the example decodes");
    let pod_json =
        encode_pod(&manifest::static_pod(web, Origin::File("/m/web.yaml"), NODE).expect("valid"));
    let trace = Some(api::TraceContext {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        tracestate: "vendor=x".into(),
    });
    let status = api::RuntimePodStatus {
        uid: "u1".into(),
        name: "web".into(),
        namespace: "default".into(),
        sandboxes: vec![api::RuntimeSandbox {
            id: "s1".into(),
            ip: "10.88.0.2".into(),
            ..Default::default()
        }],
        containers: vec![api::RuntimeContainer {
            id: "c1".into(),
            name: "httpd".into(),
            state: 1,
            attempt: 2,
            exit_code: -1,
            ..Default::default()
        }],
        timestamp_unix_nanos: 1,
    };
    let config = api::PodConfigUpdate {
        op: 2,
        revision: 7,
        pods: vec![api::SourcePod {
            source: "file".into(),
            pod_json: pod_json.clone(),
            uid: "u1".into(),
            trace: trace.clone(),
        }],
        sources_seen: vec!["file".into()],
        all_sources_ready: true,
        trace: trace.clone(),
        ..Default::default()
    };
    let event = api::PlegWatchResponse {
        kind: Some(api::pleg_watch_response::Kind::Event(
            api::PodLifecycleEvent {
                revision: 3,
                pod_uid: "u1".into(),
                r#type: 1,
                container_id: "c1".into(),
                status: Some(status.clone()),
                trace: trace.clone(),
            },
        )),
    };
    let results = api::ProbeResultUpdate {
        revision: 1,
        snapshot: true,
        results: vec![api::ProbeResult {
            pod_uid: "u1".into(),
            container_name: "httpd".into(),
            kind: 1,
            outcome: 2,
            trace,
            ..Default::default()
        }],
        ..Default::default()
    };
    let volumes = api::EnsurePodVolumesResponse {
        host_paths: [(
            "www".to_string(),
            "/var/lib/kubelet/pods/u1/volumes/www".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let node = br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},"status":{"capacity":{"cpu":"2"}}}"#;
    let seed = |which: u8, bytes: Vec<u8>| [vec![which], bytes].concat();
    vec![
        ("pod-config-update", seed(1, config.encode_to_vec())),
        ("pleg-event", seed(3, event.encode_to_vec())),
        (
            "pod-status",
            seed(
                11,
                api::PodStatusUpdate {
                    revision: 1,
                    pods_json: vec![pod_json.clone()],
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
        ),
        ("probe-results", seed(13, results.encode_to_vec())),
        (
            "ensure-volumes",
            seed(
                14,
                api::EnsurePodVolumesRequest {
                    pod_json: pod_json.clone(),
                    trace: None,
                }
                .encode_to_vec(),
            ),
        ),
        ("volume-paths", seed(15, volumes.encode_to_vec())),
        (
            "get-node",
            seed(
                21,
                api::GetNodeResponse {
                    node_json: node.to_vec(),
                }
                .encode_to_vec(),
            ),
        ),
        ("pod-json", seed(24, pod_json.clone())),
        ("node-json", seed(25, node.to_vec())),
        (
            "prepare-subpaths",
            seed(
                26,
                api::PrepareSubPathsRequest {
                    pod_json,
                    container_name: "httpd".into(),
                    mounts: vec![api::SubPathMount {
                        volume_name: "www".into(),
                        sub_path: "site/a".into(),
                        mount_index: 0,
                    }],
                    trace: None,
                }
                .encode_to_vec(),
            ),
        ),
        (
            "subpath-paths",
            seed(
                27,
                api::PrepareSubPathsResponse {
                    host_paths: [(
                        0,
                        "/var/lib/kubelet/pods/u1/volume-subpaths/www/httpd/0".to_string(),
                    )]
                    .into(),
                }
                .encode_to_vec(),
            ),
        ),
        (
            "recent-warnings",
            seed(
                29,
                api::RecentWarningsResponse {
                    warnings: vec![api::RecentWarning {
                        last_unix_nanos: 1_764_000_000_000_000_000,
                        object: "default/web".into(),
                        field_path: "spec.containers{app}".into(),
                        reason: "BackOff".into(),
                        message: "Back-off restarting failed container app".into(),
                        count: 3,
                    }],
                }
                .encode_to_vec(),
            ),
        ),
    ]
}

/// `cargo test --manifest-path tests/fuzz/Cargo.toml -- --ignored write_wire_seeds`
/// after a schema change.
#[test]
#[ignore = "writes the committed seed corpus: run by hand after a schema change"]
fn write_wire_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/wire");
    for (name, bytes) in wire_seeds() {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}

#[test]
fn wire_seeds_decode() {
    for (name, bytes) in wire_seeds() {
        eprintln!("{name}");
        wire(&bytes);
    }
}
