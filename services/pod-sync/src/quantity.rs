//! Kubernetes resource quantities ("100m", "0.5", "128Mi", "1G", "1e3") as numbers.

/// A container's CPU request and limit (millicores; the request defaults to the limit)
/// and memory limit (bytes), as the runtime and the pod cgroup need them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub cpu_request: Option<i64>,
    pub cpu_limit: Option<i64>,
    pub memory_limit: Option<i64>,
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
        }
    }
}

/// CPU in millicores, rounded up as upstream does (`MilliValue`).
pub fn cpu_millis(q: &str) -> Option<i64> {
    let value = parse(q)?;
    Some((value * 1000.0).ceil() as i64)
}

/// Memory (or any count) in whole units, rounded up.
pub fn bytes(q: &str) -> Option<i64> {
    Some(parse(q)?.ceil() as i64)
}

fn parse(q: &str) -> Option<f64> {
    let q = q.trim();
    if q.is_empty() {
        return None;
    }
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = num * mult;
    (v >= 0.0).then_some(v)
}

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
