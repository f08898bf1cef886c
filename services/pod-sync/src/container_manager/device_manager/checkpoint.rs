//! upstream's device manager checkpoint, `<root-dir>/device-plugins/kubelet_internal_checkpoint`
//! (`pkg/kubelet/cm/devicemanager/checkpoint`), byte for byte: JSON with `Data`
//! (`PodDeviceEntries`: pod UID, container, resource, device IDs by NUMA node, the
//! plugin's `AllocateResponse` as protobuf bytes; `RegisteredDevices`: each resource's
//! healthy device IDs) and `Checksum`, the FNV-1a (32 bit) of `Data` as Go's spew library
//! prints it. GPU monitoring agents read this file (DCGM exporter's older releases, vendor
//! exporters), and a file written by upstream's kubelet is read here, the other way round
//! too.

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// upstream's `kubeletDeviceManagerCheckpoint`.
pub const FILE: &str = "kubelet_internal_checkpoint";

/// NUMA node id -> device IDs (`checkpoint.DevicesPerNUMA`); -1: no topology.
pub type DevicesPerNuma = BTreeMap<i64, Vec<String>>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    #[serde(rename = "Data")]
    pub data: Data,
    #[serde(rename = "Checksum", default)]
    pub checksum: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Data {
    /// `None`: Go's nil slice (`null`), which spew prints `<nil>`.
    #[serde(rename = "PodDeviceEntries", default)]
    pub entries: Option<Vec<Entry>>,
    #[serde(rename = "RegisteredDevices", default)]
    pub registered: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container: String,
    #[serde(rename = "ResourceName")]
    pub resource: String,
    #[serde(rename = "DeviceIDs", default)]
    pub device_ids: Option<DevicesPerNuma>,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded (Go's `[]byte`: base64
    /// in JSON).
    #[serde(rename = "AllocResp", default, with = "go_bytes")]
    pub alloc_resp: Option<Vec<u8>>,
}

impl Checkpoint {
    /// The file for this data, its checksum computed.
    pub fn of(data: Data) -> Self {
        let checksum = checksum(&data);
        Self { data, checksum }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint always serializes")
    }

    /// upstream's `GetCheckpoint` and `VerifyChecksum`.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let cp: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if cp.checksum != checksum(&cp.data) {
            return Err("checkpoint is corrupted".into());
        }
        Ok(cp)
    }
}

/// What spew's `%#v` prints of `checkpointData` (go-spew's `formatState`: each field's
/// type in parentheses, slice elements' and map entries' types left out, map keys
/// sorted, strings bare, a nil slice or map `<nil>`, a `[]byte` as its decimal bytes),
/// hashed with FNV-1a: upstream's `checksum.New(cp.Data)`.
pub fn checksum(data: &Data) -> u64 {
    fn list(ids: &[String]) -> String {
        format!("[{}]", ids.join(" "))
    }
    let entries = match &data.entries {
        None => "<nil>".to_string(),
        Some(es) => {
            let printed: Vec<String> = es
                .iter()
                .map(|e| {
                    let ids = match &e.device_ids {
                        None => "<nil>".to_string(),
                        Some(m) => {
                            let per: Vec<String> =
                                m.iter().map(|(n, ids)| format!("{n}:{}", list(ids))).collect();
                            format!("map[{}]", per.join(" "))
                        }
                    };
                    let resp = match &e.alloc_resp {
                        None => "<nil>".to_string(),
                        Some(b) => {
                            let bytes: Vec<String> = b.iter().map(u8::to_string).collect();
                            format!("[{}]", bytes.join(" "))
                        }
                    };
                    format!(
                        "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA){ids} AllocResp:([]uint8){resp}}}",
                        e.pod_uid, e.container, e.resource
                    )
                })
                .collect();
            format!("[{}]", printed.join(" "))
        }
    };
    let registered = match &data.registered {
        None => "<nil>".to_string(),
        Some(m) => {
            let per: Vec<String> = m
                .iter()
                .map(|(r, ids)| format!("{r}:{}", list(ids)))
                .collect();
            format!("map[{}]", per.join(" "))
        }
    };
    let printed = format!(
        "(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries} RegisteredDevices:(map[string][]string){registered}}}"
    );
    u64::from(crate::container_manager::checksum::fnv1a_32(
        printed.as_bytes(),
    ))
}

/// Go's JSON of a `[]byte`: standard base64, `null` for nil.
mod go_bytes {
    use super::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}
