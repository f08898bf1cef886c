//! The bodies of the fuzz targets, as plain functions: libFuzzer calls them from
//! `fuzz_targets/`, and `cargo test` replays the committed corpus through them on stable.
//!
//! A target fails only by panicking (or by running out of time or memory): every error
//! the code under test returns is an expected answer to hostile input.

use config_source::manifest::{self, Origin};
use config_source::validation::validate_pod;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api;
use nodeagent_proto::k8s::{decode_node, decode_pod, encode_pod};
use prost::Message;

const NODE: &str = "fuzz-node";

/// The file source (one Pod per manifest) and the HTTP source (a Pod or a PodList), each
/// through the static-pod defaults and validation, as config-source reads them.
pub fn manifest(data: &[u8]) {
    if let Ok(pod) = manifest::decode_pod(data)
        && let Ok(pod) = manifest::static_pod(pod, Origin::File("/etc/kubernetes/fuzz.yaml"), NODE)
    {
        crosses_the_wire(&pod);
    }
    if let Ok(pods) = manifest::decode_pods(data) {
        for pod in pods {
            if let Ok(pod) = manifest::static_pod(pod, Origin::Url("http://fuzz/pods"), NODE) {
                crosses_the_wire(&pod);
            }
        }
    }
}

/// Validation of any pod JSON can express, before and after the API defaults.
pub fn validate(data: &[u8]) {
    let Ok(mut pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let _ = validate_pod(&pod);
    manifest::apply_api_defaults(&mut pod);
    let _ = validate_pod(&pod);
}

/// A pod config-source accepted is sent to every other service as JSON: it must come back
/// as the same pod.
fn crosses_the_wire(pod: &Pod) {
    let back = decode_pod(&encode_pod(pod)).expect("an accepted pod decodes from its wire form");
    assert_eq!(&back, pod, "the wire form of an accepted pod is lossless");
}

/// Decodes `bytes` as `M`; a message that decodes must re-encode to bytes that decode to
/// the same message. Equal, or encoded alike: a NaN double is not equal to itself, and a
/// map field (a `HashMap`) encodes in a different order each time.
fn decode<M: Message + Default + PartialEq>(bytes: &[u8]) -> Option<M> {
    let msg = M::decode(bytes).ok()?;
    let encoded = msg.encode_to_vec();
    assert_eq!(
        encoded.len(),
        msg.encoded_len(),
        "encoded_len is the length written"
    );
    let again = M::decode(encoded.as_slice()).expect("a re-encoded message decodes");
    assert!(
        again == msg || again.encode_to_vec() == encoded,
        "a message survives a re-encode"
    );
    Some(msg)
}

/// A message that carries nothing further to decode.
fn check<M: Message + Default + PartialEq>(bytes: &[u8]) {
    decode::<M>(bytes);
}

/// The pods inside a message are decoded by the receiver too.
fn pods<'a>(jsons: impl IntoIterator<Item = &'a Vec<u8>>) {
    for json in jsons {
        let _ = decode_pod(json);
    }
}

/// Every message of `kubelet.v1` that a service decodes from a peer (requests, responses
/// and stream items), chosen by the first byte; the rest of the input is the message.
/// Choices 24 and 25 are the JSON decoders for the pods and the node on the wire.
pub fn wire(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 30 {
        0 => check::<api::WatchConfigRequest>(bytes),
        1 => {
            if let Some(u) = decode::<api::PodConfigUpdate>(bytes) {
                pods(u.pods.iter().map(|p| &p.pod_json));
            }
        }
        2 => check::<api::WatchPlegRequest>(bytes),
        3 => check::<api::PlegWatchResponse>(bytes),
        4 => check::<api::GetPodStatusRequest>(bytes),
        5 => check::<api::RuntimePodStatus>(bytes),
        6 => check::<api::PlegHealthRequest>(bytes),
        7 => check::<api::PlegHealthResponse>(bytes),
        8 => check::<api::ListPodsRequest>(bytes),
        9 => {
            if let Some(r) = decode::<api::ListPodsResponse>(bytes) {
                pods(&r.pods_json);
            }
        }
        10 => check::<api::WatchPodStatusRequest>(bytes),
        11 => {
            if let Some(u) = decode::<api::PodStatusUpdate>(bytes) {
                pods(&u.pods_json);
            }
        }
        12 => check::<api::WatchProbeResultsRequest>(bytes),
        13 => check::<api::ProbeResultUpdate>(bytes),
        14 => {
            if let Some(r) = decode::<api::EnsurePodVolumesRequest>(bytes) {
                pods([&r.pod_json]);
            }
        }
        15 => check::<api::EnsurePodVolumesResponse>(bytes),
        16 => check::<api::ReleasePodRequest>(bytes),
        17 => check::<api::ReleasePodResponse>(bytes),
        18 => check::<api::ListVolumesRequest>(bytes),
        19 => check::<api::ListVolumesResponse>(bytes),
        20 => check::<api::GetNodeRequest>(bytes),
        21 => {
            if let Some(r) = decode::<api::GetNodeResponse>(bytes) {
                let _ = decode_node(&r.node_json);
            }
        }
        22 => check::<api::ScrapeRequest>(bytes),
        23 => check::<api::ScrapeResponse>(bytes),
        24 => {
            let _ = decode_pod(bytes);
        }
        25 => {
            let _ = decode_node(bytes);
        }
        26 => {
            if let Some(r) = decode::<api::PrepareSubPathsRequest>(bytes) {
                pods([&r.pod_json]);
            }
        }
        27 => check::<api::PrepareSubPathsResponse>(bytes),
        28 => check::<api::RecentWarningsRequest>(bytes),
        _ => check::<api::RecentWarningsResponse>(bytes),
    }
}

#[cfg(test)]
mod tests;
