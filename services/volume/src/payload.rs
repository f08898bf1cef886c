//! What goes into configMap, secret, downwardAPI and projected volumes: API objects turned
//! into [`Payload`]s for the [atomic writer](crate::atomic_writer), as upstream's
//! `configmap.MakePayload`, `secret.MakePayload`, `downwardapi.CollectData` and the
//! projected plugin's `collectData`, with upstream's error wording.
//!
//! Everything here is a pure function of the pod and the objects fetched for it: the caller
//! asks [`References::of_pod`] what to fetch, fetches it (config maps, secrets, service
//! account tokens via TokenRequest, the node's allocatable), fills [`ApiObjects`] and calls
//! [`volume_payload`] for each volume.
//!
//! # Modes and ownership (upstream `SetVolumeOwnership` for these read-only volumes)
//!
//! - A file's mode is its item's `mode`, else the volume's `defaultMode`, else 0644.
//! - With an `fsGroup`, every file gets that group and `mode | 0o440` (upstream's `roMask`
//!   for read-only volumes: owner- and group-read), so 0600 becomes 0640, 0400 0440, and
//!   0644 stays 0644.
//! - A projected `serviceAccountToken` file gets `defaultMode`; but when the pod has an
//!   fsUser (every container runs as the same `runAsUser`, upstream `FsUserFrom`) or an
//!   `fsGroup`, it gets 0600 and belongs to the fsUser, and the fsGroup rule above then
//!   makes it 0640. Other files never get the fsUser, as upstream.
//! - Directories are the writer's (0755): readable by every container user, so the group
//!   bits upstream also sets on them change nothing for a read-only volume.
//!
//! # Projected volumes
//!
//! Sources are collected in order into one payload; when two sources (or two items) give the
//! same path, the later one wins, as in upstream's `collectData` (`payload[k] = v`). API
//! validation (`validateProjectionSources`) refuses pods where two sources share a path, so
//! this only matters for pods that were never validated. Every failing source is reported,
//! in upstream's aggregate format (`[err1, err2]`; one error alone is itself).
//!
//! The alpha `defaultUser` / per-item `user` fields (feature gate `AtomicWriteVolumeUserFields`,
//! off by default upstream, whose API server then drops them) are ignored. `clusterTrustBundle`
//! and `podCertificate` projections are refused with a clear error rather than left out.

pub mod downward_api;

pub use crate::atomic_writer::{FileProjection, Payload};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, DownwardAPIVolumeSource, KeyToPath, Pod,
    ProjectedVolumeSource, Secret, SecretVolumeSource, ServiceAccountTokenProjection, Volume,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, BTreeSet};

/// `<pod>/volumes/<plugin>/<name>` directory names of the payload-backed volume kinds.
pub const CONFIG_MAP_PLUGIN: &str = "kubernetes.io~configmap";
pub const SECRET_PLUGIN: &str = "kubernetes.io~secret";
pub const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
pub const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";

/// The default `defaultMode` of all four kinds (upstream `ConfigMapVolumeSourceDefaultMode`,
/// `SecretVolumeSourceDefaultMode`, `DownwardAPIVolumeSourceDefaultMode`,
/// `ProjectedVolumeSourceDefaultMode`).
pub const DEFAULT_MODE: u32 = 0o644;
/// A token's mode when the pod has an fsUser or fsGroup, before the group bits are added.
const TOKEN_MODE_WITH_OWNER: u32 = 0o600;
/// What an fsGroup adds to a read-only volume's files (upstream `roMask`).
const FS_GROUP_MODE: u32 = 0o440;
/// A TokenRequest's lifetime when the projection does not say (API default).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// Why a volume's payload could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The object does not exist and the volume does not say it is optional.
    #[error("{resource} {name:?} not found")]
    NotFound {
        resource: &'static str,
        name: String,
    },
    /// An item names a key the config map does not have.
    #[error("configmap references non-existent config key: {0}")]
    MissingConfigMapKey(String),
    /// An item names a key the secret does not have.
    #[error("references non-existent secret key: {0}")]
    MissingSecretKey(String),
    /// Fetching an object (or a token) failed; the message is the caller's.
    #[error("{0}")]
    Fetch(String),
    /// A downwardAPI item cannot be resolved against the pod.
    #[error("{0}")]
    DownwardApi(String),
    /// A mode outside 0..=0777 (API validation's wording).
    #[error(
        "{field}: Invalid value: {value}: must be a number between 0 and 0777 (octal), both inclusive"
    )]
    InvalidMode { field: String, value: i32 },
    /// A projection kind this node agent cannot fill yet.
    #[error("{0} projections are not supported by this node agent yet")]
    Unsupported(&'static str),
    /// Several failures, in upstream's aggregate format.
    #[error("{}", aggregate_message(.0))]
    Aggregate(Vec<PayloadError>),
}

