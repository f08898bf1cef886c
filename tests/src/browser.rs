//! A real browser for the tests: Debian's headless Chromium, driven over the Chrome
//! DevTools Protocol (CDP: JSON commands over a WebSocket, the protocol Puppeteer and
//! Playwright speak). Only the few commands the tests need: open a page, send a header
//! with every request (a bearer token, as an operator's browser extension or proxy would),
//! navigate, evaluate a script, take a screenshot. A browser may also hold a client
//! certificate, as an operator's does: in its NSS database (`~/.pki/nssdb`, where Chromium
//! on Linux keeps them), chosen for the node's origin by Chromium's
//! `AutoSelectCertificateForUrls` policy (headless Chromium cannot show its picker).

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// The Chromium on PATH (Debian's `chromium` package).
pub fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// True when a browser is here; else the test is skipped (and fails under CI, which
/// installs one: deploy/test.sh).
pub fn require_chromium(test: &str) -> bool {
    if chromium().is_some() {
        return true;
    }
    crate::skip_unless_ci(&format!(
        "{test} needs Chromium (Debian's `chromium` package) on PATH"
    ))
}

/// The tools [`Browser::launch_with_certificate`] needs besides Chromium: NSS's `certutil`
/// and `pk12util` (Debian's `libnss3-tools`) and `openssl`.
pub fn require_certificate_tools(test: &str) -> bool {
    let missing: Vec<&str> = ["certutil", "pk12util", "openssl"]
        .into_iter()
        .filter(|t| {
            !std::env::var_os("PATH")
                .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(t).is_file()))
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    crate::skip_unless_ci(&format!(
        "{test} needs {missing:?} (Debian's libnss3-tools and openssl)"
    ))
}

/// Where Debian's Chromium reads the policies an administrator sets.
const POLICIES: &str = "/etc/chromium/policies/managed";

/// A policy file of one browser's, removed with it.
struct Policy(PathBuf);

impl Drop for Policy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A client certificate the browser holds, and the origin it presents it to.
pub struct ClientCertificate<'a> {
    pub identity: &'a crate::pki::Identity,
    /// Its issuer's common name (the policy's filter).
    pub issuer_cn: &'a str,
    /// `https://127.0.0.1:10250`: the only origin it is chosen for.
    pub origin: &'a str,
}

/// Puts `cert` into a new NSS database under `home` and writes the policy that selects it
/// for its origin (read by Chromium when it starts).
fn hold_certificate(home: &Path, cert: &ClientCertificate<'_>) -> Result<Policy, String> {
    let run = |program: &str, args: &[&str]| -> Result<(), String> {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    let nssdb = home.join(".pki/nssdb");
    std::fs::create_dir_all(&nssdb).map_err(|e| e.to_string())?;
    let (crt, key, p12) = (
        home.join("client.crt"),
        home.join("client.key"),
        home.join("client.p12"),
    );
    std::fs::write(&crt, &cert.identity.cert_pem).map_err(|e| e.to_string())?;
    std::fs::write(&key, &cert.identity.key_pem).map_err(|e| e.to_string())?;
    let path = |p: &Path| p.display().to_string();
    run(
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-in",
            &path(&crt),
            "-inkey",
            &path(&key),
            "-passout",
            "pass:",
            "-name",
            "nodeagent-test-client",
            "-out",
            &path(&p12),
        ],
    )?;
    let db = format!("sql:{}", nssdb.display());
    run("certutil", &["-N", "-d", &db, "--empty-password"])?;
    run("pk12util", &["-d", &db, "-i", &path(&p12), "-W", ""])?;
    std::fs::create_dir_all(POLICIES).map_err(|e| format!("{POLICIES}: {e}"))?;
    let rule = json!({"pattern": cert.origin, "filter": {"ISSUER": {"CN": cert.issuer_cn}}});
    let file = Path::new(POLICIES).join(format!(
        "nodeagent-test-{}-{}.json",
        std::process::id(),
        home.display().to_string().replace('/', "_")
    ));
    std::fs::write(
        &file,
        json!({"AutoSelectCertificateForUrls": [rule.to_string()]}).to_string(),
    )
    .map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(Policy(file))
}

/// Chromium's error for a load it aborted because the host's network changed.
pub const NETWORK_CHANGED: &str = "net::ERR_NETWORK_CHANGED";

pub struct Browser {
    _child: tokio::process::Child,
    _policy: Option<Policy>,
    _profile: tempfile::TempDir,
    socket: Socket,
    next_id: u64,
    session: Option<String>,
}

