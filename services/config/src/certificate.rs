//! The certificate manager (upstream `pkg/kubelet/certificate` and client-go's
//! `util/certificate`): the node's client certificate, bootstrapped from
//! `--bootstrap-kubeconfig` and rotated with `rotateCertificates`, and its serving
//! certificate with `serverTLSBootstrap`. Each is requested as a
//! `certificates.k8s.io/v1` CertificateSigningRequest (CN `system:node:<name>`, O
//! `system:nodes`, a fresh ECDSA P-256 key) and kept in `--cert-dir` under upstream's
//! names: `kubelet-client-<time>.pem` / `kubelet-server-<time>.pem` (certificate then
//! key, mode 0600) with a `-current.pem` symlink swapped atomically.
//!
//! node-status owns the client certificate (it bootstraps and rotates it; every service's
//! client follows the files, see `kube_client`), http-server its serving certificate.
//! A new certificate is requested at a jittered 70–90 % of the current one's lifetime, as
//! upstream; a denied or failed request is retried with a doubling back-off (2 s to
//! 5 min), and a request nobody approves is abandoned after 15 minutes and made again.

use anyhow::Context as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use nodeagent_telemetry::metrics::prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use nodeagent_telemetry::metrics::prometheus_client::metrics::counter::Counter;
use nodeagent_telemetry::metrics::prometheus_client::metrics::histogram::Histogram;
use nodeagent_telemetry::metrics::prometheus_client::metrics::{MetricType, TypedMetric};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long a request waits for approval and signing (upstream's 15 minutes).
const APPROVAL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How often a pending request is reported while it waits.
const PENDING_WARNING_EVERY: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// Which of the node's certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Client,
    Serving,
}

impl Kind {
    pub fn signer(self) -> &'static str {
        match self {
            Kind::Client => "kubernetes.io/kube-apiserver-client-kubelet",
            Kind::Serving => "kubernetes.io/kubelet-serving",
        }
    }

    /// Upstream's usages for an ECDSA key (no key encipherment).
    fn usages(self) -> Vec<String> {
        let last = match self {
            Kind::Client => "client auth",
            Kind::Serving => "server auth",
        };
        vec!["digital signature".into(), last.into()]
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::Client => "kubelet-client",
            Kind::Serving => "kubelet-server",
        }
    }

    /// `<cert-dir>/kubelet-client-current.pem` or `kubelet-server-current.pem`.
    pub fn current_path(self, cert_dir: &Path) -> PathBuf {
        cert_dir.join(format!("{}-current.pem", self.prefix()))
    }
}

/// A certificate with its key, as one PEM file holds them.
#[derive(Clone, Debug)]
pub struct Pair {
    /// The certificate chain, PEM.
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// Colon-separated hex, as `openssl x509 -serial` prints it (upper case, no colons).
    pub serial: String,
}

impl Pair {
    /// Parses a PEM text holding a certificate (first) and a private key.
    pub fn parse(text: &str) -> anyhow::Result<Pair> {
        let mut cert_pem = String::new();
        let mut key_pem = String::new();
        let mut leaf = None;
        for (label, block) in pem_blocks(text) {
            if label == "CERTIFICATE" {
                if leaf.is_none() {
                    let (_, pem) = x509_parser::pem::parse_x509_pem(block.as_bytes())
                        .map_err(|e| anyhow::anyhow!("PEM: {e}"))?;
                    let cert = pem
                        .parse_x509()
                        .map_err(|e| anyhow::anyhow!("certificate: {e}"))?;
                    let validity = cert.validity();
                    let at = |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(t.max(0) as u64);
                    leaf = Some((
                        at(validity.not_before.timestamp()),
                        at(validity.not_after.timestamp()),
                        cert.raw_serial_as_string().replace(':', "").to_uppercase(),
                    ));
                }
                cert_pem.push_str(block);
                cert_pem.push('\n');
            } else if label.ends_with("PRIVATE KEY") {
                key_pem = format!("{block}\n");
            }
        }
        let (not_before, not_after, serial) =
            leaf.ok_or_else(|| anyhow::anyhow!("no certificate in the PEM"))?;
        anyhow::ensure!(!key_pem.is_empty(), "no private key in the PEM");
        Ok(Pair {
            cert_pem,
            key_pem,
            not_before,
            not_after,
            serial,
        })
    }

