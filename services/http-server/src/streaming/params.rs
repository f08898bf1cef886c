//! The query and upgrade headers of the streaming endpoints, read as upstream reads them
//! (`remotecommand.NewOptions`, `portforward.NewV4Options`, `wsstream.IsWebSocketRequest`).
//! Every check here runs before any runtime call, so a bad request costs nothing.

use http::HeaderMap;

/// A decoded query string; keys may repeat (`command=sh&command=-c`).
#[derive(Debug, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let pairs = raw
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => (decode(k), decode(v)),
                None => (decode(pair), String::new()),
            })
            .collect();
        Query(pairs)
    }

    /// Every value of `key`, in order.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn first(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which streams a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Reads a boolean flag under its upstream name (`input`, `output`, `error`, `tty`, which
/// the API server sends) or the `PodExecOptions` name clients use (`stdin`, ...). Upstream
/// takes only "1" as true; "true" is accepted too, and anything else is refused rather
/// than silently read as false.
fn flag(query: &Query, names: &[&str]) -> Result<bool, String> {
    let mut set = false;
    for name in names {
        for value in query.all(name) {
            set |= match value.as_str() {
                "1" | "true" | "True" => true,
                "" | "0" | "false" | "False" => false,
                other => {
                    return Err(format!(
                        "invalid value {other:?} for query parameter {name:?}: want 1 or 0"
                    ));
                }
            };
        }
    }
    Ok(set)
}

/// The streams of an exec or attach (upstream's `NewOptions`).
pub fn stream_options(query: &Query) -> Result<StreamOptions, String> {
    let tty = flag(query, &["tty"])?;
    let stdin = flag(query, &["input", "stdin"])?;
    let stdout = flag(query, &["output", "stdout"])?;
    let mut stderr = flag(query, &["error", "stderr"])?;
    if tty && stderr {
        // A terminal merges stderr into stdout, as upstream.
        stderr = false;
    }
    if !stdin && !stdout && !stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(StreamOptions {
        stdin,
        stdout,
        stderr,
        tty,
    })
}

/// The command of an exec: every `command` value.
pub fn command(query: &Query) -> Result<Vec<String>, String> {
    let command = query.all("command");
    if command.is_empty() {
        return Err("query parameter \"command\" is required: the command to run and its arguments, one value each".into());
    }
    Ok(command)
}

/// The ports of a WebSocket port-forward (upstream's `NewV4Options`): `port` values, each
/// a comma-separated list. SPDY clients name ports in stream headers instead, so they get
/// an empty list.
pub fn ports(query: &Query, websocket: bool) -> Result<Vec<i32>, String> {
    if !websocket {
        return Ok(Vec::new());
    }
    let values = query.all("port");
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// `v5.channel.k8s.io`: v4 plus a CLOSE signal (channel 255) that ends one stream, so
/// a client can close stdin. The kubelet API speaks it itself (`v5.rs`).
pub const V5: &str = "v5.channel.k8s.io";

/// The WebSocket subprotocols of exec and attach: v5, spoken here, and those that
/// containerd's streaming server speaks itself.
pub const REMOTE_COMMAND_PROTOCOLS: &[&str] = &[
    V5,
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
/// ... and of port-forward.
pub const PORT_FORWARD_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "v4.base64.channel.k8s.io"];

/// How the client wants to upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    /// `Upgrade: websocket` (RFC 6455), with the subprotocol chosen: the first the
    /// client offers that is supported, as upstream's `wsstream` chooses; None when the
    /// client offers none (the runtime then speaks its default).
    WebSocket(Option<String>),
    /// Anything else, in practice `Upgrade: SPDY/3.1`; the runtime negotiates it.
    Other,
}

