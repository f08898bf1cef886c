use super::*;

/// The periodic pass wakes the pods no source lists (their removal is due), not a
/// listed one: a finished one is not synced again (upstream: no worker for a rejected
/// pod, no update for a finished one), the others have their own timers.
#[test]
fn the_periodic_pass_wakes_only_pods_no_source_wants() {
    use crate::worker::workers::PodWorkerState::{Syncing, Terminated};
    let mut st = State::default();
    for uid in ["refused", "running", "new"] {
        st.desired.insert(uid.into(), Pod::default());
    }
    st.worker_states.insert("refused".into(), Terminated);
    st.worker_states.insert("running".into(), Syncing);
    st.worker_states.insert("deleted".into(), Terminated);
    st.terminating.insert("deleted".into(), Pod::default());
    let mut uids: Vec<_> = st.resync_uids().into_iter().collect();
    uids.sort();
    assert_eq!(uids, ["deleted"]);
    assert!(
        st.all_uids().contains("refused"),
        "a pleg snapshot still wakes it"
    );
}

/// A wanted pod resyncs on its timer while it is synced; once it finished, only while
/// something of it still runs (a kill that failed is tried again), as upstream's
/// worker re-queues a failed termination.
#[test]
fn a_finished_pod_resyncs_only_while_something_of_it_runs() {
    use crate::worker::workers::PodWorkerState::{Syncing, Terminated};
    use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus, RuntimeSandbox};
    use nodeagent_proto::cri::{ContainerState, PodSandboxState};
    let mut st = State::default();
    for uid in ["syncing", "done", "kill-failed", "sandbox-left"] {
        st.desired.insert(uid.into(), Pod::default());
        let state = if uid == "syncing" {
            Syncing
        } else {
            Terminated
        };
        st.worker_states.insert(uid.into(), state);
    }
    let container = |state: ContainerState| RuntimeContainer {
        state: state as i32,
        ..Default::default()
    };
    let sandbox = |state: PodSandboxState| RuntimeSandbox {
        state: state as i32,
        ..Default::default()
    };
    use ContainerState::{ContainerExited as Exited, ContainerRunning as Running};
    use PodSandboxState::{SandboxNotready as NotReady, SandboxReady as Ready};
    for (uid, c, s) in [
        ("done", Exited, NotReady),
        ("kill-failed", Running, NotReady),
        ("sandbox-left", Exited, Ready),
    ] {
        st.runtime.insert(
            uid.into(),
            RuntimePodStatus {
                containers: vec![container(c)],
                sandboxes: vec![sandbox(s)],
                ..Default::default()
            },
        );
    }
    let resyncing: Vec<_> = ["syncing", "done", "kill-failed", "sandbox-left", "gone"]
        .into_iter()
        .filter(|uid| st.resyncs(uid))
        .collect();
    assert_eq!(resyncing, ["syncing", "kill-failed", "sandbox-left"]);
}

/// upstream client-go flowcontrol `backoff_test.go`, the tables of the back-off
/// upstream's image puller uses (no jitter), with their steps and limits.
mod flowcontrol {
    use super::*;

    fn get(b: Option<&Backoff>) -> Duration {
        b.map_or(Duration::ZERO, |b| b.until - b.at)
    }

    #[test]
    fn test_slow_backoff() {
        let step = Duration::from_secs(1);
        let limits = (step, 50 * step);
        let start = Instant::now();
        let mut b: Option<Backoff> = None;
        for (ix, c) in [0u32, 1, 2, 4, 8, 16, 32, 50, 50, 50]
            .into_iter()
            .enumerate()
        {
            let now = start + step * (ix as u32 + 1);
            assert_eq!(get(b.as_ref()), c * step, "input {ix}");
            b = Some(Backoff::next_within(b.as_ref(), now, String::new(), limits));
        }
    }

    /// upstream's "get to backoff = maxDuration": a failure every `step`, max/step + 1
    /// times; the entry and the time of the last one.
    fn at_max(step: Duration, max: Duration) -> (Backoff, Instant) {
        let mut now = Instant::now();
        let mut b: Option<Backoff> = None;
        for _ in 0..=(max.as_secs() / step.as_secs()) {
            now += step;
            b = Some(Backoff::next_within(
                b.as_ref(),
                now,
                String::new(),
                (step, max),
            ));
        }
        (b.unwrap(), now)
    }

    #[test]
    fn test_backoff_reset() {
        let (step, max) = (Duration::from_secs(1), Duration::from_secs(5));
        let (b, mut now) = at_max(step, max);
        assert!(b.waiting(now), "capped at max and in back-off");
        now += 2 * max + step;
        assert!(!b.waiting(now));
        // The next failure starts from the beginning again.
        let again = Backoff::next_within(Some(&b), now, String::new(), (step, max));
        assert_eq!(get(Some(&again)), step);
    }

