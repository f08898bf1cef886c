//! Which init containers to start, restart or kill, and whether the pod is initialized:
//! upstream's `computeInitContainerActions` (sidecar-aware), as a pure function of the
//! spec, the runtime's view of the current sandbox and the probe results. `sync.rs` only
//! carries the plan out.
//!
//! One departure from upstream, on purpose: a regular container that exists in the
//! current sandbox in any state, Exited included, means the pod was initialized. Upstream
//! skips Exited (a rebooted node's old containers), so a sidecar in back-off there blocks
//! the restart of a crashed app container (kubernetes #136969); our view is limited to the
//! current sandbox, where an exited app container can only have run after initialization.

use crate::restart_policy::restarts_after_kill;
use k8s_openapi::api::core::v1::Container;

/// The newest instance of one init container in the current sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitView {
    /// Never created in this sandbox.
    Absent,
    /// Created but not started (a pod-sync died between the two calls).
    Created,
    Running {
        id: String,
        /// Its startup probe has succeeded (or it has none).
        started: bool,
        /// Its liveness probe, or its startup probe before it passed, failed.
        unhealthy: bool,
        /// Its spec hash differs from the spec's.
        changed: bool,
    },
    Exited {
        exit_code: i32,
    },
    /// In the runtime's unknown state: killed before it runs again, so that two instances
    /// never run (or, a regular one under restartPolicy Never, the pod fails).
    Unknown {
        id: String,
    },
}

impl InitView {
    /// One this sync has just started: running, and started unless a startup probe must
    /// pass first (its id is not needed by any later decision of the same sync).
    pub fn just_started(c: &Container) -> Self {
        InitView::Running {
            id: String::new(),
            started: c.startup_probe.is_none(),
            unhealthy: false,
            changed: false,
        }
    }
}

