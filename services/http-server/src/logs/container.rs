//! `GET /containerLogs/{namespace}/{pod}/{container}` (upstream's `getContainerLogs` and
//! `GetKubeletContainerLogs`): the pod from pod-sync's statuses, the container instance
//! from its status (the current one, or with `previous` the last terminated one), its
//! log path from CRI `ContainerStatus`, and the file read as `reader.rs` does.

use super::options::{LogOptions, QueryError};
use super::reader::{Liveness, LogReader};
use crate::AppState;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use nodeagent_cri::Cri;
use nodeagent_cri::api::ContainerState;
use std::sync::Arc;

/// Chunks (of up to 64 KiB) buffered between the file reader and the client.
const BUFFERED_CHUNKS: usize = 8;

type Pairs = Vec<(String, String)>;

pub async fn container_logs(
    State(state): State<Arc<AppState>>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    query: Result<Query<Pairs>, QueryRejection>,
) -> Response {
    // Upstream answers both with fixed JSON-looking text.
    let opts = match query
        .map_err(|e| QueryError::Decode(e.body_text()))
        .and_then(|Query(pairs)| LogOptions::from_query(&pairs))
    {
        Ok(o) => o,
        Err(QueryError::Decode(why)) => {
            tracing::debug!(%why, "containerLogs query does not decode");
            return error(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#,
            );
        }
        Err(QueryError::Invalid(why)) => {
            tracing::debug!(%why, "containerLogs query is not valid");
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"message": "Invalid request."}"#,
            );
        }
    };
    let pod = match find_pod(&state, &namespace, &pod_name).await {
        Ok(Some(pod)) => pod,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                &format!("pod {pod_name:?} does not exist"),
            );
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, &e),
    };
    if !has_container(&pod, &container) {
        return error(
            StatusCode::NOT_FOUND,
            &format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let status = container_status(&pod, &container);
    let id = match select_instance(&pod_name, status, &container, opts.previous) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let log_path = match state.cri.container_status(&id).await {
        Ok(r) => r.status.map(|s| s.log_path).unwrap_or_default(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("failed to get container status {id:?}: {}", e.message()),
            );
        }
    };
    if log_path.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("container {container:?} in pod {pod_name:?} has no log file"),
        );
    }
    let path = std::path::PathBuf::from(log_path);
    // A follower holds a blocking-pool thread until the container exits or the client
    // leaves: it counts against the node's stream limit, as exec and attach do.
    let permit = if opts.follow {
        match state.streams.try_acquire() {
            Some(p) => Some(p),
            None => return crate::streaming::StreamError::TooMany.into_response(),
        }
    } else {
        None
    };
    let reader = {
        let opts = opts.clone();
        match tokio::task::spawn_blocking(move || LogReader::open(&path, &opts)).await {
            Ok(Ok(reader)) => reader,
            Ok(Err(e)) => return error(StatusCode::BAD_REQUEST, &e),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(BUFFERED_CHUNKS);
    let mut liveness = CriLiveness {
        handle: tokio::runtime::Handle::current(),
        cri: state.cri.clone(),
        id,
    };
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        reader.run(tx, &mut liveness)
    });
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

fn error(code: StatusCode, message: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.to_string(),
    )
        .into_response()
}

/// The pod named `name` in `namespace` among the pods pod-sync reports.
async fn find_pod(state: &AppState, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
    let pods = crate::pod_statuses(state.pod_sync.clone())
        .await
        .map_err(|e| format!("pod-sync is not available: {}", e.message()))?;
    for json in pods {
        let Ok(pod) = serde_json::from_slice::<Pod>(&json) else {
            continue;
        };
        let meta = &pod.metadata;
        if meta.name.as_deref() == Some(name)
            && meta.namespace.as_deref().unwrap_or("default") == namespace
        {
            return Ok(Some(pod));
        }
    }
    Ok(None)
}

fn has_container(pod: &Pod, name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.containers.iter().any(|c| c.name == name)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == name)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == name)
}

fn container_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|s| s.name == name)
}

/// The runtime ID of the instance whose log to read (upstream's
/// `validateContainerLogStatus`, with its wording).
fn select_instance(
    pod: &str,
    status: Option<&ContainerStatus>,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let Some(status) = status else {
        return Err(format!(
            "container {container:?} in pod {pod:?} is not available"
        ));
    };
    let state = status.state.clone().unwrap_or_default();
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let terminated = || format!("container {container:?} in pod {pod:?} is terminated");
    let id = if previous {
        last.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod:?} not found")
        })?
    } else if state.running.is_some() {
        status.container_id.clone().ok_or_else(terminated)?
    } else if let Some(t) = &state.terminated {
        t.container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or(last)
            .ok_or_else(terminated)?
    } else if let Some(last) = last {
        last
    } else if let Some(w) = &state.waiting {
        let reason = match w.reason.as_deref().unwrap_or_default() {
            "ErrImagePull" => "image can't be pulled".to_string(),
            "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            other => other.to_string(),
        };
        return Err(format!(
            "container {container:?} in pod {pod:?} is waiting to start: {reason}"
        ));
    } else {
        return Err(format!(
            "container {container:?} in pod {pod:?} is waiting to start - no logs yet"
        ));
    };
    // `containerd://<id>` → `<id>`.
    Ok(id
        .split_once("://")
        .map_or(id.as_str(), |(_, id)| id)
        .to_string())
}

/// Asks the runtime whether the followed container still runs.
struct CriLiveness {
    handle: tokio::runtime::Handle,
    cri: Cri,
    id: String,
}

impl Liveness for CriLiveness {
    fn running(&mut self) -> bool {
        match self.handle.block_on(self.cri.container_status(&self.id)) {
            Ok(r) => r
                .status
                .is_some_and(|s| s.state == ContainerState::ContainerRunning as i32),
            Err(e) => {
                tracing::debug!(container.id = %self.id, error = %e.message(), "ContainerStatus failed; the log follower ends");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState as State, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting,
    };

    fn terminated(id: &str) -> State {
        State {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(format!("containerd://{id}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn status(state: State, last: Option<State>) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            container_id: Some("containerd://current".into()),
            state: Some(state),
            last_state: last,
            ..Default::default()
        }
    }

    #[test]
    fn picks_the_instance_as_upstream() {
        let running = State {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let s = status(running.clone(), Some(terminated("old")));
        assert_eq!(
            select_instance("p", Some(&s), "c", false).unwrap(),
            "current"
        );
        assert_eq!(select_instance("p", Some(&s), "c", true).unwrap(), "old");
        let s = status(running, None);
        assert_eq!(
            select_instance("p", Some(&s), "c", true).unwrap_err(),
            r#"previous terminated container "c" in pod "p" not found"#
        );
        let s = status(terminated("done"), None);
        assert_eq!(select_instance("p", Some(&s), "c", false).unwrap(), "done");
        let backoff = State {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = status(backoff.clone(), Some(terminated("crashed")));
        assert_eq!(
            select_instance("p", Some(&s), "c", false).unwrap(),
            "crashed"
        );
        let s = status(backoff, None);
        assert_eq!(
            select_instance("p", Some(&s), "c", false).unwrap_err(),
            r#"container "c" in pod "p" is waiting to start: CrashLoopBackOff"#
        );
        assert_eq!(
            select_instance("p", None, "c", false).unwrap_err(),
            r#"container "c" in pod "p" is not available"#
        );
    }
}
