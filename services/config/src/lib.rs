//! Configuration shared by every service: one `KubeletConfiguration` file in the upstream
//! format, overridden by upstream-named command-line flags, resolved once at start-up into
//! a typed [`Config`] that is passed down by value.

mod address;
pub mod aggregate;
pub mod certificate;
pub mod cgroup_name;
pub mod cgroupfs;
pub mod cpuset;
pub mod duration;
pub mod events;
pub mod eviction;
mod kube_client;
mod kubelet_config;
pub mod machine;
pub mod names;
pub mod pod_level;
pub mod quantity;
pub mod state;
pub mod status_patch;
pub mod upstream_flags;
mod vsock;

pub use address::Address;
pub use kube_client::kube_client;
pub use kubelet_config::{
    API_VERSION, KIND, KubeletAnonymousAuthentication, KubeletAuthentication, KubeletAuthorization,
    KubeletConfiguration, KubeletWebhookAuthentication, KubeletWebhookAuthorization,
    KubeletX509Authentication,
};
pub use upstream_flags::UpstreamFlags;
pub use vsock::VsockAuth;

use clap::Args;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The seven services, by the names used for their sockets, units and binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    ConfigSource,
    PodSync,
    Pleg,
    Probe,
    Volume,
    NodeStatus,
    HttpServer,
}

