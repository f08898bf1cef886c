//! The node's web page (`/ui/` on 10250, issue 34) in a real browser: headless Chromium
//! (Debian's package) driven over the DevTools protocol, logged in with a bearer token
//! that the test API server reviews (TokenReview, then SubjectAccessReview on
//! `nodes/ui`), as a browser behind an authenticating proxy would send it, with a client
//! certificate the browser holds, and through `kubectl proxy`. The oracles are
//! outside the page: the pods must be those `/pods` lists, the log tail what
//! `/containerLogs` answers, 401 and 403 with upstream's kubelet wording, and the
//! SubjectAccessReview names the subresource `ui`.
//! Needs root, the containerd that `deploy/runtime/setup.sh` starts, and Chromium.

use super::kubectl::{Kubectl, require_kubectl};
use nodeagent_config::Service;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::browser::{
    Browser, ClientCertificate, require_certificate_tools, require_chromium,
};
use nodeagent_tests::kubelet_client::Credentials;
use nodeagent_tests::pki::TestCa;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// A node behind webhook authentication and authorization (the test API server's
/// TokenReview and SubjectAccessReview) whose operator (`operator-token`) may open the
/// page, list the pods and read logs (`nodes/ui`, `pods`, and `proxy` for
/// `/containerLogs`, as upstream maps it).
pub(crate) struct OperatorNode {
    pub server: ApiServer,
    pub node: Node,
    /// The client CA the node trusts.
    pub ca: TestCa,
    pub _dir: tempfile::TempDir,
}

pub(crate) async fn operator_node(
    test: &str,
    service_args: Vec<(Service, Vec<String>)>,
) -> OperatorNode {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(&format!("{test}-client-ca"));
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let server = ApiServer::start(ApiState::default(), 0).await;
    server
        .state
        .auth
        .add_token("operator-token", "operator", &[]);
    for subresource in ["ui", "pods", "stats", "proxy"] {
        server.state.auth.allow("operator", "get", subresource);
    }
    let options = NodeOptions {
        kubeconfig: Some(server.kubeconfig()),
        auth_config: Some(auth_config(&ca_file)),
        service_args,
        ..NodeOptions::default()
    };
    let node = Node::start(test, options).await;
    OperatorNode {
        server,
        node,
        ca,
        _dir: dir,
    }
}

fn auth_config(ca: &std::path::Path) -> String {
    format!(
        "authentication:\n  x509:\n    clientCAFile: {}\n  webhook:\n    enabled: true\n\
         \x20 anonymous:\n    enabled: false\nauthorization:\n  mode: Webhook\n",
        ca.display()
    )
}

/// Markup where the page shows text: none of it may become an element or run (its
/// `<img>` would be `#pwned`; its handlers set `window.pwned`).
const HOSTILE: &str =
    r#"<img src=x id=pwned onerror="window.pwned=1"><script>window.pwned=2</script>"#;

/// A pod whose every text the page shows is [`HOSTILE`]: the init container's termination
/// message, the container's log, its failing readiness probe's output (the probe result
/// and the `Unhealthy` event, which carries the raw output as upstream's does).
fn hostile_pod() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hostile\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  initContainers:\n  - name: init\n    \
         image: busybox:1.36\n    command: [\"sh\", \"-c\", \"printf '%s' \\\"$H\\\" > /dev/termination-log\"]\n    \
         env:\n    - name: H\n      value: {HOSTILE:?}\n  containers:\n  - name: c\n    \
         image: busybox:1.36\n    command: [\"sh\", \"-c\", \"echo \\\"$H\\\"; sleep 3600\"]\n    \
         env:\n    - name: H\n      value: {HOSTILE:?}\n    readinessProbe:\n      exec:\n        \
         command: [\"sh\", \"-c\", \"echo \\\"$H\\\"; exit 1\"]\n      periodSeconds: 2\n"
    )
}

fn pod(name: &str, script: &str, probe: bool) -> String {
    let readiness = if probe {
        "\n    readinessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 2"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  volumes:\n  - name: scratch\n    emptyDir: {{}}\n  \
         containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", {script:?}]\n    \
         volumeMounts:\n    - name: scratch\n      mountPath: /scratch{readiness}\n"
    )
}