    #[test]
    fn test_backoff_high_water_mark() {
        let (step, max) = (Duration::from_secs(1), Duration::from_secs(5));
        let (b, mut now) = at_max(step, max);
        // The high watermark expires only after 2 * max.
        now += max + step;
        let b = Backoff::next_within(Some(&b), now, String::new(), (step, max));
        assert_eq!(get(Some(&b)), max);
    }

    #[test]
    fn test_is_in_back_off_since_update() {
        let step = Duration::from_secs(1);
        let limits = (step, 10 * step);
        let start = Instant::now();
        let rows: [(u32, bool, u32); 38] = [
            (0, false, 0),
            (1, false, 1),
            (2, true, 2),
            (3, false, 2),
            (4, true, 4),
            (5, true, 4),
            (6, true, 4),
            (7, false, 4),
            (8, true, 8),
            (9, true, 8),
            (10, true, 8),
            (11, true, 8),
            (12, true, 8),
            (13, true, 8),
            (14, true, 8),
            (15, false, 8),
            (16, true, 10),
            (17, true, 10),
            (18, true, 10),
            (19, true, 10),
            (20, true, 10),
            (21, true, 10),
            (22, true, 10),
            (23, true, 10),
            (24, true, 10),
            (25, false, 10),
            (26, true, 10),
            (27, true, 10),
            (28, true, 10),
            (29, true, 10),
            (30, true, 10),
            (31, true, 10),
            (32, true, 10),
            (33, true, 10),
            (34, true, 10),
            (35, false, 10),
            (56, false, 0),
            (57, false, 1),
        ];
        let mut b: Option<Backoff> = None;
        for (tick, in_back_off, value) in rows {
            let now = start + tick * step;
            let waiting = b.as_ref().is_some_and(|b| b.waiting(now));
            assert_eq!(waiting, in_back_off, "tick {tick}");
            if in_back_off {
                assert_eq!(get(b.as_ref()), value * step, "tick {tick}");
            } else {
                b = Some(Backoff::next_within(b.as_ref(), now, String::new(), limits));
            }
        }
    }
}

#[test]
fn statuses_are_served_only_once_every_desired_pod_has_one() {
    let mut st = State::default();
    assert!(!st.statuses_servable(), "nothing known yet");
    st.config_synced = true;
    st.pleg_synced = true;
    assert!(
        !st.statuses_servable(),
        "an empty desired set before every source listed says nothing"
    );
    st.snapshots_seen_at = Some(Instant::now() - STATUS_GATE_MAX);
    assert!(!st.statuses_servable(), "not even after the bounded wait");
    st.snapshots_seen_at = None;
    st.sources_served = true;
    st.desired.insert("u1".into(), Pod::default());
    st.published_since_probe.insert("u1".into());
    assert!(!st.statuses_servable(), "probe's results are not in yet");
    st.probe_synced = true;
    st.published_since_probe.clear();
    assert!(
        !st.statuses_servable(),
        "u1's status predates probe's results"
    );
    st.published_since_probe.insert("u1".into());
    assert!(st.statuses_servable());
    st.desired.insert("u2".into(), Pod::default());
    assert!(
        st.statuses_servable(),
        "a new pod does not hide the others again"
    );
}

#[test]
fn a_slow_pod_hides_the_others_for_a_bounded_time_only() {
    let mut st = State {
        config_synced: true,
        sources_served: true,
        pleg_synced: true,
        ..State::default()
    };
    st.desired.insert("slow".into(), Pod::default());
    st.desired.insert("unread".into(), Pod::default());
    st.statuses.insert("slow".into(), Default::default());
    assert!(!st.statuses_servable());
    st.snapshots_seen_at = Some(Instant::now() - STATUS_GATE_MAX);
    assert!(
        !st.statuses_servable(),
        "a desired pod without any status would vanish from the list"
    );
    st.statuses.insert("unread".into(), Default::default());
    assert!(
        st.statuses_servable(),
        "every pod listed: probe's missing results hide nothing longer"
    );
}

#[test]
fn a_pod_whose_state_cannot_be_read_hides_the_others_for_a_bounded_time_only() {
    let mut st = State {
        config_synced: true,
        sources_served: true,
        pleg_synced: true,
        probe_synced: true,
        ..State::default()
    };
    st.desired.insert("unread".into(), Pod::default());
    st.snapshots_seen_at = Some(Instant::now() - STATUS_GATE_MAX);
    assert!(!st.statuses_servable());
    st.snapshots_seen_at = Some(Instant::now() - STATUS_GATE_HARD_MAX);
    assert!(st.statuses_servable());
}
