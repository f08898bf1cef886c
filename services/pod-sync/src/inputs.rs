//! The streams pod-sync follows (config-source, pleg, probe) and its periodic ticks. Each
//! stream's first message after a (re)connect is a snapshot that replaces what we held,
//! except probe's: its results only ever change values (see `probe_state`).

use crate::PodSync;
use crate::status::probe_state::{ProbeValues, Store};
use nodeagent_proto::api::config_source_client::ConfigSourceClient;
use nodeagent_proto::api::pod_config_update::Op;
use nodeagent_proto::api::{
    PlegWatchResponse, PodConfigUpdate, ProbeResultUpdate, RuntimePodStatus, WatchConfigRequest,
    WatchPlegRequest, pleg_watch_response::Kind,
};
use nodeagent_proto::k8s;
use nodeagent_transport::WithLimits;
use nodeagent_transport::{Channel, WatchEvent, watch_with_retry};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

pub async fn follow_config_source(sync: Arc<PodSync>, channel: Channel) {
    let client = ConfigSourceClient::new(channel).with_limits();
    let mut rx = watch_with_retry("config-source", sync.shutdown.clone(), move || {
        let mut c = client.clone();
        async move {
            Ok(c.watch(WatchConfigRequest {
                accept_chunked_snapshot: true,
            })
            .await?
            .into_inner())
        }
    });
    while let Some(event) = rx.recv().await {
        match event {
            WatchEvent::Connected => tracing::info!("following config-source"),
            WatchEvent::Disconnected(reason) => {
                tracing::warn!(%reason, "config-source stream broken")
            }
            WatchEvent::Message(update) => apply_config(&sync, update),
        }
    }
}

fn apply_config(sync: &Arc<PodSync>, update: PodConfigUpdate) {
    let op = update.op();
    let mut touched = Vec::new();
    // Resizes admitted because a pod left: their `ResizeStarted` events, once unlocked.
    let mut started = Vec::new();
    {
        let mut st = sync.lock();
        st.sources_ready = update.all_sources_ready;
        st.sources_served = update.all_sources_ready || update.all_sources_served;
        let desired_before = st.desired.len();
        let mut pods = Vec::new();
        for sp in &update.pods {
            match k8s::decode_pod(&sp.pod_json) {
                Ok(p) => pods.push(p),
                Err(e) => {
                    tracing::error!(source = %sp.source, pod.uid = %sp.uid, error = %e, "undecodable pod from config-source; ignored")
                }
            }
        }
        match op {
            Op::Snapshot => {
                let previous: Vec<String> = st.desired.keys().cloned().collect();
                // A pod being deleted gracefully is terminated, not run.
                let (deleting, wanted): (Vec<_>, Vec<_>) = pods
                    .into_iter()
                    .partition(|p| p.metadata.deletion_timestamp.is_some());
                // Each pod with its allocated resources (in-place resize: `allocation`).
                st.desired = wanted
                    .into_iter()
                    .map(|p| {
                        let p = st.allocations.intake(p);
                        (k8s::pod_uid(&p).to_string(), p)
                    })
                    .collect();
                for p in deleting {
                    terminate(&mut st, p);
                }
                st.config_synced = true;
                tracing::info!(
                    pods = st.desired.len(),
                    revision = update.revision,
                    sources_ready = update.all_sources_ready,
                    "config snapshot"
                );
                touched.extend(previous);
                touched.extend(st.all_uids());
            }
            Op::Add | Op::Update | Op::Reconcile => {
                for p in pods {
                    let uid = k8s::pod_uid(&p).to_string();
                    if p.metadata.deletion_timestamp.is_some() {
                        st.desired.remove(&uid);
                        terminate(&mut st, p);
                        touched.push(uid);
                        continue;
                    }
                    tracing::info!(pod = %k8s::pod_full_name(&p), pod.uid = %uid, op = ?op, "desired pod");
                    let p = st.allocations.intake(p);
                    st.desired.insert(uid.clone(), p);
                    touched.push(uid);
                }
                if op == Op::Reconcile {
                    touched.extend(st.all_uids());
                }
            }
            Op::Remove | Op::Delete => {
                for p in pods {
                    let uid = k8s::pod_uid(&p).to_string();
                    tracing::info!(pod = %k8s::pod_full_name(&p), pod.uid = %uid, op = ?op, "pod no longer desired");
                    st.desired.remove(&uid);
                    terminate(&mut st, p);
                    touched.push(uid);
                }
            }
            Op::Unspecified => {}
        }
        // A pod that left frees what it was allocated: the deferred resizes are tried
        // again at once, in upstream's order (upstream retries pending resizes when a pod
        // is removed), not only on their timers; each of them syncs, the admitted to carry
        // their resize out, the others to show their condition.
        if st.desired.len() < desired_before {
            let deferred: Vec<String> = st
                .resize
                .iter()
                .filter(|(_, c)| {
                    c.pending
                        .as_ref()
                        .is_some_and(|p| p.reason == crate::allocation::DEFERRED)
                })
                .map(|(uid, _)| uid.clone())
                .collect();
            for (_, _, resized) in sync.retry_pending_resizes(&mut st, None, "pods_removed") {
                started.extend(resized);
            }
            touched.extend(deferred);
        }
        // Each pod's next sync joins the trace of the change that touched it.
        for sp in &update.pods {
            if let Some(trace) = sp.trace.as_ref().or(update.trace.as_ref()) {
                st.pending_trace.insert(sp.uid.clone(), trace.clone());
            }
        }
    }
    for resized in &started {
        sync.resize_started(resized);
    }
    sync.lock().desired_changed.notify_waiters();
    if op == Op::Snapshot {
        sync.prune_finished();
    }
    for uid in touched {
        sync.trigger(&uid);
    }
}