    pub fn read(path: &Path) -> anyhow::Result<Pair> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Pair::parse(&text).with_context(|| path.display().to_string())
    }

    pub fn valid_now(&self) -> bool {
        let now = SystemTime::now();
        self.not_before <= now && now < self.not_after
    }

    /// When to ask for the next one: at a random 70–90 % of its lifetime (upstream's
    /// `nextRotationDeadline`), so that many nodes do not all ask at once.
    pub fn rotation_deadline(&self) -> SystemTime {
        let total = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + total.mul_f64(0.7 + 0.2 * crate::duration::random_fraction())
    }
}

/// The PEM blocks of `text`: (label, the block from BEGIN to END).
fn pem_blocks(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(begin) = rest.find("-----BEGIN ") {
        let after = &rest[begin + 11..];
        let Some(label_end) = after.find("-----") else {
            break;
        };
        let label = &after[..label_end];
        let end_marker = format!("-----END {label}-----");
        let Some(end) = rest[begin..].find(&end_marker) else {
            break;
        };
        let stop = begin + end + end_marker.len();
        out.push((label, &rest[begin..stop]));
        rest = &rest[stop..];
    }
    out
}

/// Writes a new pair as `<prefix>-<time>.pem` and points `<prefix>-current.pem` at it
/// (a symlink renamed over the old one: readers see the old pair or the new, never half).
/// Keeps the previous file (a connection may still be using it) and removes older ones.
pub fn store(cert_dir: &Path, kind: Kind, pair: &Pair) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(cert_dir)
        .with_context(|| format!("--cert-dir {}", cert_dir.display()))?;
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S%.f");
    let name = format!("{}-{stamp}.pem", kind.prefix());
    let file = cert_dir.join(&name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .with_context(|| format!("writing {}", file.display()))?;
    f.write_all(pair.cert_pem.as_bytes())?;
    f.write_all(pair.key_pem.as_bytes())?;
    f.sync_all()?;
    let current = kind.current_path(cert_dir);
    let previous = std::fs::read_link(&current).ok();
    let link = cert_dir.join(format!(".{}-current.tmp", kind.prefix()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&name, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    std::fs::rename(&link, &current).with_context(|| format!("replacing {}", current.display()))?;
    prune(cert_dir, kind, &name, previous.as_deref());
    Ok(file)
}

fn prune(cert_dir: &Path, kind: Kind, keep: &str, previous: Option<&Path>) {
    let Ok(entries) = std::fs::read_dir(cert_dir) else {
        return;
    };
    let previous = previous
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    let current = format!("{}-current.pem", kind.prefix());
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with(&format!("{}-", kind.prefix())) && name.ends_with(".pem");
        if ours && name != keep && name != current && Some(name.as_str()) != previous {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Why a request gave no certificate.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("certificate signing request {name} was denied, reason: {reason}, message: {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    #[error("certificate signing request {name} failed, reason: {reason}, message: {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    #[error(
        "certificate signing request {name} was not approved and signed within {timeout:?}; \
         approve it (kubectl certificate approve {name}) or check the signer"
    )]
    NotApproved { name: String, timeout: Duration },
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

/// Asks the API server for a certificate of `kind` for `node` with `sans` (the serving
/// certificate's names and addresses) and waits until it is approved and signed.
pub async fn request(
    client: &kube::Client,
    kind: Kind,
    node: &str,
    sans: &[String],
) -> Result<Pair, RequestError> {
    let timeout = APPROVAL_TIMEOUT;
    let key = rcgen::KeyPair::generate().context("generating a key")?;
    let mut params =
        rcgen::CertificateParams::new(sans.to_vec()).context("the certificate's names")?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .context("making the certificate signing request")?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem.into_bytes()),
            signer_name: kind.signer().into(),
            usages: Some(kind.usages()),
            ..Default::default()
        },
        status: None,
    };
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .context("creating the certificate signing request")?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, signer = kind.signer(),
        "certificate signing request created; waiting for its approval and certificate");
    let done = |c: Option<&CertificateSigningRequest>| {
        c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
                || s.conditions
                    .iter()
                    .flatten()
                    .any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        })
    };
    // Waits for the approver and the signer, saying every so often what it waits for.
    let watched = name.clone();
    let wait = kube::runtime::wait::await_condition(csrs.clone(), &watched, done);
    tokio::pin!(wait);
    let started = tokio::time::Instant::now();
    let mut reminder =
        tokio::time::interval_at(started + PENDING_WARNING_EVERY, PENDING_WARNING_EVERY);
    let waited = loop {
        tokio::select! {
            r = &mut wait => break Ok::<_, ()>(r),
            _ = reminder.tick() => {
                if started.elapsed() >= timeout {
                    break Err(());
                }
                tracing::warn!(csr = %name, signer = kind.signer(),
                    "certificate signing request {name} is still not approved and signed after \
                     {}s; approve it with kubectl certificate approve {name}",
                    started.elapsed().as_secs());
            }
        }
    };
    let csr = match waited {
        Err(_) => return Err(RequestError::NotApproved { name, timeout }),
        Ok(Err(e)) => {
            return Err(anyhow::anyhow!("watching certificate signing request {name}: {e}").into());
        }
        Ok(Ok(None)) => {
            return Err(anyhow::anyhow!("certificate signing request {name} was deleted").into());
        }
        Ok(Ok(Some(csr))) => csr,
    };
    let status = csr.status.unwrap_or_default();
    for c in status.conditions.iter().flatten() {
        let (reason, message) = (
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        );
        if c.type_ == "Denied" && c.status == "True" {
            return Err(RequestError::Denied {
                name,
                reason,
                message,
            });
        }
        if c.type_ == "Failed" && c.status == "True" {
            return Err(RequestError::Failed {
                name,
                reason,
                message,
            });
        }
    }
    let cert = status.certificate.map(|c| c.0).unwrap_or_default();
    let text = format!("{}{}", String::from_utf8_lossy(&cert), key.serialize_pem());
    let pair = Pair::parse(&text).with_context(|| format!("the certificate issued for {name}"))?;
    tracing::info!(csr = %name, serial = %pair.serial, "certificate issued");
    Ok(pair)
}

