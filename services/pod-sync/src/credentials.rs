//! Registry credentials for image pulls, as upstream's `pkg/credentialprovider`: a keyring
//! of docker config entries, from a pod's `imagePullSecrets` and from the node's own docker
//! config file, looked up by the repository being pulled.
//!
//! - Parsing: a `kubernetes.io/dockerconfigjson` secret's `.dockerconfigjson` and a
//!   `config.json` are `{"auths": {<registry>: <entry>}}`; a `kubernetes.io/dockercfg`
//!   secret's `.dockercfg` and a `.dockercfg` file are the map itself. An entry has
//!   `username`/`password`, or `auth` (base64 `user:password`, which wins), and here also
//!   `identitytoken`/`registrytoken` (docker's config.json has them; upstream's entry
//!   drops them). Field names match case-insensitively, as Go's JSON decoding does.
//! - Keys (`BasicDockerKeyring.Add`): a scheme is optional (https assumed); `/v1/` and
//!   `/v2/` paths mean the host; a key keeps its path otherwise. Keys are tried in reverse
//!   lexical order, so `quay.io/team` comes before `quay.io`.
//! - Matching (`URLsMatch`): the port must be equal, the host must have as many DNS labels,
//!   each label a glob (`*.example.com`), and the key's path a prefix of the image's. When
//!   nothing matches, an image of Docker Hub (`busybox`, `docker.io/x/y`,
//!   `index.docker.io/x/y`) gets the credentials stored under `index.docker.io`.
//! - The node's file (`ReadDockerConfigFile`): the first valid `config.json` of
//!   `<root-dir>`, the working directory, `$HOME/.docker` and `/.docker`; only if there is
//!   none, the first valid `.dockercfg` of `<root-dir>`, the working directory, `$HOME`
//!   and `/`.
//!
//! Nothing here ever shows a password: [`Credential`]'s `Debug` hides every secret.

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One registry credential.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    pub identity_token: String,
    pub registry_token: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &str| if s.is_empty() { "" } else { "<hidden>" };
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &hidden(&self.password))
            .field("identity_token", &hidden(&self.identity_token))
            .field("registry_token", &hidden(&self.registry_token))
            .finish()
    }
}

impl Credential {
    /// The CRI form. `auth` is already decoded into username and password, and the server
    /// address is left empty, as upstream's keyring leaves it: containerd then offers the
    /// credential to whichever host serves the image (for Docker Hub that is not the
    /// `docker.io` of the image's name).
    pub fn to_cri(&self) -> nodeagent_proto::cri::AuthConfig {
        nodeagent_proto::cri::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            auth: String::new(),
            server_address: String::new(),
            identity_token: self.identity_token.clone(),
            registry_token: self.registry_token.clone(),
        }
    }
}

/// The entries of one docker config: registry key -> credential.
pub type DockerConfig = Vec<(String, Credential)>;

/// A `.dockercfg` (legacy: the map of entries itself).
pub fn parse_dockercfg(bytes: &[u8]) -> Result<DockerConfig, String> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the docker config is not valid JSON: {e}"))?;
    entries(&value)
}

/// A `config.json` or `.dockerconfigjson`: `{"auths": {...}}`.
pub fn parse_dockerconfigjson(bytes: &[u8]) -> Result<DockerConfig, String> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the docker config is not valid JSON: {e}"))?;
    match &value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) => match field(map, "auths") {
            None => Ok(Vec::new()),
            Some(auths) => entries(auths).map_err(|e| format!("auths: {e}")),
        },
        _ => Err("the docker config is not a JSON object".into()),
    }
}

fn entries(value: &Value) -> Result<DockerConfig, String> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) => map
            .iter()
            .map(|(key, entry)| {
                parse_entry(entry)
                    .map(|c| (key.clone(), c))
                    .map_err(|e| format!("entry {key:?}: {e}"))
            })
            .collect(),
        _ => Err("the docker config is not a JSON object".into()),
    }
}