/// Records a pod to terminate. If it is being terminated already and this newer copy asks
/// for a shorter grace period (a second deletion, a force delete), the kills under way
/// follow it (a period only ever shrinks).
fn terminate(st: &mut crate::state::State, pod: k8s_openapi::api::core::v1::Pod) {
    let uid = k8s::pod_uid(&pod).to_string();
    if let Some(updates) = st.grace_updates.get(&uid) {
        let grace = crate::worker::kill_order::grace_seconds(&pod);
        if crate::worker::kill_order::shorten(updates, grace) {
            tracing::info!(pod.uid = %uid, grace_seconds = grace, "grace period shortened");
        }
    }
    st.terminating.insert(uid, pod);
}

pub async fn follow_pleg(sync: Arc<PodSync>) {
    let client = sync.pleg.clone();
    let mut rx = watch_with_retry("pleg", sync.shutdown.clone(), move || {
        let mut c = client.clone();
        async move {
            Ok(c.watch(WatchPlegRequest {
                accept_chunked_snapshot: true,
            })
            .await?
            .into_inner())
        }
    });
    while let Some(event) = rx.recv().await {
        match event {
            WatchEvent::Connected => tracing::info!("following pleg"),
            WatchEvent::Disconnected(reason) => tracing::warn!(%reason, "pleg stream broken"),
            WatchEvent::Message(PlegWatchResponse {
                kind: Some(Kind::Snapshot(snap)),
            }) => {
                {
                    let mut st = sync.lock();
                    st.runtime = snap.pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
                    st.pleg_synced = true;
                    tracing::info!(
                        pods = st.runtime.len(),
                        revision = snap.revision,
                        "runtime snapshot"
                    );
                }
                sync.trigger_all();
            }
            WatchEvent::Message(PlegWatchResponse {
                kind: Some(Kind::Event(ev)),
            }) => {
                {
                    let status = ev.status.unwrap_or_else(|| RuntimePodStatus {
                        uid: ev.pod_uid.clone(),
                        ..Default::default()
                    });
                    if !sync.lock().apply_runtime(&ev.pod_uid, status) {
                        tracing::debug!(pod.uid = %ev.pod_uid, "pleg event older than the status held; ignored");
                    }
                }
                sync.trigger(&ev.pod_uid);
            }
            WatchEvent::Message(_) => {}
        }
    }
}

/// How often probe values of containers the runtime no longer has are pruned.
const PRUNE_PROBE_VALUES: Duration = Duration::from_secs(30);

