//! A private image registry for the tests: the OCI distribution API, read-only (`GET /v2/`,
//! `GET|HEAD /v2/<name>/manifests/<reference>`, `GET|HEAD /v2/<name>/blobs/<digest>`),
//! over plain HTTP on 127.0.0.1 (containerd's CRI pulls from a localhost registry over
//! HTTP without any configuration), serving one image to HTTP basic auth only (or to anyone, for test images). Every
//! request is recorded with the user it presented, so a test can tell which credential a
//! pull used and that the blobs really came from here.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use base64::Engine;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An image as the registry serves it: its manifest and the blobs it names.
#[derive(Clone)]
pub struct Image {
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
    pub layer_digest: String,
    blobs: HashMap<String, Vec<u8>>,
}

fn sha256(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Image {
    /// A busybox image built here, unlike any other (so a pull fetches every blob): the
    /// host's static `/bin/busybox` with its applets as symlinks, as
    /// `deploy/runtime/setup.sh` builds `busybox:1.36`, and `/etc/registry-marker` holding
    /// `marker`.
    pub fn busybox(marker: &str) -> Image {
        Image::busybox_with(marker, &[])
    }

    /// The same busybox image with host files added: each `(host path, image path)` is
    /// copied in, and so is every shared library `ldd` names for it (at the same path), so
    /// a dynamically linked test binary runs in the image.
    pub fn busybox_with(marker: &str, files: &[(&std::path::Path, &str)]) -> Image {
        let dir = tempfile::tempdir().expect("temp dir");
        let rootfs = dir.path().join("rootfs");
        for d in [
            "bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "proc", "sys", "dev",
        ] {
            std::fs::create_dir_all(rootfs.join(d)).expect("mkdir");
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy /bin/busybox");
        let applets = std::process::Command::new("/bin/busybox")
            .arg("--list-full")
            .output()
            .expect("busybox --list-full");
        for applet in String::from_utf8_lossy(&applets.stdout).lines() {
            let link = rootfs.join(applet);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            if !link.exists() {
                std::os::unix::fs::symlink("/bin/busybox", &link).expect("symlink an applet");
            }
        }
        std::fs::write(rootfs.join("etc/registry-marker"), marker).expect("write the marker");
        for (host, in_image) in files {
            copy_into(&rootfs, host, in_image);
            for lib in shared_libraries(host) {
                let rel = lib.to_string_lossy().trim_start_matches('/').to_string();
                copy_into(&rootfs, &lib, &rel);
            }
        }
        std::fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
        )
        .expect("write passwd");
        let tar = dir.path().join("layer.tar");
        let status = std::process::Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("run tar");
        assert!(status.success(), "tar failed");
        let layer = std::fs::read(&tar).expect("read the layer");
        let diff_id = sha256(&layer);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &layer).expect("gzip");
        let layer_gz = gz.finish().expect("gzip");
        let layer_digest = sha256(&layer_gz);
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": ["sh"]
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "nodeagent tests registry"}]
        }))
        .unwrap();
        let config_digest = sha256(&config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config.len()
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest,
                "size": layer_gz.len()
            }]
        }))
        .unwrap();
        let manifest_digest = sha256(&manifest);
        let blobs = HashMap::from([
            (config_digest.clone(), config),
            (layer_digest.clone(), layer_gz),
        ]);
        Image {
            manifest,
            manifest_digest,
            layer_digest,
            blobs,
        }
    }
}

/// Copies `host` to `rootfs/in_image` (following links: the image gets the file itself).
fn copy_into(rootfs: &std::path::Path, host: &std::path::Path, in_image: &str) {
    let dest = rootfs.join(in_image.trim_start_matches('/'));
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::copy(host, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", host.display()));
}

/// The shared libraries (and the loader) `ldd` lists for a binary, as absolute paths.
fn shared_libraries(binary: &std::path::Path) -> Vec<std::path::PathBuf> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .expect("run ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/')
                .then(|| std::path::PathBuf::from(path))
        })
        .collect()
}

/// A marker no other image has: an image built with it is new to containerd every run.
pub fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}-{nanos}", std::process::id())
}

