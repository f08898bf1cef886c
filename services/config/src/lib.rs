//! Configuration shared by every service: one `KubeletConfiguration` file in the upstream
//! format, overridden by upstream-named command-line flags, resolved once at start-up into
//! a typed [`Config`] that is passed down by value.

mod address;
pub mod certificate;
pub mod cgroupfs;
pub mod duration;
pub mod events;
pub mod eviction;
mod kube_client;
mod kubelet_config;
pub mod machine;
pub mod quantity;
pub mod state;
mod vsock;

pub use address::Address;
pub use kube_client::kube_client;
pub use kubelet_config::{
    API_VERSION, KIND, KubeletAnonymousAuthentication, KubeletAuthentication, KubeletAuthorization,
    KubeletConfiguration, KubeletWebhookAuthentication, KubeletWebhookAuthorization,
    KubeletX509Authentication,
};
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
    /// any vsock endpoint).
    #[arg(long, value_delimiter = ',', value_name = "CID,...")]
    pub vsock_allowed_cids: Vec<u32>,
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
    #[arg(long)]
    pub anonymous_auth: Option<bool>,
    /// AlwaysAllow or Webhook (overrides authorization.mode).
    #[arg(long)]
    pub authorization_mode: Option<String>,
    /// Period of pleg's relist (node-agent specific; upstream hard-codes 1s).
    #[arg(long, default_value = "1s", value_parser = duration::parse_go_duration)]
    pub pleg_relist_period: Duration,
    /// Log format: "text" or "json" (upstream --logging-format).
    #[arg(long, default_value = "text")]
    pub logging_format: String,
    /// Log verbosity, as upstream: 0 info, 4 debug, 6 trace. RUST_LOG overrides.
    #[arg(long, default_value_t = 0)]
    pub v: u8,
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
    pub otlp_endpoint: Option<String>,
    /// The container GC's keep count and minimum age (see [`KubeletFlags`]).
    pub maximum_dead_containers_per_container: i32,
    pub minimum_container_ttl_duration: Duration,
    pub image_gc_period: Duration,
    /// Config-file fields this node agent accepts but does not act on.
    pub ignored_fields: Vec<String>,
}

impl Config {
    /// Reads the config file (if any), applies the flags, and validates the result.
    pub fn load(flags: &KubeletFlags) -> Result<Self, ConfigError> {
        let (mut kubelet, ignored_fields) = match &flags.config {
            Some(path) => read_file(path)?,
            None => (KubeletConfiguration::default(), Vec::new()),
        };
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
        if !matches!(flags.logging_format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid(format!(
                "--logging-format {:?}: want \"text\" or \"json\"",
                flags.logging_format
            )));
        }
        if flags.pleg_relist_period.is_zero() {
            return Err(ConfigError::Invalid(
                "--pleg-relist-period must be greater than zero".into(),
            ));
        }
        if flags.image_gc_period.is_zero() {
            return Err(ConfigError::Invalid(
                "--image-gc-period must be greater than zero".into(),
            ));
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
            logging_format: flags.logging_format.clone(),
            verbosity: flags.v,
            otlp_endpoint: flags.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            maximum_dead_containers_per_container: flags.maximum_dead_containers_per_container,
            minimum_container_ttl_duration: flags.minimum_container_ttl_duration,
            image_gc_period: flags.image_gc_period,
            ignored_fields,
        })
    }

    /// The address a service serves on.
    pub fn endpoint(&self, service: Service) -> &Address {
        // `endpoints` is filled for every service in `load`.
        &self.endpoints[&service]
    }
}

fn read_file(path: &Path) -> Result<(KubeletConfiguration, Vec<String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|reason| ConfigError::Parse {
        path: path.to_owned(),
        reason,
    })
}

/// Parses a KubeletConfiguration document (YAML or JSON). Returns it with the names of
/// top-level fields that are accepted but not acted on.
pub fn parse(text: &str) -> Result<(KubeletConfiguration, Vec<String>), String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
        // The first line names the place; the rest is a source snippet.
        let text = e.to_string();
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string()
    })?;
    let serde_json::Value::Object(map) = &value else {
        return Err("the document is not a mapping".into());
    };
    let known = kubelet_config::known_fields();
    let ignored = map.keys().filter(|k| !known.contains(k)).cloned().collect();
    let config = serde_path_to_error::deserialize(value)
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    Ok((config, ignored))
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
