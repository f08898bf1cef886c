//! Upstream's name validation (`k8s.io/apimachinery/pkg/util/validation` and the core
//! helpers built on it), with upstream's messages, for every service that checks a name
//! coming from a pod or a peer.

pub const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
pub const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Upstream `validation.IsQualifiedName`: `[prefix/]name`, with upstream's messages.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                if !is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
                }
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    let alnum = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    let well_formed = alnum(name.as_bytes().first())
        && alnum(name.as_bytes().last())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !well_formed {
        errs.push(format!("name part {QUALIFIED_NAME_MSG}"));
    }
    errs
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    s.split('.').all(label_ok)
}

/// upstream's `v1helper.IsExtendedResourceName`: not a native resource (one without a
/// `/`, or one that holds `kubernetes.io/`), not `requests.`-prefixed, and still a
/// qualified name once `requests.` is put before it (as a quota would name it).
pub fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    if native || name.starts_with("requests.") {
        return false;
    }
    qualified_name_errors(&format!("requests.{name}")).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream's `TestIsExtendedResourceName` (pkg/apis/core/v1/helper/helpers_test.go)
    /// cases, and the device plugin names upstream's registration refuses.
    #[test]
    fn extended_resource_names_as_upstream_tells_them() {
        for (name, want) in [
            ("foo.com/bar", true),
            ("nvidia.com/gpu", true),
            ("example.com/fake-dev", true),
            ("cpu", false),
            ("kubernetes.io/foo", false),
            ("requests.foo.com/bar", false),
            ("hugepages-2Mi", false),
            ("node.kubernetes.io/foo", false),
            ("xkubernetes.io/foo", false),
            ("foo.com/bar/baz", false),
            ("Foo.com/bar", false),
            ("foo.com/", false),
            ("foo.com/-bar", false),
        ] {
            assert_eq!(is_extended_resource_name(name), want, "{name}");
        }
    }
}
