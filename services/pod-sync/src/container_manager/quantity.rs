//! A container's resources as numbers; the quantity parser is shared, in nodeagent-config.

/// A container's CPU request and limit (millicores; the request defaults to the limit)
/// and memory limit (bytes), as the runtime and the pod cgroup need them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_request: Option<i64>,
    pub cpu_limit: Option<i64>,
    pub memory_limit: Option<i64>,
    /// The memory request, or the limit where no request is set (the API's defaulting).
    pub memory_request: Option<i64>,
    /// The ephemeral-storage request, or its limit where no request is set.
    pub ephemeral_storage_request: Option<i64>,
}

impl ContainerResources {
    pub fn of(c: &k8s_openapi::api::core::v1::Container) -> Self {
        let res = c.resources.clone().unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        let requests = res.requests.unwrap_or_default();
        let cpu_limit = limits.get("cpu").and_then(|q| cpu_millis(&q.0));
        Self {
            cpu_request: requests
                .get("cpu")
                .and_then(|q| cpu_millis(&q.0))
                .or(cpu_limit),
            cpu_limit,
            memory_limit: limits.get("memory").and_then(|q| bytes(&q.0)),
            memory_request: requests
                .get("memory")
                .or_else(|| limits.get("memory"))
                .and_then(|q| bytes(&q.0)),
            ephemeral_storage_request: requests
                .get("ephemeral-storage")
                .or_else(|| limits.get("ephemeral-storage"))
                .and_then(|q| bytes(&q.0)),
        }
    }
}

pub use nodeagent_config::quantity::{bytes, cpu_millis};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_forms() {
        assert_eq!(cpu_millis("100m"), Some(100));
        assert_eq!(cpu_millis("0.5"), Some(500));
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(bytes("128Mi"), Some(128 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1e3"), Some(1000));
        assert_eq!(bytes("12Zi"), None);
        assert_eq!(bytes("-1"), None);
    }
}