/// Upstream `utilerrors.NewAggregate(..).Error()`: one error is itself; several are
/// `[a, b]`, duplicates dropped.
fn aggregate_message(errs: &[PayloadError]) -> String {
    let mut seen = Vec::new();
    for e in errs {
        let msg = e.to_string();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    match seen.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// `Ok` when `errs` is empty, the single error, or an aggregate (nested ones flattened).
fn aggregate(errs: Vec<PayloadError>) -> Result<(), PayloadError> {
    let mut flat = Vec::new();
    for e in errs {
        match e {
            PayloadError::Aggregate(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    match flat.len() {
        0 => Ok(()),
        1 => Err(flat.remove(0)),
        _ => Err(PayloadError::Aggregate(flat)),
    }
}

/// Who the files of a pod's volumes belong to (upstream's `MounterArgs.FsUser`/`FsGroup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ownership {
    /// The one `runAsUser` of all (init) containers, if they agree (upstream `FsUserFrom`).
    pub fs_user: Option<u32>,
    /// `securityContext.fsGroup`.
    pub fs_group: Option<u32>,
}

impl Ownership {
    pub fn of(pod: &Pod) -> Self {
        let Some(spec) = &pod.spec else {
            return Self::default();
        };
        let pod_sc = spec.security_context.as_ref();
        let fs_group = pod_sc
            .and_then(|sc| sc.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        let pod_user = pod_sc.and_then(|sc| sc.run_as_user);
        // Ephemeral containers are excluded: they cannot have a securityContext.
        let mut users = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .map(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.run_as_user)
                    .or(pod_user)
            });
        let first = users.next().flatten();
        let fs_user = match first {
            Some(u) if users.all(|other| other == Some(u)) => u32::try_from(u).ok(),
            _ => None,
        };
        Self { fs_user, fs_group }
    }
}

/// The outcome of fetching an object: `Ok(None)` when the API server says it does not
/// exist, `Err` (the message) when fetching failed.
pub type Fetched<T> = Result<Option<T>, String>;

/// One TokenRequest: a pod gets one token per audience and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenRequestKey {
    /// Empty: the API server's own audience.
    pub audience: String,
    pub expiration_seconds: i64,
}

impl TokenRequestKey {
    pub fn of(projection: &ServiceAccountTokenProjection) -> Self {
        Self {
            audience: projection.audience.clone().unwrap_or_default(),
            expiration_seconds: projection
                .expiration_seconds
                .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS),
        }
    }
}

/// Everything fetched for one pod (its namespace's objects), keyed as [`References`] lists.
#[derive(Debug, Clone, Default)]
pub struct ApiObjects {
    pub config_maps: BTreeMap<String, Fetched<ConfigMap>>,
    pub secrets: BTreeMap<String, Fetched<Secret>>,
    /// The token's bytes (`status.token`) or why the TokenRequest failed.
    pub tokens: BTreeMap<TokenRequestKey, Result<Vec<u8>, String>>,
    /// The node's allocatable resources, the default of an unset limit.
    pub node_allocatable: BTreeMap<String, Quantity>,
    /// Where the pod's claimed volumes were published before this pass, by the pod's
    /// volume name (`server::publish_claims`); a claim not here is not set up yet.
    pub claimed: BTreeMap<String, std::path::PathBuf>,
}

/// What a pod's volumes need fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub tokens: BTreeSet<TokenRequestKey>,
    /// A `resourceFieldRef` needs the node's allocatable.
    pub node_allocatable: bool,
}

impl References {
    pub fn of_pod(pod: &Pod) -> Self {
        let mut refs = Self::default();
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten() {
            refs.add(v);
        }
        refs
    }

