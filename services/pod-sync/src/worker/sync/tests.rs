//! The back-off, grace period and restart policy rules, row by row.

/// Go's own table for `Duration.String()` (`src/time/time_test.go`, `durationTests`),
/// the non-negative rows; then the crash-loop back-off steps upstream's messages show.
#[test]
fn go_duration_as_go_writes_it() {
    use super::go_duration;
    use std::time::Duration;
    let ms = Duration::from_millis;
    for (want, d) in [
        ("0s", Duration::ZERO),
        ("1ns", Duration::from_nanos(1)),
        ("1.1µs", Duration::from_nanos(1100)),
        ("2.2ms", Duration::from_micros(2200)),
        ("3.3s", ms(3300)),
        ("4m5s", Duration::from_secs(4 * 60 + 5)),
        ("4m5.001s", ms(4 * 60_000 + 5001)),
        ("5h6m7.001s", ms(5 * 3_600_000 + 6 * 60_000 + 7001)),
        (
            "8m0.000000001s",
            Duration::from_secs(480) + Duration::from_nanos(1),
        ),
        (
            "2562047h47m16.854775807s",
            Duration::from_nanos(i64::MAX as u64),
        ),
    ] {
        assert_eq!(go_duration(d), want);
    }
    let steps: Vec<String> = (1..=6)
        .map(|r| go_duration(super::crash_backoff(r, Duration::ZERO)))
        .collect();
    assert_eq!(steps, ["10s", "20s", "40s", "1m20s", "2m40s", "5m0s"]);
}

use super::*;

#[test]
fn a_probes_own_grace_period_applies_unless_the_pod_is_being_deleted() {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {"terminationGracePeriodSeconds": 30, "containers": []}
    }))
    .unwrap();
    let probe = k8s_openapi::api::core::v1::Probe {
        termination_grace_period_seconds: Some(2),
        ..Default::default()
    };
    assert_eq!(probe_kill_grace(&pod, Some(&probe)), 2);
    assert_eq!(probe_kill_grace(&pod, Some(&Default::default())), 30);
    assert_eq!(probe_kill_grace(&pod, None), 30);
    pod.metadata.deletion_grace_period_seconds = Some(5);
    assert_eq!(probe_kill_grace(&pod, Some(&probe)), 5);
}

#[tokio::test]
async fn a_peer_that_is_not_there_is_unreachable_not_an_error_about_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let gone = nodeagent_config::Address::Unix(dir.path().join("volume.sock"));
    let mut client =
        nodeagent_proto::api::volume_client::VolumeClient::new(nodeagent_transport::connect(&gone));
    let status = client
        .list(nodeagent_proto::api::ListVolumesRequest {})
        .await
        .unwrap_err();
    assert!(peer_unreachable(&status), "{status:?}");
    assert!(!peer_unreachable(&tonic::Status::invalid_argument(
        "bad volume name"
    )));
}

#[test]
fn backoff_doubles_to_five_minutes_and_resets() {
    let short = Duration::from_secs(1);
    assert_eq!(crash_backoff(0, short), Duration::ZERO);
    assert_eq!(crash_backoff(1, short), Duration::from_secs(10));
    assert_eq!(crash_backoff(2, short), Duration::from_secs(20));
    assert_eq!(crash_backoff(3, short), Duration::from_secs(40));
    assert_eq!(crash_backoff(10, short), Duration::from_secs(300));
    assert_eq!(crash_backoff(99, short), Duration::from_secs(300));
    assert_eq!(crash_backoff(5, Duration::from_secs(601)), Duration::ZERO);
    // After a long run the count starts again: the next quick crash waits 0 s, then 10 s.
    let long = Duration::from_secs(700);
    let base = next_backoff_base(7, 0, long);
    assert_eq!(base, 8);
    assert_eq!(crash_backoff(8 - base, short), Duration::ZERO);
    assert_eq!(
        crash_backoff(9 - next_backoff_base(8, base, short), short),
        Duration::from_secs(10)
    );
}

#[test]
fn restart_policy() {
    let should_restart = |policy: &str, code| {
        let spec = k8s_openapi::api::core::v1::PodSpec {
            restart_policy: Some(policy.into()),
            ..Default::default()
        };
        crate::restart_policy::container_should_restart(&Default::default(), &spec, code)
    };
    assert!(should_restart("Always", 0));
    assert!(should_restart("OnFailure", 1));
    assert!(!should_restart("OnFailure", 0));
    assert!(!should_restart("Never", 1));
}