/// A member of a JSON object by name as Go decodes it: the exact name, else any case.
fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn parse_entry(value: &Value) -> Result<Credential, String> {
    let map = match value {
        Value::Null => return Ok(Credential::default()),
        Value::Object(map) => map,
        _ => return Err("not a JSON object".into()),
    };
    let text = |name: &str| -> Result<String, String> {
        match field(map, name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("{name} is not a string")),
        }
    };
    let mut credential = Credential {
        username: text("username")?,
        password: text("password")?,
        identity_token: text("identitytoken")?,
        registry_token: text("registrytoken")?,
    };
    text("email")?;
    let auth = text("auth")?;
    if !auth.is_empty() {
        let (username, password) = decode_auth(&auth)?;
        credential.username = username;
        credential.password = password;
    }
    Ok(credential)
}

/// The `auth` field: base64 of `user:password`, padded or not (upstream decides by a
/// trailing `=`). The error never quotes the field.
fn decode_auth(field: &str) -> Result<(String, String), String> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let padding = if field.trim().ends_with('=') {
        DecodePaddingMode::RequireCanonical
    } else {
        DecodePaddingMode::RequireNone
    };
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(padding),
    );
    // Go's decoder skips line breaks.
    let data: String = field.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    let decoded = engine
        .decode(data)
        .map_err(|e| format!("the auth field is not base64: {e}"))?;
    let decoded = String::from_utf8_lossy(&decoded);
    let (username, password) = decoded.split_once(':').ok_or_else(|| {
        "unable to parse auth field, must be formatted as base64(username:password)".to_string()
    })?;
    Ok((username.to_string(), password.to_string()))
}

