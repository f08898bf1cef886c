//! `nodeagent-test-apiserver`: the test API server on its own, for kubectl and a node agent
//! outside the test suite (the compose `cluster` profile, the systemd test's `kubeadm
//! join`). Plain HTTP without authentication (bind it to loopback or a private network
//! only), or HTTPS with client certificates and bootstrap tokens (`--tls-dir`).
//!
//! ```text
//! nodeagent-test-apiserver --port 8080 --kubelet-client-pki /var/lib/test-apiserver
//! kubectl --server http://127.0.0.1:8080 get nodes
//! nodeagent-test-apiserver --port 6443 --tls-dir /root/apiserver --bootstrap-token abcdef.0123456789abcdef
//! kubectl --kubeconfig /root/apiserver/admin.conf get nodes
//! ```

use anyhow::Context;
use clap::Parser;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::pki::{Identity, TestCa};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The test API server (pods, nodes, leases, events, configmaps, secrets, serviceaccounts
/// and their tokens; discovery; the pods/log, exec, attach, portforward and nodes/proxy
/// subresources) on plain HTTP, or HTTPS with `--tls-dir`.
#[derive(Parser, Debug)]
#[command(name = "nodeagent-test-apiserver")]
struct Args {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: IpAddr,
    /// The port to listen on (plain HTTP).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The client certificate (PEM) presented to kubelets.
    #[arg(long, requires = "kubelet_client_key")]
    kubelet_client_certificate: Option<PathBuf>,
    /// The key (PEM) of --kubelet-client-certificate.
    #[arg(long, requires = "kubelet_client_certificate")]
    kubelet_client_key: Option<PathBuf>,
    /// A directory with the kubelet client pair (kubelet-client.crt, kubelet-client.key)
    /// and the CA that signed it (ca.crt, the kubelets' clientCAFile); made there on first
    /// start (CN kube-apiserver-kubelet-client, O system:masters; the CA key is not kept).
    #[arg(long, conflicts_with = "kubelet_client_certificate")]
    kubelet_client_pki: Option<PathBuf>,
    /// The CA (PEM) of the kubelets' serving certificates; unset: not verified, as
    /// kube-apiserver without it.
    #[arg(long)]
    kubelet_certificate_authority: Option<PathBuf>,
    /// NODE=HOST: dial NODE's kubelet at HOST instead of its published address
    /// (repeatable).
    #[arg(long, value_parser = parse_host)]
    kubelet_host: Vec<(String, String)>,
    /// How long a node may post neither status nor Lease before its Ready condition goes
    /// Unknown (kube-controller-manager's flag; "50s", "2m" or seconds).
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    node_monitor_grace_period: std::time::Duration,
    /// Serve HTTPS instead of HTTP, with a CA made at start (kept in memory only) that
    /// signs the serving certificate and approved CSRs and authenticates client
    /// certificates; written to this directory: `ca.crt` (a kubelet's clientCAFile and what
    /// `kubeadm join` puts in /etc/kubernetes/pki/ca.crt), an administrator's pair
    /// (`admin.crt`, `admin.key`, `test-admin` in `system:masters`) and `admin.conf`.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// A bootstrap token (`<id>.<secret>`, repeatable) that authenticates as
    /// `system:bootstrap:<id>` in `system:bootstrappers`, as `kubeadm token create` makes
    /// one; kubelets' client CSRs are approved, serving ones wait for `kubectl certificate
    /// approve`. Needs --tls-dir.
    #[arg(long, requires = "tls_dir")]
    bootstrap_token: Vec<String>,
    /// Leave pods without spec.nodeName unscheduled and nodes' health alone (no scheduler,
    /// no node lifecycle controller).
    #[arg(long)]
    no_controllers: bool,
}

/// A Go-style duration with one unit ("50s", "2m", "500ms") or plain seconds.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration"))?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(format!("{s:?} is not a duration (ms, s, m or h)")),
    };
    Ok(std::time::Duration::from_millis(ms))
}

fn parse_host(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((node, host)) if !node.is_empty() && !host.is_empty() => {
            Ok((node.to_string(), host.to_string()))
        }
        _ => Err(format!("{s:?} is not NODE=HOST")),
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes `text` to `path` with `mode`, through a temporary file renamed into place.
fn write(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// The kubelet client pair in `dir`, made (with its CA) when absent.
fn client_pki(dir: &Path) -> anyhow::Result<Identity> {
    let (cert, key) = (
        dir.join("kubelet-client.crt"),
        dir.join("kubelet-client.key"),
    );
    if cert.exists() && key.exists() {
        return Ok(Identity {
            cert_pem: read(&cert)?,
            key_pem: read(&key)?,
        });
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = TestCa::new("nodeagent-test-apiserver-kubelet-client-ca");
    let id = ca.issue_client("kube-apiserver-kubelet-client", &["system:masters"]);
    write(&key, &id.key_pem, 0o600)?;
    write(&cert, &id.cert_pem, 0o644)?;
    // Last: its presence tells a waiting kubelet that the pair is complete.
    write(&dir.join("ca.crt"), ca.cert_pem(), 0o644)?;
    Ok(id)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = match (
        &args.kubelet_client_pki,
        &args.kubelet_client_certificate,
        &args.kubelet_client_key,
    ) {
        (Some(dir), _, _) => Some(client_pki(dir)?),
        (None, Some(cert), Some(key)) => Some(Identity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        }),
        _ => None,
    };
    let server_ca = args
        .kubelet_certificate_authority
        .as_deref()
        .map(read)
        .transpose()?;
    let state = ApiState::default();
    state.kubelet.configure(|k| {
        k.client = client;
        k.server_ca = server_ca;
        k.hosts = args.kubelet_host.iter().cloned().collect();
    });
    if !args.no_controllers {
        state.cluster.enable(Some(args.node_monitor_grace_period));
    }
    for token in &args.bootstrap_token {
        state.certificates.add_bootstrap_token(token);
    }
    let addr = (args.bind_address, args.port).into();
    let server = match &args.tls_dir {
        Some(_) => ApiServer::start_tls_at(state, addr).await,
        None => ApiServer::start_at(state, addr).await,
    }
    .with_context(|| format!("listening on {addr}"))?;
    match &args.tls_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let admin = server.admin_identity();
            write(&dir.join("admin.key"), &admin.key_pem, 0o600)?;
            write(&dir.join("admin.crt"), &admin.cert_pem, 0o644)?;
            write(
                &dir.join("admin.conf"),
                &server.admin_kubeconfig_of(&admin),
                0o600,
            )?;
            // Last: its presence tells a waiting client that the directory is complete.
            write(&dir.join("ca.crt"), server.state.root_ca_pem(), 0o644)?;
            eprintln!(
                "nodeagent-test-apiserver: serving on {} (try: kubectl --kubeconfig {} get nodes)",
                server.url(),
                dir.join("admin.conf").display()
            );
        }
        None => eprintln!(
            "nodeagent-test-apiserver: serving on http://{}:{} (try: kubectl --server http://{}:{} get nodes)",
            args.bind_address, server.port, args.bind_address, server.port
        ),
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.stop().await;
    Ok(())
}
