//! Upstream kubelet flags on our command line. An operator's unit files, kubeadm's
//! `KUBELET_KUBEADM_ARGS` and `/etc/default/kubelet` pass upstream's flags; every one of
//! upstream's names is accepted, read as upstream's pflag reads it (`--name=value`,
//! `--name value` for a flag that takes a value, a bare boolean `--name` for true or
//! `--name=false`). One that sets a KubeletConfiguration field we honour is applied over
//! the config file (flags win, as upstream); the rest are named in one warning at start and
//! ignored. A name upstream does not have is still an error.

use serde_json::{Map, Value};
use std::ffi::OsString;

/// Upstream's flags, one per line: `name kind field [deprecated]` (see the file's header
/// for where the list was read).
const UPSTREAM: &str = include_str!("upstream-kubelet-flags.txt");

/// One upstream flag: whether it takes a value (pflag consumes the next argument for it)
/// and the KubeletConfiguration field it sets, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Upstream {
    takes_value: bool,
    field: Option<&'static str>,
}

fn upstream(name: &str) -> Option<Upstream> {
    UPSTREAM
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == name).then_some(())?;
            let kind = words.next()?;
            let field = words.next().filter(|f| *f != "-");
            Some(Upstream {
                takes_value: kind != "bool",
                field,
            })
        })
}

/// The upstream flags a command line held that are not among our own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamFlags {
    /// (flag, config field, value), in command-line order (a later one wins).
    pub fields: Vec<(String, String, String)>,
    /// Flags of upstream's with no config field: accepted, not acted on.
    pub ignored: Vec<String>,
}

/// Splits `args` (the program name first) into those `cmd` parses and the upstream kubelet
/// flags it does not define. Anything else, an unknown flag included, is left for `cmd`
/// to judge.
pub fn split(cmd: &clap::Command, args: Vec<OsString>) -> (Vec<OsString>, UpstreamFlags) {
    let mut ours = Vec::with_capacity(args.len());
    let mut found = UpstreamFlags::default();
    let mut args = args.into_iter();
    ours.extend(args.next());
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            ours.push(arg);
            continue;
        };
        if text == "--" {
            ours.push(arg);
            ours.extend(args.by_ref());
            break;
        }
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        // pflag's WordSepNormalizeFunc, which the kubelet sets: `--max_pods` is `--max-pods`.
        let normalized;
        let (name, arg) = match name.strip_prefix("--") {
            Some(long) if long.contains('_') => {
                normalized = format!("--{}", long.replace('_', "-"));
                let arg = match inline {
                    Some(v) => OsString::from(format!("{normalized}={v}")),
                    None => OsString::from(&normalized),
                };
                (normalized.as_str(), arg)
            }
            _ => (name, arg.clone()),
        };
        let ours_takes_next = |a: &clap::Arg| {
            inline.is_none() && a.get_action().takes_values() && !a.is_require_equals_set()
        };
        if let Some(long) = name.strip_prefix("--") {
            if let Some(a) = cmd.get_arguments().find(|a| a.get_long() == Some(long)) {
                let next = ours_takes_next(a);
                ours.push(arg);
                if next {
                    ours.extend(args.next());
                }
                continue;
            }
            if let Some(flag) = upstream(long) {
                let value = match (inline, flag.takes_value) {
                    (Some(v), _) => v.to_string(),
                    (None, true) => match args.next() {
                        Some(v) => v.to_string_lossy().into_owned(),
                        // A value flag at the end: leave it to clap's readable error.
                        None => {
                            ours.push(arg);
                            continue;
                        }
                    },
                    (None, false) => "true".to_string(),
                };
                match flag.field {
                    Some(field) => found.fields.push((long.into(), field.into(), value)),
                    None => found.ignored.push(long.into()),
                }
                continue;
            }
        } else if let Some(short) = name.strip_prefix('-')
            && short.chars().count() == 1
            && let Some(a) = cmd
                .get_arguments()
                .find(|a| a.get_short().map(String::from).as_deref() == Some(short))
        {
            let next = ours_takes_next(a);
            ours.push(arg);
            if next {
                ours.extend(args.next());
            }
            continue;
        }
        ours.push(arg);
    }
    found.ignored.sort();
    found.ignored.dedup();
    (ours, found)
}