/// The metrics of one manager, upstream's names: for the client certificate (in
/// node-status) `kubelet_certificate_manager_client_ttl_seconds` and
/// `kubelet_certificate_manager_client_expiration_renew_errors`; for the serving
/// certificate (in http-server) `kubelet_certificate_manager_server_ttl_seconds`,
/// `kubelet_certificate_manager_server_rotation_seconds` and
/// `kubelet_server_expiration_renew_errors`.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub ttl: TtlGauge,
    pub renew_errors: Counter,
    pub rotation: Option<Histogram>,
}

impl Metrics {
    /// Registers the metrics of `kind` in this process's registry (once per process).
    pub fn get(kind: Kind) -> Metrics {
        static CLIENT: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
        static SERVING: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
        use nodeagent_telemetry::metrics::register;
        match kind {
            Kind::Client => CLIENT
                .get_or_init(|| Metrics {
                    ttl: register(
                        "kubelet_certificate_manager_client_ttl_seconds",
                        "Gauge of the TTL (time-to-live) of the Kubelet's client certificate. \
                         The value is in seconds until certificate expiry (negative if already expired)",
                        TtlGauge::default(),
                    ),
                    renew_errors: register(
                        "kubelet_certificate_manager_client_expiration_renew_errors",
                        "Counter of certificate renewal errors",
                        Counter::default(),
                    ),
                    rotation: None,
                })
                .clone(),
            Kind::Serving => SERVING
                .get_or_init(|| Metrics {
                    ttl: register(
                        "kubelet_certificate_manager_server_ttl_seconds",
                        "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving \
                         certificate. The value is in seconds until certificate expiry \
                         (negative if already expired)",
                        TtlGauge::default(),
                    ),
                    renew_errors: register(
                        "kubelet_server_expiration_renew_errors",
                        "Counter of certificate renewal errors",
                        Counter::default(),
                    ),
                    rotation: Some(register(
                        "kubelet_certificate_manager_server_rotation_seconds",
                        "Histogram of the number of seconds the previous certificate lived \
                         before being rotated",
                        Histogram::new(ROTATION_BUCKETS),
                    )),
                })
                .clone(),
        }
    }
}