/// The runtime's image of that name (or id), if it has one.
pub async fn image_status(
    cri: &nodeagent_cri::Cri,
    image: &str,
) -> Option<nodeagent_proto::cri::Image> {
    let mut images = cri.image.clone();
    images
        .image_status(nodeagent_proto::cri::ImageStatusRequest {
            image: Some(nodeagent_proto::cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
}

/// Removes every image pulled from a test registry into `repository` (from this run or
/// one that died). Such images are built fresh each run, so no other name shares their
/// id and removing by id removes nothing else.
pub async fn remove_images(cri: &nodeagent_cri::Cri, repository: &str) {
    let mut images = cri.image.clone();
    let all = images
        .list_images(nodeagent_proto::cri::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .into_inner()
        .images;
    for image in all {
        let ours = image.repo_tags.iter().any(|t| {
            t.strip_prefix("127.0.0.1:")
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(_, name)| name.starts_with(&format!("{repository}:")))
        });
        if ours {
            images
                .remove_image(nodeagent_proto::cri::RemoveImageRequest {
                    image: Some(nodeagent_proto::cri::ImageSpec {
                        image: image.id.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .expect("RemoveImage");
        }
    }
}

/// One request the registry answered.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    /// The user of the basic credentials presented, if any.
    pub user: Option<String>,
    pub status: u16,
}

struct Inner {
    repository: String,
    tag: String,
    image: Image,
    username: String,
    password: String,
    log: Mutex<Vec<Logged>>,
    /// How long each blob request waits before it is answered (a slow or hung registry).
    blob_delay: Mutex<Duration>,
    /// Blob requests received, answered or not.
    blobs_asked: std::sync::atomic::AtomicUsize,
}

/// The registry, serving until dropped.
pub struct Registry {
    pub port: u16,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Registry {
    /// Serves `image` as `<repository>:<tag>` on a free port of 127.0.0.1, to
    /// `username`/`password` only (to anyone when `username` is empty).
    pub async fn start(
        repository: &str,
        tag: &str,
        image: Image,
        username: &str,
        password: &str,
    ) -> Registry {
        let inner = Arc::new(Inner {
            repository: repository.into(),
            tag: tag.into(),
            image,
            username: username.into(),
            password: password.into(),
            log: Mutex::new(Vec::new()),
            blob_delay: Mutex::new(Duration::ZERO),
            blobs_asked: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the registry");
        let port = listener.local_addr().unwrap().port();
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Registry { port, inner, task }
    }

    /// `127.0.0.1:<port>`, the registry host of its images.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The image's full reference, `127.0.0.1:<port>/<repository>:<tag>`.
    pub fn image_ref(&self) -> String {
        format!(
            "{}/{}:{}",
            self.host(),
            self.inner.repository,
            self.inner.tag
        )
    }

    pub fn image(&self) -> &Image {
        &self.inner.image
    }

    /// Makes every later blob request wait `delay` before its answer (a slow link; a very
    /// long one is a registry that hangs).
    pub fn delay_blobs(&self, delay: Duration) {
        *self.inner.blob_delay.lock().unwrap() = delay;
    }

    /// How many blob requests have arrived, including those still waiting for an answer.
    pub fn blobs_asked(&self) -> usize {
        self.inner
            .blobs_asked
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.inner.log.lock().unwrap().clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The user and password of `Authorization: Basic ...`.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// A distribution API error body.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"errors": [{"code": code, "message": message, "detail": null}]});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header("Docker-Distribution-API-Version", "registry/2.0")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn content(media_type: &str, digest: Option<&str>, bytes: &[u8]) -> Response {
    // For HEAD, hyper sends the headers (the length from the body) and no body.
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, media_type)
        .header("Docker-Distribution-API-Version", "registry/2.0");
    if let Some(digest) = digest {
        response = response.header("Docker-Content-Digest", digest);
    }
    response.body(Body::from(bytes.to_vec())).unwrap()
}

async fn handle(
    State(reg): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let presented = basic_credentials(&headers);
    // A registry started with no username serves anyone.
    let authorized = reg.username.is_empty()
        || presented
            .as_ref()
            .is_some_and(|(u, p)| *u == reg.username && *p == reg.password);
    let response = if !authorized {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "authentication required",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Basic realm=\"nodeagent-test-registry\"".parse().unwrap(),
        );
        r
    } else {
        if uri.path().contains("/blobs/") {
            reg.blobs_asked
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let delay = *reg.blob_delay.lock().unwrap();
            tokio::time::sleep(delay).await;
        }
        route(&reg, &method, uri.path())
    };
    reg.log.lock().unwrap().push(Logged {
        method: method.to_string(),
        path: uri.path().to_string(),
        user: presented.map(|(u, _)| u),
        status: response.status().as_u16(),
    });
    response
}

fn route(reg: &Inner, method: &Method, path: &str) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this registry is read-only",
        );
    }
    if path == "/v2/" || path == "/v2" {
        return content("application/json", None, b"{}");
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return error(StatusCode::NOT_FOUND, "NOT_FOUND", "not found");
    };
    let image = &reg.image;
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        if name != reg.repository {
            return error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
            );
        }
        if reference != reg.tag && reference != image.manifest_digest {
            return error(
                StatusCode::NOT_FOUND,
                "MANIFEST_UNKNOWN",
                "manifest unknown",
            );
        }
        return content(
            "application/vnd.oci.image.manifest.v1+json",
            Some(&image.manifest_digest),
            &image.manifest,
        );
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        if name != reg.repository {
            return error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
            );
        }
        return match image.blobs.get(digest) {
            Some(bytes) => content("application/octet-stream", Some(digest), bytes),
            None => error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN", "blob unknown"),
        };
    }
    error(StatusCode::NOT_FOUND, "NOT_FOUND", "not found")
}