/// The docker config a pull secret carries: a `kubernetes.io/dockerconfigjson` secret's
/// `.dockerconfigjson` or a `kubernetes.io/dockercfg` secret's `.dockercfg`; `None` for
/// any other secret (upstream ignores it).
pub fn secret_config(secret: &Secret) -> Result<Option<DockerConfig>, String> {
    let data = secret.data.as_ref();
    let item = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|b| b.0.as_slice())
            .filter(|b| !b.is_empty())
    };
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    match secret.type_.as_deref() {
        Some("kubernetes.io/dockerconfigjson") => match item(".dockerconfigjson") {
            Some(bytes) => parse_dockerconfigjson(bytes)
                .map(Some)
                .map_err(|e| format!("pull secret {name:?}: {e}")),
            None => Ok(None),
        },
        Some("kubernetes.io/dockercfg") => match item(".dockercfg") {
            Some(bytes) => parse_dockercfg(bytes)
                .map(Some)
                .map_err(|e| format!("pull secret {name:?}: {e}")),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The keyring of a pod's pull secrets (upstream `MakeDockerKeyring`): every docker config
/// secret's entries; an invalid one fails the pull.
pub fn secrets_keyring(secrets: &[Secret]) -> Result<Keyring, String> {
    let mut keyring = Keyring::default();
    for secret in secrets {
        if let Some(config) = secret_config(secret)? {
            keyring.add(&config);
        }
    }
    Ok(keyring)
}

/// A URL without its scheme, split as Go's `url.Parse` splits it.
struct SchemelessUrl {
    host: String,
    path: String,
}

impl SchemelessUrl {
    fn parse(s: &str) -> Option<SchemelessUrl> {
        if s.chars().any(|c| c.is_ascii_control()) {
            return None;
        }
        let s = s.split('#').next().unwrap_or_default();
        let s = s.split('?').next().unwrap_or_default();
        let (authority, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let host = authority.rsplit('@').next().unwrap_or_default();
        if !valid_host(host) {
            return None;
        }
        Some(SchemelessUrl {
            host: unescape(host)?,
            path: unescape(path)?,
        })
    }

    /// The host's DNS labels and the port (`net.SplitHostPort`; no port when it fails).
    fn labels_and_port(&self) -> (Vec<&str>, &str) {
        let (host, port) = split_host_port(&self.host).unwrap_or((&self.host, ""));
        (host.split('.').collect(), port)
    }
}

/// Go's host check: the characters a host may have, and a port of digits only.
fn valid_host(host: &str) -> bool {
    let allowed = |c: char| {
        c.is_ascii_alphanumeric() || !c.is_ascii() || "-._~!$&'()*+,;=:[]<>\"%".contains(c)
    };
    if !host.chars().all(allowed) {
        return false;
    }
    let port = if let Some(rest) = host.strip_prefix('[') {
        match rest.find(']') {
            Some(i) => &rest[i + 1..],
            None => return false,
        }
    } else {
        host.rfind(':').map_or("", |i| &host[i..])
    };
    port.is_empty() || (port.starts_with(':') && port[1..].chars().all(|c| c.is_ascii_digit()))
}

fn split_host_port(host: &str) -> Option<(&str, &str)> {
    if let Some(rest) = host.strip_prefix('[') {
        let end = rest.find(']')?;
        let port = rest[end + 1..].strip_prefix(':')?;
        return Some((&rest[..end], port));
    }
    let (h, port) = host.split_once(':')?;
    if port.contains(':') {
        return None; // too many colons
    }
    Some((h, port))
}

/// %XX escapes decoded; an invalid one is a parse error.
fn unescape(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Go's `filepath.Match` for one DNS label: `*`, `?`, `[...]` classes (with `^`
/// negation and ranges) and `\` escapes. A malformed pattern matches nothing.
fn glob_match(pattern: &[char], name: &[char]) -> bool {
    match pattern.first() {
        None => name.is_empty(),
        Some('*') => (0..=name.len()).any(|skip| glob_match(&pattern[1..], &name[skip..])),
        Some('?') => !name.is_empty() && glob_match(&pattern[1..], &name[1..]),
        Some('[') => {
            let Some((&c, rest_name)) = name.split_first() else {
                return false;
            };
            let mut i = 1;
            let negated = pattern.get(i) == Some(&'^');
            if negated {
                i += 1;
            }
            let mut matched = false;
            let mut first = true;
            loop {
                let Some(&lo) = pattern.get(i) else {
                    return false; // unterminated class
                };
                if lo == ']' && !first {
                    i += 1;
                    break;
                }
                first = false;
                let (lo, next) = match class_char(pattern, i) {
                    Some(v) => v,
                    None => return false,
                };
                i = next;
                let mut hi = lo;
                if pattern.get(i) == Some(&'-') {
                    match class_char(pattern, i + 1) {
                        Some((h, next)) => {
                            hi = h;
                            i = next;
                        }
                        None => return false,
                    }
                }
                if lo <= c && c <= hi {
                    matched = true;
                }
            }
            matched != negated && glob_match(&pattern[i..], rest_name)
        }
        Some('\\') => match (pattern.get(1), name.first()) {
            (Some(p), Some(n)) => p == n && glob_match(&pattern[2..], &name[1..]),
            _ => false,
        },
        Some(p) => name.first() == Some(p) && glob_match(&pattern[1..], &name[1..]),
    }
}

/// One character of a class at `i` (an escape taken whole), and where the next starts.
fn class_char(pattern: &[char], i: usize) -> Option<(char, usize)> {
    match pattern.get(i)? {
        '\\' => pattern.get(i + 1).map(|c| (*c, i + 2)),
        '-' | ']' => None,
        c => Some((*c, i + 1)),
    }
}

/// Whether the key `glob` (host labels may be globs) covers `target` (upstream
/// `URLsMatchStr`): same port, same number of labels, each label matching, and the key's
/// path a prefix of the target's.
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (Some(glob), Some(target)) = (SchemelessUrl::parse(glob), SchemelessUrl::parse(target))
    else {
        return false;
    };
    let (glob_labels, glob_port) = glob.labels_and_port();
    let (target_labels, target_port) = target.labels_and_port();
    glob_port == target_port
        && glob_labels.len() == target_labels.len()
        && target.path.starts_with(&glob.path)
        && glob_labels.iter().zip(&target_labels).all(|(g, t)| {
            let g: Vec<char> = g.chars().collect();
            let t: Vec<char> = t.chars().collect();
            glob_match(&g, &t)
        })
}

/// The key an entry is stored under (upstream `BasicDockerKeyring.Add`): no scheme, and
/// `/v1/` or `/v2/` paths stand for the host. `None`: not a URL (the entry is ignored).
fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let url = SchemelessUrl::parse(rest)?;
    let mut path = url.path.as_str();
    if path.starts_with("/v2/") || path.starts_with("/v1/") {
        path = &path[3..];
    }
    Some(if !path.is_empty() && path != "/" {
        format!("{}{path}", url.host)
    } else {
        url.host
    })
}

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Whether `image` is pulled from Docker Hub, judged by its name (upstream
/// `isDefaultRegistryMatch`).
pub fn is_default_registry_match(image: &str) -> bool {
    let mut parts = image.splitn(2, '/');
    let first = parts.next().unwrap_or_default();
    if first.is_empty() {
        return false;
    }
    if parts.next().is_none() {
        return true;
    }
    if first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// Credentials by registry key, looked up by repository (upstream `BasicDockerKeyring`).
#[derive(Debug, Default)]
pub struct Keyring {
    /// Keys, most specific first (reverse lexical order).
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

impl Keyring {
    pub fn add(&mut self, config: &DockerConfig) {
        for (location, credential) in config {
            let Some(key) = registry_key(location) else {
                tracing::warn!(entry = %location, "docker config entry is not a valid URL; ignored");
                continue;
            };
            self.creds
                .entry(key.clone())
                .or_default()
                .push(credential.clone());
            self.index.push(key);
        }
        self.index.sort();
        self.index.dedup();
        self.index.reverse();
    }

    /// Every credential whose key covers `repository` (a normalized repository name, see
    /// [`crate::image_ref::Reference::repository`]), most specific key first; Docker Hub's
    /// when none does.
    pub fn lookup(&self, repository: &str) -> Vec<Credential> {
        let mut found = Vec::new();
        for key in &self.index {
            if urls_match(key, repository) {
                found.extend(self.creds[key].iter().cloned());
            }
        }
        if found.is_empty()
            && is_default_registry_match(repository)
            && let Some(hub) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            found = hub.clone();
        }
        found
    }
}

/// Which format a node docker config file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"auths": {...}}`
    ConfigJson,
    /// The legacy map.
    Dockercfg,
}

/// Where the node's own credentials are looked for, in upstream's order: every
/// `config.json` place, then every `.dockercfg` place. `cwd` and `home` are left out when
/// unknown.
pub fn node_search_paths(
    root_dir: &Path,
    cwd: Option<&Path>,
    home: Option<&Path>,
) -> Vec<(PathBuf, Format)> {
    let mut paths = vec![(root_dir.join("config.json"), Format::ConfigJson)];
    if let Some(cwd) = cwd {
        paths.push((cwd.join("config.json"), Format::ConfigJson));
    }
    if let Some(home) = home {
        paths.push((home.join(".docker/config.json"), Format::ConfigJson));
    }
    paths.push(("/.docker/config.json".into(), Format::ConfigJson));
    paths.push((root_dir.join(".dockercfg"), Format::Dockercfg));
    if let Some(cwd) = cwd {
        paths.push((cwd.join(".dockercfg"), Format::Dockercfg));
    }
    if let Some(home) = home {
        paths.push((home.join(".dockercfg"), Format::Dockercfg));
    }
    paths.push(("/.dockercfg".into(), Format::Dockercfg));
    paths
}

/// The first of `paths` that exists and parses (upstream `ReadDockerConfigFile`): a file
/// that cannot be read or parsed is skipped.
pub fn read_node_config(paths: &[(PathBuf, Format)]) -> Option<(PathBuf, DockerConfig)> {
    for (path, format) in paths {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "docker config not readable");
                continue;
            }
        };
        let parsed = match format {
            Format::ConfigJson => parse_dockerconfigjson(&bytes),
            Format::Dockercfg => parse_dockercfg(&bytes),
        };
        match parsed {
            Ok(config) => return Some((path.clone(), config)),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "docker config not valid; skipped")
            }
        }
    }
    None
}

