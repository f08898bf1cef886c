//! Upstream's plugin manager for CSI drivers (`pkg/kubelet/pluginmanager`, the CSI
//! plugin's `RegistrationHandler`): watches `<root-dir>/plugins_registry` for registration
//! sockets, runs the handshake with each (`GetInfo`, validation, `NodeGetInfo` on the
//! driver's endpoint, `NotifyRegistrationStatus`), and keeps the drivers registered. A
//! socket that goes away (or is replaced, as when a registrar restarts) deregisters its
//! driver; a failed handshake is retried with back-off. The node's CSINode object and
//! `csi.volume.kubernetes.io/nodeid` annotation follow (`nodeinfo`).
//!
//! Nothing here is persisted: a restarted volume service finds the sockets again, as
//! upstream's kubelet does at its start.

use super::nodeinfo::NodeInfo;
use nodeagent_config::Address;
use nodeagent_proto::csi::NodeGetInfoRequest;
use nodeagent_proto::csi::node_client::NodeClient;
use nodeagent_proto::pluginregistration::registration_client::RegistrationClient;
use nodeagent_proto::pluginregistration::{InfoRequest, RegistrationStatus};
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The directory below the root dir where registrars put their sockets (upstream's
/// `plugins_registry`).
pub const REGISTRY_DIR: &str = "plugins_registry";
/// How often the directory is read again (upstream's reconciler loops every second).
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// Upstream's timeouts: `GetInfo` 1 s, `NotifyRegistrationStatus` 5 s, `NodeGetInfo` 2 min.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// A failed handshake is tried again after this, doubling up to `RETRY_MAX` (upstream's
/// operation back-off: 500 ms doubling to 2 min).
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(120);
/// How deep below the registry directory sockets are looked for.
const MAX_DEPTH: u32 = 8;
/// The CSI plugin type a registrar announces (upstream's `CSIPlugin`).
pub const CSI_PLUGIN: &str = "CSIPlugin";

/// A registered CSI driver.
#[derive(Debug, Clone)]
pub struct Driver {
    pub name: String,
    /// Its CSI endpoint.
    pub endpoint: PathBuf,
    pub node_id: String,
    /// The CSI version chosen at registration (the highest 1.x offered).
    pub version: Version,
}

impl Driver {
    pub fn node_client(&self) -> NodeClient<nodeagent_transport::Channel> {
        NodeClient::new(nodeagent_transport::connect(&Address::Unix(
            self.endpoint.clone(),
        )))
    }
}

/// A socket as the scan last saw it: a new inode or modification time is a new
/// registrar, registered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    inode: u64,
    mtime: i64,
    mtime_nsec: i64,
}

/// What the scan knows of one socket.
#[derive(Debug)]
enum Entry {
    Registered {
        seen: Seen,
        driver: Driver,
    },
    Failed {
        seen: Seen,
        retry_at: Instant,
        backoff: Duration,
    },
}

#[derive(Default)]
struct State {
    /// Registration socket -> its state.
    sockets: BTreeMap<PathBuf, Entry>,
    /// Driver name -> the driver (the last registered, of the sockets that announce it).
    drivers: BTreeMap<String, Driver>,
    /// Drivers gone whose removal from the Node and CSINode failed: tried again each scan.
    uninstall: std::collections::BTreeSet<String>,
}

#[derive(Clone)]
pub struct Registry {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    node: NodeInfo,
}

impl Registry {
    pub fn new(root_dir: &Path, node: NodeInfo) -> Self {
        Self {
            dir: root_dir.join(REGISTRY_DIR),
            state: Arc::default(),
            node,
        }
    }

    /// The driver registered under `name`, or upstream's error.
    pub fn driver(&self, name: &str) -> Result<Driver, String> {
        self.state
            .lock()
            .unwrap()
            .drivers
            .get(name)
            .cloned()
            .ok_or_else(|| {
                format!("driver name {name} not found in the list of registered CSI drivers")
            })
    }

