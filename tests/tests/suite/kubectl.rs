//! A real client drives the node: kubectl (whichever is on PATH; Debian 12's
//! kubernetes-client is 1.20, newer ones try WebSocket before SPDY) against the test API
//! server, which forwards pods/log, exec, attach, portforward and nodes/proxy to the
//! node's kubelet API on its TLS port with a client certificate, as kube-apiserver does.

use nodeagent_tests::apiserver::ApiServer;
use nodeagent_tests::{Node, NodeOptions, eventually, http_get, require_runtime};
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

mod debug;
mod resize;

const DEADLINE: Duration = Duration::from_secs(40);
/// One kubectl command that does not stream.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// kubectl with a kubeconfig for the test API server and a home of its own (its
/// discovery cache must not outlive the server).
pub(crate) struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    pub(crate) fn new(server: &ApiServer) -> Kubectl {
        let dir = tempfile::Builder::new()
            .prefix("nodeagent-kubectl-")
            .tempdir()
            .expect("temp dir");
        std::fs::write(dir.path().join("kubeconfig"), server.kubeconfig()).expect("kubeconfig");
        Kubectl { dir }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The command line, for `script -c`.
    fn shell_line(&self, args: &str) -> String {
        format!(
            "kubectl --kubeconfig {} --cache-dir {}/cache {args}",
            self.kubeconfig().display(),
            self.dir.path().display()
        )
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl to the end, `stdin` written to it.
    async fn run_with_input(&self, args: &[&str], stdin: &str) -> Output {
        let mut cmd = self.command(args);
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn kubectl");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.as_bytes())
            .await
            .expect("write stdin");
        drop(input);
        tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in {COMMAND_TIMEOUT:?}"))
            .expect("kubectl")
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.run_with_input(args, "").await
    }

    /// Runs kubectl; its stdout, or its stderr as the error.
    async fn try_ok(&self, args: &[&str]) -> Result<String, String> {
        let out = self.run(args).await;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(format!(
                "kubectl {args:?} exited {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        self.try_ok(args).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// `kubectl get pod <pod> -o jsonpath=<path>`.
    async fn jsonpath(&self, pod: &str, path: &str) -> Result<String, String> {
        self.try_ok(&["get", "pod", pod, "-o", &format!("jsonpath={path}")])
            .await
    }

    /// Creates objects from YAML, validated as kubectl validates by default: from 1.27 the
    /// server checks the fields (`fieldValidation=Strict`, learnt from `/openapi/v3`);
    /// an older kubectl validates itself against `/openapi/v2`, which this server does
    /// not serve, so it is told `--validate=false`.
    async fn create(&self, yaml: &str) {
        let args: &[&str] = if kubectl_minor() >= SERVER_SIDE_VALIDATION {
            &["create", "-f", "-"]
        } else {
            &["create", "--validate=false", "-f", "-"]
        };
        let out = self.run_with_input(args, yaml).await;
        assert!(
            out.status.success(),
            "kubectl create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until `kubectl get pods` shows the pod Running with every container ready.
    async fn wait_running(&self, pod: &str) {
        eventually(
            &format!("{pod} Running in kubectl get pods"),
            DEADLINE,
            || async {
                let out = self.try_ok(&["get", "pods"]).await?;
                let row = out
                    .lines()
                    .find(|l| l.split_whitespace().next() == Some(pod))
                    .ok_or_else(|| format!("{pod} not listed:\n{out}"))?;
                let cells: Vec<&str> = row.split_whitespace().collect();
                match cells.as_slice() {
                    [_, ready, "Running", ..]
                        if ready.split('/').next() == ready.split('/').nth(1) =>
                    {
                        Ok(())
                    }
                    _ => Err(out.clone()),
                }
            },
        )
        .await;
    }
}

/// Skips (returns None) where kubectl is not installed, except in CI, where
/// deploy/runtime/setup.sh installs Debian's kubernetes-client.
/// The kubectl minor version from which validation asks the server (its
/// `QueryParamVerifierV3` reads `/openapi/v3`).
const SERVER_SIDE_VALIDATION: u32 = 27;

/// The minor version of the kubectl on PATH (0 when it cannot say).
fn kubectl_minor() -> u32 {
    static MINOR: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MINOR.get_or_init(|| {
        let out = std::process::Command::new("kubectl")
            .args(["version", "--client", "-o", "json"])
            .output();
        let v: serde_json::Value = out
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or_default();
        let minor = v["clientVersion"]["minor"].as_str().unwrap_or_default();
        let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or(0)
    })
}

/// Whether the kubectl on PATH is at least 1.`minor`, which `needs` says why; an older one
/// is reported skipped here, and fails under CI.
fn kubectl_at_least(minor: u32, needs: &str) -> bool {
    if kubectl_minor() >= minor {
        return true;
    }
    let why = format!(
        "{needs} from kubectl 1.{minor}; this one is 1.{}",
        kubectl_minor()
    );
    nodeagent_tests::skip_unless_ci(&why)
}

pub(crate) fn require_kubectl(test: &str) -> Option<()> {
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(());
    }
    let why = format!(
        "{test} needs kubectl on PATH (deploy/runtime/setup.sh installs kubernetes-client)"
    );
    nodeagent_tests::skip_unless_ci(&why);
    None
}

/// A node registered with a test API server that can reach its kubelet API: a client
/// certificate from the node's client CA (as kube-apiserver's
/// `--kubelet-client-certificate`), the node's serving certificate as the CA to verify,
/// and the node's address (its name does not resolve).
async fn cluster(test: &str) -> (ApiServer, Node, Kubectl) {
    let (server, node) = Node::start_with_api_server(test, NodeOptions::default()).await;
    let serving = node.path("cert-dir/kubelet.crt");
    let server_ca = eventually("the kubelet's serving certificate", DEADLINE, || async {
        std::fs::read_to_string(&serving).map_err(|e| format!("{}: {e}", serving.display()))
    })
    .await;
    server.state.kubelet.configure(|k| {
        k.client = Some(
            node.ca
                .issue_client("kube-apiserver-kubelet-client", &["system:masters"]),
        );
        k.server_ca = Some(server_ca);
        k.hosts.insert(node.name.clone(), "127.0.0.1".into());
    });
    let kubectl = Kubectl::new(&server);
    let name = node.name.clone();
    eventually("the node Ready in kubectl get nodes", DEADLINE, || async {
        let out = kubectl.try_ok(&["get", "nodes"]).await?;
        match out.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.first() == Some(&name.as_str()) && cells.get(1) == Some(&"Ready")
        }) {
            true => Ok(()),
            false => Err(out.clone()),
        }
    })
    .await;
    (server, node, kubectl)
}

fn pod_yaml(name: &str, node: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n{spec}"
    )
}

/// Reads `child`'s stdout until a line contains `want`; the lines read.
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    want: &str,
) -> Result<Vec<String>, String> {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(DEADLINE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let hit = line.contains(want);
            seen.push(line);
            if hit {
                return true;
            }
        }
        false
    })
    .await;
    match found {
        Ok(true) => Ok(seen),
        _ => Err(format!("{want:?} not read; read {seen:?}")),
    }
}