    pub fn of_volume(volume: &Volume) -> Self {
        let mut refs = Self::default();
        refs.add(volume);
        refs
    }

    fn add(&mut self, v: &Volume) {
        if let Some(cm) = &v.config_map {
            self.config_maps.insert(cm.name.clone());
        }
        if let Some(s) = &v.secret {
            self.secrets
                .insert(s.secret_name.clone().unwrap_or_default());
        }
        if let Some(r) = v
            .csi
            .as_ref()
            .and_then(|c| c.node_publish_secret_ref.as_ref())
        {
            self.secrets.insert(r.name.clone());
        }
        if let Some(d) = &v.downward_api {
            self.node_allocatable |= d
                .items
                .iter()
                .flatten()
                .any(|i| i.resource_field_ref.is_some());
        }
        let sources = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        for source in sources.into_iter().flatten() {
            if let Some(cm) = &source.config_map {
                self.config_maps.insert(cm.name.clone());
            }
            if let Some(s) = &source.secret {
                self.secrets.insert(s.name.clone());
            }
            if let Some(d) = &source.downward_api {
                self.node_allocatable |= d
                    .items
                    .iter()
                    .flatten()
                    .any(|i| i.resource_field_ref.is_some());
            }
            if let Some(t) = &source.service_account_token {
                self.tokens.insert(TokenRequestKey::of(t));
            }
        }
    }
}

/// The `volumes/<plugin>` directory of a payload-backed volume; `None` for other kinds.
pub fn plugin_dir(volume: &Volume) -> Option<&'static str> {
    if volume.config_map.is_some() {
        Some(CONFIG_MAP_PLUGIN)
    } else if volume.secret.is_some() {
        Some(SECRET_PLUGIN)
    } else if volume.downward_api.is_some() {
        Some(DOWNWARD_API_PLUGIN)
    } else if volume.projected.is_some() {
        Some(PROJECTED_PLUGIN)
    } else {
        None
    }
}

/// The payload of `volume` of `pod`; `Ok(None)` for volume kinds that are not payloads.
pub fn volume_payload(
    volume: &Volume,
    pod: &Pod,
    objects: &ApiObjects,
) -> Result<Option<Payload>, PayloadError> {
    let owner = Ownership::of(pod);
    let payload = if let Some(source) = &volume.config_map {
        let optional = source.optional.unwrap_or(false);
        let object = lookup(&objects.config_maps, "configmaps", &source.name, optional)?;
        config_map(source, object, owner)?
    } else if let Some(source) = &volume.secret {
        let optional = source.optional.unwrap_or(false);
        let name = source.secret_name.as_deref().unwrap_or_default();
        let object = lookup(&objects.secrets, "secrets", name, optional)?;
        secret(source, object, owner)?
    } else if let Some(source) = &volume.downward_api {
        downward_api(source, pod, &objects.node_allocatable, owner)?
    } else if let Some(source) = &volume.projected {
        projected(source, pod, objects, owner)?
    } else {
        return Ok(None);
    };
    Ok(Some(payload))
}

/// A fetched object; `Ok(None)` only when it does not exist and that is allowed.
fn lookup<'a, T>(
    fetched: &'a BTreeMap<String, Fetched<T>>,
    resource: &'static str,
    name: &str,
    optional: bool,
) -> Result<Option<&'a T>, PayloadError> {
    match fetched.get(name) {
        Some(Ok(Some(object))) => Ok(Some(object)),
        Some(Ok(None)) if optional => Ok(None),
        Some(Ok(None)) => Err(PayloadError::NotFound {
            resource,
            name: name.into(),
        }),
        Some(Err(e)) => Err(PayloadError::Fetch(e.clone())),
        None => Err(PayloadError::Fetch(format!(
            "{resource} {name:?} was not fetched"
        ))),
    }
}