impl Browser {
    /// Starts a headless Chromium with a profile of its own and attaches to a new page
    /// of `width`×`height` CSS pixels.
    pub async fn launch(width: u32, height: u32) -> Result<Browser, String> {
        Self::start(width, height, None).await
    }

    /// As [`Self::launch`], holding `cert` for its origin, and no other credential.
    pub async fn launch_with_certificate(
        width: u32,
        height: u32,
        cert: &ClientCertificate<'_>,
    ) -> Result<Browser, String> {
        Self::start(width, height, Some(cert)).await
    }

    async fn start(
        width: u32,
        height: u32,
        cert: Option<&ClientCertificate<'_>>,
    ) -> Result<Browser, String> {
        let binary = chromium().ok_or("no chromium on PATH")?;
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        // Chromium finds its NSS database in $HOME.
        let home = profile.path().join("home");
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        let policy = match cert {
            Some(cert) => Some(hold_certificate(&home, cert)?),
            None => None,
        };
        let child = tokio::process::Command::new(&binary)
            .args([
                "--headless",
                // As root (the tests run as root) Chromium refuses its sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                // The kubelet's serving certificate is the test CA's.
                "--ignore-certificate-errors",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!(
                "--user-data-dir={}",
                profile.path().join("data").display()
            ))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .env("HOME", &home)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let (port, url) = devtools_url(&profile.path().join("data")).await?;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        let (socket, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        let mut browser = Browser {
            _child: child,
            _policy: policy,
            _profile: profile,
            socket,
            next_id: 1,
            session: None,
        };
        let target = browser
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await?;
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await?;
        browser.session = attached["sessionId"].as_str().map(str::to_string);
        browser.call("Page.enable", json!({})).await?;
        browser.call("Network.enable", json!({})).await?;
        browser
            .call(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
            )
            .await?;
        Ok(browser)
    }

    /// Sends one command (to the page once attached) and waits for its answer, skipping
    /// the events that arrive meanwhile.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            command["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::Text(command.to_string().into()))
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let answer = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(message) = self.socket.next().await {
                let Ok(Message::Text(text)) = message else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if value["id"] == json!(id) {
                    return Ok(value);
                }
            }
            Err(format!("{method}: the browser closed the connection"))
        })
        .await
        .map_err(|_| format!("{method}: no answer in 30 s"))??;
        match answer.get("error") {
            Some(e) => Err(format!("{method}: {e}")),
            None => Ok(answer["result"].clone()),
        }
    }

    /// Every request the page makes from now on carries these headers.
    pub async fn set_headers(&mut self, headers: Value) -> Result<(), String> {
        self.call("Network.setExtraHTTPHeaders", json!({"headers": headers}))
            .await
            .map(drop)
    }

    /// Opens `url`. Chromium aborts what it is loading with `net::ERR_NETWORK_CHANGED`
    /// whenever the host's network interfaces change, which the other tests' pod networks
    /// (CNI bridges, veths) do all the time on a test host: such a navigation is made
    /// again, as a user would reload (CI's node page test failed on it).
    pub async fn navigate(&mut self, url: &str) -> Result<(), String> {
        let mut tries = 0;
        loop {
            let r = self.call("Page.navigate", json!({"url": url})).await?;
            match r.get("errorText").and_then(Value::as_str) {
                None => return Ok(()),
                Some(NETWORK_CHANGED) if tries < 5 => {
                    eprintln!("navigating to {url}: {NETWORK_CHANGED}; again");
                    tries += 1;
                }
                Some(e) => return Err(format!("navigating to {url}: {e:?}")),
            }
        }
    }

    /// Reloads the page (see [`Self::navigate`] for why a test may have to).
    pub async fn reload(&mut self) -> Result<(), String> {
        self.call("Page.reload", json!({})).await.map(drop)
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub async fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(format!("{expression}: {e}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// A PNG of the whole page, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        use base64::Engine;
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The browser's DevTools WebSocket URL, from the `DevToolsActivePort` file Chromium
/// writes into its profile (port, then path) once it listens.
async fn devtools_url(profile: &Path) -> Result<(u16, String), String> {
    let file = profile.join("DevToolsActivePort");
    Ok(crate::eventually(
        "Chromium's DevToolsActivePort",
        Duration::from_secs(30),
        || async {
            let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            let mut lines = text.lines();
            match (lines.next().map(str::parse::<u16>), lines.next()) {
                (Some(Ok(port)), Some(path)) => Ok((port, format!("ws://127.0.0.1:{port}{path}"))),
                _ => Err(format!("not complete yet: {text:?}")),
            }
        },
    )
    .await)
}