    /// Watches the registry directory until `shutdown`. The first pass also drops from
    /// the node's CSINode the drivers no socket announces any more (a driver removed
    /// while this service was down).
    pub async fn run(self, shutdown: nodeagent_transport::Shutdown) {
        // Upstream's `MkdirAll(path, 0755)`.
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.dir);
        if let Err(e) = made {
            tracing::error!(dir = %self.dir.display(), error = %e, "cannot create the plugin registry directory; no CSI driver can register");
            return;
        }
        tracing::info!(dir = %self.dir.display(), "watching for CSI driver registrations");
        // Until it succeeds once (the Node may not be registered yet).
        let mut stale_drivers_checked = false;
        loop {
            self.scan().await;
            if !stale_drivers_checked {
                let names: Vec<String> =
                    self.state.lock().unwrap().drivers.keys().cloned().collect();
                match self.node.keep_only(&names).await {
                    Ok(()) => stale_drivers_checked = true,
                    Err(e) => {
                        tracing::debug!(error = %e, "the node's CSINode not checked for stale drivers yet")
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(SCAN_EVERY) => {}
                _ = shutdown.wait() => return,
            }
        }
    }

    /// One pass: registers new (or replaced) sockets, retries failed ones when due,
    /// deregisters the drivers whose socket went.
    async fn scan(&self) {
        let pending: Vec<String> = {
            let state = self.state.lock().unwrap();
            state
                .uninstall
                .iter()
                .filter(|n| !state.drivers.contains_key(*n))
                .cloned()
                .collect()
        };
        for name in pending {
            self.uninstall(&name).await;
        }
        let found = sockets(&self.dir);
        let now = Instant::now();
        let (gone, todo) = {
            let state = self.state.lock().unwrap();
            let gone: Vec<(PathBuf, Option<String>)> = state
                .sockets
                .iter()
                .filter(|(path, entry)| {
                    let seen = match entry {
                        Entry::Registered { seen, .. } | Entry::Failed { seen, .. } => seen,
                    };
                    found.get(*path) != Some(seen)
                })
                .map(|(path, entry)| {
                    let driver = match entry {
                        Entry::Registered { driver, .. } => Some(driver.name.clone()),
                        Entry::Failed { .. } => None,
                    };
                    (path.clone(), driver)
                })
                .collect();
            let todo: Vec<(PathBuf, Seen, Duration)> = found
                .iter()
                .filter_map(|(path, seen)| match state.sockets.get(path) {
                    Some(Entry::Registered { seen: s, .. }) if s == seen => None,
                    Some(Entry::Failed {
                        seen: s,
                        retry_at,
                        backoff,
                    }) if s == seen => {
                        (now >= *retry_at).then_some((path.clone(), *seen, *backoff))
                    }
                    _ => Some((path.clone(), *seen, Duration::ZERO)),
                })
                .collect();
            (gone, todo)
        };
        for (path, driver) in gone {
            self.state.lock().unwrap().sockets.remove(&path);
            if let Some(name) = driver {
                self.deregister(&name, &path).await;
            }
        }
        for (path, seen, backoff) in todo {
            match self.register(&path).await {
                Ok(driver) => {
                    let mut state = self.state.lock().unwrap();
                    state.uninstall.remove(&driver.name);
                    state
                        .sockets
                        .insert(path, Entry::Registered { seen, driver });
                }
                Err(e) => {
                    let backoff = (backoff * 2).clamp(RETRY_FIRST, RETRY_MAX);
                    tracing::warn!(socket = %path.display(), error = %e, retry_in = ?backoff, "plugin registration failed");
                    self.state.lock().unwrap().sockets.insert(
                        path,
                        Entry::Failed {
                            seen,
                            retry_at: Instant::now() + backoff,
                            backoff,
                        },
                    );
                }
            }
        }
    }

    /// The handshake with one registration socket; the driver registered.
    async fn register(&self, socket: &Path) -> Result<Driver, String> {
        let mut registrar = RegistrationClient::new(nodeagent_transport::connect(&Address::Unix(
            socket.to_path_buf(),
        )));
        let info = match tokio::time::timeout(GET_INFO_TIMEOUT, registrar.get_info(InfoRequest {}))
            .await
        {
            Ok(Ok(info)) => info.into_inner(),
            Ok(Err(status)) => {
                return Err(format!(
                    "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {}",
                    socket.display(),
                    crate::csi::go_rpc_error(&status)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: rpc error: code = DeadlineExceeded desc = context deadline exceeded",
                    socket.display()
                ));
            }
        };
        let result = self.register_csi(socket, &info).await;
        let status = RegistrationStatus {
            plugin_registered: result.is_ok(),
            error: result.as_ref().err().cloned().unwrap_or_default(),
        };
        if let Err(e) =
            tokio::time::timeout(NOTIFY_TIMEOUT, registrar.notify_registration_status(status))
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.message().to_string()))
        {
            tracing::warn!(socket = %socket.display(), error = %e, "NotifyRegistrationStatus failed");
        }
        result
    }

    async fn register_csi(
        &self,
        socket: &Path,
        info: &nodeagent_proto::pluginregistration::PluginInfo,
    ) -> Result<Driver, String> {
        if info.r#type != CSI_PLUGIN {
            return Err(format!(
                "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
                info.r#type,
                socket.display()
            ));
        }
        let name = &info.name;
        let endpoint = if info.endpoint.is_empty() {
            socket.to_path_buf()
        } else {
            PathBuf::from(&info.endpoint)
        };
        // Upstream's ValidatePlugin: a driver registered already is replaced only by a
        // higher version.
        let registered = self
            .state
            .lock()
            .unwrap()
            .drivers
            .get(name)
            .map(|d| d.version.clone());
        let version = validate_versions(
            "ValidatePlugin",
            name,
            &info.supported_versions,
            registered.as_ref(),
        )
        .map_err(|e| {
            format!(
                "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver {name} at endpoint {}: {e}",
                endpoint.display()
            )
        })?;
        self.register_driver(name, endpoint, version)
            .await
            .map_err(|e| {
                format!("RegisterPlugin error -- plugin registration failed with err: {e}")
            })
    }

    /// Upstream's `RegisterPlugin` past validation: NodeGetInfo, then the Node and CSINode.
    async fn register_driver(
        &self,
        name: &str,
        endpoint: PathBuf,
        version: Version,
    ) -> Result<Driver, String> {
        let mut driver = Driver {
            name: name.to_string(),
            endpoint,
            node_id: String::new(),
            version,
        };
        let node_info = tokio::time::timeout(
            CALL_TIMEOUT,
            driver.node_client().node_get_info(NodeGetInfoRequest {}),
        )
        .await
        .map_err(|_| {
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded".to_string()
        })?
        .map_err(|status| crate::csi::go_rpc_error(&status))?
        .into_inner();
        if node_info.node_id.is_empty() {
            return Err(
                "error adding CSI driver node info: driverNodeID must not be empty".to_string(),
            );
        }
        driver.node_id = node_info.node_id;
        // Upstream's CSINode `topologyKeys`: the driver's topology keys, sorted.
        let topology_keys = node_info.accessible_topology.map(|t| {
            let mut keys: Vec<String> = t.segments.into_keys().collect();
            keys.sort();
            keys
        });
        if let Err(e) = self
            .node
            .install(
                &driver.name,
                &driver.node_id,
                node_info.max_volumes_per_node,
                topology_keys,
            )
            .await
        {
            // Upstream's `unregisterDriver` after a failed install: nothing half-written
            // stays, unless another socket stands for the driver.
            if self.announced_elsewhere(name).is_none() {
                self.uninstall(name).await;
            }
            return Err(e);
        }
        self.state
            .lock()
            .unwrap()
            .drivers
            .insert(name.to_string(), driver.clone());
        tracing::info!(driver = %name, endpoint = %driver.endpoint.display(), node_id = %driver.node_id, version = %driver.version, "CSI driver registered");
        Ok(driver)
    }

    /// The driver `name` as another registered socket announces it, if one does.
    fn announced_elsewhere(&self, name: &str) -> Option<Driver> {
        let state = self.state.lock().unwrap();
        state.sockets.values().find_map(|e| match e {
            Entry::Registered { driver, .. } if driver.name == name => Some(driver.clone()),
            _ => None,
        })
    }

    async fn deregister(&self, name: &str, socket: &Path) {
        // Another socket may announce the same driver: it stands for it from now on.
        if let Some(other) = self.announced_elsewhere(name) {
            self.state
                .lock()
                .unwrap()
                .drivers
                .insert(name.to_string(), other);
            return;
        }
        self.state.lock().unwrap().drivers.remove(name);
        tracing::info!(driver = %name, socket = %socket.display(), "CSI driver deregistered: its registration socket is gone");
        self.uninstall(name).await;
    }

    /// Removes a driver no socket announces from the Node and CSINode; a failure is tried
    /// again at the next scans.
    async fn uninstall(&self, name: &str) {
        match self.node.uninstall(name).await {
            Ok(()) => {
                self.state.lock().unwrap().uninstall.remove(name);
            }
            Err(e) => {
                tracing::warn!(driver = %name, error = %e, "Error uninstalling CSI driver; tried again");
                self.state
                    .lock()
                    .unwrap()
                    .uninstall
                    .insert(name.to_string());
            }
        }
    }
}