fn stdout_lines(child: &mut Child) -> tokio::io::Lines<BufReader<tokio::process::ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout")).lines()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_pods_follows_logs_and_execs() {
    if !require_runtime("kubectl get, logs and exec")
        || require_kubectl("kubectl get, logs and exec").is_none()
    {
        return;
    }
    let (_server, node, kubectl) = cluster("kubectl").await;
    let pod = node.pod_name("web");
    // After `exec sleep`, PID 1's stdout is the container's log: an exec that writes to
    // /proc/1/fd/1 adds a log line while `logs -f` follows.
    kubectl
        .create(&pod_yaml(
            &pod,
            &node.name,
            "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"echo first-line; exec sleep 3600\"]\n",
        ))
        .await;
    kubectl.wait_running(&pod).await;

    let logs = kubectl.ok(&["logs", &pod]).await;
    assert_eq!(logs, "first-line\n");

    // logs -f sees a line written after it started.
    let mut follow = kubectl
        .command(&["logs", "-f", &pod])
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = stdout_lines(&mut follow);
    read_until(&mut lines, "first-line").await.unwrap();
    kubectl
        .ok(&[
            "exec",
            &pod,
            "--",
            "sh",
            "-c",
            "echo second-line > /proc/1/fd/1",
        ])
        .await;
    read_until(&mut lines, "second-line").await.unwrap();
    assert!(
        follow.try_wait().expect("try_wait").is_none(),
        "kubectl logs -f ended while the container runs"
    );
    follow.kill().await.expect("kill kubectl logs -f");

    // exec -i: stdin reaches the command, and kubectl exits with the command's code.
    // kubectl ≥ 1.30 speaks v5.channel.k8s.io (its -v=8 log says so), where closing
    // stdin is the CLOSE signal the kubelet API translates to SPDY's FIN.
    let out = kubectl
        .run_with_input(
            &[
                "exec",
                "-v=8",
                "-i",
                &pod,
                "-c",
                "c",
                "--",
                "sh",
                "-c",
                "tr a-z A-Z; exit 3",
            ],
            "hello through stdin\n",
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "HELLO THROUGH STDIN\n"
    );
    let log = String::from_utf8_lossy(&out.stderr);
    if log.contains("Sec-Websocket-Protocol: v5.channel.k8s.io") {
        assert!(
            log.contains("The subprotocol is v5.channel.k8s.io") && !log.contains("fallback"),
            "kubectl offered v5 and did not get it: {log}"
        );
    }
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // exec -it under a pseudo-terminal (script from bsdutils gives kubectl one).
    let line = kubectl.shell_line(&format!("exec -it {pod} -- sh -c 'tty; stty size; exit 4'"));
    let mut script = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("HOME", kubectl.dir.path())
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn script");
    // Kept open until the command ends: closing it would end the session's input early.
    let stdin = script.stdin.take();
    let out = tokio::time::timeout(COMMAND_TIMEOUT, script.wait_with_output())
        .await
        .expect("kubectl exec -it finished")
        .expect("script");
    drop(stdin);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/dev/pts/"),
        "no terminal in the container: {text:?} {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(4), "output: {text:?}");

    // Errors come back as the API server words them.
    let out = kubectl.run(&["logs", &pod, "-c", "nope"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("container nope is not valid for pod {pod}")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_previous_after_a_restart() {
    if !require_runtime("kubectl logs --previous")
        || require_kubectl("kubectl logs --previous").is_none()
    {
        return;
    }
    let (_server, node, kubectl) = cluster("kubectl-prev").await;
    let pod = node.pod_name("crash");
    // The first run exits 1; the second (after the 10 s crash-loop back-off) stays up.
    let script = "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo attempt-$n; [ $n -ge 2 ] || exit 1; exec sleep 3600";
    kubectl
        .create(&pod_yaml(
            &pod,
            &node.name,
            &format!(
                "  restartPolicy: Always\n  volumes:\n  - name: data\n    emptyDir: {{}}\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n"
            ),
        ))
        .await;
    eventually(
        "the second attempt running",
        Duration::from_secs(45),
        || async {
            let restarts = kubectl
                .try_ok(&[
                    "get",
                    "pod",
                    &pod,
                    "-o",
                    "jsonpath={.status.containerStatuses[0].restartCount}",
                ])
                .await?;
            let logs = kubectl.try_ok(&["logs", &pod]).await?;
            match (restarts.trim(), logs.as_str()) {
                ("1", "attempt-2\n") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    kubectl.wait_running(&pod).await;
    assert_eq!(
        kubectl.ok(&["logs", "--previous", &pod]).await,
        "attempt-1\n"
    );
    assert_eq!(
        kubectl.ok(&["logs", "-p", &pod, "--tail", "1"]).await,
        "attempt-1\n"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_attaches_port_forwards_and_proxies_to_the_node() {
    if !require_runtime("kubectl port-forward") || require_kubectl("kubectl port-forward").is_none()
    {
        return;
    }
    let (_server, node, kubectl) = cluster("kubectl-pf").await;
    let pod = node.pod_name("httpd");
    kubectl
        .create(&pod_yaml(
            &pod,
            &node.name,
            "  containers:\n  - name: httpd\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo hello through port-forward > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n",
        ))
        .await;
    let shell = node.pod_name("shell");
    kubectl
        .create(&pod_yaml(
            &shell,
            &node.name,
            "  containers:\n  - name: sh\n    image: busybox:1.36\n    command: [\"sh\"]\n    stdin: true\n",
        ))
        .await;
    kubectl.wait_running(&pod).await;
    kubectl.wait_running(&shell).await;

    // attach -i to the running shell: a command in through stdin, its output out.
    let mut attach = kubectl
        .command(&["attach", "-i", &shell])
        .stdin(Stdio::piped())
        .spawn()
        .expect("kubectl attach");
    let mut attach_in = attach.stdin.take().expect("stdin");
    let mut lines = stdout_lines(&mut attach);
    attach_in
        .write_all(b"echo attached-$((6 * 7))\n")
        .await
        .expect("write to kubectl attach");
    read_until(&mut lines, "attached-42").await.unwrap();
    attach.kill().await.expect("kill kubectl attach");

    // port-forward to a local port kubectl picks, then a GET through it.
    let mut forward = kubectl
        .command(&["port-forward", &format!("pod/{pod}"), ":8080"])
        .spawn()
        .expect("kubectl port-forward");
    let mut lines = stdout_lines(&mut forward);
    let seen = read_until(&mut lines, "Forwarding from 127.0.0.1:")
        .await
        .unwrap();
    let local: u16 = seen
        .last()
        .and_then(|l| l.split("127.0.0.1:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {seen:?}"));
    for _ in 0..2 {
        // Two connections: each is its own stream pair in one session.
        let (code, body) = http_get(local, "/index.html")
            .await
            .expect("GET through port-forward");
        assert_eq!((code, body.as_str()), (200, "hello through port-forward\n"));
    }
    forward.kill().await.expect("kill kubectl port-forward");

    // nodes/proxy: the kubelet's own endpoints through the API server.
    let healthz = kubectl
        .ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/healthz", node.name),
        ])
        .await;
    assert_eq!(healthz, "ok");
    let summary = kubectl
        .ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/stats/summary", node.name),
        ])
        .await;
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("summary JSON");
    assert_eq!(summary["node"]["nodeName"], node.name.as_str());
    assert!(
        summary["pods"]
            .as_array()
            .is_some_and(|pods| pods.iter().any(|p| p["podRef"]["name"] == pod.as_str())),
        "{pod} not in the summary: {summary}"
    );
    node.stop().await;
}

/// `kubectl apply` as a user types it, no flags: kubectl reads the server's OpenAPI v3 to
/// learn that PATCH takes `fieldValidation` and leaves the checking to the server. A typo
/// is refused in upstream's words (the text users see from kube-apiserver:
/// `Error from server (BadRequest): error when creating "...": Pod in version "v1" cannot
/// be handled as a Pod: strict decoding error: unknown field "spec.containers[0]..."`),
/// `--validate=warn` passes it with kubectl's `Warning:` line, and applying again changes
/// the pod in place: `configured`, the same container running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_validates_fields_on_the_server_and_configures_in_place() {
    if !require_runtime("kubectl apply") || require_kubectl("kubectl apply").is_none() {
        return;
    }
    if !kubectl_at_least(
        SERVER_SIDE_VALIDATION,
        "kubectl apply's server-side validation comes",
    ) {
        return;
    }
    let (_server, node, kubectl) = cluster("apply").await;
    let pod = node.pod_name("applied");
    let spec = |labels: &str, container_extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: default\n{labels}spec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n{container_extra}",
            node.name
        )
    };
    let typo = spec("", "    imagePullPolicee: Never\n");
    let out = kubectl.run_with_input(&["apply", "-f", "-"], &typo).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Error from server (BadRequest): error when creating \"STDIN\": Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].imagePullPolicee\""),
        "{stderr}"
    );
    assert!(
        kubectl.try_ok(&["get", "pod", &pod]).await.is_err(),
        "a refused pod was stored"
    );

    // `kubectl apply -f -` of `yaml` succeeds and says `pod/<name> <verb>`.
    let applied = |yaml: String, verb: &'static str| {
        let (kubectl, pod) = (&kubectl, &pod);
        async move {
            let out = kubectl.run_with_input(&["apply", "-f", "-"], &yaml).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("pod/{pod} {verb}\n")
            );
        }
    };
    applied(spec("", ""), "created").await;
    kubectl.wait_running(&pod).await;
    let id_of = || async {
        kubectl
            .ok(&[
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.containerStatuses[0].containerID}",
            ])
            .await
    };
    let first = id_of().await;

    // A label changed in the file: a strategic merge patch, the pod kept.
    applied(spec("  labels:\n    tier: web\n", ""), "configured").await;
    let tier = kubectl
        .ok(&["get", "pod", &pod, "-o", "jsonpath={.metadata.labels.tier}"])
        .await;
    assert_eq!(tier, "web");

    // The same typo in a patch: refused under the default, passed with a warning under
    // --validate=warn.
    let typo = spec("  labels:\n    tier: web\n  labelz:\n    x: y\n", "");
    let out = kubectl.run_with_input(&["apply", "-f", "-"], &typo).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("strict decoding error: unknown field \"metadata.labelz\""),
        "{stderr}"
    );
    let out = kubectl
        .run_with_input(&["apply", "--validate=warn", "-f", "-"], &typo)
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"metadata.labelz\""),
        "{stderr}"
    );
    assert_eq!(id_of().await, first, "apply restarted the container");
    assert_eq!(
        kubectl
            .ok(&["get", "pod", &pod, "-o", "jsonpath={.status.phase}"])
            .await,
        "Running"
    );
}
