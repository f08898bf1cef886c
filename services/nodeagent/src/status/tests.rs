use super::*;
use serde_json::json;

fn serving(name: &'static str) -> ServiceState {
    ServiceState {
        name,
        health: Ok(()),
        version: Some("0.1.0 (commit abc)".into()),
        warnings: Vec::new(),
    }
}

fn ready(status: &str) -> Condition {
    Condition {
        kind: "Ready".into(),
        status: status.into(),
        reason: if status == "True" {
            "KubeletReady".into()
        } else {
            "KubeletNotReady".into()
        },
        message: "kubelet is posting ready status".into(),
    }
}

fn healthy_report() -> Report {
    Report {
        node: "node-1".into(),
        services: Service::ALL.iter().map(|s| serving(s.name())).collect(),
        conditions: Some(vec![ready("True")]),
        phases: Some(BTreeMap::from([("Running".into(), 2)])),
        ..Report::default()
    }
}

#[test]
fn healthy_means_every_service_serves_and_the_node_is_ready() {
    assert!(problems(&healthy_report()).is_empty());
    assert!(render(&healthy_report()).ends_with("\nhealthy\n"));

    let mut down = healthy_report();
    let pod_sync = down
        .services
        .iter()
        .position(|s| s.name == "pod-sync")
        .unwrap();
    down.services[pod_sync].health =
        Err("connection refused at unix:///run/nodeagent/pod-sync.sock".into());
    assert_eq!(
        problems(&down),
        vec!["pod-sync: connection refused at unix:///run/nodeagent/pod-sync.sock"]
    );
    assert!(render(&down).contains("UNHEALTHY:\n  pod-sync: connection refused"));

    let mut not_ready = healthy_report();
    not_ready.conditions = Some(vec![ready("False")]);
    assert_eq!(
        problems(&not_ready),
        vec!["node not Ready: KubeletNotReady kubelet is posting ready status"]
    );
    let mut unknown = healthy_report();
    unknown.conditions = None;
    assert_eq!(problems(&unknown).len(), 1);
    let mut none_yet = healthy_report();
    none_yet.conditions = Some(vec![]);
    assert_eq!(problems(&none_yet), vec!["node has no Ready condition yet"]);
}

/// Upstream's waiting reasons (pkg/kubelet/images/types.go, kuberuntime): those that say
/// something is wrong are listed; ContainerCreating and PodInitializing are a start.
#[test]
fn waiting_containers_are_those_stuck_for_a_reason() {
    let pods = vec![
        json!({"metadata": {"namespace": "default", "name": "web"},
               "status": {"phase": "Pending",
                          "containerStatuses": [
                              {"name": "c", "state": {"waiting": {"reason": "ErrImagePull", "message": "no such host"}}},
                              {"name": "d", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}),
        json!({"metadata": {"namespace": "kube-system", "name": "dns"},
               "status": {"phase": "Running",
                          "initContainerStatuses": [{"name": "i", "state": {"terminated": {"exitCode": 0}}}],
                          "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
        json!({"metadata": {"namespace": "default", "name": "new"}, "status": {}}),
    ];
    assert_eq!(
        waiting_containers(&pods),
        vec![
            "default/web c: ErrImagePull: no such host",
            "kube-system/dns c: CrashLoopBackOff"
        ]
    );
    assert_eq!(
        phases(&pods),
        BTreeMap::from([("Pending".to_string(), 2), ("Running".to_string(), 1)])
    );
}

#[test]
fn the_build_comes_from_the_metrics_text() {
    let text = "# HELP nodeagent_build_info x\n# TYPE nodeagent_build_info gauge\n\
                nodeagent_build_info{service=\"pleg\",version=\"0.1.0 (commit 1a2b\\\"c)\"} 1\n";
    assert_eq!(
        build_version(text).as_deref(),
        Some("0.1.0 (commit 1a2b\"c)")
    );
    assert_eq!(
        build_version("process_open_fds{service=\"pleg\"} 9\n"),
        None
    );
}

#[test]
fn kubelet_env_gives_the_services_flags() {
    let text = "# Written by kubelet (kubelet.service) for the seven nodeagent services.\n\
                KUBELET_ARGS='--config=/var/lib/kubelet/config.yaml --v=2'\n";
    assert_eq!(
        kubelet_env_args(text).unwrap(),
        vec![
            OsString::from("--config=/var/lib/kubelet/config.yaml"),
            OsString::from("--v=2")
        ]
    );
    assert_eq!(kubelet_env_args("nothing\n"), None);
}

#[test]
fn the_report_names_what_is_ignored_and_counts_pods() {
    let mut r = healthy_report();
    r.ignored_fields = vec!["logging.flushFrequency".into()];
    r.ignored_flags = vec!["vmodule".into()];
    r.waiting = vec!["default/web c: ErrImagePull".into()];
    let text = render(&r);
    assert!(text.contains("pods: 2 (Running 2)"), "{text}");
    assert!(
        text.contains("config fields: logging.flushFrequency"),
        "{text}"
    );
    assert!(text.contains("flags: vmodule"), "{text}");
    assert!(
        text.contains("waiting containers:\n  default/web c: ErrImagePull"),
        "{text}"
    );
    assert!(
        text.contains("  pleg           serving      0.1.0 (commit abc)"),
        "{text}"
    );
}

fn warning(service: &'static str, t: i64, object: &str, reason: &str) -> Warning {
    Warning {
        service,
        last_unix_nanos: t,
        object: object.into(),
        container: None,
        reason: reason.into(),
        message: "why".into(),
        count: 1,
    }
}

/// The services' recent warnings: merged by time, the newest ten shown, oldest first,
/// with the container from the event's fieldPath and a repeat count; they do not make the
/// node unhealthy (they are history, not a state).
#[test]
fn recent_warnings_merge_newest_last_and_render() {
    let mut all = Vec::new();
    for i in 0..8 {
        all.push(warning(
            "pod-sync",
            100 + 2 * i,
            &format!("default/p{i}"),
            "BackOff",
        ));
        all.push(warning(
            "probe",
            101 + 2 * i,
            &format!("default/q{i}"),
            "Unhealthy",
        ));
    }
    let shown = newest_warnings(all.into_iter());
    assert_eq!(shown.len(), 10);
    assert_eq!(shown.first().unwrap().last_unix_nanos, 106);
    assert_eq!(shown.last().unwrap().object, "default/q7");
    assert!(
        shown
            .windows(2)
            .all(|w| w[0].last_unix_nanos <= w[1].last_unix_nanos)
    );

    assert_eq!(container_of("spec.containers{app}").as_deref(), Some("app"));
    assert_eq!(
        container_of("spec.initContainers{init}").as_deref(),
        Some("init")
    );
    assert_eq!(container_of(""), None);

    let mut report = healthy_report();
    let mut w = warning("pod-sync", 3_723_000_000_000, "default/web", "Failed");
    w.container = Some("c".into());
    w.message = "Error: ErrImageNeverPull".into();
    w.count = 3;
    report.warnings = vec![w];
    let text = render(&report);
    assert!(
        text.contains(
            "recent warnings (UTC, newest last):\n  01:02:03 pod-sync    default/web c: Failed: Error: ErrImageNeverPull (x3)\n"
        ),
        "{text}"
    );
    assert!(problems(&report).is_empty());
    assert!(text.ends_with("\nhealthy\n"), "{text}");
}
