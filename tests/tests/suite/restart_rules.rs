//! Container-level `restartPolicy` and `restartPolicyRules` (ContainerRestartRules, beta
//! and on by default since 1.35), against the real containerd. Oracles: upstream's
//! `ContainerShouldRestart` (pkg/api/v1/pod/util.go: the container's first matching rule,
//! then its own policy, then the pod's) and `TestPodPhaseWithContainerRestartPolicy` (a
//! container that will not run again does not keep the pod Running on its own), and the
//! documentation's own example (`restartPolicy: Never` with a rule restarting on exit 42).

use nodeagent_tests::{
    Node, NodeOptions, consistently, container_status, eventually, require_runtime,
};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
/// How long a container that must not run again is given to show it would.
const NO_RESTART_WINDOW: Duration = Duration::from_secs(12);

/// The container's restart count and its terminated exit code, if it is terminated.
fn seen(pod: &Value, name: &str) -> (i64, Option<i64>) {
    let null = Value::Null;
    let s = container_status(pod, name).unwrap_or(&null);
    (
        s["restartCount"].as_i64().unwrap_or(-1),
        s["state"]["terminated"]["exitCode"].as_i64(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_own_policy_and_rules_decide_its_restarts_whatever_the_pods() {
    if !require_runtime("container restart rules") {
        return;
    }
    let node = Node::start("restart-rules", NodeOptions::default()).await;
    // The pod says Always. `retry` says Never but restarts on exit 42: its first run exits
    // 42 (restarted at once: upstream's back-off lets a first restart go), its second exits 3 (no rule matches,
    // its own Never holds: it stays down). `app` follows the pod's Always and keeps running.
    let script = "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; [ $n -ge 2 ] && exit 3; exit 42";
    node.write_manifest(
        "rules.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: rules\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: data\n    emptyDir: {{}}\n  containers:\n  - name: retry\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", {script:?}]\n    restartPolicy: Never\n    restartPolicyRules:\n    - action: Restart\n      exitCodes:\n        operator: In\n        values: [42]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n  - name: app\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n"
        ),
    );
    let pod = eventually(
        "retry ran twice, the second run exiting 3",
        DEADLINE,
        || async {
            let pod = node.pod("rules").await?;
            match seen(&pod, "retry") {
                (1, Some(3)) => Ok(pod),
                other => Err(format!("{other:?}: {}", pod["status"])),
            }
        },
    )
    .await;
    assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    let retry = container_status(&pod, "retry").unwrap();
    assert_eq!(retry["lastState"]["terminated"]["exitCode"], 42, "{retry}");
    // Exit 3 matches no rule and the container says Never: it is not run again, though
    // the pod says Always. A restart to come would show at once: the status would wait in
    // CrashLoopBackOff through the 10 s back-off instead of staying terminated.
    consistently(
        "retry not run a third time",
        NO_RESTART_WINDOW,
        Duration::from_millis(500),
        || async {
            let pod = node.pod("rules").await?;
            match seen(&pod, "retry") {
                (1, Some(3)) if pod["status"]["phase"] == "Running" => Ok(()),
                other => Err(format!("{other:?}: {}", pod["status"])),
            }
        },
    )
    .await;
    let pod = node.pod("rules").await.unwrap();
    let app = container_status(&pod, "app").unwrap();
    assert!(app["state"]["running"].is_object(), "{app}");
    node.stop().await;
}
