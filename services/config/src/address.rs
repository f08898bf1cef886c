//! Service addresses: `unix:///path` or `vsock://<cid>:<port>`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Vsock { cid: u32, port: u32 },
}

impl FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "invalid address {s:?}: unix socket path must be absolute"
                ));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = s.strip_prefix("vsock://") {
            let (cid, port) = rest
                .split_once(':')
                .ok_or_else(|| format!("invalid address {s:?}: want vsock://<cid>:<port>"))?;
            let cid = cid
                .parse()
                .map_err(|_| format!("invalid address {s:?}: cid {cid:?} is not a number"))?;
            let port = port
                .parse()
                .map_err(|_| format!("invalid address {s:?}: port {port:?} is not a number"))?;
            return Ok(Self::Vsock { cid, port });
        }
        if s.starts_with('/') {
            // Upstream accepts a bare path for the runtime endpoint (with a deprecation warning).
            return Ok(Self::Unix(PathBuf::from(s)));
        }
        Err(format!(
            "invalid address {s:?}: want unix:///path or vsock://<cid>:<port>"
        ))
    }
}

impl Address {
    /// Probe instance `id`'s address (`--probe-instance ID`): `probe-<ID>.sock` beside
    /// this one, the probe service's unix socket; None for vsock. The one place that names
    /// it: an instance serves there and http-server finds every instance by it.
    pub fn probe_instance(&self, id: &str) -> Option<Address> {
        match self {
            Self::Unix(path) => Some(Self::Unix(path.with_file_name(format!("probe-{id}.sock")))),
            Self::Vsock { .. } => None,
        }
    }

    /// The instance a file beside the probe socket serves, if it is an instance's socket.
    pub fn probe_instance_id(file_name: &str) -> Option<&str> {
        file_name
            .strip_prefix("probe-")?
            .strip_suffix(".sock")
            .filter(|id| !id.is_empty())
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Vsock { cid, port } => write!(f, "vsock://{cid}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_instance_serves_beside_the_probe_socket() {
        let probe = Address::Unix("/run/nodeagent/probe.sock".into());
        let b = probe.probe_instance("b").unwrap();
        assert_eq!(b, Address::Unix("/run/nodeagent/probe-b.sock".into()));
        let Address::Unix(path) = b else { panic!() };
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(Address::probe_instance_id(name), Some("b"));
        assert_eq!(Address::probe_instance_id("probe.sock"), None);
        assert_eq!(Address::probe_instance_id("probe-.sock"), None);
        assert_eq!(Address::probe_instance_id("probe-values.json"), None);
        assert_eq!(Address::Vsock { cid: 3, port: 1 }.probe_instance("b"), None);
    }

    #[test]
    fn parses_both_schemes() {
        assert_eq!(
            "unix:///run/nodeagent/pleg.sock".parse(),
            Ok(Address::Unix("/run/nodeagent/pleg.sock".into()))
        );
        assert_eq!(
            "vsock://3:1024".parse(),
            Ok(Address::Vsock { cid: 3, port: 1024 })
        );
        assert_eq!(
            "/run/x.sock".parse(),
            Ok(Address::Unix("/run/x.sock".into()))
        );
    }

    #[test]
    fn round_trips_through_display() {
        for s in ["unix:///a/b.sock", "vsock://1:5000"] {
            assert_eq!(s.parse::<Address>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_bad_addresses_readably() {
        for bad in [
            "tcp://1.2.3.4:5",
            "unix://rel/path",
            "vsock://x:1",
            "vsock://1",
            "vsock://1:y",
        ] {
            let err = bad.parse::<Address>().unwrap_err();
            assert!(err.starts_with("invalid address"), "{bad}: {err}");
        }
    }
}
