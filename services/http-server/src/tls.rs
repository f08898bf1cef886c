//! The serving identity of port 10250 and the TLS settings: `tlsCertFile` and
//! `tlsPrivateKeyFile`, or (as upstream) a self-signed pair kept in `--cert-dir` as
//! `kubelet.crt` and `kubelet.key`, made on first start and reused after.
//!
//! Client certificates are requested, never required: a request without one may still
//! authenticate with a bearer token. A certificate that does not chain to the client CA
//! does not fail the handshake either; the authenticator answers it with 401, as upstream
//! (Go's `tls.RequestClientCert`). The handshake does check that the client holds the key
//! of the certificate it presents.

use anyhow::Context;
use nodeagent_config::{Config, certificate};
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::ResolvesServerCert;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The TLS configuration of port 10250 and the client verifier the authenticator uses.
pub struct Tls {
    pub server: Arc<rustls::ServerConfig>,
    /// The serving pair in use; `serverTLSBootstrap` replaces it as certificates are
    /// issued, and each new handshake uses the pair current at that moment.
    pub serving: Arc<ServingCert>,
    /// Checks a client's chain against `clientCAFile`; None when it is unset (then no
    /// certificate authenticates anyone).
    pub client_ca: Option<Arc<dyn ClientCertVerifier>>,
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads (or makes) the serving pair and builds the server configuration.
pub fn server_config(config: &Config) -> anyhow::Result<Tls> {
    let (cert_file, key_file) = match (
        &config.kubelet.tls_cert_file,
        &config.kubelet.tls_private_key_file,
    ) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            let (c, k) = self_signed_paths(&config.cert_dir);
            // Several instances may start at once on a fresh node: one makes the pair,
            // under a lock, and the others take it (never a key of one with the
            // certificate of another).
            std::fs::create_dir_all(&config.cert_dir)
                .with_context(|| format!("--cert-dir {}", config.cert_dir.display()))?;
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(config.cert_dir.join(".kubelet-self-signed.lock"))
                .context("the self-signed pair's lock")?;
            let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| anyhow::anyhow!("locking the self-signed pair: {e}"))?;
            if !c.exists() || !k.exists() {
                write_self_signed(config, &c, &k)?;
            }
            (c, k)
        }
    };
    let mut first = load_pair(&cert_file, &key_file)?;
    if bootstraps_serving(config) {
        // A certificate issued before a restart is used again while it is valid.
        let issued = certificate::Kind::Serving.current_path(&config.cert_dir);
        match certificate::Pair::read(&issued) {
            Ok(pair) if pair.valid_now() => match certified_key(&pair) {
                Ok(key) => {
                    certificate::Metrics::get(certificate::Kind::Serving)
                        .ttl
                        .set(pair.not_after);
                    first = key;
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "{}", issued.display()),
            },
            _ => tracing::info!(
                "serverTLSBootstrap: serving the self-signed pair until a certificate is issued"
            ),
        }
    }
    let serving = Arc::new(ServingCert(std::sync::RwLock::new(Arc::new(first))));
    let client_ca = match &config.kubelet.authentication.x509.client_ca_file {
        Some(path) => Some(client_ca_verifier(path)?),
        None => None,
    };
    let policy = TlsPolicy::from_config(
        &config.kubelet.tls_min_version,
        &config.kubelet.tls_cipher_suites,
    )?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(policy.provider))
        .with_protocol_versions(&policy.versions)?;
    let builder = match &client_ca {
        Some(inner) => builder.with_client_cert_verifier(Arc::new(RequestClientCert {
            inner: inner.clone(),
        })),
        None => builder.with_no_client_auth(),
    };
    let mut server = builder.with_cert_resolver(serving.clone());
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Tls {
        server: Arc::new(server),
        serving,
        client_ca,
    })
}