/// Checks that the request is an upgrade this node can accept: an upgrade at all
/// (upstream's proxy answers "Upgrade request required" otherwise), and for WebSocket a
/// subprotocol among `supported`.
pub fn check_upgrade(headers: &HeaderMap, supported: &[&str]) -> Result<Upgrade, String> {
    let connection_upgrade = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let upgrade = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !connection_upgrade || upgrade.is_empty() {
        return Err("Upgrade request required".into());
    }
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return Ok(Upgrade::Other);
    }
    let offered: Vec<&str> = headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Ok(Upgrade::WebSocket(None));
    }
    match offered.iter().find(|p| supported.contains(p)) {
        Some(p) => Ok(Upgrade::WebSocket(Some(p.to_string()))),
        None => Err(format!(
            "none of the requested WebSocket subprotocols ({}) is supported; this node speaks {} \
             and SPDY/3.1",
            offered.join(", "),
            supported.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Query {
        Query::parse(Some(s))
    }

    #[test]
    fn query_decoding_and_repeats() {
        let query = q("command=sh&command=-c&command=echo+a%20b%3B&x");
        assert_eq!(query.all("command"), ["sh", "-c", "echo a b;"]);
        assert_eq!(query.first("x"), Some(""));
        assert_eq!(q("a=%zz%4&b=%+1").first("a"), Some("%zz%4"));
        assert_eq!(q("b=%+1").first("b"), Some("% 1"));
        assert_eq!(q("a=%C3%A9").first("a"), Some("é"));
    }

    #[test]
    fn stream_options_as_upstream() {
        let o = stream_options(&q("input=1&output=1&tty=1&error=1")).unwrap();
        assert_eq!(
            o,
            StreamOptions {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true
            }
        );
        let o = stream_options(&q("stdin=true&stderr=1")).unwrap();
        assert!(o.stdin && o.stderr && !o.stdout && !o.tty);
        assert_eq!(
            stream_options(&q("tty=1")).unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
        assert!(
            stream_options(&q("output=yes"))
                .unwrap_err()
                .contains("\"yes\"")
        );
        assert!(command(&q("output=1")).is_err());
    }

    #[test]
    fn ports_as_upstream() {
        assert_eq!(ports(&q(""), false).unwrap(), Vec::<i32>::new());
        assert_eq!(
            ports(&q("port=80,8080&port=1"), true).unwrap(),
            [80, 8080, 1]
        );
        assert_eq!(
            ports(&q(""), true).unwrap_err(),
            "query parameter \"port\" is required"
        );
        assert_eq!(
            ports(&q("port="), true).unwrap_err(),
            "query parameter \"port\" cannot be empty"
        );
        assert!(
            ports(&q("port=70000"), true)
                .unwrap_err()
                .starts_with("unable to parse \"70000\" as a port")
        );
        assert_eq!(
            ports(&q("port=0"), true).unwrap_err(),
            "port \"0\" must be > 0"
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn upgrades() {
        assert_eq!(
            check_upgrade(&headers(&[]), REMOTE_COMMAND_PROTOCOLS).unwrap_err(),
            "Upgrade request required"
        );
        let spdy = headers(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
        assert_eq!(
            check_upgrade(&spdy, REMOTE_COMMAND_PROTOCOLS),
            Ok(Upgrade::Other)
        );
        let ws = |protocols: &str| {
            headers(&[
                ("connection", "keep-alive, Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", protocols),
            ])
        };
        // The client's order decides, as upstream's wsstream.
        assert_eq!(
            check_upgrade(
                &ws("v5.channel.k8s.io, v4.channel.k8s.io"),
                REMOTE_COMMAND_PROTOCOLS
            ),
            Ok(Upgrade::WebSocket(Some(V5.into())))
        );
        assert_eq!(
            check_upgrade(
                &ws("x.k8s.io, v4.channel.k8s.io, v5.channel.k8s.io"),
                REMOTE_COMMAND_PROTOCOLS
            ),
            Ok(Upgrade::WebSocket(Some("v4.channel.k8s.io".into())))
        );
        assert_eq!(
            check_upgrade(&ws(""), REMOTE_COMMAND_PROTOCOLS),
            Ok(Upgrade::WebSocket(None))
        );
        let err = check_upgrade(&ws("v6.channel.k8s.io"), REMOTE_COMMAND_PROTOCOLS).unwrap_err();
        assert!(
            err.contains("v6.channel.k8s.io") && err.contains("SPDY/3.1"),
            "{err}"
        );
        assert!(check_upgrade(&ws(V5), PORT_FORWARD_PROTOCOLS).is_err());
        assert!(check_upgrade(&ws("channel.k8s.io"), PORT_FORWARD_PROTOCOLS).is_err());
        assert!(check_upgrade(&ws("SPDY/3.1+portforward.k8s.io"), PORT_FORWARD_PROTOCOLS).is_err());
    }
}