/// Applies the upstream flags' values to a KubeletConfiguration document (`doc`, a JSON
/// object), each converted to the type the field has in `defaults` (the document of a
/// default configuration). Returns the flags whose field this node agent does not have
/// (accepted, not acted on).
pub(crate) fn apply(
    doc: &mut Map<String, Value>,
    defaults: &Map<String, Value>,
    fields: &[(String, String, String)],
) -> Result<Vec<String>, String> {
    let mut ignored = Vec::new();
    for (flag, field, raw) in fields {
        // A nested field is a dotted path (`authentication.webhook.enabled`).
        let path: Vec<&str> = field.split('.').collect();
        let mut default = defaults.get(path[0]);
        for part in &path[1..] {
            default = default.and_then(|d| d.get(part));
        }
        let Some(default) = default else {
            ignored.push(flag.clone());
            continue;
        };
        let value = convert(field, default, raw)
            .map_err(|why| format!("invalid argument {raw:?} for \"--{flag}\" flag: {why}"))?;
        // Upstream ORs `--seccomp-default` with the file's seccompDefault.
        if flag == "seccomp-default" && value == Value::Bool(false) {
            continue;
        }
        let mut at = &mut *doc;
        for part in &path[..path.len() - 1] {
            let next = at
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !next.is_object() {
                *next = Value::Object(Map::new());
            }
            let Value::Object(inner) = next else {
                unreachable!("made an object just above")
            };
            at = inner;
        }
        let last = path[path.len() - 1].to_string();
        // Upstream merges `--feature-gates` into the file's gates, a later flag over an
        // earlier one (cliflag's MapStringBool, kubeletConfigFlagPrecedence).
        if let (Some(Value::Object(have)), Value::Object(gates)) = (at.get_mut(&last), &value)
            && field == "featureGates"
        {
            have.extend(gates.clone());
            continue;
        }
        at.insert(last, value);
    }
    Ok(ignored)
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("strconv.ParseBool: parsing: invalid syntax".into()),
    }
}

fn list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A flag's text as the value of `field`, whose default is `default`.
fn convert(field: &str, default: &Value, raw: &str) -> Result<Value, String> {
    Ok(match field {
        // upstream's `--eviction-hard=memory.available<100Mi,nodefs.available<10%`
        // (cliflag.NewLangleSeparatedMapStringString).
        "evictionHard" | "evictionSoft" => Value::Object(pairs(raw, '<')?),
        "evictionSoftGracePeriod"
        | "evictionMinimumReclaim"
        | "kubeReserved"
        | "systemReserved" => Value::Object(pairs(raw, '=')?),
        // `key=value:Effect` or `key:Effect` (upstream's RegisterWithTaints flag).
        // `--feature-gates=MemoryQoS=true,...` (cliflag's MapStringBool).
        "featureGates" => Value::Object(
            pairs(raw, '=')?
                .into_iter()
                .map(|(k, v)| Ok((k, Value::Bool(parse_bool(v.as_str().unwrap_or_default())?))))
                .collect::<Result<Map<String, Value>, String>>()?,
        ),
        "registerWithTaints" => Value::Array(list(raw).map(taint).collect::<Result<Vec<_>, _>>()?),
        _ => match default {
            Value::Bool(_) => Value::Bool(parse_bool(raw)?),
            Value::Number(_) => Value::from(
                raw.parse::<i64>()
                    .map_err(|_| "strconv.ParseInt: parsing: invalid syntax".to_string())?,
            ),
            Value::Array(_) => Value::Array(list(raw).map(Value::from).collect()),
            Value::Object(_) => Value::Object(pairs(raw, '=')?),
            _ => Value::from(raw),
        },
    })
}

/// `k1<sep>v1,k2<sep>v2` as a map.
fn pairs(raw: &str, sep: char) -> Result<Map<String, Value>, String> {
    list(raw)
        .map(|kv| {
            let (k, v) = kv
                .split_once(sep)
                .ok_or_else(|| format!("malformed pair {kv:?}, expect key{sep}value"))?;
            Ok((k.trim().to_string(), Value::from(v.trim())))
        })
        .collect()
}