/// `tlsMinVersion` and `tlsCipherSuites` as this node honours them: never weaker than
/// asked. Versions below TLS 1.2 are not offered at all (a lower minimum gets 1.2); TLS 1.3
/// suites are not configurable (as in Go); a TLS 1.2 suite the TLS library does not offer,
/// or an unknown version name, is refused at start.
pub struct TlsPolicy {
    pub versions: Vec<&'static rustls::SupportedProtocolVersion>,
    pub provider: rustls::crypto::CryptoProvider,
}

impl TlsPolicy {
    pub fn from_config(min_version: &str, suites: &[String]) -> anyhow::Result<TlsPolicy> {
        let versions = match min_version {
            "" | "VersionTLS10" | "VersionTLS11" | "VersionTLS12" => {
                vec![&rustls::version::TLS13, &rustls::version::TLS12]
            }
            "VersionTLS13" => vec![&rustls::version::TLS13],
            other => anyhow::bail!(
                "tlsMinVersion {other:?}: want one of VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
            ),
        };
        let mut provider = rustls::crypto::ring::default_provider();
        if !suites.is_empty() {
            let name = |s: &rustls::SupportedCipherSuite| format!("{:?}", s.suite());
            let unknown: Vec<&String> = suites
                .iter()
                .filter(|want| {
                    !provider
                        .cipher_suites
                        .iter()
                        .any(|s| s.version() == &rustls::version::TLS12 && &name(s) == *want)
                })
                .collect();
            if !unknown.is_empty() {
                let offered: Vec<String> = provider
                    .cipher_suites
                    .iter()
                    .filter(|s| s.version() == &rustls::version::TLS12)
                    .map(name)
                    .collect();
                anyhow::bail!(
                    "tlsCipherSuites: {unknown:?} cannot be offered by this node; it offers {offered:?} for TLS 1.2"
                );
            }
            provider
                .cipher_suites
                .retain(|s| s.version() == &rustls::version::TLS13 || suites.contains(&name(s)));
        }
        Ok(TlsPolicy { versions, provider })
    }
}

/// Whether http-server requests its serving certificate (`serverTLSBootstrap`, no
/// `tlsCertFile`, and an API server to ask).
pub fn bootstraps_serving(config: &Config) -> bool {
    config.kubelet.server_tls_bootstrap
        && config.kubelet.tls_cert_file.is_none()
        && config.kubeconfig.is_some()
}

/// The serving pair of port 10250, swapped in place when a new one is issued: open
/// connections keep the session they made, new handshakes get the new pair.
#[derive(Debug)]
pub struct ServingCert(std::sync::RwLock<Arc<CertifiedKey>>);

impl ServingCert {
    pub fn set(&self, pair: &certificate::Pair) -> anyhow::Result<()> {
        let key = certified_key(pair)?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        tracing::info!(serial = %pair.serial, "serving the newly issued certificate");
        Ok(())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn certified_key(pair: &certificate::Pair) -> anyhow::Result<CertifiedKey> {
    let certs = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the issued certificate")?;
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).context("the issued key")?;
    CertifiedKey::from_der(certs, key, &provider())
        .context("the issued certificate and key do not match")
}

fn load_pair(cert_file: &Path, key_file: &Path) -> anyhow::Result<CertifiedKey> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .with_context(|| format!("tlsCertFile {}", cert_file.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("tlsCertFile {}", cert_file.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "tlsCertFile {} holds no certificate",
        cert_file.display()
    );
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("tlsPrivateKeyFile {}", key_file.display()))?;
    CertifiedKey::from_der(certs, key, &provider())
        .context("the serving certificate and key do not match")
}

/// The `address` port 10250 is bound to, when it is one IP (not 0.0.0.0 or ::): a name
/// the serving certificate must hold.
fn bound_address(config: &Config) -> Option<String> {
    let address = &config.kubelet.address;
    address
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| !ip.is_unspecified())
        .then(|| address.clone())
}