impl Service {
    pub const ALL: [Service; 7] = [
        Service::ConfigSource,
        Service::PodSync,
        Service::Pleg,
        Service::Probe,
        Service::Volume,
        Service::NodeStatus,
        Service::HttpServer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::ConfigSource => "config-source",
            Service::PodSync => "pod-sync",
            Service::Pleg => "pleg",
            Service::Probe => "probe",
            Service::Volume => "volume",
            Service::NodeStatus => "node-status",
            Service::HttpServer => "http-server",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Flags every service accepts (upstream names where upstream has the flag).
#[derive(Debug, Clone, Default, Args)]
pub struct KubeletFlags {
    /// The KubeletConfiguration file (kubelet.config.k8s.io/v1beta1). Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A drop-in directory of KubeletConfiguration documents merged over `--config`
    /// (upstream's `--config-dir`, KEP-3983): its `*.conf` files in alphanumeric order,
    /// each a whole document (apiVersion and kind included); structures and maps merge
    /// field by field, lists and scalars are replaced. Flags override both.
    #[arg(long = "config-dir")]
    pub config_dir: Option<PathBuf>,
    /// kubeconfig of the API server; without it the node runs standalone (static pods only).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig used to request the node's client certificate when --kubeconfig does not
    /// exist yet (or its certificate expired); node-status then writes --kubeconfig.
    #[arg(long)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Directory for the node agent's files (volume mounts, plugin state).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Static pod manifest directory or file (overrides staticPodPath).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// CRI runtime endpoint (overrides containerRuntimeEndpoint).
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// The node's name, instead of the hostname.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// Directory of the services' gRPC sockets (node-agent specific).
    #[arg(long, default_value = "/run/nodeagent")]
    pub socket_dir: PathBuf,
    /// Override one service's address, as NAME=ADDRESS (e.g. probe=vsock://3:1024); repeatable.
    #[arg(long = "service-endpoint", value_name = "NAME=ADDRESS")]
    pub service_endpoints: Vec<String>,
    /// Peer CIDs allowed to connect to our vsock endpoints, comma-separated (required with
    /// any vsock endpoint); `CID=SERVICE+SERVICE` limits a CID to those gRPC services
    /// (`kubelet.v1.Prober`; health checks always pass).
    #[arg(long, value_delimiter = ',', value_name = "CID[=SERVICE+...],...")]
    pub vsock_allowed_cids: Vec<String>,
    /// File holding the shared secret that every call over vsock carries (required with
    /// any vsock endpoint; not readable by others).
    #[arg(long, value_name = "PATH")]
    pub vsock_secret_file: Option<PathBuf>,
    /// Read-only kubelet API port (overrides readOnlyPort; 0 disables).
    #[arg(long)]
    pub read_only_port: Option<u16>,
    /// Healthz port (overrides healthzPort; 0 disables).
    #[arg(long)]
    pub healthz_port: Option<u16>,
    /// The kubelet API's secure port (overrides port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Where the self-signed serving pair (kubelet.crt, kubelet.key) is kept when
    /// tlsCertFile and tlsPrivateKeyFile are unset.
    #[arg(long, default_value = "/var/lib/kubelet/pki")]
    pub cert_dir: PathBuf,
    /// Serving certificate of port 10250 (overrides tlsCertFile).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving private key of port 10250 (overrides tlsPrivateKeyFile).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// Client CA bundle for x509 authentication (overrides authentication.x509.clientCAFile).
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Allow anonymous requests to port 10250 (overrides authentication.anonymous.enabled).
    /// A boolean as pflag reads it: bare for true, `=false` for false.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// AlwaysAllow or Webhook (overrides authorization.mode).
    #[arg(long)]
    pub authorization_mode: Option<String>,
    /// Accept `authorization.mode: AlwaysAllow` together with webhook (bearer token)
    /// authentication on a node with an API server, which lets any token the API server
    /// accepts (any pod's service account token) exec into every pod of the node; refused
    /// without this flag (node-agent specific).
    #[arg(long)]
    pub insecure_always_allow_tokens: bool,
    /// Period of pleg's relist (node-agent specific; upstream hard-codes 1s).
    #[arg(long, default_value = "1s", value_parser = duration::parse_go_duration)]
    pub pleg_relist_period: Duration,
    /// Log format: "text" (klog's lines) or "json" (component-base's), as upstream's
    /// --logging-format; over the config file's `logging.format` (default text).
    #[arg(long)]
    pub logging_format: Option<String>,
    /// Log verbosity, as upstream (`-v 2`, `--v=2`): 0 info, 4 debug, 6 trace; over the
    /// config file's `logging.verbosity` (default 0). RUST_LOG overrides.
    #[arg(short = 'v', long)]
    pub v: Option<u8>,
    /// Per-file verbosity, as klog's `--vmodule`: a comma-separated list of `pattern=N`,
    /// each pattern a source file's name without its extension (`runtime_calls`), or a
    /// glob (`sync*`), or a path suffix (`pod-sync/src/sync/*`); over the config file's
    /// `logging.vmodule`.
    #[arg(long)]
    pub vmodule: Option<String>,
    /// OTLP/gRPC endpoint for traces; unset disables export.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Dead containers kept per container of a pod by the container GC (upstream's
    /// deprecated flag of the same name; < 0 keeps all).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: i32,
    /// How long a dead container is kept before the container GC may remove it.
    #[arg(long, default_value = "0", value_parser = duration::parse_go_duration)]
    pub minimum_container_ttl_duration: Duration,
    /// How often the image GC checks the image filesystem (node-agent specific; upstream
    /// hard-codes 5m).
    #[arg(long, default_value = "5m", value_parser = duration::parse_go_duration)]
    pub image_gc_period: Duration,
    /// How often the container GC runs (node-agent specific; upstream hard-codes
    /// `ContainerGCPeriod`, 1m).
    #[arg(long, default_value = "1m", value_parser = duration::parse_go_duration)]
    pub container_gc_period: Duration,
    /// How often the eviction manager and node-status read the pressure signals
    /// (node-agent specific; upstream hard-codes `evictionMonitoringPeriod`, 10s).
    #[arg(long, default_value = "10s", value_parser = duration::parse_go_duration)]
    pub eviction_monitoring_period: Duration,
    /// How many of the runtime's expensive calls (sandbox and container creation, start
    /// and removal) pod-sync makes at once (node-agent specific; upstream does not bound
    /// them). 0, the default: a bound that follows the runtime's throughput, rising while
    /// more calls at once get more done and coming down when they do not.
    #[arg(long, default_value_t = 0)]
    pub max_parallel_runtime_calls: usize,
    /// How long a kubelet API connection with no request under way stays open (node-agent
    /// specific; upstream hard-codes its server's IdleTimeout, 90s; 0: never closed).
    #[arg(long, default_value = "90s", value_parser = duration::parse_go_duration)]
    pub http_idle_timeout: Duration,
    /// A port on 127.0.0.1 serving the node's web page (`/ui/`, with `/pods` and
    /// `/containerLogs` it reads) in plain HTTP to root's processes only, without
    /// credentials, for an operator on the node (node-agent specific; 0, the default: off).
    /// Below 1024, so that no unprivileged user can take it first.
    #[arg(long, default_value_t = 0)]
    pub ui_loopback_port: u16,
    /// How often http-server takes a point of the node page's history (node-agent
    /// specific; the page keeps 240 points: an hour at the default 15s; 0: no history is
    /// kept, which the tests' nodes use, since every node of the suite would sample).
    #[arg(long, default_value = "15s", value_parser = duration::parse_go_duration)]
    pub ui_history_period: Duration,
    /// The node's IP addresses (upstream --node-ip): one, or an IPv4 and an IPv6 one
    /// comma-separated, each an address of this host; the first is the node's InternalIP.
    /// Unset: the address of the default route's interface, as upstream's.
    #[arg(long, value_name = "IP[,IP]")]
    pub node_ip: Option<String>,
    /// Labels the Node is registered with (upstream --node-labels), `key=value,...`.
    #[arg(long, value_delimiter = ',', value_name = "KEY=VALUE,...")]
    pub node_labels: Vec<String>,
    /// `external` (upstream --cloud-provider): the Node is registered with the
    /// `node.cloudprovider.kubernetes.io/uninitialized` taint, and addresses a cloud
    /// controller set are left alone.
    #[arg(long)]
    pub cloud_provider: Option<String>,
    /// Upstream kubelet flags found on the command line besides ours (see
    /// [`upstream_flags::split`]).
    #[arg(skip)]
    pub upstream: UpstreamFlags,
}

/// A configuration that cannot be used; the message says which setting and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("failed to read kubelet config file {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config file is not a valid KubeletConfiguration document.
    #[error("failed to parse kubelet config file {path:?}: {reason}")]
    Parse { path: PathBuf, reason: String },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The resolved configuration of one service.
#[derive(Debug, Clone)]
pub struct Config {
    pub kubelet: KubeletConfiguration,
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: the credentials of the client certificate's bootstrap.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub root_dir: PathBuf,
    /// `--cert-dir`: the self-signed serving pair lives here.
    pub cert_dir: PathBuf,
    pub node_name: String,
    pub runtime_endpoint: Address,
    pub endpoints: BTreeMap<Service, Address>,
    /// Set when any endpoint is vsock (then it is required).
    pub vsock_auth: Option<VsockAuth>,
    pub pleg_relist_period: Duration,
    pub logging_format: String,
    pub verbosity: u8,
    /// `--vmodule` or `logging.vmodule`: (file pattern, verbosity).
    pub vmodule: Vec<(String, u8)>,
    pub otlp_endpoint: Option<String>,
    /// The container GC's keep count and minimum age (see [`KubeletFlags`]).
    pub maximum_dead_containers_per_container: i32,
    pub minimum_container_ttl_duration: Duration,
    pub image_gc_period: Duration,
    /// See [`KubeletFlags::http_idle_timeout`].
    pub http_idle_timeout: Duration,
    /// See [`KubeletFlags::ui_loopback_port`] (0: off).
    pub ui_loopback_port: u16,
    /// See [`KubeletFlags::ui_history_period`] (zero: none kept).
    pub ui_history_period: Duration,
    /// See [`KubeletFlags::container_gc_period`].
    pub container_gc_period: Duration,
    /// See [`KubeletFlags::eviction_monitoring_period`].
    pub eviction_monitoring_period: Duration,
    /// See [`KubeletFlags::max_parallel_runtime_calls`] (0: adaptive).
    pub max_parallel_runtime_calls: usize,
    /// Config-file fields this node agent accepts but does not act on.
    pub ignored_fields: Vec<String>,
    /// Upstream kubelet flags this node agent accepts but does not act on.
    pub ignored_flags: Vec<String>,
    /// `--node-ip`: the node's addresses, the primary first (empty: detected).
    pub node_ips: Vec<std::net::IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--cloud-provider=external`.
    pub external_cloud_provider: bool,
}

impl Config {
    /// Reads the config file (if any), applies the flags, and validates the result.
    pub fn load(flags: &KubeletFlags) -> Result<Self, ConfigError> {
        let (mut kubelet, ignored_fields, ignored_flags) = load_document(
            flags.config.as_deref(),
            flags.config_dir.as_deref(),
            &flags.upstream,
        )?;
        if let Some(p) = &flags.pod_manifest_path {
            kubelet.static_pod_path = Some(p.clone());
        }
        if let Some(e) = &flags.container_runtime_endpoint {
            kubelet.container_runtime_endpoint = e.clone();
        }
        if let Some(p) = flags.read_only_port {
            kubelet.read_only_port = p;
        }
        if let Some(p) = flags.healthz_port {
            kubelet.healthz_port = p;
        }
        if let Some(p) = flags.port {
            kubelet.port = p;
        }
        if let Some(f) = &flags.tls_cert_file {
            kubelet.tls_cert_file = Some(f.clone());
        }
        if let Some(f) = &flags.tls_private_key_file {
            kubelet.tls_private_key_file = Some(f.clone());
        }
        if let Some(f) = &flags.client_ca_file {
            kubelet.authentication.x509.client_ca_file = Some(f.clone());
        }
        if let Some(a) = flags.anonymous_auth {
            kubelet.authentication.anonymous.enabled = a;
        }
        if let Some(m) = &flags.authorization_mode {
            kubelet.authorization.mode = m.clone();
        }
        kubelet.validate().map_err(ConfigError::Invalid)?;
        kubelet.apply_reserved_system_cpus();
        let has_api_server = flags.kubeconfig.is_some() || flags.bootstrap_kubeconfig.is_some();
        if has_api_server
            && kubelet.authorization.mode == "AlwaysAllow"
            && kubelet.authentication.webhook.enabled
            && !flags.insecure_always_allow_tokens
        {
            return Err(ConfigError::Invalid(
                "authorization.mode AlwaysAllow with authentication.webhook.enabled on a node \
                 with an API server lets any bearer token the API server accepts (any pod's \
                 service account token) exec into every pod of this node: use \
                 authorization.mode: Webhook (upstream's default), or set \
                 authentication.webhook.enabled: false, or pass \
                 --insecure-always-allow-tokens to accept it"
                    .into(),
            ));
        }

        let runtime_endpoint = kubelet
            .container_runtime_endpoint
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("containerRuntimeEndpoint: {e}")))?;
        let endpoints = endpoints(&flags.socket_dir, &flags.service_endpoints)?;
        let vsock_auth = vsock::resolve(
            endpoints.values(),
            &flags.vsock_allowed_cids,
            flags.vsock_secret_file.as_deref(),
        )?;
        let verbosity = flags.v.unwrap_or(kubelet.logging.verbosity);
        let vmodule = match &flags.vmodule {
            Some(text) => parse_vmodule(text).map_err(ConfigError::Invalid)?,
            None => kubelet
                .logging
                .vmodule
                .iter()
                .map(|i| (i.file_pattern.clone(), i.verbosity))
                .collect(),
        };
        let logging_format = flags
            .logging_format
            .clone()
            .unwrap_or_else(|| kubelet.logging.format.clone());
        if !matches!(logging_format.as_str(), "text" | "json") {
            let which = match flags.logging_format {
                Some(_) => "--logging-format",
                None => "logging.format",
            };
            return Err(ConfigError::Invalid(format!(
                "{which} {logging_format:?}: want \"text\" or \"json\""
            )));
        }
        if flags.pleg_relist_period.is_zero() {
            return Err(ConfigError::Invalid(
                "--pleg-relist-period must be greater than zero".into(),
            ));
        }
        for (flag, period) in [
            ("--image-gc-period", flags.image_gc_period),
            ("--container-gc-period", flags.container_gc_period),
            (
                "--eviction-monitoring-period",
                flags.eviction_monitoring_period,
            ),
        ] {
            if period.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "{flag} must be greater than zero"
                )));
            }
        }
        let node_name = match &flags.hostname_override {
            Some(name) => name.trim().to_lowercase(),
            None => nix::unistd::gethostname()
                .map_err(|e| ConfigError::Invalid(format!("cannot read the hostname: {e}")))?
                .to_string_lossy()
                .trim()
                .to_lowercase(),
        };
        if node_name.is_empty() {
            return Err(ConfigError::Invalid(
                "the node name is empty; set --hostname-override".into(),
            ));
        }
        if flags.ui_loopback_port >= 1024 {
            return Err(ConfigError::Invalid(format!(
                "--ui-loopback-port={}: must be below 1024 (a privileged port, so that no \
                 unprivileged user can bind it first and serve root a page of its own)",
                flags.ui_loopback_port
            )));
        }
        Ok(Self {
            kubelet,
            kubeconfig: flags.kubeconfig.clone(),
            bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
            root_dir: flags.root_dir.clone(),
            cert_dir: flags.cert_dir.clone(),
            node_name,
            runtime_endpoint,
            endpoints,
            vsock_auth,
            pleg_relist_period: flags.pleg_relist_period,
            logging_format,
            verbosity,
            vmodule,
            otlp_endpoint: flags.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            maximum_dead_containers_per_container: flags.maximum_dead_containers_per_container,
            minimum_container_ttl_duration: flags.minimum_container_ttl_duration,
            image_gc_period: flags.image_gc_period,
            http_idle_timeout: flags.http_idle_timeout,
            ui_loopback_port: flags.ui_loopback_port,
            ui_history_period: flags.ui_history_period,
            container_gc_period: flags.container_gc_period,
            eviction_monitoring_period: flags.eviction_monitoring_period,
            max_parallel_runtime_calls: flags.max_parallel_runtime_calls,
            ignored_fields,
            ignored_flags,
            node_ips: node_ips(flags.node_ip.as_deref())?,
            node_labels: node_labels(&flags.node_labels)?,
            external_cloud_provider: match flags.cloud_provider.as_deref() {
                None | Some("") => false,
                Some("external") => true,
                Some(other) => {
                    return Err(ConfigError::Invalid(format!(
                        "--cloud-provider {other:?}: only \"external\" (or none) is supported, as upstream since in-tree cloud providers were removed"
                    )));
                }
            },
        })
    }

    /// The address a service serves on.
    pub fn endpoint(&self, service: Service) -> &Address {
        // `endpoints` is filled for every service in `load`.
        &self.endpoints[&service]
    }
}

/// The config file (if any) with the upstream flags' values over it: the configuration,
/// the file's fields accepted but not acted on, and the flags likewise.
fn load_document(
    path: Option<&Path>,
    config_dir: Option<&Path>,
    upstream: &UpstreamFlags,
) -> Result<(KubeletConfiguration, Vec<String>, Vec<String>), ConfigError> {
    let mut doc = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            document(&text).map_err(|reason| ConfigError::Parse {
                path: path.to_owned(),
                reason,
            })?
        }
        None => serde_json::Map::new(),
    };
    if let Some(dir) = config_dir {
        merge_drop_ins(&mut doc, dir)?;
    }
    let parse_error = |reason| match path {
        Some(path) => ConfigError::Parse {
            path: path.to_owned(),
            reason,
        },
        None => ConfigError::Invalid(reason),
    };
    let (config, ignored_fields, mut ignored_flags) = from_document(doc, &upstream.fields)
        .map_err(|e| match e {
            DocumentError::Flag(why) => ConfigError::Invalid(why),
            DocumentError::Field(why) => parse_error(why),
        })?;
    ignored_flags.extend(upstream.ignored.iter().cloned());
    ignored_flags.sort();
    ignored_flags.dedup();
    Ok((config, ignored_fields, ignored_flags))
}

/// `--config-dir`: merges the directory's `*.conf` documents over `doc`, in alphanumeric
/// order of their names (upstream's `mergeKubeletConfigurations`). A directory that cannot
/// be read, or a file that is not a KubeletConfiguration document (apiVersion and kind
/// included, as upstream requires of each), stops the load with the file's name.
fn merge_drop_ins(
    doc: &mut serde_json::Map<String, serde_json::Value>,
    dir: &Path,
) -> Result<(), ConfigError> {
    let read_error = |path: &Path, source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_error(dir, e))? {
        let entry = entry.map_err(|e| read_error(dir, e))?;
        let path = entry.path();
        let is_file = entry
            .file_type()
            .map_err(|e| read_error(&path, e))?
            .is_file()
            || path.metadata().is_ok_and(|m| m.is_file());
        if is_file && path.extension().is_some_and(|e| e == "conf") {
            files.push(path);
        }
    }
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| read_error(&path, e))?;
        let parse_error = |reason: String| ConfigError::Parse {
            path: path.clone(),
            reason,
        };
        let drop_in = document(&text).map_err(parse_error)?;
        for (field, want) in [
            ("apiVersion", kubelet_config::API_VERSION),
            ("kind", kubelet_config::KIND),
        ] {
            let got = drop_in.get(field).and_then(|v| v.as_str());
            if got != Some(want) {
                return Err(parse_error(format!(
                    "{field}: {got:?}, want {want:?}: each drop-in is a whole KubeletConfiguration document"
                )));
            }
        }
        merge_object(doc, drop_in);
    }
    Ok(())
}

/// JSON merge patch (RFC 7386): objects merge key by key, a null removes the key, anything
/// else (lists included) replaces what was there.
fn merge_object(
    into: &mut serde_json::Map<String, serde_json::Value>,
    patch: serde_json::Map<String, serde_json::Value>,
) {
    for (key, value) in patch {
        match (into.get_mut(&key), value) {
            (_, serde_json::Value::Null) => {
                into.remove(&key);
            }
            (Some(serde_json::Value::Object(old)), serde_json::Value::Object(new)) => {
                merge_object(old, new)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// A KubeletConfiguration document (YAML or JSON) as a JSON object.
fn document(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
        // The first line names the place; the rest is a source snippet.
        let text = e.to_string();
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string()
    })?;
    match value {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("the document is not a mapping".into()),
    }
}

enum DocumentError {
    /// A flag's value does not fit its field.
    Flag(String),
    /// The document (with the flags' values) is not a KubeletConfiguration.
    Field(String),
}

fn from_document(
    mut doc: serde_json::Map<String, serde_json::Value>,
    flag_fields: &[(String, String, String)],
) -> Result<(KubeletConfiguration, Vec<String>, Vec<String>), DocumentError> {
    let defaults = kubelet_config::default_document();
    let mut ignored_fields = upstream_flags::unknown_fields(&doc, &defaults);
    let ignored_flags =
        upstream_flags::apply(&mut doc, &defaults, flag_fields).map_err(DocumentError::Flag)?;
    // The gates not acted on are named as fields are.
    if let Some(serde_json::Value::Object(gates)) = doc.get("featureGates") {
        ignored_fields.extend(
            gates
                .keys()
                .filter(|g| !kubelet_config::KNOWN_FEATURE_GATES.contains(&g.as_str()))
                .map(|g| format!("featureGates.{g}")),
        );
    }
    let mut config: KubeletConfiguration =
        serde_path_to_error::deserialize(serde_json::Value::Object(doc))
            .map_err(|e| DocumentError::Field(format!("{}: {}", e.path(), e.inner())))?;
    config.apply_upstream_defaults();
    Ok((config, ignored_fields, ignored_flags))
}

/// Parses a KubeletConfiguration document (YAML or JSON). Returns it with the names of the
/// fields, at any depth, that are accepted but not acted on.
pub fn parse(text: &str) -> Result<(KubeletConfiguration, Vec<String>), String> {
    let (config, ignored, _) = from_document(document(text)?, &[]).map_err(|e| match e {
        DocumentError::Flag(why) | DocumentError::Field(why) => why,
    })?;
    Ok((config, ignored))
}

/// `--node-ip`: one address, or one of each family, as upstream's `ParseNodeIPArgument`;
/// `0.0.0.0` or `::` alone means "detect" (only the family is kept upstream; we detect).
fn node_ips(flag: Option<&str>) -> Result<Vec<std::net::IpAddr>, ConfigError> {
    let Some(flag) = flag.filter(|f| !f.is_empty()) else {
        return Ok(Vec::new());
    };
    let bad = |why: &str| ConfigError::Invalid(format!("--node-ip {flag:?}: {why}"));
    let ips = flag
        .split(',')
        .map(|s| s.trim().parse::<std::net::IpAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad("could not parse as an IP address"))?;
    match ips.as_slice() {
        [ip] if ip.is_unspecified() => Ok(Vec::new()),
        [_] => Ok(ips),
        [a, b] if a.is_ipv4() != b.is_ipv4() && !a.is_unspecified() && !b.is_unspecified() => {
            Ok(ips)
        }
        [_, _] => Err(bad(
            "dual-stack --node-ip must be one IPv4 and one IPv6 address",
        )),
        _ => Err(bad(
            "must contain either a single IP or a dual-stack pair of IPs",
        )),
    }
}

/// `--node-labels key=value,...` (a key may carry a prefix: `node-role.kubernetes.io/x=`).
fn node_labels(flag: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    flag.iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!("--node-labels {l:?}: want key=value"))
            })?;
            if k.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "--node-labels {l:?}: the key is empty"
                )));
            }
            Ok((k.to_string(), v.to_string()))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()
        .and_then(|labels| {
            let unknown = upstream_forbidden_labels(&labels);
            if unknown.is_empty() {
                Ok(labels)
            } else {
                Err(ConfigError::Invalid(format!(
                    "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {unknown:?}\n\
                     --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix ({}) or be in the specifically allowed set ({})",
                    KUBELET_LABEL_NAMESPACES.join(", "),
                    KUBELET_LABELS.join(", ")
                )))
            }
        })
}

/// The label namespaces and labels a kubelet may set on its own Node (upstream's
/// `kubeletapis.KubeletLabelNamespaces` and `KubeletLabels`, which the NodeRestriction
/// admission plugin also enforces).
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/arch",
];

/// Labels in the `kubernetes.io` or `k8s.io` namespaces a kubelet may not set (upstream's
/// `ValidateKubeletFlags`): `node-role.kubernetes.io/control-plane` is one (kubeadm sets
/// it through the API).
fn upstream_forbidden_labels(labels: &BTreeMap<String, String>) -> Vec<String> {
    labels
        .keys()
        .filter(|k| {
            let namespace = k.split_once('/').map_or("", |(ns, _)| ns);
            let reserved = ["kubernetes.io", "k8s.io"]
                .iter()
                .any(|r| namespace == *r || namespace.ends_with(&format!(".{r}")));
            let allowed = KUBELET_LABEL_NAMESPACES
                .iter()
                .any(|a| namespace == *a || namespace.ends_with(&format!(".{a}")))
                || KUBELET_LABELS.contains(&k.as_str());
            reserved && !allowed
        })
        .cloned()
        .collect()
}

fn endpoints(
    socket_dir: &Path,
    overrides: &[String],
) -> Result<BTreeMap<Service, Address>, ConfigError> {
    let mut map: BTreeMap<Service, Address> = Service::ALL
        .into_iter()
        .map(|s| {
            (
                s,
                Address::Unix(socket_dir.join(format!("{}.sock", s.name()))),
            )
        })
        .collect();
    for o in overrides {
        let (name, addr) = o.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!("--service-endpoint {o:?}: want NAME=ADDRESS"))
        })?;
        let service = Service::from_name(name).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "--service-endpoint {o:?}: unknown service {name:?}"
            ))
        })?;
        let addr = addr
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("--service-endpoint {o:?}: {e}")))?;
        map.insert(service, addr);
    }
    Ok(map)
}

impl Config {
    /// A client of the API server named by `--kubeconfig`; None on a standalone node.
    /// With `--bootstrap-kubeconfig` and no usable `--kubeconfig` yet, waits for
    /// node-status to bootstrap the client certificate and write it.
    pub async fn api_client(&self) -> anyhow::Result<Option<kube::Client>> {
        let Some(path) = &self.kubeconfig else {
            return Ok(None);
        };
        if self.bootstrap_kubeconfig.is_some() {
            let mut polls = 0u32;
            while !certificate::kubeconfig_usable(path) {
                if polls.is_multiple_of(20) {
                    tracing::info!(kubeconfig = %path.display(),
                        "waiting for node-status to bootstrap the client certificate");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                polls += 1;
            }
        }
        Ok(Some(kube_client(path).await?))
    }
}

#[cfg(test)]
mod tests;

/// klog's `--vmodule` value: `pattern=N[,pattern=N...]` (klog's `moduleSpec.Set`: an
/// empty value is no patterns; a pattern must not be empty, N must be a number).
pub fn parse_vmodule(text: &str) -> Result<Vec<(String, u8)>, String> {
    let syntax =
        || format!("--vmodule {text:?}: syntax error: expect comma-separated list of filename=N");
    text.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (pattern, level) = part.split_once('=').ok_or_else(syntax)?;
            if pattern.is_empty() {
                return Err(syntax());
            }
            let level = level.parse::<u8>().map_err(|_| syntax())?;
            Ok((pattern.to_string(), level))
        })
        .collect()
}