/// Upstream's buckets: a minute up to four years.
const ROTATION_BUCKETS: [f64; 10] = [
    60.0,
    3600.0,
    14400.0,
    86400.0,
    604800.0,
    2592000.0,
    7776000.0,
    15552000.0,
    31104000.0,
    124416000.0,
];

/// Seconds until a certificate expires, computed at each scrape (no series until a
/// certificate is known).
#[derive(Clone, Debug, Default)]
pub struct TtlGauge(Arc<std::sync::Mutex<Option<SystemTime>>>);

impl TtlGauge {
    pub fn set(&self, not_after: SystemTime) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(not_after);
    }
}

impl TypedMetric for TtlGauge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for TtlGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let Some(not_after) = *self.0.lock().unwrap_or_else(|e| e.into_inner()) else {
            return Ok(());
        };
        let ttl = match not_after.duration_since(SystemTime::now()) {
            Ok(left) => left.as_secs_f64(),
            Err(past) => -past.duration().as_secs_f64(),
        };
        encoder.encode_gauge(&ttl)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Keeps one certificate of the node fresh: requests a new one at its rotation deadline
/// (at once when there is none or it expired), stores it, and hands it to `on_new`.
/// Runs until the task is dropped.
pub struct Rotator {
    pub kind: Kind,
    pub cert_dir: PathBuf,
    pub node: String,
    pub sans: Vec<String>,
    pub client: kube::Client,
    pub metrics: Metrics,
    pub on_new: Box<dyn Fn(&Pair) + Send + Sync>,
}