/// The sockets in the registry directory and the directories below it (upstream's
/// watcher walks the tree; links are not followed); names starting with a dot, files and
/// directories alike, are ignored, as upstream's watcher ignores them.
fn sockets(dir: &Path) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    collect_sockets(dir, 0, &mut out);
    out
}

fn collect_sockets(dir: &Path, depth: u32, out: &mut BTreeMap<PathBuf, Seen>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_socket() {
            let seen = Seen {
                inode: meta.ino(),
                mtime: meta.mtime(),
                mtime_nsec: meta.mtime_nsec(),
            };
            out.insert(path, seen);
        } else if meta.is_dir() && depth < MAX_DEPTH {
            collect_sockets(&path, depth + 1, out);
        }
    }
}

/// A version as upstream's `ParseGeneric` reads it: two or more dot-separated numbers, a
/// leading `v` and any trailing text allowed (and ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(Vec<u64>);

impl Version {
    pub fn parse(text: &str) -> Result<Self, String> {
        let s = text.trim_start();
        let s = s.strip_prefix('v').unwrap_or(s);
        let numeric: String = s
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        // The regex's `[0-9]+(\.[0-9]+)*`: stop before a dot that no digit follows.
        let numeric = numeric.trim_end_matches('.');
        if numeric.is_empty() {
            return Err(format!("could not parse {text:?} as version"));
        }
        let parts: Vec<&str> = numeric.split('.').collect();
        if parts.len() < 2 {
            return Err(format!("illegal version string {text:?}"));
        }
        if parts[0].len() > 1 && parts[0].starts_with('0') {
            return Err(format!(
                "illegal zero-prefixed version component {:?} in {text:?}",
                parts[0]
            ));
        }
        parts
            .iter()
            .map(|p| {
                p.parse::<u64>()
                    .map_err(|_| format!("illegal version string {text:?}"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Version)
    }

    pub fn major(&self) -> u64 {
        self.0[0]
    }

    fn component(&self, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let n = self.0.len().max(other.0.len());
        (0..n)
            .map(|i| self.component(i).cmp(&other.component(i)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Upstream's `HighestSupportedVersion`: the highest version offered whose major version
/// is at most 1 (unparsable ones skipped), which must then be a 1.x.
pub fn highest_supported_version(versions: &[String]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err("empty array for supported versions".to_string());
    }
    let mut highest: Option<Version> = None;
    let mut last_error: Option<String> = None;
    for v in versions.iter().rev() {
        match Version::parse(v) {
            Err(e) => last_error = Some(e),
            Ok(v) if v.major() > 1 => {}
            Ok(v) => {
                if highest.as_ref().is_none_or(|h| *h < v) {
                    highest = Some(v);
                }
            }
        }
    }
    let Some(highest) = highest else {
        return Err(format!(
            "could not find a highest supported version from versions ([{}]) reported: {}",
            versions.join(" "),
            last_error.as_deref().unwrap_or("<nil>")
        ));
    };
    if highest.major() != 1 {
        return Err(format!(
            "highest supported version reported is {highest}, must be v1.x"
        ));
    }
    Ok(highest)
}

/// Upstream's `validateVersions` (`caller`: ValidatePlugin or RegisterPlugin): the version
/// to speak with the driver, unless one of the same name with this version or a higher one
/// is registered already.
pub fn validate_versions(
    caller: &str,
    name: &str,
    versions: &[String],
    registered: Option<&Version>,
) -> Result<Version, String> {
    if versions.is_empty() {
        return Err(format!(
            "kubernetes.io/csi: {caller} for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
        ));
    }
    let quoted: Vec<String> = versions.iter().map(|v| format!("{v:?}")).collect();
    let highest = highest_supported_version(versions).map_err(|e| {
        format!(
            "kubernetes.io/csi: {caller} for CSI driver {name:?} failed. None of the versions specified [{}] are supported. err={e}",
            quoted.join(" ")
        )
    })?;
    if let Some(existing) = registered
        && *existing >= highest
    {
        return Err(format!(
            "kubernetes.io/csi: {caller} for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: \"{existing}\""
        ));
    }
    Ok(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's plugin watcher tests (`TestPluginRegistration`,
    /// `TestPluginRegistrationAtKubeletStart`): sockets found at any depth, dot-names and
    /// plain files ignored; a socket made again is seen as new.
    #[test]
    fn the_scan_finds_sockets_and_ignores_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        let bind = |p: &Path| std::os::unix::net::UnixListener::bind(p).unwrap();
        let _a = bind(&root.join("a.sock"));
        let _b = bind(&root.join("sub/deeper/b.sock"));
        let _c = bind(&root.join(".c.sock"));
        let _d = bind(&root.join(".hidden/d.sock"));
        std::fs::write(root.join("plain.sock"), "not a socket").unwrap();
        let found = sockets(root);
        let names: Vec<&Path> = found
            .keys()
            .map(|p| p.strip_prefix(root).unwrap())
            .collect();
        assert_eq!(
            names,
            vec![Path::new("a.sock"), Path::new("sub/deeper/b.sock")]
        );
        // A registrar's new socket (bound beside the old one, then renamed over it: the
        // old inode is still in use, so the new one differs).
        let before = found[&root.join("a.sock")];
        let _new = bind(&root.join("new.tmp"));
        std::fs::rename(root.join("new.tmp"), root.join("a.sock")).unwrap();
        assert_ne!(sockets(root)[&root.join("a.sock")], before);
    }

    fn versions(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Upstream's `TestValidatePlugin` and `TestHighestSupportedVersion` (csi_plugin_test.go)
    /// rows: the versions offered, and the version chosen (None: refused).
    #[test]
    fn upstreams_version_tables() {
        let rows: &[(&[&str], Option<&str>)] = &[
            (&["v1.0.0"], Some("1.0.0")),
            (&["1.0.0"], Some("1.0.0")),
            (&["0.2.0", "v1.0.0"], Some("1.0.0")),
            (&["0.2.0", "v1.2.3"], Some("1.2.3")),
            (&["v1.2.3", "v0.3.0"], Some("1.2.3")),
            (&["v1.2.3", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&["v1.2.3", "4.9.12", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&["v1.2.3", "boo", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&["0.3.0"], None),
            (&["0.2.0"], None),
            (&["0.2.0", "v0.3.0"], None),
            (&["4.9.12", "2.0.1"], None),
            (&[], None),
            (&["var", "boo", "foo"], None),
        ];
        for (offered, want) in rows {
            let got = validate_versions("ValidatePlugin", "test.plugin", &versions(offered), None)
                .map(|v| v.to_string())
                .ok();
            assert_eq!(got.as_deref(), *want, "{offered:?}");
        }
    }

    /// Upstream's `TestValidatePluginExistingDriver` rows, and its words.
    #[test]
    fn a_driver_registered_already_is_replaced_only_by_a_higher_version() {
        let registered = Version::parse("1.0.0").unwrap();
        assert_eq!(
            validate_versions(
                "ValidatePlugin",
                "d",
                &versions(&["v1.0.0"]),
                Some(&registered)
            )
            .unwrap_err(),
            "kubernetes.io/csi: ValidatePlugin for CSI driver \"d\" failed. Another driver with the same name is already registered with a higher supported version: \"1.0.0\""
        );
        assert_eq!(
            validate_versions(
                "ValidatePlugin",
                "d",
                &versions(&["v1.0.1"]),
                Some(&registered)
            )
            .unwrap()
            .to_string(),
            "1.0.1"
        );
    }

    #[test]
    fn refusals_say_what_upstream_says() {
        assert_eq!(
            validate_versions("ValidatePlugin", "d", &versions(&["0.3.0"]), None).unwrap_err(),
            "kubernetes.io/csi: ValidatePlugin for CSI driver \"d\" failed. None of the versions specified [\"0.3.0\"] are supported. err=highest supported version reported is 0.3.0, must be v1.x"
        );
        assert_eq!(
            highest_supported_version(&versions(&["var", "boo", "foo"])).unwrap_err(),
            "could not find a highest supported version from versions ([var boo foo]) reported: could not parse \"var\" as version"
        );
        assert_eq!(
            validate_versions("RegisterPlugin", "d", &[], None).unwrap_err(),
            "kubernetes.io/csi: RegisterPlugin for CSI driver \"d\" failed. Plugin returned an empty list for supported versions"
        );
    }
}
