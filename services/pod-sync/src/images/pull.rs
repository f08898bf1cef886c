//! One image pull, as upstream makes it: with no deadline (a large image on a slow link
//! takes what it takes), ended early only when the pod that wants it is no longer wanted
//! (upstream cancels the pod worker's context) or pod-sync shuts down. Pod workers are not
//! bounded, so a slow or hung registry stalls only the pods whose image it serves.

use crate::PodSync;
use nodeagent_proto::cri::{AuthConfig, ImageSpec, PullImageRequest};

impl PodSync {
    /// One CRI PullImage for pod `uid`; the runtime's whole error on failure, as upstream's
    /// Go client words it (`rpc error: code = ... desc = ...`).
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
                r = &mut pull => break r.map(|_| ()).map_err(|e| go_grpc_error(&e)),
                _ = &mut changed => {}
                _ = self.shutdown.wait() => break Err("image pull cancelled: shutting down".into()),
            }
        }
    }
}

/// A gRPC error as Go's `status.Error()` words it: upstream's image manager puts the runtime's
/// whole error, so worded, into the waiting message and the Failed event.
pub(crate) fn go_grpc_error(status: &tonic::Status) -> String {
    use tonic::Code::*;
    let code = match status.code() {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// Upstream's InvalidImageName message (`applyDefaultImageTag` in `image_manager.go`) for an
/// image reference `github.com/distribution/reference`'s `ParseNormalizedNamed` refuses; None
/// for a valid one.
pub(crate) fn invalid_image_name(image: &str) -> Option<String> {
    let why = crate::images::image_ref::parse_normalized_named(image).err()?;
    Some(format!(
        "Failed to apply default image tag {image:?}: couldn't parse image name {image:?}: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `status.Error()` wording for a runtime's pull error.
    #[test]
    fn grpc_errors_read_as_go_words_them() {
        let e = tonic::Status::not_found("failed to pull and unpack image \"x\": not found");
        assert_eq!(
            go_grpc_error(&e),
            "rpc error: code = NotFound desc = failed to pull and unpack image \"x\": not found"
        );
        let e = tonic::Status::cancelled("gone");
        assert_eq!(go_grpc_error(&e), "rpc error: code = Canceled desc = gone");
    }

    /// Upstream `image_manager_test.go`'s pullerTestCases: "invalid image name, no pull"
    /// (`FAILED_IMAGE`) ends InvalidImageName; the others' images (`missing_image`,
    /// `present_image`, `typo_image`, with or without tag or digest) parse.
    #[test]
    fn invalid_image_names_as_upstream() {
        assert_eq!(
            invalid_image_name("FAILED_IMAGE").as_deref(),
            Some(
                "Failed to apply default image tag \"FAILED_IMAGE\": couldn't parse image name \"FAILED_IMAGE\": invalid reference format: repository name (library/FAILED_IMAGE) must be lowercase"
            )
        );
        for ok in [
            "missing_image",
            "present_image",
            "typo_image",
            "present_image:latest",
            "busybox:1.36",
            "registry.k8s.io/pause:3.10",
            "localhost:5000/a/b-c__d.e:v1.0",
            "localhost:1/absent:1.0",
            "[::1]:5000/x",
            "quay.io/x/y@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(invalid_image_name(ok), None, "{ok}");
        }
        for (bad, why) in [
            ("nginx:", "invalid reference format"),
            ("a//b", "invalid reference format"),
            ("-x", "invalid reference format"),
            ("x@sha256", "invalid reference format"),
            (
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "invalid repository name (0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef), cannot specify 64-byte hexadecimal strings",
            ),
        ] {
            let got = crate::images::image_ref::parse_normalized_named(bad).err();
            assert_eq!(got.as_deref(), Some(why), "{bad}");
        }
    }
}
