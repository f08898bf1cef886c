//! vsock authentication settings: which peer CIDs may connect, and the shared secret that
//! every call carries. vsock has no file permissions or peer credentials, so without
//! these any peer that reaches the port could call every RPC.

use crate::{Address, ConfigError};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

/// Largest secret file we read; a secret is a line of text.
const MAX_SECRET_BYTES: u64 = 4096;

/// Who may talk to us over vsock.
#[derive(Clone)]
pub struct VsockAuth {
    /// Peer CIDs whose connections are accepted; others are closed on accept.
    pub allowed_cids: Vec<u32>,
    /// CID -> the gRPC services (`kubelet.v1.Prober`) it may call; a CID not here may call
    /// every service (`--vsock-allowed-cids 3=kubelet.v1.Prober+kubelet.v1.PodSync,4`).
    pub scopes: std::collections::BTreeMap<u32, Vec<String>>,
    /// The shared secret both ends prove they hold (a challenge-response; never sent).
    pub secret: Arc<[u8]>,
}

impl std::fmt::Debug for VsockAuth {
    // Never print the secret (configs are logged in debug output).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockAuth")
            .field("allowed_cids", &self.allowed_cids)
            .field("scopes", &self.scopes)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl VsockAuth {
    /// Whether peer `cid` may call gRPC service `service` (health checks always).
    pub fn allows(&self, cid: u32, service: &str) -> bool {
        service == "grpc.health.v1.Health"
            || self
                .scopes
                .get(&cid)
                .is_none_or(|allowed| allowed.iter().any(|s| s == service))
    }

    /// Reads the secret file: its first line, which must not be empty, and a file that
    /// only its owner (and group) may read.
    pub fn load(
        allowed_cids: Vec<u32>,
        scopes: std::collections::BTreeMap<u32, Vec<String>>,
        secret_file: &Path,
    ) -> Result<Self, ConfigError> {
        let invalid = |why: String| {
            ConfigError::Invalid(format!(
                "--vsock-secret-file {}: {why}",
                secret_file.display()
            ))
        };
        let meta = std::fs::metadata(secret_file).map_err(|e| invalid(e.to_string()))?;
        if !meta.is_file() || meta.len() > MAX_SECRET_BYTES {
            return Err(invalid(format!(
                "want a regular file of at most {MAX_SECRET_BYTES} bytes"
            )));
        }
        if meta.permissions().mode() & 0o007 != 0 {
            return Err(invalid(
                "is readable or writable by others; chmod o-rwx it".into(),
            ));
        }
        let text = std::fs::read(secret_file).map_err(|e| invalid(e.to_string()))?;
        let secret = text.split(|b| *b == b'\n').next().unwrap_or_default();
        let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
        if secret.is_empty() {
            return Err(invalid("the secret is empty".into()));
        }
        // One line of visible ASCII, as it is written and copied between hosts.
        if !secret.iter().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "the secret must be visible ASCII (no spaces or control characters)".into(),
            ));
        }
        Ok(Self {
            allowed_cids,
            scopes,
            secret: secret.into(),
        })
    }
}

/// vsock settings for a set of endpoints: required as soon as any endpoint is vsock.
pub(crate) fn resolve<'a>(
    endpoints: impl IntoIterator<Item = &'a Address>,
    allowed_cids: &[String],
    secret_file: Option<&Path>,
) -> Result<Option<VsockAuth>, ConfigError> {
    let Some(vsock) = endpoints
        .into_iter()
        .find(|a| matches!(a, Address::Vsock { .. }))
    else {
        return Ok(None);
    };
    let Some(file) = secret_file else {
        return Err(ConfigError::Invalid(format!(
            "{vsock} is a vsock endpoint, and vsock has no other authentication: give --vsock-secret-file (and --vsock-allowed-cids)"
        )));
    };
    if allowed_cids.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "{vsock} is a vsock endpoint: give --vsock-allowed-cids, the peer CIDs that may connect"
        )));
    }
    let (cids, scopes) = parse_allowed(allowed_cids)?;
    VsockAuth::load(cids, scopes, file).map(Some)
}

