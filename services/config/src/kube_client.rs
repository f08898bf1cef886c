//! The API-server client every service uses: built from a kubeconfig file, and rebuilt
//! whenever that file or the client certificate and key it names change on disk (the
//! certificate manager rotating `kubelet-client-current.pem`, or an operator replacing
//! the kubeconfig). No service restarts for it.
//!
//! A rebuild starts a new connection pool, so every request after a rotation handshakes
//! with the new certificate. Requests already under way keep their connections: a watch
//! opened with the old certificate stays open until it ends by itself (upstream's
//! kubelet instead closes every connection on rotation, which drops its watches).

use anyhow::Context;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

/// A client of the API server that `path` (a kubeconfig) names; it follows changes of the
/// file and of the client certificate and key it points to.
pub async fn kube_client(path: &Path) -> anyhow::Result<kube::Client> {
    let source = Arc::new(Source {
        path: path.to_path_buf(),
        loaded: tokio::sync::Mutex::new(None),
    });
    // A broken kubeconfig fails here, at start, with its reason.
    let (first, _) = source.current().await?;
    let namespace = first.default_namespace().to_string();
    Ok(kube::Client::new(Reloading(source), namespace))
}

/// What identifies one version of a file: a rotation replaces the file (a new inode) or
/// rewrites it (a new modification time or length).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    modified: Option<std::time::SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    // metadata follows symlinks: a swapped `-current.pem` link shows the new file.
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        modified: m.modified().ok(),
        len: m.len(),
    })
}

struct Loaded {
    /// The kubeconfig and the certificate files it names, with their stamps at load.
    files: Vec<(PathBuf, Option<Stamp>)>,
    client: kube::Client,
    /// The API server's host:port (the `host` label of the rest_client metrics).
    host: String,
}

impl Loaded {
    fn fresh(&self) -> bool {
        self.files.iter().all(|(path, was)| stamp(path) == *was)
    }
}

struct Source {
    path: PathBuf,
    loaded: tokio::sync::Mutex<Option<Loaded>>,
}

impl Source {
    /// The client of the files as they are now (a stat of each per request), and its
    /// server's host:port.
    async fn current(&self) -> anyhow::Result<(kube::Client, String)> {
        let mut loaded = self.loaded.lock().await;
        if let Some(l) = loaded.as_ref().filter(|l| l.fresh()) {
            return Ok((l.client.clone(), l.host.clone()));
        }
        let reloading = loaded.is_some();
        let next = load(&self.path).await?;
        if reloading {
            tracing::info!(kubeconfig = %self.path.display(),
                "the kubeconfig or its client certificate changed; new requests use it");
        }
        let current = (next.client.clone(), next.host.clone());
        *loaded = Some(next);
        Ok(current)
    }
}

async fn load(path: &Path) -> anyhow::Result<Loaded> {
    // Stamped before reading: a change during the read is seen at the next request.
    let kubeconfig_stamp = stamp(path);
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
    let mut files = vec![(path.to_path_buf(), kubeconfig_stamp)];
    for file in certificate_files(&kubeconfig) {
        let s = stamp(&file);
        files.push((file, s));
    }
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let client =
        kube::Client::try_from(config).with_context(|| format!("kubeconfig {}", path.display()))?;
    Ok(Loaded {
        files,
        client,
        host,
    })
}

/// The kubeconfig's current context.
pub(crate) fn current_context(
    kubeconfig: &kube::config::Kubeconfig,
) -> Option<&kube::config::Context> {
    let name = kubeconfig.current_context.as_ref()?;
    kubeconfig
        .contexts
        .iter()
        .find(|n| &n.name == name)
        .and_then(|c| c.context.as_ref())
}

/// The client certificate and key files of the kubeconfig's current user.
pub(crate) fn certificate_files(kubeconfig: &kube::config::Kubeconfig) -> Vec<PathBuf> {
    let user = current_context(kubeconfig).and_then(|c| c.user.clone());
    let Some(auth) = kubeconfig
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == user.as_ref())
        .and_then(|a| a.auth_info.as_ref())
    else {
        return Vec::new();
    };
    [&auth.client_certificate, &auth.client_key]
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .collect()
}

/// The service under `kube::Client`: each request goes to the client of the current
/// files.
#[derive(Clone)]
struct Reloading(Arc<Source>);

type Body = kube::client::Body;

impl tower::Service<http::Request<Body>> for Reloading {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// Each request is counted and timed as client-go's rest_client metrics count them
    /// (the response's status, or `<error>`; the time until the response's head).
    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let source = self.0.clone();
        Box::pin(async move {
            let (client, host) = source
                .current()
                .await
                .map_err(|e| kube::Error::Service(e.into()))?;
            let method = request.method().to_string();
            let started = std::time::Instant::now();
            let response = client.send(request).await;
            // `send` hands back every response as it came (statuses included); an error
            // is a request that got none.
            let code = response.as_ref().ok().map(|r| r.status().as_u16());
            nodeagent_telemetry::metrics::kubelet::record_rest_request(
                &method,
                &host,
                code,
                started.elapsed().as_secs_f64(),
            );
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_current_users_certificate_files() {
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
                    users:\n- name: other\n  user:\n    token: x\n- name: node\n  user:\n    client-certificate: /pki/current.pem\n    client-key: /pki/key.pem\n\
                    contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: node\ncurrent-context: ctx\n";
        let kubeconfig = kube::config::Kubeconfig::from_yaml(text).unwrap();
        assert_eq!(
            certificate_files(&kubeconfig),
            vec![
                PathBuf::from("/pki/current.pem"),
                PathBuf::from("/pki/key.pem")
            ]
        );
    }

    #[test]
    fn a_replaced_file_is_a_new_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "one").unwrap();
        let before = stamp(&a);
        let tmp = dir.path().join("b");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &a).unwrap();
        assert_ne!(stamp(&a), before);
        assert_eq!(stamp(&dir.path().join("missing")), None);
    }
}
