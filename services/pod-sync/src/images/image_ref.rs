//! Image references, parsed as upstream parses them: `github.com/distribution/reference`
//! v0.6.0 (what kubelet vendors), with `github.com/opencontainers/go-digest`
//! v1.0.0 checking digests. One parser for every use here:
//!
//! - [`parse_normalized_named`] is `ParseNormalizedNamed`: a familiar name (`busybox:1.36`)
//!   made canonical (`docker.io/library/busybox:1.36`), or upstream's error text for a name
//!   it refuses (kubelet's InvalidImageName message quotes it);
//! - [`Reference::repository`] is its `Name()`: what credentials are looked up by
//!   (kubelet's `parsers.ParseImageName`);
//! - [`Reference::docker_ref`] is `ParseDockerRef`: how containerd names what it pulls
//!   (`latest` when neither tag nor digest; a digest wins over a tag), so how it lists its
//!   sandbox image.
//!
//! The grammar (upstream `regexp.go`), matched by hand rather than by regex:
//!
//! ```text
//! reference        := name [ ":" tag ] [ "@" digest ]
//! name             := [domain "/"] remote-name
//! domain           := host [":" port-number]
//! host             := domain-name | "[" IPv6 "]"      ; IPv6: [a-fA-F0-9:]+
//! domain-name      := domain-component ["." domain-component]*
//! domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! port-number      := [0-9]+
//! remote-name      := path-component ["/" path-component]*
//! path-component   := [a-z0-9]+ [separator [a-z0-9]+]*
//! separator        := "." | "_" | "__" | "-"+
//! tag              := [\w][\w.-]{0,127}
//! digest           := algorithm ":" [0-9a-fA-F]{32,}
//! algorithm        := [A-Za-z][A-Za-z0-9]* [[-_+.] [A-Za-z][A-Za-z0-9]*]*
//! ```

use std::fmt;

/// `ErrReferenceInvalidFormat`.
const INVALID_FORMAT: &str = "invalid reference format";
/// `ErrNameContainsUppercase`.
const NAME_UPPERCASE: &str = "repository name must be lowercase";
/// `ErrNameEmpty`.
const NAME_EMPTY: &str = "repository name must have at least one component";
/// `ErrNameTooLong` (`RepositoryNameTotalLengthMax`, 255, counts the path only since v0.6.0).
const NAME_TOO_LONG: &str = "repository name must not be more than 255 characters";
/// go-digest's `ErrDigestInvalidFormat` (its `ErrDigestInvalidLength` is the same error).
const DIGEST_INVALID: &str = "invalid checksum digest format";
/// go-digest's `ErrDigestUnsupported`.
const DIGEST_UNSUPPORTED: &str = "unsupported digest algorithm";

const MAX_PATH_LEN: usize = 255;
const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";

/// A parsed reference: upstream's `reference` (a `repository` with a tag and a digest, each
/// possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// Empty when the name has none (only [`parse`] gives that, and only for names whose
    /// first component is not a valid domain: `ParseNormalizedNamed` adds one otherwise).
    pub domain: String,
    /// The remote name: `library/busybox`.
    pub path: String,
    pub tag: Option<String>,
    /// `algorithm:encoded`, as given.
    pub digest: Option<String>,
}

impl Reference {
    /// The repository, `Name()`: `domain/path` (the path alone without a domain); no tag,
    /// no digest.
    pub fn repository(&self) -> String {
        if self.domain.is_empty() {
            self.path.clone()
        } else {
            format!("{}/{}", self.domain, self.path)
        }
    }

    /// `TagNameOnly(ref).String()`: the reference with tag `latest` when it has neither tag
    /// nor digest.
    pub fn canonical(&self) -> String {
        if self.tag.is_none() && self.digest.is_none() {
            format!("{}:{DEFAULT_TAG}", self.repository())
        } else {
            self.to_string()
        }
    }