/// A port below 1024 that nothing listens on (`--ui-loopback-port` must be privileged).
fn free_privileged_port() -> u16 {
    (700..1000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below 1024")
}

/// Where the screenshots go: `$NODEAGENT_SCREENSHOTS`, else `target/screenshots`.
fn screenshots() -> PathBuf {
    std::env::var_os("NODEAGENT_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
            target.join("screenshots")
        })
}

/// Waits until the page has rendered `hash` (app.js marks `body[data-loaded]`), then
/// until `check` (a script returning a string: empty when satisfied, else what is
/// missing) is satisfied.
pub(crate) async fn wait_page(browser: &mut Browser, hash: &str, what: &str, check: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let script = format!(
        "(() => {{ if (!document.body || document.body.dataset.loaded !== {hash:?}) return 'not loaded: ' + \
         (document.getElementById('live') || {{}}).textContent; return ({check})(); }})()"
    );
    // The page's own script never ran: the page loaded but its app.js did not (Chromium
    // aborts a load with ERR_NETWORK_CHANGED when another test's pod network comes or
    // goes; CI's node page test waited 60 s on such a page). A user reloads; so does this
    // wait, a few times, after 10 s without the script.
    let script_ran = "typeof route === 'function'";
    let mut reloads = 0;
    let mut since = tokio::time::Instant::now();
    loop {
        // An error while the page navigates (no body yet, its context replaced) is a wait.
        let got = browser.eval(&script).await.map_err(Value::String);
        if got == Ok(Value::String(String::new())) {
            return Value::Null;
        }
        if reloads < 3
            && since.elapsed() > Duration::from_secs(10)
            && browser.eval(script_ran).await == Ok(Value::Bool(false))
        {
            eprintln!("{what}: the page's script did not load; reloading");
            browser.reload().await.unwrap();
            reloads += 1;
            since = tokio::time::Instant::now();
        }
        if tokio::time::Instant::now() > deadline {
            // What the page was doing: its state (`refreshing`: since when a refresh is
            // under way), the view, and every request it finished with how long it took
            // (one under way is not listed).
            let state = browser
                .eval(
                    "JSON.stringify({readyState: document.readyState, hash: location.href, \
                     dataset: Object.assign({}, document.body && document.body.dataset), \
                     view: (document.getElementById('view') || {}).textContent, \
                     requests: performance.getEntriesByType('resource').map(r => [r.name, \
                     Math.round(r.responseEnd ? r.duration : -1)])})",
                )
                .await;
            panic!("{what}: still {got:?} after 60 s; the page: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The pod list shows both pods (the empty string), or how many rows it shows.
const TWO_POD_ROWS: &str = "() => document.querySelectorAll('tr.pod').length >= 2 ? '' : \
                            'rows: ' + document.querySelectorAll('tr.pod').length";

#[tokio::test(flavor = "multi_thread")]
async fn the_node_page_in_a_browser_lists_the_pods_draws_history_and_tails_logs() {
    if !require_runtime("the node page")
        || !require_chromium("the node page")
        || !require_certificate_tools("the node page")
        || require_kubectl("the node page").is_none()
    {
        return;
    }
    let ui_port = free_privileged_port();
    let OperatorNode {
        server,
        mut node,
        ca,
        _dir,
    } = operator_node(
        "node_page",
        vec![(
            Service::HttpServer,
            vec![
                format!("--ui-loopback-port={ui_port}"),
                // The history the page draws (the harness turns it off elsewhere).
                "--ui-history-period=15s".into(),
            ],
        )],
    )
    .await;
    let policy = server.state.auth.clone();
    // The viewer may only list pods.
    policy.add_token("viewer-token", "viewer", &[]);
    policy.allow("viewer", "get", "pods");
    node.write_manifest(
        "web.yaml",
        &pod(
            "web",
            "i=0; while true; do i=$((i+1)); echo \"hello from web $i\"; sleep 1; done",
            true,
        ),
    );
    node.write_manifest("idle.yaml", &pod("idle", "sleep 3600", false));
    node.write_manifest("hostile.yaml", &hostile_pod());
    let operator = node.api.with(Credentials::Token("operator-token".into()));
    for name in ["web", "idle"] {
        eventually(
            &format!("{name} running"),
            Duration::from_secs(60),
            || async {
                let pods: Value = serde_json::from_str(&operator.get("/pods").await?.text())
                    .map_err(|e| e.to_string())?;
                let running = pods["items"].as_array().into_iter().flatten().any(|p| {
                    p["metadata"]["name"] == node.pod_name(name).as_str()
                        && p["status"]["phase"] == "Running"
                });
                running.then_some(()).ok_or_else(|| format!("{pods}"))
            },
        )
        .await;
    }

    // Who may not see it: no credentials 401, a user without `nodes/ui` (nor `proxy`)
    // 403, in upstream's words; the operator's review names the subresource `ui`.
    let none = node.api.with(Credentials::None).get("/ui/").await.unwrap();
    assert_eq!((none.status, none.text().as_str()), (401, "Unauthorized"));
    let viewer = node.api.with(Credentials::Token("viewer-token".into()));
    let denied = viewer.get("/ui/").await.unwrap();
    assert_eq!(
        (denied.status, denied.text().as_str()),
        (
            403,
            "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[ui proxy])\n"
        )
    );
    let denied = viewer.get("/ui/api/node").await.unwrap();
    assert_eq!(denied.status, 403, "{}", denied.text());
    let page = operator.get("/ui/").await.unwrap();
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(
        page.text().contains("<script src=\"app.js\""),
        "{}",
        page.text()
    );
    let reviewed: Vec<Value> = policy
        .access_reviews()
        .into_iter()
        .filter(|s| s["user"] == "operator")
        .collect();
    assert!(
        reviewed
            .iter()
            .any(|s| s["resourceAttributes"]["subresource"] == "ui"
                && s["resourceAttributes"]["name"] == node.name.as_str()),
        "{reviewed:?}"
    );

    // The services card: pleg killed and started again is one restart, with its new
    // process's start time (the harness is not systemd: the restarts this http-server saw;
    // under systemd, deploy/systemd/test-in-container.sh checks they are NRestarts).
    let pleg_row = |node_json: &str| -> Result<Value, String> {
        let v: Value = serde_json::from_str(node_json).map_err(|e| e.to_string())?;
        v["services"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["name"] == "pleg"))
            .cloned()
            .ok_or_else(|| format!("no pleg row: {v}"))
    };
    let before = eventually("pleg's row", Duration::from_secs(30), || async {
        let row = pleg_row(&operator.get("/ui/api/node").await?.text())?;
        (row["healthy"] == true && row["startTime"].is_number())
            .then_some(row.clone())
            .ok_or_else(|| format!("{row}"))
    })
    .await;
    assert_eq!(
        (&before["restarts"], &before["restartsFrom"]),
        (&serde_json::json!(0), &serde_json::json!("watched")),
        "{before}"
    );
    node.signal(Service::Pleg, nix::sys::signal::Signal::SIGKILL)
        .await;
    node.spawn(Service::Pleg);
    node.wait_serving(Service::Pleg).await;
    eventually(
        "pleg's restart on the page",
        Duration::from_secs(30),
        || async {
            let row = pleg_row(&operator.get("/ui/api/node").await?.text())?;
            (row["restarts"] == 1
                && row["restartsFrom"] == "watched"
                && row["healthy"] == true
                && row["startTime"].is_number()
                && row["startTime"] != before["startTime"])
                .then_some(())
                .ok_or_else(|| format!("{row}"))
        },
    )
    .await;

    // The operator's port on loopback: root's processes get the page, the pod list and a
    // log tail without credentials; a connection of another uid (nobody's) is closed
    // unanswered, and nothing but those paths is served there.
    let wget = |path: &str, uid: Option<u32>, host: Option<&str>| {
        let mut cmd = tokio::process::Command::new("/bin/busybox");
        cmd.kill_on_drop(true);
        // (Debian's busybox 1.35 wget crashes with `-T`: the wait is bounded here instead.)
        cmd.args(["wget", "-q", "-O-"])
            .arg(format!("http://127.0.0.1:{ui_port}{path}"));
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        if let Some(host) = host {
            cmd.args(["--header", &format!("Host: {host}")]);
        }
        async move {
            tokio::time::timeout(Duration::from_secs(20), cmd.output())
                .await
                .map_err(|_| "wget took over 20 s".to_string())?
                .map_err(|e| e.to_string())
        }
    };
    let root = wget("/ui/", None, None).await.unwrap();
    assert!(
        root.status.success() && String::from_utf8_lossy(&root.stdout).contains("app.js"),
        "{root:?}"
    );
    let pods = wget("/pods", None, None).await.unwrap();
    assert!(
        String::from_utf8_lossy(&pods.stdout).contains(&node.pod_name("web")),
        "{pods:?}"
    );
    let logs = wget(
        &format!("/containerLogs/default/{}/c", node.pod_name("web")),
        None,
        None,
    )
    .await
    .unwrap();
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("hello from web"),
        "{logs:?}"
    );
    let nobody = wget("/ui/", Some(65534), None).await.unwrap();
    assert!(
        !nobody.status.success() && nobody.stdout.is_empty(),
        "another uid is not served: {nobody:?}"
    );
    for path in ["/configz", "/stats/summary", "/runningpods/"] {
        let other = wget(path, None, None).await.unwrap();
        assert!(
            !other.status.success(),
            "{path} is not served on loopback: {other:?}"
        );
    }
    assert!(
        node.log(Service::HttpServer)
            .lines()
            .any(|l| l.contains("only root's are served") && l.contains("uid=\"Some(65534)\"")),
        "the refused connection is logged with its uid"
    );
    // A web page of another site whose name was re-pointed to 127.0.0.1 (DNS rebinding)
    // sends its own name: refused.
    let rebound = wget("/pods", None, Some(&format!("evil.example:{ui_port}")))
        .await
        .unwrap();
    assert!(
        !rebound.status.success() && rebound.stdout.is_empty(),
        "another Host is refused: {rebound:?}"
    );

    let mut browser = Browser::launch(1400, 1000).await.expect("start Chromium");
    browser
        .set_headers(serde_json::json!({"Authorization": "Bearer operator-token"}))
        .await
        .unwrap();
    let base = format!("https://127.0.0.1:{}/ui/", node.port);
    let out = screenshots();

    // The pod list is `/pods`'s, pod for pod.
    browser.navigate(&format!("{base}#/pods")).await.unwrap();
    wait_page(&mut browser, "#/pods", "the pod list", TWO_POD_ROWS).await;
    let listed: BTreeSet<String> = serde_json::from_value(
        browser
            .eval("[...document.querySelectorAll('tr.pod')].map(tr => tr.dataset.uid)")
            .await
            .unwrap(),
    )
    .unwrap();
    let pods: Value = serde_json::from_str(&operator.get("/pods").await.unwrap().text()).unwrap();
    let served: BTreeSet<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["uid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, served,
        "the page lists exactly the pods /pods lists"
    );

    // `nodes/ui` shows nobody more than the raw API would: a pod's details (events,
    // probes, traces) need what `/pods` needs, the history what `/stats/summary` needs,
    // with upstream's 403 naming the subresources tried.
    policy.add_token("ui-token", "ui-only", &[]);
    policy.allow("ui-only", "get", "ui");
    let ui_only = node.api.with(Credentials::Token("ui-token".into()));
    let web_uid = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == node.pod_name("web").as_str())
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(ui_only.get("/ui/api/node").await.unwrap().status, 200);
    for (path, subresources) in [
        (format!("/ui/api/pod?uid={web_uid}"), "pods proxy"),
        (format!("/ui/api/history?uid={web_uid}"), "stats"),
        ("/ui/api/history".to_string(), "stats"),
    ] {
        let denied = ui_only.get(&path).await.unwrap();
        assert_eq!(
            (denied.status, denied.text().as_str()),
            (
                403,
                format!(
                    "Forbidden (user=ui-only, verb=get, resource=nodes, subresource(s)=[{subresources}])\n"
                )
                .as_str()
            ),
            "{path}"
        );
    }
    // The filter narrows the list to the web pod.
    let shown = browser
        .eval(
            "(() => { const f = document.getElementById('pod-filter'); f.value = 'web'; \
             f.dispatchEvent(new Event('input')); return [...document.querySelectorAll('tr.pod')]\
             .map(tr => tr.children[1].textContent); })()",
        )
        .await
        .unwrap();
    assert_eq!(shown, serde_json::json!([node.pod_name("web")]));

    // The node page: seven services, every one healthy, and graphs with points (one point
    // at the start and one every 15 s).
    browser.navigate(&format!("{base}#/")).await.unwrap();
    wait_page(
        &mut browser,
        "#/",
        "the node page's services and conditions",
        "() => { const rows = [...document.querySelectorAll('.card')].find(c => \
         c.querySelector('h2').textContent === 'Services').querySelectorAll('tbody tr'); \
         const bad = [...rows].filter(r => r.children[1].textContent !== 'healthy')\
         .map(r => r.textContent); return rows.length === 7 && !bad.length ? '' : \
         rows.length + ' services, unhealthy: ' + bad.join('; '); }",
    )
    .await;
    wait_page(
        &mut browser,
        "#/",
        "the node's CPU and memory graphs with two points",
        "() => { const n = (k) => Number(document.querySelector(`#node-graphs \
         canvas[data-graph=\"${k}\"]`).dataset.points || 0); return n('mem') >= 2 && \
         n('cpu') >= 1 ? '' : 'points: mem ' + n('mem') + ', cpu ' + n('cpu'); }",
    )
    .await;
    let ready = browser
        .eval(
            "[...document.querySelectorAll('.card')].find(c => c.querySelector('h2').textContent \
             === 'Conditions').textContent.includes('Ready')",
        )
        .await
        .unwrap();
    assert_eq!(ready, Value::Bool(true), "the node's conditions are shown");
    browser
        .screenshot(&out.join("node-page.png"))
        .await
        .unwrap();

    // The web pod's page: its log tail is its output, its readiness probe's result and its
    // volume are shown.
    let web = node.pod_name("web");
    let hash = format!("#/pod/default/{web}");
    browser.navigate(&format!("{base}{hash}")).await.unwrap();
    wait_page(
        &mut browser,
        &hash,
        "the web pod's log tail, probe result and volume",
        "() => { const logs = document.getElementById('logs').textContent; \
         const text = document.getElementById('view').textContent; \
         if (!/hello from web \\d+/.test(logs)) return 'logs: ' + logs; \
         if (!text.includes('readiness') || !/Success \\d/.test(text)) return 'no probe result'; \
         if (!text.includes('scratch') || !text.includes('kubernetes.io~empty-dir')) \
         return 'no volume'; return ''; }",
    )
    .await;
    let tail = browser
        .eval("document.getElementById('logs').textContent")
        .await
        .unwrap();
    let served = operator
        .get(&format!("/containerLogs/default/{web}/c?tailLines=200"))
        .await
        .unwrap()
        .text();
    let first_shown = tail.as_str().unwrap().lines().next().unwrap().to_string();
    assert!(
        served.lines().any(|l| l == first_shown),
        "the tail is /containerLogs' answer: {first_shown:?} not in {served:?}"
    );
    wait_page(
        &mut browser,
        &hash,
        "the web pod's memory graph with a point",
        "() => { const n = Number(document.querySelector('#pod-graphs \
         canvas[data-graph=\"mem\"]').dataset.points || 0); return n >= 1 ? '' : 'points ' + n; }",
    )
    .await;
    // Its traces: one crosses services (the sync's calls to the volume service carry its
    // trace), under a 32-hex-digit OTLP trace ID.
    wait_page(
        &mut browser,
        &hash,
        "a trace of the web pod across two services",
        "() => { const ts = [...document.querySelectorAll('details.trace')]; \
         const across = ts.find(t => new Set([...t.querySelectorAll('tbody tr')]\
         .map(r => r.children[0].textContent)).size >= 2); if (!across) return ts.length + \
         ' traces, none across services'; const id = across.querySelector('.trace-id').textContent; \
         return /^[0-9a-f]{32}$/.test(id) ? '' : 'trace id ' + id; }",
    )
    .await;
    browser.screenshot(&out.join("pod-page.png")).await.unwrap();
    eprintln!("screenshots in {}", out.display());

    // A refresh keeps what the user did on the page: a trace closed stays closed, a log
    // tail scrolled back stays where it was (it followed the end before).
    wait_page(
        &mut browser,
        &hash,
        "a log tail longer than its box",
        "() => { const l = document.getElementById('logs'); return l.scrollHeight > \
         l.clientHeight + 50 ? '' : 'log height ' + l.scrollHeight; }",
    )
    .await;
    // The user scrolls back while a refresh is loading the tail (each tail load now takes
    // a second longer): where they scrolled to must win over where the refresh found the
    // box (at the end, so it would follow the end). Before, the refresh put it back at the end.
    browser
        .eval(
            "(() => { const real = window.fetch; window.logsPending = 0; \
             window.fetch = async (u, o) => { if (!String(u).startsWith('../containerLogs/')) \
             return real(u, o); window.logsPending++; \
             await new Promise(r => setTimeout(r, 1000)); \
             try { return await real(u, o); } finally { window.logsPending--; } }; \
             return true; })()",
        )
        .await
        .unwrap();
    wait_page(
        &mut browser,
        &hash,
        "a refresh loading the log tail",
        "() => window.logsPending > 0 ? '' : 'no tail loading'",
    )
    .await;
    let before = browser
        .eval(
            "(() => { const l = document.getElementById('logs'); \
             const atEnd = l.scrollTop + l.clientHeight >= l.scrollHeight - 4; \
             const d = document.querySelector('details.trace[open]'); d.open = false; \
             l.scrollTop = 0; return [d.dataset.trace, atEnd, \
             Number(document.body.dataset.refreshes)]; })()",
        )
        .await
        .unwrap();
    assert_eq!(
        before[1],
        Value::Bool(true),
        "the tail followed the end: {before}"
    );
    let closed = before[0].as_str().unwrap().to_string();
    // A refresh whose request fails (as Chromium aborts requests when the host's network
    // changes) keeps the page as it was and says it is stale: the trace is neither gone
    // nor opened again.
    browser
        .eval(
            "(() => { const real = window.fetch; window.failedFetches = 0; \
             window.fetch = (u, o) => { if (String(u).startsWith('api/pod?') && \
             window.failedFetches < 1) { window.failedFetches++; \
             return Promise.reject(new TypeError('Failed to fetch')); } return real(u, o); }; \
             return true; })()",
        )
        .await
        .unwrap();
    wait_page(
        &mut browser,
        &hash,
        "a refresh that failed, the page kept",
        &format!(
            "() => {{ if (window.failedFetches < 1 || document.body.dataset.refreshing) \
             return 'not failed yet'; const d = document.querySelector(\
             'details.trace[data-trace=\"{closed}\"]'); if (!d || d.open) return 'trace ' + \
             (d ? 'opened' : 'gone'); return document.getElementById('live').classList\
             .contains('stale') ? '' : 'not stale: ' + document.getElementById('live').textContent; }}"
        ),
    )
    .await;
    let refreshes = browser
        .eval("Number(document.body.dataset.refreshes)")
        .await
        .unwrap()
        .as_u64()
        .unwrap();
    wait_page(
        &mut browser,
        &hash,
        "two refreshes of the pod's page",
        &format!(
            "() => Number(document.body.dataset.refreshes) >= {} ? '' : 'refreshes ' + \
             document.body.dataset.refreshes",
            refreshes + 2
        ),
    )
    .await;
    let after = browser
        .eval(&format!(
            "[document.querySelector('details.trace[data-trace=\"{closed}\"]')?.open ?? null, \
             document.getElementById('logs').scrollTop]"
        ))
        .await
        .unwrap();
    assert_eq!(
        after,
        serde_json::json!([false, 0]),
        "the closed trace and the scrolled-back tail stay through refreshes"
    );

    // Hostile text where the page shows text (a termination message, a log line, a probe's
    // output and its event): shown as text, never made an element nor run.
    let hostile = node.pod_name("hostile");
    let hostile_hash = format!("#/pod/default/{hostile}");
    browser
        .navigate(&format!("{base}{hostile_hash}"))
        .await
        .unwrap();
    let check = format!(
        "() => {{ const h = {HOSTILE:?}; const view = document.getElementById('view').textContent; \
         const logs = document.getElementById('logs').textContent; \
         if (!logs.includes(h)) return 'log tail: ' + logs; \
         if (!view.includes('exit code 0, ') || !view.includes('(' + h + ')')) return 'no termination message'; \
         if (!view.includes('Failure') || view.split(h).length < 4) return 'no probe output'; \
         if (!view.includes('Readiness probe failed: ' + h)) return 'no Unhealthy event'; \
         return ''; }}"
    );
    wait_page(
        &mut browser,
        &hostile_hash,
        "the hostile pod's texts",
        &check,
    )
    .await;
    let injected = browser
        .eval(
            "[document.querySelectorAll('#pwned, #view script, #view img').length, \
             typeof window.pwned]",
        )
        .await
        .unwrap();
    assert_eq!(
        injected,
        serde_json::json!([0, "undefined"]),
        "no element made of a pod's text, nothing of it run"
    );
    browser
        .screenshot(&out.join("hostile-pod-page.png"))
        .await
        .unwrap();

    // A user who may read the pods but not `nodes/stats` sees the pod's page, and in
    // place of its graphs why not.
    policy.add_token("pods-token", "pods-only", &[]);
    policy.allow("pods-only", "get", "ui");
    policy.allow("pods-only", "get", "pods");
    browser
        .set_headers(serde_json::json!({"Authorization": "Bearer pods-token"}))
        .await
        .unwrap();
    browser.navigate(&format!("{base}{hash}")).await.unwrap();
    wait_page(
        &mut browser,
        &hash,
        "the graphs' card saying nodes/stats is not allowed",
        "() => { const d = [...document.querySelectorAll('.denied')].map(e => e.textContent); \
         const text = document.getElementById('view').textContent; \
         if (!text.includes('readiness')) return 'no probes card'; \
         return d.length === 1 && d[0].includes('403 Forbidden (user=pods-only, verb=get, \
         resource=nodes, subresource(s)=[stats])') ? '' : 'denied: ' + JSON.stringify(d); }",
    )
    .await;

    // An operator whose browser holds a client certificate of the node's client CA (in its
    // NSS database, chosen for the node's origin by policy) logs in with it alone, no
    // header: upstream's x509 authentication (CN the user, O the groups), then the same
    // review of `nodes/ui`. Without the certificate the page would get 401 and list no pod.
    policy.allow("cert-operator", "get", "ui");
    policy.allow("cert-operator", "get", "pods");
    let identity = ca.issue_client("cert-operator", &["ops"]);
    let mut holder = Browser::launch_with_certificate(
        1400,
        1000,
        &ClientCertificate {
            identity: &identity,
            issuer_cn: "node_page-client-ca",
            origin: &format!("https://127.0.0.1:{}", node.port),
        },
    )
    .await
    .expect("start Chromium holding a client certificate");
    holder.navigate(&format!("{base}#/pods")).await.unwrap();
    wait_page(
        &mut holder,
        "#/pods",
        "the pod list, logged in with a client certificate",
        TWO_POD_ROWS,
    )
    .await;
    let reviewed = policy
        .access_reviews()
        .into_iter()
        .filter(|s| s["user"] == "cert-operator")
        .collect::<Vec<Value>>();
    assert!(
        reviewed.iter().any(|s| s["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == "ops"))
            && s["resourceAttributes"]["subresource"] == "ui"),
        "the certificate's user and group were reviewed for nodes/ui: {reviewed:?}"
    );
    holder
        .screenshot(&out.join("pod-list-client-certificate.png"))
        .await
        .unwrap();
    drop(holder);

    // Through the API server's node proxy (`kubectl proxy`), as an operator without a
    // credential of the node's opens it: no header from the browser; the API server's own
    // client certificate reaches the kubelet (kube-apiserver's
    // `--kubelet-client-certificate`), allowed `nodes/proxy` as upstream's
    // system:kubelet-api-admin role allows it (with `nodes/stats` and `nodes/log`), so `ui`
    // falls back to `proxy`. Every URL in the page is relative, so it all goes through the
    // proxy.
    let serving = std::fs::read_to_string(node.path("cert-dir/kubelet.crt")).unwrap();
    server.state.kubelet.configure(|k| {
        k.client = Some(ca.issue_client("kube-apiserver-kubelet-client", &[]));
        k.server_ca = Some(serving.clone());
        k.hosts.insert(node.name.clone(), "127.0.0.1".into());
    });
    for subresource in ["proxy", "stats", "log"] {
        policy.allow("kube-apiserver-kubelet-client", "get", subresource);
    }
    let kubectl = Kubectl::new(&server);
    let mut proxy = kubectl
        .command(&["proxy", "--port=0"])
        .spawn()
        .expect("kubectl proxy");
    let mut lines = tokio::io::BufReader::new(proxy.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("kubectl proxy's first line")
        .unwrap()
        .unwrap_or_default();
    let port = first
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    browser.set_headers(serde_json::json!({})).await.unwrap();
    let proxied = format!(
        "http://127.0.0.1:{port}/api/v1/nodes/{}/proxy/ui/",
        node.name
    );
    browser.navigate(&format!("{proxied}#/pods")).await.unwrap();
    wait_page(
        &mut browser,
        "#/pods",
        "the pod list through kubectl proxy",
        TWO_POD_ROWS,
    )
    .await;
    browser.navigate(&format!("{proxied}{hash}")).await.unwrap();
    wait_page(
        &mut browser,
        &hash,
        "the web pod's log tail through kubectl proxy",
        "() => /hello from web \\d+/.test(document.getElementById('logs').textContent) ? '' : \
         document.getElementById('logs').textContent",
    )
    .await;
    proxy.kill().await.unwrap();
    drop(browser);
    node.stop().await;
}