/// `--vsock-allowed-cids` entries: `CID` (every service) or `CID=SERVICE+SERVICE...`.
#[allow(clippy::type_complexity)]
fn parse_allowed(
    entries: &[String],
) -> Result<(Vec<u32>, std::collections::BTreeMap<u32, Vec<String>>), ConfigError> {
    let mut cids = Vec::new();
    let mut scopes = std::collections::BTreeMap::new();
    for entry in entries {
        let (cid, services) = match entry.split_once('=') {
            Some((cid, services)) => (cid, Some(services)),
            None => (entry.as_str(), None),
        };
        let cid: u32 = cid.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "--vsock-allowed-cids {entry:?}: want CID or CID=SERVICE+SERVICE"
            ))
        })?;
        cids.push(cid);
        if let Some(services) = services {
            let list: Vec<String> = services
                .split('+')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if list.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "--vsock-allowed-cids {entry:?}: name at least one gRPC service"
                )));
            }
            scopes.insert(cid, list);
        }
    }
    Ok((cids, scopes))
}

#[cfg(test)]
mod tests {
    use crate::{Config, ConfigError, KubeletFlags};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: KubeletFlags,
    }

    fn flags(args: &[&str]) -> KubeletFlags {
        let mut all = vec!["svc", "--hostname-override", "n1"];
        all.extend_from_slice(args);
        Cli::parse_from(all).flags
    }

    fn secret_file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        use std::os::unix::fs::PermissionsExt;
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        f
    }

    #[test]
    fn a_vsock_endpoint_needs_a_secret_and_allowed_cids() {
        let vsock = ["--service-endpoint", "probe=vsock://3:1024"];
        let err = Config::load(&flags(&vsock)).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid(_)));
        assert!(err.to_string().contains("--vsock-secret-file"), "{err}");

        let good = secret_file("s3cret\n", 0o600);
        let path = good.path().to_str().unwrap();
        let err =
            Config::load(&flags(&[vsock[0], vsock[1], "--vsock-secret-file", path])).unwrap_err();
        assert!(err.to_string().contains("--vsock-allowed-cids"), "{err}");

        let args = |file: &str| {
            let mut a = vsock.to_vec();
            a.extend(["--vsock-allowed-cids", "3,7", "--vsock-secret-file"]);
            a.push(file);
            flags(&a)
        };
        let c = Config::load(&args(path)).unwrap();
        let auth = c.vsock_auth.expect("vsock auth");
        assert_eq!(auth.allowed_cids, vec![3, 7]);
        assert!(auth.scopes.is_empty());
        assert_eq!(&auth.secret[..], b"s3cret");
        assert!(
            !format!("{auth:?}").contains("s3cret"),
            "the secret is never printed"
        );

        for (text, mode, want) in [
            ("\n", 0o600, "empty"),
            ("s3cret", 0o644, "by others"),
            ("s3 cret", 0o600, "visible ASCII"),
        ] {
            let f = secret_file(text, mode);
            let err = Config::load(&args(f.path().to_str().unwrap())).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[test]
    fn a_cid_may_be_scoped_to_some_services() {
        let good = secret_file("s3cret\n", 0o600);
        let load = |allowed: &str| {
            Config::load(&flags(&[
                "--service-endpoint",
                "probe=vsock://3:1024",
                "--vsock-secret-file",
                good.path().to_str().unwrap(),
                "--vsock-allowed-cids",
                allowed,
            ]))
        };
        let auth = load("3=kubelet.v1.Prober+kubelet.v1.PodSync,4")
            .unwrap()
            .vsock_auth
            .unwrap();
        assert_eq!(auth.allowed_cids, vec![3, 4]);
        assert!(auth.allows(3, "kubelet.v1.PodSync"));
        assert!(!auth.allows(3, "kubelet.v1.Pleg"));
        assert!(auth.allows(3, "grpc.health.v1.Health"));
        assert!(auth.allows(4, "kubelet.v1.Pleg"));
        for bad in ["x", "3=", "3=+"] {
            assert!(load(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unix_only_endpoints_need_no_vsock_settings() {
        assert!(Config::load(&flags(&[])).unwrap().vsock_auth.is_none());
    }
}