    /// `ParseDockerRef(ref).String()` (given a reference from [`parse_normalized_named`]):
    /// [`canonical`](Self::canonical), but a reference with both a tag and a digest keeps
    /// only the digest. Containerd names what it pulls so.
    pub fn docker_ref(&self) -> String {
        match (&self.tag, &self.digest) {
            (Some(_), Some(digest)) => format!("{}@{digest}", self.repository()),
            _ => self.canonical(),
        }
    }
}

/// `String()`: `name[:tag][@digest]`.
impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repository())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `ParseNormalizedNamed`: `s` as a canonical named reference (Docker Hub's domain and
/// `library/` added to familiar names, `index.docker.io` made `docker.io`), or the error
/// upstream gives, worded as upstream words it.
pub(crate) fn parse_normalized_named(s: &str) -> Result<Reference, String> {
    if is_identifier(s) {
        return Err(format!(
            "invalid repository name ({s}), cannot specify 64-byte hexadecimal strings"
        ));
    }
    let (domain, remainder) = split_docker_domain(s);
    let remote = remainder.split(':').next().unwrap_or_default();
    if go_to_lower(remote) != remote {
        return Err(format!(
            "{INVALID_FORMAT}: repository name ({remote}) must be lowercase"
        ));
    }
    parse(&format!("{domain}/{remainder}"))
}

/// `Parse`: `s` as a reference, as written (nothing added).
fn parse(s: &str) -> Result<Reference, String> {
    let Some((name, tag, digest)) = match_reference(s) else {
        if s.is_empty() {
            return Err(NAME_EMPTY.into());
        }
        // Valid once lowercased: the name has uppercase letters.
        if match_reference(&go_to_lower(s)).is_some() {
            return Err(NAME_UPPERCASE.into());
        }
        return Err(INVALID_FORMAT.into());
    };
    let (domain, path) = split_name(name).unwrap_or(("", name));
    if path.len() > MAX_PATH_LEN {
        return Err(NAME_TOO_LONG.into());
    }
    if let Some(d) = digest {
        validate_digest(d)?;
    }
    Ok(Reference {
        domain: domain.to_string(),
        path: path.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    })
}

/// `splitDockerDomain`: the domain `s` names (Docker Hub's unless its first component is
/// `localhost` or has a `.`, a `:` or an uppercase letter) and the rest, with `library/`
/// before a single-component name on Docker Hub.
fn split_docker_domain(s: &str) -> (&str, String) {
    let Some((first, rest)) = s.split_once('/') else {
        // A single component is always a Docker Hub name, even `localhost` or `a.com`.
        return (DEFAULT_DOMAIN, format!("{OFFICIAL_REPO_PREFIX}{s}"));
    };
    let (domain, remote) = if first == "localhost" {
        (first, rest)
    } else if first == LEGACY_DEFAULT_DOMAIN {
        (DEFAULT_DOMAIN, rest)
    } else if first.contains(['.', ':']) || go_to_lower(first) != first {
        (first, rest)
    } else {
        (DEFAULT_DOMAIN, s)
    };
    if domain == DEFAULT_DOMAIN && !remote.contains('/') {
        return (domain, format!("{OFFICIAL_REPO_PREFIX}{remote}"));
    }
    (domain, remote.to_string())
}

/// Go's `strings.ToLower` (simple case mapping: `İ` becomes `i`, not `i̇`).
fn go_to_lower(s: &str) -> String {
    s.chars()
        .map(|c| c.to_lowercase().next().unwrap_or(c))
        .collect()
}

/// `anchoredIdentifierRegexp`: 64 lowercase hex digits (an image ID, not a name).
fn is_identifier(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `ReferenceRegexp` (anchored): `s`'s name, tag and digest when it matches. The parts
/// cannot overlap: nothing but the digest may hold an `@`, and a `:` after the last `/` can
/// only start the tag (a port is always followed by the path's `/`).
fn match_reference(s: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !is_digest(d)) {
        return None;
    }
    let after_last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[after_last_slash..].find(':') {
        Some(i) => {
            let i = after_last_slash + i;
            (&rest[..i], Some(&rest[i + 1..]))
        }
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) {
        return None;
    }
    let named = split_name(name).is_some() || is_remote_name(name);
    named.then_some((name, tag, digest))
}

/// `anchoredNameRegexp` with its domain group matched: the domain and the remote name, when
/// `name`'s first component is a valid domain and the rest a valid remote name (Go's regexp
/// prefers the optional domain group whenever it can match).
fn split_name(name: &str) -> Option<(&str, &str)> {
    let (domain, path) = name.split_once('/')?;
    (is_domain_and_port(domain) && is_remote_name(path)).then_some((domain, path))
}

/// `domainAndPort`: a domain name or a bracketed IPv6 address, and an optional port.
fn is_domain_and_port(s: &str) -> bool {
    let (host_ok, port) = if let Some(inner) = s.strip_prefix('[') {
        let Some((address, after)) = inner.split_once(']') else {
            return false;
        };
        let address_ok =
            !address.is_empty() && address.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return false,
            },
        };
        (address_ok, port)
    } else {
        let (host, port) = match s.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        };
        (host.split('.').all(is_domain_component), port)
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// `domainNameComponent`: letters (either case), digits and inner hyphens.
fn is_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
        }
        _ => false,
    }
}

