//! The one checked constructor for host paths built from pod data (volume names, pod UIDs,
//! container names, subPaths): a trusted base plus untrusted components, each of which must
//! be a single plain path component. Bad input is refused, never sanitized.

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};

/// Longest file name Linux accepts (NAME_MAX).
pub const MAX_COMPONENT_LEN: usize = 255;
/// Longest pod UID accepted (upstream UIDs are 36 characters, static pod UIDs 32).
pub const MAX_UID_LEN: usize = 128;

/// Why untrusted text cannot be part of a host path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The component is not a single plain path component.
    #[error("{component:?} is not a safe path component: {reason}")]
    BadComponent {
        component: String,
        reason: &'static str,
    },
    /// A relative path (a subPath) would leave its base or is not relative.
    #[error("{path:?} is not a safe relative path: {reason}")]
    BadRelative { path: String, reason: &'static str },
}

/// Checks that `s` is one plain path component: not empty, not `.` or `..`, no '/', no
/// NUL, at most NAME_MAX bytes.
pub fn component(s: &str) -> Result<&str, PathError> {
    let reason = if s.is_empty() {
        "must not be empty"
    } else if s == "." || s == ".." {
        "must not be '.' or '..'"
    } else if s.contains('/') {
        "must not contain '/'"
    } else if s.contains('\0') {
        "must not contain NUL"
    } else if s.len() > MAX_COMPONENT_LEN {
        "must be at most 255 bytes"
    } else {
        return Ok(s);
    };
    Err(PathError::BadComponent {
        component: s.chars().take(80).collect(),
        reason,
    })
}

/// Checks a pod UID: a path component of bounded length.
pub fn uid(s: &str) -> Result<&str, PathError> {
    component(s)?;
    if s.len() > MAX_UID_LEN {
        return Err(PathError::BadComponent {
            component: s.chars().take(80).collect(),
            reason: "a pod UID must be at most 128 bytes",
        });
    }
    Ok(s)
}

/// The components of a relative path that must stay below its base (a subPath): not
/// absolute, no `..` component, no NUL. Empty and `.` components are dropped, as
/// `filepath.Clean` would.
pub fn relative_components(path: &str) -> Result<Vec<&str>, PathError> {
    let err = |reason| PathError::BadRelative {
        path: path.chars().take(200).collect(),
        reason,
    };
    if path.starts_with('/') {
        return Err(err("must not be an absolute path"));
    }
    if path.contains('\0') {
        return Err(err("must not contain NUL"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(err("must not contain '..'"));
    }
    for p in &parts {
        component(p)?;
    }
    Ok(parts)
}

/// A host path made of a trusted base and checked components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPath(PathBuf);

impl HostPath {
    /// `base/c1/c2/...`, refusing any component that is not a single plain component.
    pub fn new<S: AsRef<str>>(base: &Path, components: &[S]) -> Result<Self, PathError> {
        let mut path = base.to_path_buf();
        for c in components {
            path.push(component(c.as_ref())?);
        }
        Ok(Self(path))
    }

    /// This path plus one more checked component.
    pub fn join(&self, c: &str) -> Result<Self, PathError> {
        Ok(Self(self.0.join(component(c)?)))
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }

    pub fn into_path_buf(self) -> PathBuf {
        self.0
    }

    /// The path as a string for CRI and the wire (pod data is UTF-8, bases are ours).
    pub fn to_string_lossy(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Deref for HostPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for HostPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl fmt::Display for HostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_component_is_refused() {
        let long = "a".repeat(256);
        for bad in ["", ".", "..", "a/b", "/", "../x", "a\0b", long.as_str()] {
            assert!(component(bad).is_err(), "{bad:?}");
            assert!(
                HostPath::new(Path::new("/base"), &["ok", bad]).is_err(),
                "{bad:?}"
            );
            assert!(
                HostPath::new(Path::new("/base"), &["ok"])
                    .unwrap()
                    .join(bad)
                    .is_err()
            );
        }
        for ok in ["data", "a.b", "...", "x-1_2", "default_web_0123"] {
            assert_eq!(component(ok), Ok(ok));
        }
    }

    #[test]
    fn paths_stay_under_their_base() {
        let p = HostPath::new(Path::new("/var/lib/k/pods"), &["u1", "volumes", "data"]).unwrap();
        assert_eq!(p.as_path(), Path::new("/var/lib/k/pods/u1/volumes/data"));
        let err = HostPath::new(Path::new("/var/lib/k/pods"), &["../../../../tmp/x"]).unwrap_err();
        assert!(err.to_string().contains("must not contain '/'"), "{err}");
    }

    #[test]
    fn uids_are_bounded_components() {
        assert!(uid("0123456789abcdef0123456789abcdef").is_ok());
        assert!(uid("6f0c6f1e-8a2b-4c1d-9e3f-0a1b2c3d4e5f").is_ok());
        for bad in ["", "..", "a/b", "x\0", &"u".repeat(129)] {
            assert!(uid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relative_paths_never_climb() {
        assert_eq!(relative_components("a/./b//c").unwrap(), ["a", "b", "c"]);
        assert_eq!(relative_components("evil").unwrap(), ["evil"]);
        for bad in ["/etc", "a/../../x", "..", "a/..", "a\0"] {
            assert!(relative_components(bad).is_err(), "{bad:?}");
        }
    }
}