/// The node's keyring: its docker config file found as upstream finds it, with
/// `<root-dir>` first.
pub fn node_keyring(root_dir: &Path) -> Keyring {
    let cwd = std::env::current_dir().ok();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let mut keyring = Keyring::default();
    if let Some((path, config)) = read_node_config(&node_search_paths(
        root_dir,
        cwd.as_deref(),
        home.as_deref(),
    )) {
        tracing::debug!(path = %path.display(), entries = config.len(), "node docker config");
        keyring.add(&config);
    }
    keyring
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn cred(user: &str, password: &str) -> Credential {
        Credential {
            username: user.into(),
            password: password.into(),
            ..Default::default()
        }
    }

    fn keyring_of(json: &str) -> Keyring {
        let mut k = Keyring::default();
        k.add(&parse_dockercfg(json.as_bytes()).unwrap());
        k
    }

    /// One entry under `key` with user foo, password bar (as upstream's tests build them).
    fn single(key: &str) -> Keyring {
        keyring_of(
            &serde_json::json!({key: {"email": "foo@bar.baz", "auth": b64("foo:bar")}}).to_string(),
        )
    }

    #[test]
    fn urls_match_as_upstream() {
        let cases = [
            ("*.kubernetes.io", "prefix.kubernetes.io", true),
            ("prefix.*.io", "prefix.kubernetes.io", true),
            ("prefix.kubernetes.*", "prefix.kubernetes.io", true),
            ("*-good.kubernetes.io", "prefix-good.kubernetes.io", true),
            ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", true),
            ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", true),
            (
                "*.kubernetes.io:1111/blah",
                "prefix.kubernetes.io:1111/blah",
                true,
            ),
            (
                "prefix.*.io:1111/foo",
                "prefix.kubernetes.io:1111/foo/bar",
                true,
            ),
            ("*.kubernetes.io", "kubernetes.io", false),
            ("*.*.kubernetes.io", "prefix.kubernetes.io", false),
            ("*.*.kubernetes.io", "kubernetes.io", false),
            ("kubernetes.io", "kubernetes.com", false),
            ("k*.io", "quay.io", false),
            (
                "*.kubernetes.io:1234/blah",
                "prefix.kubernetes.io:1111/blah",
                false,
            ),
            (
                "prefix.*.io/foo",
                "prefix.kubernetes.io:1111/foo/bar",
                false,
            ),
            // Beyond upstream's table: classes, a malformed glob, and a '?', which starts
            // the URL's query (as Go parses it) and so never reaches the glob.
            ("registry-[0-9].example.com", "registry-7.example.com", true),
            (
                "registry-[^0-9].example.com",
                "registry-7.example.com",
                false,
            ),
            ("r?.example.com", "r1.example.com", false),
            ("r[.example.com", "r[.example.com", false),
            ("127.0.0.1:5000", "127.0.0.1:5000/private/busybox", true),
            ("127.0.0.1:5000", "127.0.0.1/private/busybox", false),
            ("127.0.0.1", "127.0.0.1:5000/private/busybox", false),
        ];
        for (glob, target, want) in cases {
            assert_eq!(urls_match(glob, target), want, "{glob} vs {target}");
        }
    }

    #[test]
    fn labels_glob_as_go_filepath_match() {
        let m = |p: &str, n: &str| {
            let p: Vec<char> = p.chars().collect();
            let n: Vec<char> = n.chars().collect();
            glob_match(&p, &n)
        };
        assert!(m("r?", "r1") && !m("r?", "r") && !m("r?", "r12"));
        assert!(m("*", "") && m("a*b*c", "axxbyyc") && !m("a*b*c", "axxbyy"));
        assert!(m("[a-c]x", "bx") && !m("[a-c]x", "dx") && m("[^a-c]x", "dx"));
        assert!(m("\\*", "*") && !m("\\*", "a"));
        assert!(!m("[", "[") && !m("[]a]", "]") && !m("[a-]", "a"));
    }

    #[test]
    fn keyring_globs_schemes_ports_and_paths_as_upstream() {
        let hits = [
            ("https://hello.kubernetes.io", "hello.kubernetes.io"),
            ("https://*.docker.io", "prefix.docker.io"),
            ("https://prefix.*.io", "prefix.docker.io"),
            ("https://prefix.docker.*", "prefix.docker.io"),
            ("https://*.docker.io/path", "prefix.docker.io/path"),
            ("https://prefix.*.io/path", "prefix.docker.io/path/subpath"),
            ("https://prefix.docker.*/path", "prefix.docker.io/path"),
            ("https://*.docker.io:8888", "prefix.docker.io:8888"),
            ("https://prefix.*.io:8888", "prefix.docker.io:8888"),
            ("https://prefix.docker.*:8888", "prefix.docker.io:8888"),
            (
                "https://*.docker.io/path:1111",
                "prefix.docker.io/path:1111",
            ),
            ("https://*.docker.io/v1/", "prefix.docker.io/path:1111"),
            ("https://*.docker.io/v2/", "prefix.docker.io/path:1111"),
            (
                "https://prefix.docker.*/path:1111",
                "prefix.docker.io/path:1111",
            ),
            ("prefix.docker.io:1111", "prefix.docker.io:1111/path"),
            ("*.docker.io:1111", "prefix.docker.io:1111/path"),
            (
                "http://127.0.0.1:5000/private",
                "127.0.0.1:5000/private/busybox",
            ),
        ];
        for (key, target) in hits {
            let found = single(key).lookup(&format!("{target}/foo/bar"));
            assert_eq!(
                found,
                vec![cred("foo", "bar")],
                "{key} should cover {target}"
            );
        }
        let misses = [
            ("https://hello.kubernetes.io", "world.mesos.org/foo/bar"),
            ("https://*.docker.com", "prefix.docker.io"),
            ("https://suffix.*.io", "prefix.docker.io"),
            ("https://prefix.docker.c*", "prefix.docker.io"),
            (
                "https://prefix.*.io/path:1111",
                "prefix.docker.io/path/subpath:1111",
            ),
            ("suffix.*.io", "prefix.docker.io"),
            ("https://index.docker.io/v1/", "world.mesos.org/foo/bar"),
            (
                "http://127.0.0.1:5000/other",
                "127.0.0.1:5000/private/busybox",
            ),
        ];
        for (key, target) in misses {
            let found = single(key).lookup(&format!("{target}/foo/bar"));
            assert!(found.is_empty(), "{key} should not cover {target}");
        }
    }

    #[test]
    fn docker_hub_credentials_serve_unqualified_and_qualified_hub_images() {
        let hub = single("https://index.docker.io/v1/");
        for image in [
            "google/docker-registry",
            "jenkins",
            "index.docker.io/v1//google/docker-registry",
            "docker.io/library/busybox",
        ] {
            assert_eq!(hub.lookup(image), vec![cred("foo", "bar")], "{image}");
        }
        // Through the normalization pull names get first.
        let repo = crate::image_ref::parse_normalized_named("busybox:1.36")
            .unwrap()
            .repository();
        assert_eq!(hub.lookup(&repo), vec![cred("foo", "bar")]);
        // A key of "docker.io" matches normalized names by URL.
        let docker_io = single("docker.io");
        assert_eq!(docker_io.lookup(&repo), vec![cred("foo", "bar")]);
        assert!(docker_io.lookup("quay.io/x/y").is_empty());
    }

    #[test]
    fn is_default_registry_match_as_upstream() {
        for (image, want) in [
            ("foo/bar", true),
            ("docker.io/foo/bar", true),
            ("index.docker.io/foo/bar", true),
            ("foo", true),
            ("", false),
            ("registry.tld/foo/bar", false),
            ("registry:5000/foo/bar", false),
            ("myhostdocker.io/foo/bar", false),
        ] {
            assert_eq!(is_default_registry_match(image), want, "{image:?}");
        }
    }

    #[test]
    fn more_specific_keys_come_first() {
        let ada = cred("ada", "smash");
        let grace = cred("grace", "squash");
        let mut dk = Keyring::default();
        dk.add(&vec![
            ("bar.example.com/pong".into(), grace.clone()),
            ("bar.example.com".into(), ada.clone()),
        ]);
        let cases: [(&str, Vec<Credential>); 7] = [
            ("bar.example.com", vec![ada.clone()]),
            ("bar.example.com/pong", vec![grace.clone(), ada.clone()]),
            ("bar.example.com/ping", vec![ada.clone()]),
            ("bar.example.com/pongz", vec![grace.clone(), ada.clone()]),
            (
                "bar.example.com/pong/pang",
                vec![grace.clone(), ada.clone()],
            ),
            ("example.com", vec![]),
            ("foo.example.com", vec![]),
        ];
        for (image, want) in cases {
            assert_eq!(dk.lookup(image), want, "{image}");
        }
        // A scheme and a /v1/ path stand for the host (upstream issue 3797).
        let mut dk = Keyring::default();
        dk.add(&vec![(
            "https://quay.io/v1/".into(),
            cred("rex", "tiny arms"),
        )]);
        for image in ["quay.io", "quay.io/foo", "quay.io/foo/bar"] {
            assert_eq!(dk.lookup(image), vec![cred("rex", "tiny arms")]);
        }
    }

    #[test]
    fn several_configs_add_up_in_order() {
        let mut dk = Keyring::default();
        dk.add(&vec![("registry.example.com".into(), cred("one", "1"))]);
        dk.add(&vec![("registry.example.com".into(), cred("two", "2"))]);
        assert_eq!(
            dk.lookup("registry.example.com/app"),
            vec![cred("one", "1"), cred("two", "2")]
        );
    }

    #[test]
    fn entries_parse_as_go_decodes_them() {
        // auth wins over username/password; field names in any case; padded or not.
        let cfg = parse_dockercfg(
            serde_json::json!({
                "a.example.com": {"username": "x", "password": "y", "auth": b64("user:pa:ss")},
                "b.example.com": {"Username": "u", "PASSWORD": "p"},
                "c.example.com": {"auth": b64("ab:c").trim_end_matches('=')},
                "d.example.com": {"identitytoken": "id-tok", "registrytoken": "reg-tok"},
                "e.example.com": null,
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let by_key: HashMap<_, _> = cfg.into_iter().collect();
        assert_eq!(by_key["a.example.com"], cred("user", "pa:ss"));
        assert_eq!(by_key["b.example.com"], cred("u", "p"));
        assert_eq!(by_key["c.example.com"], cred("ab", "c"));
        assert_eq!(by_key["d.example.com"].identity_token, "id-tok");
        assert_eq!(by_key["d.example.com"].registry_token, "reg-tok");
        assert_eq!(by_key["e.example.com"], Credential::default());

        let json = parse_dockerconfigjson(
            br#"{"auths": {"r.example.com": {"auth": "Zm9vOmJhcg=="}}, "HttpHeaders": {}}"#,
        )
        .unwrap();
        assert_eq!(json, vec![("r.example.com".into(), cred("foo", "bar"))]);
        assert!(parse_dockerconfigjson(b"{}").unwrap().is_empty());
        assert!(parse_dockerconfigjson(b"null").unwrap().is_empty());

        for bad in [
            r#"{"r": {"auth": "bm9jb2xvbg=="}}"#, // "nocolon"
            r#"{"r": {"auth": "!!!"}}"#,
            r#"{"r": {"username": 5}}"#,
            r#"{"r": "x"}"#,
            r#"[]"#,
            r#"{"#,
        ] {
            assert!(parse_dockercfg(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_dockerconfigjson(br#"{"auths": []}"#).is_err());
    }

    #[test]
    fn errors_and_debug_never_show_a_secret() {
        let err = parse_dockercfg(br#"{"r": {"auth": "aHVudGVyMg=="}}"#).unwrap_err();
        assert!(
            !err.contains("aHVudGVyMg") && !err.contains("hunter2"),
            "{err}"
        );
        let c = Credential {
            username: "ada".into(),
            password: "hunter2".into(),
            identity_token: "tok-123".into(),
            registry_token: String::new(),
        };
        let shown = format!("{c:?}");
        assert!(shown.contains("ada"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok-123"),
            "{shown}"
        );
        let cri = c.to_cri();
        assert_eq!(
            (cri.username.as_str(), cri.password.as_str()),
            ("ada", "hunter2")
        );
        assert!(cri.auth.is_empty() && cri.server_address.is_empty());
        assert_eq!(cri.identity_token, "tok-123");
    }

    #[test]
    fn invalid_keys_are_ignored() {
        let mut dk = Keyring::default();
        dk.add(&vec![
            ("https://bad host".into(), cred("x", "y")),
            ("bad.example.com:port".into(), cred("x", "y")),
            ("good.example.com".into(), cred("g", "h")),
        ]);
        assert_eq!(dk.index, vec!["good.example.com".to_string()]);
    }

    fn dockerconfigjson_secret(ty: &str, key: &str, body: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "regcred"},
            "type": ty,
            "data": {key: b64(body)},
        }))
        .unwrap()
    }

    #[test]
    fn pull_secrets_of_both_types_and_nothing_else() {
        let json = dockerconfigjson_secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths": {"r.example.com": {"username": "a", "password": "b"}}}"#,
        );
        let legacy = dockerconfigjson_secret(
            "kubernetes.io/dockercfg",
            ".dockercfg",
            r#"{"r.example.com": {"username": "c", "password": "d"}}"#,
        );
        // The right key under the wrong type is ignored, as upstream ignores it.
        let mistyped = dockerconfigjson_secret(
            "Opaque",
            ".dockerconfigjson",
            r#"{"auths": {"r.example.com": {"username": "e", "password": "f"}}}"#,
        );
        let keyring = secrets_keyring(&[json, legacy, mistyped]).unwrap();
        assert_eq!(
            keyring.lookup("r.example.com/app"),
            vec![cred("a", "b"), cred("c", "d")]
        );
        let broken = dockerconfigjson_secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            "not json",
        );
        let err = secrets_keyring(&[broken]).unwrap_err();
        assert!(err.contains("regcred"), "{err}");
    }

    #[test]
    fn the_node_file_is_found_in_upstream_order() {
        let root = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let paths = node_search_paths(root.path(), Some(cwd.path()), Some(home.path()));
        let names: Vec<(PathBuf, Format)> = vec![
            (root.path().join("config.json"), Format::ConfigJson),
            (cwd.path().join("config.json"), Format::ConfigJson),
            (home.path().join(".docker/config.json"), Format::ConfigJson),
            ("/.docker/config.json".into(), Format::ConfigJson),
            (root.path().join(".dockercfg"), Format::Dockercfg),
            (cwd.path().join(".dockercfg"), Format::Dockercfg),
            (home.path().join(".dockercfg"), Format::Dockercfg),
            ("/.dockercfg".into(), Format::Dockercfg),
        ];
        assert_eq!(paths, names);
        // Only the temp dirs: the host's own files play no part in this test.
        let paths: Vec<_> = paths
            .into_iter()
            .filter(|(p, _)| !p.starts_with("/.docker") && p != Path::new("/.dockercfg"))
            .collect();
        let entry = |user: &str| {
            format!(r#"{{"r.example.com": {{"username": "{user}", "password": "p"}}}}"#)
        };
        let write = |p: PathBuf, s: String| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        assert!(read_node_config(&paths).is_none());
        // A .dockercfg in the root dir, a config.json in $HOME/.docker: config.json wins.
        write(root.path().join(".dockercfg"), entry("root-dockercfg"));
        write(
            home.path().join(".docker/config.json"),
            format!(r#"{{"auths": {}}}"#, entry("home-json")),
        );
        let (found, cfg) = read_node_config(&paths).unwrap();
        assert_eq!(found, home.path().join(".docker/config.json"));
        assert_eq!(cfg[0].1.username, "home-json");
        // The working directory comes before $HOME; an invalid file is skipped.
        write(cwd.path().join("config.json"), "{broken".into());
        assert_eq!(
            read_node_config(&paths).unwrap().1[0].1.username,
            "home-json"
        );
        write(
            cwd.path().join("config.json"),
            format!(r#"{{"auths": {}}}"#, entry("cwd-json")),
        );
        assert_eq!(
            read_node_config(&paths).unwrap().1[0].1.username,
            "cwd-json"
        );
        // The root dir first of all; one file only, never merged.
        write(
            root.path().join("config.json"),
            format!(r#"{{"auths": {}}}"#, entry("root-json")),
        );
        let (found, cfg) = read_node_config(&paths).unwrap();
        assert_eq!(found, root.path().join("config.json"));
        assert_eq!(cfg.len(), 1);
        assert_eq!(cfg[0].1.username, "root-json");
        // With no config.json anywhere, the first .dockercfg.
        for p in [
            root.path().join("config.json"),
            cwd.path().join("config.json"),
            home.path().join(".docker/config.json"),
        ] {
            std::fs::remove_file(p).unwrap();
        }
        write(home.path().join(".dockercfg"), entry("home-dockercfg"));
        assert_eq!(
            read_node_config(&paths).unwrap().1[0].1.username,
            "root-dockercfg"
        );
        std::fs::remove_file(root.path().join(".dockercfg")).unwrap();
        assert_eq!(
            read_node_config(&paths).unwrap().1[0].1.username,
            "home-dockercfg"
        );
    }
}