/// One taint as upstream's `ParseTaint` reads it: `key=value:Effect` or `key:Effect`.
fn taint(text: &str) -> Result<Value, String> {
    let (kv, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("invalid taint spec: {text}"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "invalid taint effect: {effect}, unsupported taint effect"
        ));
    }
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    if key.is_empty() {
        return Err(format!("invalid taint spec: {text}"));
    }
    let mut t = Map::new();
    t.insert("key".into(), key.into());
    if !value.is_empty() {
        t.insert("value".into(), value.into());
    }
    t.insert("effect".into(), effect.into());
    Ok(Value::Object(t))
}

/// The fields of `doc` that `defaults` does not have, at any depth of a nested struct
/// (`authentication.webhook.cacheTTL`), as dotted paths. A map field (its default an
/// empty object or null: `evictionHard`, `kubeReserved`) takes any key.
pub(crate) fn unknown_fields(
    doc: &Map<String, Value>,
    defaults: &Map<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in doc {
        match (defaults.get(k), v) {
            (None, _) => out.push(k.clone()),
            (Some(Value::Object(d)), Value::Object(inner)) if !d.is_empty() => out.extend(
                unknown_fields(inner, d)
                    .into_iter()
                    .map(|sub| format!("{k}.{sub}")),
            ),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: crate::KubeletFlags,
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// kubeadm's own command line: its systemd drop-in `10-kubeadm.conf` runs
    /// `kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS
    /// $KUBELET_EXTRA_ARGS`, with `KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=...
    /// --kubeconfig=...`, `KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml` and
    /// `kubeadm-flags.env` as `kubeadm init` writes it
    /// (cmd/kubeadm/app/phases/kubelet/flags.go: the runtime endpoint, the sandbox image,
    /// node-ip and the taints of a control-plane node). An upstream flag we do not act on
    /// is named; one we do goes to its field; pflag's bare boolean and `-v` both work.
    #[test]
    fn kubeadms_command_line_is_accepted() {
        let cmd = Cli::command();
        let (ours, up) = split(
            &cmd,
            os(&[
                "kubelet",
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--config=/var/lib/kubelet/config.yaml",
                "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
                "--pod-infra-container-image=registry.k8s.io/pause:3.10",
                "--register-with-taints=node-role.kubernetes.io/control-plane:NoSchedule",
                "--max-pods",
                "20",
                "--fail-swap-on=false",
                "--rotate-certificates",
                "--eviction-hard=memory.available<100Mi,nodefs.available<10%",
                "--read_only_port=0",
                "-v=2",
            ]),
        );
        assert_eq!(
            ours,
            os(&[
                "kubelet",
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--config=/var/lib/kubelet/config.yaml",
                "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
                "--read-only-port=0",
                "-v=2",
            ])
        );
        assert_eq!(up.ignored, vec!["pod-infra-container-image".to_string()]);
        let fields: Vec<(&str, &str)> = up
            .fields
            .iter()
            .map(|(_, f, v)| (f.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            fields,
            vec![
                (
                    "registerWithTaints",
                    "node-role.kubernetes.io/control-plane:NoSchedule"
                ),
                ("maxPods", "20"),
                ("failSwapOn", "false"),
                ("rotateCertificates", "true"),
                (
                    "evictionHard",
                    "memory.available<100Mi,nodefs.available<10%"
                ),
            ]
        );
        let flags = Cli::try_parse_from(ours).unwrap().flags;
        assert_eq!(flags.v, Some(2));
    }

    /// pflag reads a boolean flag's value only after `=`: `--rotate-certificates false`
    /// is true followed by an argument. Our own flags keep their values whatever they
    /// hold, `=` or not; a flag name upstream does not have is left for clap to refuse.
    #[test]
    fn pflag_habits() {
        let cmd = Cli::command();
        let (ours, up) = split(
            &cmd,
            os(&[
                "x",
                "--rotate-certificates",
                "--max-pods=7",
                "--root-dir",
                "/r",
                "--port",
                "--max-pods",
                "--no-such-flag",
                "--",
                "--max-pods=9",
            ]),
        );
        // `--port` is ours and takes a value: the next argument is its, whatever it holds.
        assert_eq!(
            ours,
            os(&[
                "x",
                "--root-dir",
                "/r",
                "--port",
                "--max-pods",
                "--no-such-flag",
                "--",
                "--max-pods=9"
            ])
        );
        assert_eq!(
            up.fields,
            vec![
                (
                    "rotate-certificates".into(),
                    "rotateCertificates".into(),
                    "true".into()
                ),
                ("max-pods".into(), "maxPods".into(), "7".into()),
            ]
        );
        assert!(Cli::try_parse_from(os(&["x", "--no-such-flag"])).is_err());
    }

    /// `--feature-gates` adds to the file's `featureGates` (a gate it names is set, the
    /// others stay), and a second flag adds to the first, as upstream's MapStringBool.
    #[test]
    fn feature_gate_flags_merge_into_the_files_gates() {
        let defaults = crate::kubelet_config::default_document();
        let mut doc = Map::new();
        doc.insert(
            "featureGates".into(),
            serde_json::json!({"MemoryQoS": true, "Foo": true}),
        );
        let fields = [
            ("feature-gates", "featureGates", "Foo=false"),
            ("feature-gates", "featureGates", "Bar=true"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        apply(&mut doc, &defaults, &fields).unwrap();
        assert_eq!(
            doc["featureGates"],
            serde_json::json!({"MemoryQoS": true, "Foo": false, "Bar": true})
        );
    }

    #[test]
    fn values_take_their_fields_types() {
        let defaults = crate::kubelet_config::default_document();
        let mut doc = Map::new();
        let fields = [
            ("max-pods", "maxPods", "20"),
            ("rotate-certificates", "rotateCertificates", "True"),
            ("cluster-dns", "clusterDNS", "10.96.0.10, fd00::a"),
            ("kube-reserved", "kubeReserved", "cpu=100m,memory=100Mi"),
            ("eviction-hard", "evictionHard", "memory.available<100Mi"),
            ("cgroup-driver", "cgroupDriver", "systemd"),
            (
                "register-with-taints",
                "registerWithTaints",
                "a=b:NoSchedule,c:NoExecute",
            ),
            (
                "topology-manager-policy",
                "topologyManagerPolicy",
                "best-effort",
            ),
            (
                "authentication-token-webhook",
                "authentication.webhook.enabled",
                "false",
            ),
            ("seccomp-default", "seccompDefault", "false"),
            // cliflag's MapStringBool: `Name=bool,...`, Go's ParseBool.
            ("feature-gates", "featureGates", "MemoryQoS=true, Foo=F"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        let ignored = apply(&mut doc, &defaults, &fields).unwrap();
        assert_eq!(ignored, vec!["topology-manager-policy".to_string()]);
        assert_eq!(
            Value::Object(doc),
            serde_json::json!({
                "maxPods": 20,
                "rotateCertificates": true,
                "clusterDNS": ["10.96.0.10", "fd00::a"],
                "kubeReserved": {"cpu": "100m", "memory": "100Mi"},
                "evictionHard": {"memory.available": "100Mi"},
                "cgroupDriver": "systemd",
                "registerWithTaints": [
                    {"key": "a", "value": "b", "effect": "NoSchedule"},
                    {"key": "c", "effect": "NoExecute"}
                ],
                "authentication": {"webhook": {"enabled": false}},
                "featureGates": {"MemoryQoS": true, "Foo": false},
            })
        );
        for (flag, field, raw, want) in [
            (
                "max-pods",
                "maxPods",
                "many",
                "invalid argument \"many\" for \"--max-pods\" flag",
            ),
            (
                "fail-swap-on",
                "rotateCertificates",
                "yes",
                "strconv.ParseBool",
            ),
            (
                "register-with-taints",
                "registerWithTaints",
                "a=b:Sometimes",
                "invalid taint effect",
            ),
            ("kube-reserved", "kubeReserved", "cpu", "malformed pair"),
        ] {
            let err = apply(
                &mut Map::new(),
                &defaults,
                &[(flag.into(), field.into(), raw.into())],
            )
            .unwrap_err();
            assert!(err.contains(want), "{flag}: {err}");
        }
    }

    #[test]
    fn nested_unknown_fields_are_named() {
        let defaults = crate::kubelet_config::default_document();
        let doc = serde_json::json!({
            "authentication": {"webhook": {"enabled": true, "cacheTTL": "2m", "audience": "x"}},
            "kubeReserved": {"cpu": "1"},
            "evictionHard": {"memory.available": "1Gi"},
            "topologyManagerPolicy": "none",
        });
        let Value::Object(doc) = doc else {
            unreachable!()
        };
        assert_eq!(
            unknown_fields(&doc, &defaults),
            vec![
                "authentication.webhook.audience".to_string(),
                "topologyManagerPolicy".to_string()
            ]
        );
    }
}
