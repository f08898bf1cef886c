//! One image pull, as upstream makes it: with no deadline (a large image on a slow link
//! takes what it takes), ended early only when the pod that wants it is no longer wanted
//! (upstream cancels the pod worker's context) or pod-sync shuts down. Pod workers are not
//! bounded, so a slow or hung registry stalls only the pods whose image it serves.

use crate::PodSync;
use nodeagent_proto::cri::{AuthConfig, ImageSpec, PullImageRequest};

impl PodSync {
    /// One CRI PullImage for pod `uid`; the runtime's message on failure.
    pub(crate) async fn pull(
        &self,
        uid: &str,
        spec: &ImageSpec,
        auth: Option<AuthConfig>,
    ) -> Result<(), String> {
        // The pod shows (waiting, ContainerCreating) while its image comes, however long.
        self.publish_status(uid).await;
        let mut images = self.cri.image.clone();
        // No timeout, unlike every other CRI call.
        let pull = images.pull_image(tonic::Request::new(PullImageRequest {
            image: Some(spec.clone()),
            auth,
            sandbox_config: None,
        }));
        tokio::pin!(pull);
        let changes = self.lock().desired_changed.clone();
        loop {
            let changed = changes.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.lock().desired.contains_key(uid) {
                tracing::info!(image = %spec.image, "image pull cancelled: the pod is no longer wanted");
                break Err("image pull cancelled: the pod is no longer wanted".to_string());
            }
            tokio::select! {
                r = &mut pull => break r.map(|_| ()).map_err(|e| e.message().to_string()),
                _ = &mut changed => {}
                _ = self.shutdown.wait() => break Err("image pull cancelled: shutting down".into()),
            }
        }
    }
}