/// Follows one probe instance's results at `channel` (the default probe socket, or a
/// registered member's endpoint) and hands them to [`apply_probe_results`]. `instance` is
/// empty for the default instance.
pub async fn follow_probe(
    shutdown: nodeagent_transport::Shutdown,
    instance: String,
    channel: Channel,
    results: crate::probers::ResultsTx,
) {
    let mut rx = nodeagent_transport::watch_probe_results(channel, shutdown);
    while let Some(event) = rx.recv().await {
        match event {
            WatchEvent::Connected => tracing::info!(probe.instance = %instance, "following probe"),
            WatchEvent::Disconnected(reason) => {
                tracing::debug!(probe.instance = %instance, %reason, "probe stream broken")
            }
            WatchEvent::Message(update) => {
                if results.send(update).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Applies the results of every probe instance (see `probe_state` for the rule) and owns
/// their file: this task is the only writer of the ready/started values, so saves never
/// race however many instances report.
pub async fn apply_probe_results(
    sync: Arc<PodSync>,
    store: Store,
    mut results: tokio::sync::mpsc::Receiver<ProbeResultUpdate>,
) {
    let mut prune = tokio::time::interval(PRUNE_PROBE_VALUES);
    loop {
        tokio::select! {
            update = results.recv() => match update {
                None => return,
                Some(update) => apply_probe(&sync, &store, update).await,
            },
            _ = prune.tick() => prune_probe_values(&sync, &store).await,
        }
    }
}

/// Applies a snapshot or a delta alike: only the results in it change values.
async fn apply_probe(sync: &Arc<PodSync>, store: &Store, update: ProbeResultUpdate) {
    let (mut touched, values) = {
        let mut st = sync.lock();
        let mut values = probe_values(&st);
        let touched = values.apply(&mut st.liveness_failed, &update);
        (touched, values)
    };
    {
        // The first snapshot after our start: every status is recomputed with it before
        // statuses are served (see `State::statuses_servable`). With several instances
        // the first one's snapshot counts: the others' pods keep the values saved on
        // disk, which is what a default-only node shows for a probe that is down.
        let mut st = sync.lock();
        if update.snapshot && !st.probe_synced {
            st.probe_synced = true;
            st.published_since_probe.clear();
            touched.extend(st.desired.keys().cloned());
        }
    }
    commit_probe_values(sync, store, values).await;
    for uid in touched {
        sync.trigger(&uid);
    }
}

/// Forgets the values of containers that the runtime no longer has (once pleg's view is in).
async fn prune_probe_values(sync: &Arc<PodSync>, store: &Store) {
    let values = {
        let mut guard = sync.lock();
        let st = &mut *guard;
        if !st.pleg_synced {
            return;
        }
        let mut values = probe_values(st);
        let live: HashSet<&str> = st
            .runtime
            .values()
            .flat_map(|p| p.containers.iter().map(|c| c.id.as_str()))
            .collect();
        if !values.prune(&live) {
            return;
        }
        let gone: Vec<String> = st
            .liveness_failed
            .iter()
            .filter(|id| !live.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            st.liveness_failed.remove(&id);
        }
        values
    };
    commit_probe_values(sync, store, values).await;
}

fn probe_values(st: &crate::state::State) -> ProbeValues {
    ProbeValues {
        ready: st.readiness.clone(),
        started: st.started.clone(),
    }
}

/// Saves new values, then lets pod-sync publish from them: whatever it publishes is on
/// disk first, so a restart starts from it.
async fn commit_probe_values(sync: &Arc<PodSync>, store: &Store, values: ProbeValues) {
    if probe_values(&sync.lock()) == values {
        return;
    }
    if let Err(e) = store.save(&values).await {
        tracing::warn!(error = %e, "probe values not saved; a restart may not restore them");
    }
    let mut st = sync.lock();
    st.readiness = values.ready;
    st.started = values.started;
}

/// The periodic resync of every pod, and housekeeping: pods that no source wants and
/// volumes that no pod owns are cleaned up (only once all sources are ready).
pub async fn ticks(sync: Arc<PodSync>, resync: Duration, housekeeping: Duration) {
    let mut resync_tick = tokio::time::interval(resync);
    let mut housekeeping_tick = tokio::time::interval(housekeeping);
    resync_tick.tick().await;
    loop {
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = resync_tick.tick() => sync.trigger_resync(),
            _ = housekeeping_tick.tick() => housekeep(&sync).await,
        }
    }
}

async fn housekeep(sync: &Arc<PodSync>) {
    {
        let mut st = sync.lock();
        st.heartbeat = Some(std::time::Instant::now());
        st.prune_containers();
    }
    let (orphans, ready) = {
        let st = sync.lock();
        let ready = st.config_synced && st.sources_ready && st.pleg_synced;
        let orphans: Vec<String> = st
            .runtime
            .keys()
            .filter(|u| !st.desired.contains_key(*u))
            .cloned()
            .collect();
        (orphans, ready)
    };
    if !ready {
        return;
    }
    for uid in orphans {
        sync.trigger(&uid);
    }
    // Allocations of pods and containers that are gone (every source has listed and
    // pleg's view is in).
    {
        let mut guard = sync.lock();
        let st = &mut *guard;
        let uids: std::collections::BTreeSet<String> = st
            .desired
            .keys()
            .chain(st.terminating.keys())
            .chain(st.runtime.keys())
            .cloned()
            .collect();
        let ids = st
            .runtime
            .values()
            .flat_map(|p| p.containers.iter().map(|c| c.id.clone()))
            .collect();
        st.allocations.retain(&uids, &ids);
        st.resize.retain(|u, _| uids.contains(u));
        crate::worker::sync::record_resize_counts(st);
    }
    sync.save_allocations().await;
    // The QoS tiers follow the pods that came and went (upstream: every minute and at
    // each pod cgroup made; here whenever they changed).
    sync.update_qos_cgroups().await;
    // Volumes left by a pod that is neither desired nor running (e.g. pod-sync died
    // between stopping a pod and releasing its volumes).
    let mut volume = sync.volume.clone();
    let Ok(found) = volume
        .list(nodeagent_proto::api::ListVolumesRequest {})
        .await
    else {
        return;
    };
    let mut uids: Vec<String> = found
        .into_inner()
        .volumes
        .into_iter()
        .map(|v| v.pod_uid)
        .collect();
    uids.sort();
    uids.dedup();
    let stale: Vec<String> = {
        let st = sync.lock();
        uids.into_iter()
            .filter(|u| !st.desired.contains_key(u) && !st.runtime.contains_key(u))
            .collect()
    };
    for uid in stale {
        tracing::info!(pod.uid = %uid, "cleaning up orphaned pod volumes");
        sync.trigger(&uid);
    }
}