impl Rotator {
    pub async fn run(self) {
        let current_path = self.kind.current_path(&self.cert_dir);
        let mut backoff = FIRST_BACKOFF;
        loop {
            let current = Pair::read(&current_path).ok();
            if let Some(c) = &current {
                self.metrics.ttl.set(c.not_after);
            }
            let deadline = current
                .as_ref()
                .filter(|p| p.valid_now())
                .map(Pair::rotation_deadline)
                .unwrap_or_else(SystemTime::now);
            if let Ok(wait) = deadline.duration_since(SystemTime::now()) {
                tracing::info!(kind = ?self.kind, wait = ?wait,
                    "next certificate rotation in {}s", wait.as_secs());
                tokio::time::sleep(wait).await;
            }
            match request(&self.client, self.kind, &self.node, &self.sans).await {
                Ok(pair) => {
                    if let Err(e) = store(&self.cert_dir, self.kind, &pair) {
                        tracing::error!(error = %format!("{e:#}"), "storing the new certificate");
                    }
                    let lived = current
                        .as_ref()
                        .and_then(|c| SystemTime::now().duration_since(c.not_before).ok());
                    self.metrics.ttl.set(pair.not_after);
                    if let (Some(h), Some(lived)) = (&self.metrics.rotation, lived) {
                        h.observe(lived.as_secs_f64());
                    }
                    (self.on_new)(&pair);
                    backoff = FIRST_BACKOFF;
                }
                Err(e) => {
                    self.metrics.renew_errors.inc();
                    tracing::error!(kind = ?self.kind, error = %e,
                        "rotating the certificate failed; retrying in {}s", backoff.as_secs());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Whether the kubeconfig at `path` can be used as it is: it exists, and the client
/// certificate it names (if any) is still valid (upstream's `isClientConfigStillValid`).
pub fn kubeconfig_usable(path: &Path) -> bool {
    let Ok(kubeconfig) = kube::config::Kubeconfig::read_from(path) else {
        return false;
    };
    let mut files = crate::kube_client::certificate_files(&kubeconfig);
    if files.is_empty() {
        return true;
    }
    // `client-certificate` and `client-key`: one file (kubeadm's
    // kubelet-client-current.pem) or two (a certificate and its key apart).
    files.dedup();
    let mut text = String::new();
    for f in &files {
        match std::fs::read_to_string(f) {
            Ok(t) => {
                text.push_str(&t);
                text.push('\n');
            }
            Err(_) => return false,
        }
    }
    Pair::parse(&text).is_ok_and(|p| p.valid_now())
}

/// The client certificate bootstrap (upstream `LoadClientCert`): when `--kubeconfig` is
/// missing or its certificate expired, requests a client certificate with the
/// `--bootstrap-kubeconfig` credentials, stores it, and writes `--kubeconfig` to use
/// `<cert-dir>/kubelet-client-current.pem`. Retries with back-off until it succeeds.
pub async fn bootstrap_client(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node: &str,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    if kubeconfig_usable(kubeconfig) {
        return Ok(());
    }
    let current = Kind::Client.current_path(cert_dir);
    if Pair::read(&current).is_ok_and(|p| p.valid_now()) {
        tracing::info!(cert = %current.display(), "using the existing client certificate");
        return write_kubeconfig(kubeconfig, bootstrap, &current);
    }
    tracing::info!(bootstrap = %bootstrap.display(),
        "no usable client certificate; requesting one with the bootstrap kubeconfig");
    let client = crate::kube_client(bootstrap).await?;
    let mut backoff = FIRST_BACKOFF;
    loop {
        match request(&client, Kind::Client, node, &[]).await {
            Ok(pair) => {
                store(cert_dir, Kind::Client, &pair)?;
                return write_kubeconfig(kubeconfig, bootstrap, &current);
            }
            Err(e) => {
                metrics.renew_errors.inc();
                tracing::error!(error = %e,
                    "bootstrapping the client certificate failed; retrying in {}s", backoff.as_secs());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Writes the node's kubeconfig: the bootstrap kubeconfig's cluster, the client pair.
fn write_kubeconfig(path: &Path, bootstrap: &Path, cert: &Path) -> anyhow::Result<()> {
    let b = kube::config::Kubeconfig::read_from(bootstrap).map_err(|e| {
        anyhow::anyhow!(
            "reading --bootstrap-kubeconfig {}: {e}",
            bootstrap.display()
        )
    })?;
    let cluster_name = crate::kube_client::current_context(&b).map(|c| c.cluster.clone());
    let mut cluster = b
        .clusters
        .iter()
        .find(|c| Some(&c.name) == cluster_name.as_ref())
        .or(b.clusters.first())
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--bootstrap-kubeconfig {} names no cluster",
                bootstrap.display()
            )
        })?;
    // A relative CA path was relative to the bootstrap file.
    if let Some(ca) = &cluster.certificate_authority
        && Path::new(ca).is_relative()
        && let Some(dir) = bootstrap.parent()
    {
        cluster.certificate_authority = Some(dir.join(ca).display().to_string());
    }
    let cluster = serde_json::to_string(&cluster)?;
    let cert = serde_json::to_string(&cert.display().to_string())?;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster: {cluster}\n\
         contexts:\n- name: default-context\n  context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n\
         current-context: default-context\n\
         users:\n- name: default-auth\n  user:\n    client-certificate: {cert}\n    client-key: {cert}\n"
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::state::write_atomically(path, text.as_bytes())
        .with_context(|| format!("writing --kubeconfig {}", path.display()))?;
    tracing::info!(kubeconfig = %path.display(), "wrote the kubeconfig with the client certificate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(lifetime: Duration) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["n1".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = time_from(SystemTime::now() + lifetime);
        let cert = params.self_signed(&key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    fn time_from(t: SystemTime) -> time::OffsetDateTime {
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        time::OffsetDateTime::from_unix_timestamp(secs as i64).unwrap()
    }

    #[test]
    fn parses_a_pair_and_places_the_deadline_in_70_to_90_percent() {
        let pair = Pair::parse(&self_signed(Duration::from_secs(3600))).unwrap();
        assert!(pair.valid_now());
        assert!(!pair.serial.is_empty());
        let total = pair.not_after.duration_since(pair.not_before).unwrap();
        for _ in 0..50 {
            let at = pair
                .rotation_deadline()
                .duration_since(pair.not_before)
                .unwrap();
            assert!(
                at >= total.mul_f64(0.7) && at <= total.mul_f64(0.9),
                "{at:?} of {total:?}"
            );
        }
    }

    #[test]
    fn a_pem_without_a_key_is_refused() {
        let text = self_signed(Duration::from_secs(60));
        let cert_only = text.split("-----BEGIN PRIVATE KEY").next().unwrap();
        assert!(Pair::parse(cert_only).is_err());
    }

    #[test]
    fn store_swaps_the_current_link_and_keeps_only_the_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut serials = Vec::new();
        for _ in 0..3 {
            let pair = Pair::parse(&self_signed(Duration::from_secs(60))).unwrap();
            store(dir.path(), Kind::Client, &pair).unwrap();
            let now = Pair::read(&Kind::Client.current_path(dir.path())).unwrap();
            assert_eq!(now.serial, pair.serial);
            serials.push(pair.serial);
        }
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("kubelet-client-2"))
            .collect();
        assert_eq!(files.len(), 2, "{files:?}");
        use std::os::unix::fs::PermissionsExt;
        let target = std::fs::read_link(Kind::Client.current_path(dir.path())).unwrap();
        let mode = std::fs::metadata(dir.path().join(target))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn the_written_kubeconfig_uses_the_pair_and_the_bootstrap_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = dir.path().join("bootstrap.kubeconfig");
        std::fs::write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: ca.crt\n\
             users:\n- name: t\n  user:\n    token: abcdef.0123456789abcdef\n\
             contexts:\n- name: b\n  context:\n    cluster: b\n    user: t\ncurrent-context: b\n",
        )
        .unwrap();
        let cert = dir.path().join("pki/kubelet-client-current.pem");
        let out = dir.path().join("kubelet.kubeconfig");
        write_kubeconfig(&out, &bootstrap, &cert).unwrap();
        let k = kube::config::Kubeconfig::read_from(&out).unwrap();
        let c = k.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(c.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            c.certificate_authority.as_deref(),
            Some(dir.path().join("ca.crt").display().to_string().as_str())
        );
        assert_eq!(
            crate::kube_client::certificate_files(&k),
            vec![cert.clone(), cert.clone()]
        );
        // No pair yet: not usable.
        assert!(!kubeconfig_usable(&out));
        // The pair written: usable.
        std::fs::create_dir_all(cert.parent().unwrap()).unwrap();
        let pem = self_signed(Duration::from_secs(3600));
        std::fs::write(&cert, &pem).unwrap();
        assert!(kubeconfig_usable(&out));
    }

    /// kubeadm init's kubelet.conf may name the certificate and the key as two files
    /// (`client-certificate` and `client-key`): usable, so the missing
    /// bootstrap-kubelet.conf (which kubeadm init never writes) is not needed.
    #[test]
    fn a_kubeconfig_with_the_key_apart_is_usable() {
        let dir = tempfile::tempdir().unwrap();
        let pem = self_signed(Duration::from_secs(3600));
        let pair = Pair::parse(&pem).unwrap();
        let (crt, key) = (dir.path().join("node.crt"), dir.path().join("node.key"));
        std::fs::write(&crt, &pair.cert_pem).unwrap();
        std::fs::write(&key, &pair.key_pem).unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n\
                 users:\n- name: n\n  user:\n    client-certificate: {}\n    client-key: {}\n\
                 contexts:\n- name: k\n  context:\n    cluster: k\n    user: n\ncurrent-context: k\n",
                crt.display(),
                key.display()
            ),
        )
        .unwrap();
        assert!(kubeconfig_usable(&kubeconfig));
        std::fs::remove_file(&key).unwrap();
        assert!(!kubeconfig_usable(&kubeconfig));
    }
}