/// Why a running init container is killed (upstream's Killing messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    pub index: usize,
    pub id: String,
    pub message: String,
    /// A probe failure (the probe's own grace applies), not a definition change.
    pub probe: Option<&'static str>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InitPlan {
    /// Init containers to start (or restart after their back-off), in spec order.
    pub to_start: Vec<usize>,
    /// Running sidecars to kill first; each is also in `to_start`.
    pub to_kill: Vec<Kill>,
    /// Every init container has done its part: the regular containers may run.
    pub initialized: bool,
    /// A regular init container failed under restartPolicy Never: the pod failed.
    pub kill_pod: bool,
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The plan for `init` (the spec's init containers, `views` in the same order).
/// `app_exists`: some regular container has an instance in the current sandbox.
pub fn compute(
    init: &[Container],
    views: &[InitView],
    app_exists: bool,
    restart_on_failure: bool,
) -> InitPlan {
    let mut plan = InitPlan::default();
    if init.is_empty() {
        plan.initialized = true;
        return plan;
    }
    let mut initialized = app_exists;
    // Walk backwards from the last init container that ran: earlier ones were done
    // before it started (their instances may even be gone).
    let mut previously_initialized = app_exists;
    let mut start = Vec::new();
    for (i, c) in init.iter().enumerate().rev() {
        let sidecar = is_sidecar(c);
        let view = views.get(i).unwrap_or(&InitView::Absent);
        if *view == InitView::Absent {
            if previously_initialized && sidecar {
                start.push(i); // a sidecar whose instance is gone runs again
            }
            continue;
        }
        if previously_initialized && !sidecar {
            continue; // after initialization only sidecars are kept running
        }
        match view {
            InitView::Absent => unreachable!("handled above"),
            InitView::Created => start.push(i),
            InitView::Running { .. } if !sidecar => {} // wait for it to exit
            InitView::Running {
                id,
                started,
                unhealthy,
                changed,
            } => {
                let kill = |message: String, probe| Kill {
                    index: i,
                    id: id.clone(),
                    message,
                    probe,
                };
                if !started {
                    // Until its startup probe passes, nothing after it starts.
                    if *unhealthy {
                        plan.to_kill.push(kill(
                            format!("Init container {} failed startup probe", c.name),
                            Some("startup"),
                        ));
                        start.push(i);
                    }
                } else {
                    if i + 1 == init.len() {
                        initialized = true;
                    } else if !previously_initialized {
                        start.push(i + 1);
                    }
                    if *changed {
                        plan.to_kill.push(kill(
                            format!("Init container {} definition changed", c.name),
                            None,
                        ));
                        start.push(i);
                    } else if *unhealthy {
                        plan.to_kill.push(kill(
                            format!("Init container {} failed liveness probe", c.name),
                            Some("liveness"),
                        ));
                        start.push(i);
                    }
                }
            }
            InitView::Unknown { id } => {
                if !sidecar && !restarts_after_kill(c, restart_on_failure) {
                    plan.kill_pod = true;
                    return plan;
                }
                plan.to_kill.push(Kill {
                    index: i,
                    id: id.clone(),
                    message:
                        "Init container is in \"unknown\" state, try killing it before restart"
                            .into(),
                    probe: None,
                });
                start.push(i);
            }
            InitView::Exited { .. } if sidecar => start.push(i),
            InitView::Exited { exit_code } if *exit_code != 0 => {
                if !restarts_after_kill(c, restart_on_failure) {
                    plan.kill_pod = true;
                    return plan;
                }
                start.push(i);
            }
            InitView::Exited { .. } => {
                if i + 1 == init.len() {
                    initialized = true;
                } else {
                    start.push(i + 1);
                }
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        start.push(0); // nothing has run yet: the first one starts
    }
    start.reverse();
    start.dedup();
    plan.to_start = start;
    plan.initialized = initialized;
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(name: &str) -> Container {
        Container {
            name: name.into(),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            name: name.into(),
            restart_policy: Some("Always".into()),
            ..Default::default()
        }
    }

    fn running(started: bool, unhealthy: bool, changed: bool) -> InitView {
        InitView::Running {
            id: "id".into(),
            started,
            unhealthy,
            changed,
        }
    }

    fn exited(code: i32) -> InitView {
        InitView::Exited { exit_code: code }
    }

    /// One situation: its name, the init containers, their views, whether a regular
    /// container exists, whether the policy restarts failures.
    type Case = (&'static str, Vec<Container>, Vec<InitView>, bool, bool);

    /// Checks the plan for `case`: what starts, the kill messages, initialized, kill pod.
    fn expect(case: Case, start: &[usize], kills: &[&str], initialized: bool, kill_pod: bool) {
        let (what, init, views, app_exists, on_failure) = case;
        let plan = compute(&init, &views, app_exists, on_failure);
        assert_eq!(plan.to_start, start, "{what}: to start");
        let messages: Vec<&str> = plan.to_kill.iter().map(|k| k.message.as_str()).collect();
        assert_eq!(messages, kills, "{what}: kills");
        assert_eq!(plan.initialized, initialized, "{what}: initialized");
        assert_eq!(plan.kill_pod, kill_pod, "{what}: kill pod");
    }

    /// One row per upstream rule (a table: one row a line).
    #[rustfmt::skip]
    #[test]
    fn plan_follows_upstream_compute_init_container_actions() {
        use InitView::{Absent, Created};
        let ok = || running(true, false, false);
        let (a, b) = (|| init("a"), || init("b"));
        expect(("no init containers", vec![], vec![], false, true), &[], &[], true, false);
        expect(("nothing ran: the first starts", vec![a(), b()], vec![Absent, Absent], false, true), &[0], &[], false, false);
        expect(("a running init container is waited for", vec![a(), b()], vec![ok(), Absent], false, true), &[], &[], false, false);
        expect(("a succeeded one starts the next", vec![a(), b()], vec![exited(0), Absent], false, true), &[1], &[], false, false);
        expect(("the last succeeded: initialized", vec![a(), b()], vec![exited(0), exited(0)], false, true), &[], &[], true, false);
        expect(("a failed one restarts under OnFailure", vec![a()], vec![exited(1)], false, true), &[0], &[], false, false);
        expect(("a failed one fails the pod under Never", vec![a()], vec![exited(1)], false, false), &[], &[], false, true);
        expect(("a created one is started", vec![a()], vec![Created], false, true), &[0], &[], false, false);
        expect(("a started sidecar starts the next", vec![sidecar("s"), b()], vec![ok(), Absent], false, true), &[1], &[], false, false);
        expect(("a sidecar not yet started holds the next back", vec![sidecar("s"), b()], vec![running(false, false, false), Absent], false, true), &[], &[], false, false);
        expect(("a sidecar failing its startup probe is restarted", vec![sidecar("s"), b()], vec![running(false, true, false), Absent], false, true), &[0], &["Init container s failed startup probe"], false, false);
        expect(("a started last sidecar: initialized", vec![a(), sidecar("s")], vec![exited(0), ok()], false, true), &[], &[], true, false);
        expect(("a sidecar failing liveness is restarted", vec![sidecar("s")], vec![running(true, true, false)], true, true), &[0], &["Init container s failed liveness probe"], true, false);
        expect(("a changed sidecar is restarted", vec![sidecar("s")], vec![running(true, false, true)], true, true), &[0], &["Init container s definition changed"], true, false);
        expect(("an exited sidecar under Never restarts", vec![sidecar("s")], vec![exited(0)], true, false), &[0], &[], true, false);
        expect(("a gone sidecar of an initialized pod runs again", vec![a(), sidecar("s")], vec![Absent, Absent], true, true), &[1], &[], true, false);
        expect(("regular init containers never rerun once initialized", vec![a(), sidecar("s")], vec![exited(1), ok()], true, false), &[], &[], true, false);
        expect(("an exited sidecar before a running init container restarts", vec![sidecar("s"), b()], vec![exited(2), ok()], false, true), &[0], &[], false, false);
        expect(("two sidecars: the second starts after the first", vec![sidecar("s1"), sidecar("s2")], vec![ok(), Absent], false, true), &[1], &[], false, false);
        expect(("two started sidecars: initialized", vec![sidecar("s1"), sidecar("s2")], vec![ok(), ok()], false, true), &[], &[], true, false);
        // Upstream skips an exited regular container here (kubernetes #136969): a sidecar
        // in back-off then holds back the restart of a crashed app. In our view of the
        // current sandbox alone, an app container that exists in any state means the pod
        // was initialized.
        expect(("an exited sidecar restarts; the app still runs", vec![sidecar("s")], vec![exited(1)], true, true), &[0], &[], true, false);
    }
}