/// The names and addresses of the serving certificate: the node's name, the host name
/// when it differs, and the node's addresses (InternalIP and a set `address`).
pub fn serving_names(config: &Config) -> Vec<String> {
    let mut names = vec![config.node_name.clone()];
    if let Ok(host) = nix::unistd::gethostname()
        && let Some(host) = host.to_str()
    {
        names.push(host.to_lowercase());
    }
    let ip = nodeagent_config::machine::host_ip();
    if !ip.is_empty() {
        names.push(ip);
    }
    names.extend(bound_address(config));
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// `<cert-dir>/kubelet.crt` and `<cert-dir>/kubelet.key`, upstream's names.
pub fn self_signed_paths(cert_dir: &Path) -> (PathBuf, PathBuf) {
    (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"))
}

fn write_self_signed(config: &Config, cert: &Path, key: &Path) -> anyhow::Result<()> {
    let mut names = vec![config.node_name.clone(), "localhost".to_string()];
    names.push("127.0.0.1".into());
    names.extend(bound_address(config));
    names.dedup();
    let key_pair = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{}@{now}", config.node_name),
    );
    // Upstream's self-signed serving certificate lives a year.
    params.not_before = rcgen::date_time_ymd(1975, 1, 1);
    params.not_after = time_after_days(365);
    let certificate = params.self_signed(&key_pair)?;
    std::fs::create_dir_all(&config.cert_dir)
        .with_context(|| format!("--cert-dir {}", config.cert_dir.display()))?;
    write_atomically(key, key_pair.serialize_pem().as_bytes(), 0o600)?;
    // Whole or not at all: whoever reads the certificate (a client pinning it, the tests)
    // never sees it half-written.
    write_atomically(cert, certificate.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert.display(), "generated a self-signed serving certificate");
    Ok(())
}

fn time_after_days(days: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(days)
}

/// Writes `path` through a temporary file renamed over it, created with `mode`.
fn write_atomically(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn client_ca_verifier(path: &Path) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)
        .with_context(|| format!("authentication.x509.clientCAFile {}", path.display()))?
    {
        roots
            .add(cert.with_context(|| format!("clientCAFile {}", path.display()))?)
            .with_context(|| format!("clientCAFile {}", path.display()))?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "authentication.x509.clientCAFile {} holds no certificate",
        path.display()
    );
    Ok(
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()?,
    )
}

/// Asks for a client certificate and checks the handshake signatures (the client holds
/// the key), but leaves the chain to the authenticator, which answers a foreign one with
/// 401 instead of a failed handshake.
#[derive(Debug)]
struct RequestClientCert {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream: the kubelet's --tls-min-version and --tls-cipher-suites take Go's names
    /// (crypto/tls, `cliflag.TLSCipherSuites`): each value is honoured or refused.
    #[test]
    fn tls_min_version_and_cipher_suites_are_honoured_or_refused() {
        let versions = |v: &str| {
            TlsPolicy::from_config(v, &[])
                .unwrap()
                .versions
                .iter()
                .map(|v| format!("{:?}", v.version))
                .collect::<Vec<_>>()
        };
        assert_eq!(versions(""), vec!["TLSv1_3", "TLSv1_2"]);
        assert_eq!(versions("VersionTLS10"), vec!["TLSv1_3", "TLSv1_2"]);
        assert_eq!(versions("VersionTLS13"), vec!["TLSv1_3"]);
        assert!(TlsPolicy::from_config("TLS1.3", &[]).is_err());

        let one = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_string()];
        let policy = TlsPolicy::from_config("", &one).unwrap();
        let tls12: Vec<String> = policy
            .provider
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(tls12, one.to_vec());
        // TLS 1.3's suites stay, as in Go.
        assert!(
            policy
                .provider
                .cipher_suites
                .iter()
                .any(|s| s.version() == &rustls::version::TLS13)
        );
        // A weak suite Go still knows, and a made-up one: refused, never ignored.
        for bad in ["TLS_RSA_WITH_3DES_EDE_CBC_SHA", "TLS_NOPE"] {
            let err = TlsPolicy::from_config("", &[bad.to_string()])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(bad) && err.contains("cannot be offered"),
                "{err}"
            );
        }
    }
}
