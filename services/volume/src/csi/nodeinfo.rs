//! Upstream's `nodeinfomanager`: what the API server learns of the CSI drivers on this
//! node. Each registered driver is an entry of the node's CSINode object (`spec.drivers`:
//! name, nodeID, allocatable count) and of the Node's `csi.volume.kubernetes.io/nodeid`
//! annotation (a JSON map driver -> node ID). The CSINode is owned by the Node, so it goes
//! with it. A node without an API server (standalone) keeps nothing.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;

/// The Node annotation naming each driver's node ID (upstream's `annotationKeyNodeID`).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// An update that lost a race is tried again this many times.
const ATTEMPTS: usize = 5;

#[derive(Clone)]
pub struct NodeInfo {
    client: Option<kube::Client>,
    node_name: String,
}

impl NodeInfo {
    pub fn new(client: Option<kube::Client>, node_name: String) -> Self {
        Self { client, node_name }
    }

    /// Records a registered driver on the Node and its CSINode.
    pub async fn install(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes_per_node: i64,
        topology_keys: Option<Vec<String>>,
    ) -> Result<(), String> {
        let Some(client) = &self.client else {
            return Ok(());
        };
        let (name, id) = (driver.to_string(), node_id.to_string());
        self.annotate(client, |ids| {
            ids.insert(name.clone(), id.clone());
        })
        .await
        .map_err(|e| {
            format!(
                "error updating Node object with CSI driver node info: error updating node: {e}"
            )
        })?;
        let entry = CSINodeDriver {
            name: driver.to_string(),
            node_id: node_id.to_string(),
            topology_keys,
            allocatable: (max_volumes_per_node > 0).then(|| VolumeNodeResources {
                // Clamped to an int32, as upstream does.
                count: Some(i32::try_from(max_volumes_per_node).unwrap_or(i32::MAX)),
            }),
        };
        // Upstream's `installDriverToCSINode`: the driver's entry replaced, at the end;
        // nothing written when it is there as it would be.
        self.update_csinode(client, true, |drivers| {
            if drivers.contains(&entry) {
                return;
            }
            drivers.retain(|d| d.name != entry.name);
            drivers.push(entry.clone());
        })
        .await
        .map_err(|e| {
            format!(
                "error updating CSINode object with CSI driver node info: error updating CSINode: {e}"
            )
        })
    }

    /// Removes a deregistered driver from the CSINode (never created for that) and the
    /// Node, both tried whatever the other's outcome, as upstream's `UninstallCSIDriver`.
    pub async fn uninstall(&self, name: &str) -> Result<(), String> {
        self.keep(false, |n| n != name).await
    }

    /// Drops every driver but `names`, creating the CSINode if there is none (run once
    /// the first scan has registered what is there: a driver removed while this service
    /// was down leaves nothing stale, which upstream's kubelet leaves).
    pub async fn keep_only(&self, names: &[String]) -> Result<(), String> {
        self.keep(true, |n| names.iter().any(|k| k == n)).await
    }

    async fn keep(&self, create: bool, keep: impl Fn(&str) -> bool) -> Result<(), String> {
        let Some(client) = &self.client else {
            return Ok(());
        };
        let csinode = self
            .update_csinode(client, create, |drivers| drivers.retain(|d| keep(&d.name)))
            .await
            .map_err(|e| format!("error uninstalling CSI driver from CSINode object {e}"));
        let node = self
            .annotate(client, |ids| ids.retain(|n, _| keep(n)))
            .await
            .map_err(|e| format!("error removing CSI driver node info from Node object {e}"));
        match (csinode, node) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(a), Err(b)) => Err(format!("{a}; {b}")),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    /// Changes the node ID annotation's map; written only when it changed.
    async fn annotate(
        &self,
        client: &kube::Client,
        change: impl Fn(&mut BTreeMap<String, String>),
    ) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| format!("cannot get node {}: {e}", self.node_name))?;
        let current = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION));
        let mut ids: BTreeMap<String, String> = match current {
            Some(json) => serde_json::from_str(json).map_err(|e| {
                format!("cannot parse the node's {NODE_ID_ANNOTATION} annotation {json:?}: {e}")
            })?,
            None => BTreeMap::new(),
        };
        let before = ids.clone();
        change(&mut ids);
        if ids == before && (current.is_some() || ids.is_empty()) {
            return Ok(());
        }
        let value = if ids.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(serde_json::to_string(&ids).expect("a map of strings"))
        };
        let patch = serde_json::json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: value}}});
        nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("cannot annotate node {}: {e}", self.node_name))?;
        Ok(())
    }

    /// Changes the CSINode's driver list (creating the CSINode, owned by the Node, when
    /// absent and `create`); a write that lost a race to another writer is tried again.
    async fn update_csinode(
        &self,
        client: &kube::Client,
        create: bool,
        change: impl Fn(&mut Vec<CSINodeDriver>),
    ) -> Result<(), String> {
        let csinodes: Api<CSINode> = Api::all(client.clone());
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let found = csinodes
                .get_opt(&self.node_name)
                .await
                .map_err(|e| format!("cannot get CSINode {}: {e}", self.node_name))?;
            let written = match found {
                Some(mut csinode) => {
                    let before = csinode.spec.drivers.clone();
                    change(&mut csinode.spec.drivers);
                    if csinode.spec.drivers == before {
                        return Ok(());
                    }
                    // The change is written as a whole: an older resourceVersion conflicts.
                    csinodes
                        .replace(&self.node_name, &PostParams::default(), &csinode)
                        .await
                }
                None if !create => return Ok(()),
                None => {
                    let mut drivers = Vec::new();
                    change(&mut drivers);
                    let csinode = CSINode {
                        metadata: ObjectMeta {
                            name: Some(self.node_name.clone()),
                            owner_references: self.owner(client).await?,
                            ..Default::default()
                        },
                        spec: CSINodeSpec { drivers },
                        ..Default::default()
                    };
                    csinodes.create(&PostParams::default(), &csinode).await
                }
            };
            match written {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    last = status.message;
                }
                Err(e) => return Err(format!("cannot write CSINode {}: {e}", self.node_name)),
            }
        }
        Err(format!(
            "cannot write CSINode {}: conflicts {ATTEMPTS} times in a row: {last}",
            self.node_name
        ))
    }

    /// The CSINode's owner: the Node (upstream sets it so that the CSINode goes with it).
    async fn owner(&self, client: &kube::Client) -> Result<Option<Vec<OwnerReference>>, String> {
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| format!("cannot get node {}: {e}", self.node_name))?;
        Ok(node.metadata.uid.map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node_name.clone(),
                uid,
                ..Default::default()
            }]
        }))
    }
}
