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
    /// [`crate::images::image_ref::Reference::repository`]), most specific key first; Docker Hub's
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
mod tests;