/// A configMap volume (upstream `configmap.MakePayload`): every key of `data` and
/// `binaryData`, or only `items`. `object` is `None` when the config map does not exist.
pub fn config_map(
    source: &ConfigMapVolumeSource,
    object: Option<&ConfigMap>,
    owner: Ownership,
) -> Result<Payload, PayloadError> {
    let optional = source.optional.unwrap_or(false);
    let Some(object) = exists(object, optional, "configmaps", &source.name)? else {
        return Ok(Payload::new());
    };
    let default_mode = mode("defaultMode", source.default_mode, DEFAULT_MODE)?;
    let mut payload = config_map_files(source.items.as_deref(), object, default_mode, optional)?;
    apply_fs_group(&mut payload, owner.fs_group);
    Ok(payload)
}

/// A secret volume (upstream `secret.MakePayload`): every key of `data`, or only `items`.
/// `object` is `None` when the secret does not exist.
pub fn secret(
    source: &SecretVolumeSource,
    object: Option<&Secret>,
    owner: Ownership,
) -> Result<Payload, PayloadError> {
    let optional = source.optional.unwrap_or(false);
    let name = source.secret_name.as_deref().unwrap_or_default();
    let Some(object) = exists(object, optional, "secrets", name)? else {
        return Ok(Payload::new());
    };
    let default_mode = mode("defaultMode", source.default_mode, DEFAULT_MODE)?;
    let mut payload = secret_files(source.items.as_deref(), object, default_mode, optional)?;
    apply_fs_group(&mut payload, owner.fs_group);
    Ok(payload)
}

/// A downwardAPI volume (upstream `downwardapi.CollectData`).
pub fn downward_api(
    source: &DownwardAPIVolumeSource,
    pod: &Pod,
    node_allocatable: &BTreeMap<String, Quantity>,
    owner: Ownership,
) -> Result<Payload, PayloadError> {
    let default_mode = mode("defaultMode", source.default_mode, DEFAULT_MODE)?;
    let items = source.items.as_deref().unwrap_or_default();
    let mut payload = downward_api::collect(items, pod, node_allocatable, default_mode)?;
    apply_fs_group(&mut payload, owner.fs_group);
    Ok(payload)
}

/// A projected volume (upstream projected `collectData`): the sources in order, a later
/// one winning a shared path; every failing source reported.
pub fn projected(
    source: &ProjectedVolumeSource,
    pod: &Pod,
    objects: &ApiObjects,
    owner: Ownership,
) -> Result<Payload, PayloadError> {
    let default_mode = mode("defaultMode", source.default_mode, DEFAULT_MODE)?;
    let mut payload = Payload::new();
    let mut errs = Vec::new();
    for projection in source.sources.iter().flatten() {
        match projection_files(projection, pod, objects, owner, default_mode) {
            Ok(files) => payload.extend(files),
            Err(e) => errs.push(e),
        }
    }
    aggregate(errs)?;
    apply_fs_group(&mut payload, owner.fs_group);
    Ok(payload)
}

/// The files of one source of a projected volume, before the fsGroup rule.
fn projection_files(
    projection: &VolumeProjection,
    pod: &Pod,
    objects: &ApiObjects,
    owner: Ownership,
    default_mode: u32,
) -> Result<Payload, PayloadError> {
    if let Some(s) = &projection.secret {
        let optional = s.optional.unwrap_or(false);
        match lookup(&objects.secrets, "secrets", &s.name, optional)? {
            Some(object) => secret_files(s.items.as_deref(), object, default_mode, optional),
            None => Ok(Payload::new()),
        }
    } else if let Some(cm) = &projection.config_map {
        let optional = cm.optional.unwrap_or(false);
        match lookup(&objects.config_maps, "configmaps", &cm.name, optional)? {
            Some(object) => config_map_files(cm.items.as_deref(), object, default_mode, optional),
            None => Ok(Payload::new()),
        }
    } else if let Some(d) = &projection.downward_api {
        let items = d.items.as_deref().unwrap_or_default();
        downward_api::collect(items, pod, &objects.node_allocatable, default_mode)
    } else if let Some(t) = &projection.service_account_token {
        let key = TokenRequestKey::of(t);
        let token = match objects.tokens.get(&key) {
            Some(Ok(token)) => token.clone(),
            Some(Err(e)) => return Err(PayloadError::Fetch(e.clone())),
            None => {
                return Err(PayloadError::Fetch(format!(
                    "service account token for audience {:?} and {} seconds was not fetched",
                    key.audience, key.expiration_seconds
                )));
            }
        };
        // Upstream: "When FsGroup is set, we depend on SetVolumeOwnership to change from
        // 0600 to 0640."
        let owned = owner.fs_user.is_some() || owner.fs_group.is_some();
        let file = FileProjection {
            data: token,
            mode: if owned {
                TOKEN_MODE_WITH_OWNER
            } else {
                default_mode
            },
            uid: owner.fs_user,
            gid: None,
        };
        Ok(Payload::from([(clean(&t.path), file)]))
    } else if projection.cluster_trust_bundle.is_some() {
        Err(PayloadError::Unsupported("clusterTrustBundle"))
    } else if projection.pod_certificate.is_some() {
        Err(PayloadError::Unsupported("podCertificate"))
    } else {
        Ok(Payload::new())
    }
}

