//! A strict parser of the Prometheus text format (version 0.0.4), independent of the one
//! http-server uses, so that the tests check the bodies rather than trust them.

use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Family {
    pub kind: String,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("expected {")?;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let key = &rest[..eq];
        if !valid_name(key) || key.contains(':') {
            return Err(format!("bad label name {key:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, '\n')) | None => return Err("unterminated label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        rest = &rest[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// The family a sample belongs to, given the declared families.
fn family_of<'a>(name: &'a str, families: &BTreeMap<String, Family>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && families.get(base).is_some_and(|f| {
                f.kind == "histogram" || (f.kind == "summary" && suffix != "_bucket")
            })
        {
            return base;
        }
    }
    name
}

/// Counters that upstream's kubelet names without `_total` (k8s.io/kubernetes
/// pkg/kubelet/metrics/metrics.go `Evictions`; pkg/kubelet/certificate/kubelet.go), which
/// kubernetes-mixin's alerts read by these exact names.
pub const UNSUFFIXED_COUNTERS: &[&str] = &[
    "kubelet_evictions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Parses a body; errors name the line. Checks: one TYPE per family, declared before its
/// samples, families not interleaved, no series twice, histograms with `le` and
/// cumulative buckets ending in `+Inf` equal to `_count`, counters named `_total` (but
/// upstream's [`UNSUFFIXED_COUNTERS`], which must not be).
pub fn parse(text: &str) -> Result<BTreeMap<String, Family>, String> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut series: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        let mut switch_to = |name: &str, current: &mut Option<String>| -> Result<(), String> {
            if current.as_deref() != Some(name) {
                if let Some(old) = current.take() {
                    closed.insert(old);
                }
                if closed.contains(name) {
                    return Err(format!("family {name} appears twice"));
                }
                *current = Some(name.to_string());
            }
            Ok(())
        };
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("HELP"), Some(name), help) => {
                    switch_to(name, &mut current).map_err(err)?;
                    let f = families.entry(name.to_string()).or_default();
                    if f.help
                        .replace(help.unwrap_or_default().to_string())
                        .is_some()
                    {
                        return Err(err("HELP twice".into()));
                    }
                }
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !valid_name(name) {
                        return Err(err("bad metric name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(err(format!("bad type {kind}")));
                    }
                    switch_to(name, &mut current).map_err(err)?;
                    let f = families.entry(name.to_string()).or_default();
                    if !f.kind.is_empty() || !f.samples.is_empty() {
                        return Err(err("TYPE twice or after samples".into()));
                    }
                    let unsuffixed = UNSUFFIXED_COUNTERS
                        .iter()
                        .any(|c| name == *c || name.strip_suffix("_total") == Some(*c));
                    if kind == "counter" && unsuffixed && name.ends_with("_total") {
                        return Err(err("upstream names this counter without _total".into()));
                    }
                    if kind == "counter" && !unsuffixed && !name.ends_with("_total") {
                        return Err(err("a counter not named *_total".into()));
                    }
                    f.kind = kind.to_string();
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err("bad metric name".into()));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(err)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before value".into()))?
            .split(' ');
        let value = parse_value(fields.next().unwrap_or_default()).map_err(err)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp".into()))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let family = family_of(name, &families).to_string();
        switch_to(&family, &mut current).map_err(err)?;
        let key = (
            name.to_string(),
            labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        );
        if !series.insert(key) {
            return Err(err("series twice".into()));
        }
        let f = families.entry(family).or_default();
        if f.kind.is_empty() {
            f.kind = "untyped".into();
        }
        if f.kind == "histogram" && name.ends_with("_bucket") && !labels.contains_key("le") {
            return Err(err("bucket without le".into()));
        }
        f.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for (name, f) in &families {
        if f.kind == "histogram" {
            check_histogram(name, f)?;
        }
    }
    Ok(families)
}

/// A series' labels without `le`.
type SeriesKey = Vec<(String, String)>;

fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
    let mut by_series: BTreeMap<SeriesKey, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<SeriesKey, f64> = BTreeMap::new();
    for s in &f.samples {
        let mut labels = s.labels.clone();
        let le = labels.remove("le");
        let key: Vec<_> = labels.into_iter().collect();
        if s.name.ends_with("_bucket") {
            let le = parse_value(le.as_deref().unwrap_or_default())?;
            by_series.entry(key).or_default().push((le, s.value));
        } else if s.name.ends_with("_count") {
            counts.insert(key, s.value);
        }
    }
    for (key, buckets) in by_series {
        let mut last = (f64::NEG_INFINITY, 0.0);
        for b in &buckets {
            if b.0 <= last.0 || b.1 < last.1 {
                return Err(format!(
                    "{name}{key:?}: buckets not cumulative: {buckets:?}"
                ));
            }
            last = *b;
        }
        if last.0 != f64::INFINITY || counts.get(&key) != Some(&last.1) {
            return Err(format!("{name}{key:?}: +Inf bucket is not the count"));
        }
    }
    Ok(())
}

#[test]
fn the_parser_refuses_what_the_format_forbids() {
    assert!(parse("# TYPE a gauge\na 1\n").is_ok());
    assert!(parse("# TYPE a gauge\na 1\n# TYPE a gauge\n").is_err());
    assert!(parse("# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{x=\"1\"} 2\n").is_err());
    assert!(parse("# TYPE a gauge\na 1\na 2\n").is_err());
    assert!(parse("# TYPE a counter\na 1\n").is_err());
    assert!(
        parse("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n")
            .is_err()
    );
    assert!(parse("a{x=\"1} 1\n").is_err());
}