/// `remoteName`: path components joined by single slashes.
fn is_remote_name(s: &str) -> bool {
    s.split('/').all(is_path_component)
}

/// `pathComponent`: runs of `[a-z0-9]` joined by one separator each: `.`, `_`, `__` or
/// any number of `-`.
fn is_path_component(p: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = p.as_bytes();
    let mut i = 0;
    loop {
        let run = b[i..].iter().take_while(|c| alnum(**c)).count();
        if run == 0 {
            return false;
        }
        i += run;
        if i == b.len() {
            return true;
        }
        let sep = b[i..].iter().take_while(|c| !alnum(**c)).count();
        let ok = match &b[i..i + sep] {
            b"." | b"_" | b"__" => true,
            s => s.iter().all(|c| *c == b'-'),
        };
        if !ok {
            return false;
        }
        i += sep;
    }
}

/// `tag`: `[\w][\w.-]{0,127}`.
fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    (1..=128).contains(&b.len())
        && word(b[0])
        && b[1..].iter().all(|c| word(*c) || matches!(c, b'.' | b'-'))
}

/// `digestPat`: an algorithm (components of a letter then letters or digits, joined by one
/// of `-_+.`), `:`, and at least 32 hex digits.
fn is_digest(d: &str) -> bool {
    let Some((algorithm, encoded)) = d.split_once(':') else {
        return false;
    };
    let algorithm_ok = algorithm.split(['-', '_', '+', '.']).all(|c| {
        c.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && c.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    algorithm_ok && encoded.len() >= 32 && encoded.bytes().all(|b| b.is_ascii_hexdigit())
}

/// go-digest's `Digest.Validate`, for a digest [`is_digest`] accepted: sha256, sha384 and
/// sha512 (what kubelet links) with exactly their length of lowercase hex; any other
/// algorithm is unsupported when go-digest's own pattern accepts it, invalid otherwise.
fn validate_digest(d: &str) -> Result<(), String> {
    let (algorithm, encoded) = d.split_once(':').unwrap_or((d, ""));
    let hex_len = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => {
            // `DigestRegexpAnchored`: `[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+`.
            let lower_alnum = |c: &str| {
                !c.is_empty()
                    && c.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            };
            let pattern_ok = algorithm.split(['.', '+', '_', '-']).all(lower_alnum)
                && !encoded.is_empty()
                && encoded
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'_' | b'-'));
            return Err(if pattern_ok {
                DIGEST_UNSUPPORTED
            } else {
                DIGEST_INVALID
            }
            .into());
        }
    };
    let encoded_ok = encoded.len() == hex_len
        && encoded
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if encoded_ok {
        Ok(())
    } else {
        Err(DIGEST_INVALID.into())
    }
}

#[cfg(test)]
mod tests;