/// `Ok(Some(object))`, `Ok(None)` for a missing optional object, or upstream's NotFound.
fn exists<'a, T>(
    object: Option<&'a T>,
    optional: bool,
    resource: &'static str,
    name: &str,
) -> Result<Option<&'a T>, PayloadError> {
    match object {
        Some(o) => Ok(Some(o)),
        None if optional => Ok(None),
        None => Err(PayloadError::NotFound {
            resource,
            name: name.into(),
        }),
    }
}

fn config_map_files(
    items: Option<&[KeyToPath]>,
    cm: &ConfigMap,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, PayloadError> {
    let data = cm.data.iter().flatten().map(|(k, v)| (k, v.as_bytes()));
    let binary = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| (k, v.0.as_slice()));
    let all: BTreeMap<&String, &[u8]> = data.chain(binary).collect();
    key_files(
        items,
        &all,
        default_mode,
        optional,
        PayloadError::MissingConfigMapKey,
    )
}

fn secret_files(
    items: Option<&[KeyToPath]>,
    secret: &Secret,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, PayloadError> {
    // `stringData` is write-only: the API server has already merged it into `data`.
    let all: BTreeMap<&String, &[u8]> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k, v.0.as_slice()))
        .collect();
    key_files(
        items,
        &all,
        default_mode,
        optional,
        PayloadError::MissingSecretKey,
    )
}

/// Upstream `MakePayload`'s body: every key as a file at `defaultMode`, or with `items`
/// only the listed keys, each at its `path` and `mode`; a missing key is an error unless
/// the volume is optional.
fn key_files(
    items: Option<&[KeyToPath]>,
    all: &BTreeMap<&String, &[u8]>,
    default_mode: u32,
    optional: bool,
    missing: fn(String) -> PayloadError,
) -> Result<Payload, PayloadError> {
    let items = items.unwrap_or_default();
    if items.is_empty() {
        return Ok(all
            .iter()
            .map(|(k, v)| (clean(k), FileProjection::new(*v, default_mode)))
            .collect());
    }
    let mut payload = Payload::new();
    for (i, item) in items.iter().enumerate() {
        let Some(content) = all.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(missing(item.key.clone()));
        };
        let mode = mode(&format!("items[{i}].mode"), item.mode, default_mode)?;
        payload.insert(clean(&item.path), FileProjection::new(*content, mode));
    }
    Ok(payload)
}

/// A mode field: unset is `default`; valid is 0..=0777.
fn mode(field: &str, value: Option<i32>, default: u32) -> Result<u32, PayloadError> {
    match value {
        None => Ok(default),
        Some(v) if (0..=0o777).contains(&v) => Ok(v as u32),
        Some(value) => Err(PayloadError::InvalidMode {
            field: field.into(),
            value,
        }),
    }
}

/// With an fsGroup, every file gets the group and owner- and group-read.
fn apply_fs_group(payload: &mut Payload, fs_group: Option<u32>) {
    if let Some(group) = fs_group {
        for file in payload.values_mut() {
            file.gid = Some(group);
            file.mode |= FS_GROUP_MODE;
        }
    }
}

/// Drops empty and `.` elements so that `a//b` and `./a/b` name one file when sources are
/// merged. `..` is kept: the atomic writer refuses it, and it must never be cleaned away
/// (`a/../b` is an attack, not `b`). An absolute path, or one with nothing left, is kept
/// as it is for the writer to refuse with upstream's message.
fn clean(path: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        path.to_string()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests;
