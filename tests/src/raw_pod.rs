//! Pods made directly over CRI, beside the node agent: the benchmarks' baseline, and the
//! holder that keeps the shared containerd's images in use while a test node may collect
//! images (`Node::start`).

use nodeagent_cri::Cri;
use nodeagent_cri::api as cri;
use nodeagent_proto::k8s::labels;
use std::collections::HashMap;

/// One pod made directly over CRI, as the agent makes it (a sandbox with the CNI network,
/// then one container): returns (sandbox id, container id). `labelled` gives it the
/// upstream pod labels, so that pleg counts it as a pod.
pub async fn raw_pod(
    cri: &Cri,
    namespace: &str,
    name: &str,
    script: &str,
    logs: &std::path::Path,
    labelled: bool,
) -> (String, String) {
    let uid = format!("raw-{name}-{}", nodeagent_cri::now_nanos());
    let mut pod_labels = HashMap::new();
    if labelled {
        pod_labels.insert(labels::POD_NAME.to_string(), name.to_string());
        pod_labels.insert(labels::POD_NAMESPACE.to_string(), namespace.to_string());
        pod_labels.insert(labels::POD_UID.to_string(), uid.clone());
    }
    let log_dir = logs.join(&uid);
    std::fs::create_dir_all(&log_dir).unwrap();
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.clone(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_dir.display().to_string(),
        labels: pod_labels.clone(),
        linux: Some(cri::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let mut runtime = cri.runtime.clone();
    let sandbox = runtime
        .run_pod_sandbox(cri.request(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        }))
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let mut container_labels = pod_labels;
    if labelled {
        container_labels.insert(labels::CONTAINER_NAME.to_string(), "c".into());
    }
    let container = runtime
        .create_container(cri.request(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: crate::BUSYBOX.into(),
                    ..Default::default()
                }),
                command: vec!["sh".into(), "-c".into(), script.into()],
                log_path: "c/0.log".into(),
                labels: container_labels,
                linux: Some(cri::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        }))
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    runtime
        .start_container(cri.request(cri::StartContainerRequest {
            container_id: container.clone(),
        }))
        .await
        .expect("StartContainer");
    (sandbox, container)
}

/// Stops (with `grace` seconds for the container) and removes one raw pod.
pub async fn remove_raw_pod(cri: &Cri, (sandbox, container): &(String, String), grace: i64) {
    let mut runtime = cri.runtime.clone();
    if !container.is_empty() {
        let _ = runtime
            .stop_container(cri.request(cri::StopContainerRequest {
                container_id: container.clone(),
                timeout: grace,
            }))
            .await;
    }
    let _ = runtime
        .stop_pod_sandbox(cri.request(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        }))
        .await;
    let _ = runtime
        .remove_pod_sandbox(cri.request(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        }))
        .await;
}

/// Removes the raw pods of `namespace` an interrupted run left behind.
pub async fn remove_raw_leftovers(cri: &Cri, namespace: &str) {
    remove_leftovers(cri, |m| m.namespace == namespace).await
}

/// Removes every pod whose metadata `left` picks (an interrupted run's), 8 at a time.
pub async fn remove_leftovers(cri: &Cri, left: impl Fn(&cri::PodSandboxMetadata) -> bool) {
    let left: Vec<String> = cri
        .list_sandboxes(None)
        .await
        .expect("ListPodSandbox")
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(&left))
        .map(|s| s.id)
        .collect();
    if !left.is_empty() {
        eprintln!(
            "[bench] removing {} pods left by an earlier run",
            left.len()
        );
    }
    let mut tasks = tokio::task::JoinSet::new();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
    for id in left {
        let (cri, slots) = (cri.clone(), slots.clone());
        tasks.spawn(async move {
            let _slot = slots.acquire().await;
            remove_raw_pod(&cri, &(id, String::new()), 0).await
        });
    }
    tasks.join_all().await;
}
