//! A container's image: present, pulled as its pull policy says (with the pod's and the
//! node's credentials and upstream's image back-off), or why not.

use super::*;

impl PodSync {
    /// `imagePullPolicy`: Always pulls, IfNotPresent pulls when missing, Never never does.
    /// A pull tries each credential that matches the image (the pod's pull secrets', then
    /// the node's), in order, until one succeeds; without a matching credential it pulls
    /// anonymously (upstream `kuberuntime_image.go` `PullImage`).
    pub(crate) async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<(), (&'static str, String, Duration)> {
        let uid = k8s::pod_uid(pod);
        let image = c.image.clone().unwrap_or_default();
        // The API server defaults it; a pod that reaches us without one gets upstream's
        // default too (Always for `latest` or no tag).
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| config_source::manifest::default_pull_policy(&image).into());
        let event = |ty: EventType, reason: &str, message: &str| {
            self.events.container(pod, &c.name, ty, reason, message);
        };
        // Upstream: an image reference that does not parse is InvalidImageName (with an
        // InspectFailed event), before any look at the runtime.
        if let Some(message) = crate::images::pull::invalid_image_name(&image) {
            event(EventType::Warning, "InspectFailed", &message);
            return Err(("InvalidImageName", message, Duration::from_secs(30)));
        }
        let spec = ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let mut images = self.cri.image.clone();
        let present = images
            .image_status(self.cri.request(ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            }))
            .await
            .map(|r| r.into_inner().image.is_some())
            .map_err(|e| {
                (
                    "ErrImageInspect",
                    e.message().to_string(),
                    Duration::from_secs(10),
                )
            })?;
        if present && policy != "Always" {
            let message = format!("Container image \"{image}\" already present on machine");
            event(EventType::Normal, "Pulled", &message);
            return Ok(());
        }
        if policy == "Never" {
            let message =
                format!("Container image \"{image}\" is not present with pull policy of Never");
            event(EventType::Warning, "ErrImageNeverPull", &message);
            return Err(("ErrImageNeverPull", message, Duration::from_secs(30)));
        }
        let key = (uid.to_string(), image.clone());
        let now = Instant::now();
        if let Some(b) = self
            .lock()
            .pull_backoff
            .get(&key)
            .filter(|b| b.waiting(now))
        {
            // With the error of the failed pull, as upstream (so the registry's words stay
            // in the status during the back-off).
            let message = format!(
                "Back-off pulling image \"{image}\": ErrImagePull: {}",
                b.last_error
            );
            let until = b.until;
            event(
                EventType::Normal,
                "BackOff",
                &format!("Back-off pulling image \"{image}\""),
            );
            return Err(("ImagePullBackOff", message, until - now));
        }
        event(
            EventType::Normal,
            "Pulling",
            &format!("Pulling image \"{image}\""),
        );
        let pulled = match self.pull_credentials(pod, &image).await {
            Err(message) => Err(message),
            Ok(credentials) if credentials.is_empty() => {
                tracing::info!(%image, "pulling image");
                self.pull(uid, &spec, None).await
            }
            Ok(credentials) => {
                tracing::info!(%image, credentials = credentials.len(), "pulling image with credentials");
                let mut errors = Vec::new();
                let mut pulled = None;
                for credential in &credentials {
                    match self.pull(uid, &spec, Some(credential.to_cri())).await {
                        Ok(()) => {
                            pulled = Some(());
                            break;
                        }
                        Err(e) => errors.push(e),
                    }
                }
                match pulled {
                    Some(()) => Ok(()),
                    // Upstream's aggregate error: one alone, several in brackets.
                    None if errors.len() == 1 => Err(errors.remove(0)),
                    None => Err(format!("[{}]", errors.join(", "))),
                }
            }
        };
        // A failed pull is ErrImagePull even where a copy is present (policy Always): as
        // upstream, never a silent fall-back to what another pod may have pulled.
        match pulled {
            Ok(()) => {
                self.lock().pull_backoff.remove(&key);
                let took = now.elapsed();
                let size = self.image_size(&spec).await;
                event(
                    EventType::Normal,
                    "Pulled",
                    &format!(
                        "Successfully pulled image \"{image}\" in {took:?} ({took:?} including waiting). Image size: {size} bytes."
                    ),
                );
                Ok(())
            }
            Err(message) => {
                let retry = {
                    let mut st = self.lock();
                    let b = Backoff::next(st.pull_backoff.get(&key), now, message.clone());
                    let retry = b.until - now;
                    st.pull_backoff.insert(key, b);
                    retry
                };
                // Upstream: the event says which image; the waiting message is the
                // runtime's whole error.
                event(
                    EventType::Warning,
                    "Failed",
                    &format!("Failed to pull image \"{image}\": {message}"),
                );
                Err(("ErrImagePull", message, retry))
            }
        }
    }

    /// The image's size as the runtime reports it (0 when it cannot say).
    pub(crate) async fn image_size(&self, spec: &ImageSpec) -> u64 {
        let mut images = self.cri.image.clone();
        images
            .image_status(self.cri.request(ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            }))
            .await
            .ok()
            .and_then(|r| r.into_inner().image)
            .map_or(0, |i| i.size)
    }

    /// Upstream's `Failed` event of a container that could not be made: "Error: <what>".
    pub(crate) fn failed(&self, pod: &Pod, c: &Container, what: &str) {
        self.events.container(
            pod,
            &c.name,
            EventType::Warning,
            "Failed",
            &format!("Error: {what}"),
        );
    }

    /// A CreateContainerConfigError: the waiting reason and upstream's Failed event.
    pub(crate) fn config_error(&self, pod: &Pod, c: &Container, message: &str) {
        self.set_waiting(
            k8s::pod_uid(pod),
            &c.name,
            "CreateContainerConfigError",
            message,
        );
        self.failed(pod, c, message);
    }

    /// The credentials to try for `image`, in upstream's order: those of the pod's pull
    /// secrets, then the node's own (its docker config file). `Err`: a pull secret that is
    /// not a valid docker config (upstream fails the pull with that error).
    pub(crate) async fn pull_credentials(
        &self,
        pod: &Pod,
        image: &str,
    ) -> Result<Vec<credentials::Credential>, String> {
        let Ok(reference) = crate::images::image_ref::parse_normalized_named(image) else {
            return Ok(Vec::new()); // the runtime says what is wrong with the name
        };
        let repository = reference.repository();
        let secrets = self.pull_secrets(pod).await;
        let mut found = credentials::secrets_keyring(&secrets)?.lookup(&repository);
        found.extend(credentials::node_keyring(&self.node.root_dir).lookup(&repository));
        Ok(found)
    }

    /// The pod's `imagePullSecrets` from the API server. One that cannot be had is left out
    /// with upstream's warning event (`FailedToRetrieveImagePullSecret`), and the pull goes
    /// on without it; a node without an API server has none to read.
    pub(crate) async fn pull_secrets(&self, pod: &Pod) -> Vec<Secret> {
        let names: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        let mut found = Vec::new();
        let mut failed = Vec::new();
        match &self.api {
            None => failed = names,
            Some(client) => {
                let api: Api<Secret> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
                for name in names {
                    match api.get_opt(&name).await {
                        Ok(Some(secret)) => found.push(secret),
                        Ok(None) => {
                            tracing::info!(secret = %name, error = "not found", "Unable to retrieve pull secret, the image pull may not succeed.");
                            failed.push(name);
                        }
                        Err(e) => {
                            tracing::info!(secret = %name, error = %e, "Unable to retrieve pull secret, the image pull may not succeed.");
                            failed.push(name);
                        }
                    }
                }
            }
        }
        if !failed.is_empty() {
            let message = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                failed.join(", ")
            );
            self.events.pod(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                &message,
            );
        }
        found
    }
}
