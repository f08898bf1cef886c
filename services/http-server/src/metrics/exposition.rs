//! The Prometheus text format: parses each service's exposition (OpenMetrics text from
//! prometheus-client, or classic text), merges families across services, and renders
//! one classic text body (version 0.0.4, what upstream's kubelet serves by default).
//!
//! A family is named as in classic text (a counter `foo` of OpenMetrics becomes
//! `foo_total`), appears once, and a series that two services both report (a CRI
//! operation that pleg and pod-sync both make) is summed for counters, histograms and
//! summary counts, since each service counts only its own calls.

use nodeagent_telemetry::metrics::keeps_counter_name;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
            Kind::Untyped => "untyped",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// Milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub samples: Vec<Sample>,
}

impl Family {
    pub fn new(name: &str, help: &str, kind: Kind) -> Self {
        Self {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            samples: Vec::new(),
        }
    }

    /// Adds a sample named after the family.
    pub fn push(&mut self, labels: &[(&str, &str)], value: f64, timestamp_ms: Option<i64>) {
        self.samples.push(Sample {
            name: self.name.clone(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
            timestamp_ms,
        });
    }

    fn owns(&self, sample: &str) -> bool {
        let suffixes: &[&str] = match self.kind {
            Kind::Histogram => &["_bucket", "_sum", "_count"],
            Kind::Summary => &["_sum", "_count"],
            // OpenMetrics samples of a counter kept without `_total`.
            Kind::Counter if !self.name.ends_with("_total") => &["_total"],
            _ => &[],
        };
        sample == self.name
            || suffixes
                .iter()
                .any(|s| sample.strip_suffix(s) == Some(&self.name))
    }
}

/// Families by name.
#[derive(Debug, Default)]
pub struct Exposition {
    families: BTreeMap<String, Family>,
}

/// The type and classic name of an OpenMetrics or classic `# TYPE` line. A counter that
/// upstream names without `_total` keeps its name
/// ([`nodeagent_telemetry::metrics::UNSUFFIXED_COUNTERS`]); its OpenMetrics samples
/// (`<name>_total`) are renamed to it in [`parse`].
fn classic(name: &str, kind: &str) -> (String, Kind) {
    match kind {
        "counter" if name.ends_with("_total") || keeps_counter_name(name) => {
            (name.to_string(), Kind::Counter)
        }
        "counter" => (format!("{name}_total"), Kind::Counter),
        "gauge" => (name.to_string(), Kind::Gauge),
        "info" => (format!("{name}_info"), Kind::Gauge),
        "histogram" => (name.to_string(), Kind::Histogram),
        "summary" => (name.to_string(), Kind::Summary),
        _ => (name.to_string(), Kind::Untyped),
    }
}

fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Parses `{a="x",b="y"}` at the start of `s`; returns the labels and the rest.
type LabelPairs = Vec<(String, String)>;

fn parse_labels(s: &str) -> Result<(LabelPairs, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("expected '{'")?;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("a label without '='")?;
        let key = rest[..eq].trim().to_string();
        rest = rest[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("a label value without '\"'")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("an unterminated label value".into()),
                },
                Some((_, c)) => value.push(c),
                None => return Err("an unterminated label value".into()),
            }
        };
        labels.push((key, value));
        rest = &rest[end + 1..];
    }
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = line[..name_end].to_string();
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    // An exemplar follows " # ".
    let rest = rest.split(" # ").next().unwrap_or_default();
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next().ok_or("a sample without a value")?)?;
    // OpenMetrics timestamps are seconds, classic ones milliseconds; ours carry none.
    let timestamp_ms = fields.next().and_then(|t| t.parse().ok());
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses one exposition into families (classic names). Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Family>, String> {
    let mut families: Vec<Family> = Vec::new();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut parts = comment.trim_start().splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("HELP"), Some(name), help) => {
                    helps.insert(name.to_string(), unescape_help(help.unwrap_or_default()));
                }
                (Some("TYPE"), Some(name), Some(kind)) => {
                    let (classic_name, kind) = classic(name, kind.trim());
                    let help = helps.remove(name).unwrap_or_default();
                    families.push(Family::new(&classic_name, &help, kind));
                }
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(at)?;
        if sample.name.ends_with("_created") {
            continue;
        }
        match families.last_mut() {
            Some(family) if family.owns(&sample.name) => {
                let mut sample = sample;
                if family.kind == Kind::Counter {
                    // A counter kept without `_total`: its samples are named as it is.
                    sample.name.clone_from(&family.name);
                }
                family.samples.push(sample)
            }
            _ => {
                let mut family = Family::new(&sample.name, "", Kind::Untyped);
                family.samples.push(sample);
                families.push(family);
            }
        }
    }
    Ok(families)
}

impl Exposition {
    /// Merges `families` in; returns why a family was left out (same name, other type).
    pub fn merge(&mut self, families: Vec<Family>) -> Vec<String> {
        let mut refused = Vec::new();
        for family in families {
            let Some(existing) = self.families.get_mut(&family.name) else {
                self.families.insert(family.name.clone(), family);
                continue;
            };
            if existing.kind != family.kind {
                refused.push(format!(
                    "{} is a {} here and a {} elsewhere",
                    family.name,
                    family.kind.as_str(),
                    existing.kind.as_str()
                ));
                continue;
            }
            if existing.help.is_empty() {
                existing.help = family.help;
            }
            let additive = matches!(existing.kind, Kind::Counter | Kind::Histogram);
            for sample in family.samples {
                let same = existing
                    .samples
                    .iter_mut()
                    .find(|s| s.name == sample.name && same_labels(&s.labels, &sample.labels));
                match same {
                    Some(s)
                        if additive
                            || sample.name.ends_with("_count")
                            || sample.name.ends_with("_sum") =>
                    {
                        s.value += sample.value
                    }
                    // Two services cannot both own one gauge series: keep the first.
                    Some(_) => {}
                    None => existing.samples.push(sample),
                }
            }
        }
        refused
    }

    pub fn families(&self) -> impl Iterator<Item = &Family> {
        self.families.values()
    }

    /// Keeps only the families `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.families.retain(|name, _| keep(name));
    }

    /// The classic text body.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for family in self.families.values() {
            render_family(family, &mut out);
        }
        out
    }
}

fn same_labels(a: &[(String, String)], b: &[(String, String)]) -> bool {
    a.len() == b.len() && a.iter().all(|pair| b.contains(pair))
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

fn escape(s: &str, quote: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

pub fn render_family(family: &Family, out: &mut String) {
    if !family.help.is_empty() {
        let _ = writeln!(
            out,
            "# HELP {} {}",
            family.name,
            escape(&family.help, false)
        );
    }
    let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.as_str());
    let mut samples: Vec<&Sample> = family.samples.iter().collect();
    if family.kind == Kind::Histogram {
        // Each series' buckets, then its sum and count, as client_golang writes them.
        let rank = |s: &Sample| match s.name.strip_prefix(&family.name) {
            Some("_bucket") => 0,
            Some("_sum") => 1,
            _ => 2,
        };
        fn series(s: &Sample) -> Vec<&(String, String)> {
            let mut l: Vec<_> = s.labels.iter().filter(|(k, _)| k != "le").collect();
            l.sort();
            l
        }
        samples.sort_by(|a, b| series(a).cmp(&series(b)).then(rank(a).cmp(&rank(b))));
    }
    for s in samples {
        out.push_str(&s.name);
        if !s.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in s.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // `le` as Go formats it ("1", not "1.0").
                let v = match (k.as_str(), parse_value(v)) {
                    ("le", Ok(le)) => format_value(le),
                    _ => v.clone(),
                };
                let _ = write!(out, "{k}=\"{}\"", escape(&v, true));
            }
            out.push('}');
        }
        let _ = write!(out, " {}", format_value(s.value));
        if let Some(t) = s.timestamp_ms {
            let _ = write!(out, " {t}");
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLEG: &str = "# HELP kubelet_runtime_operations [ALPHA] Cumulative number of runtime operations by operation type.\n\
# TYPE kubelet_runtime_operations counter\n\
kubelet_runtime_operations_total{operation_type=\"list_containers\"} 3\n\
# HELP process_cpu_seconds Total user and system CPU time spent in seconds.\n\
# TYPE process_cpu_seconds counter\n\
process_cpu_seconds_total{service=\"pleg\"} 1.5\n\
# HELP h A histogram.\n\
# TYPE h histogram\n\
h_sum 0.5\nh_count 1\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 1\n";

    const POD_SYNC: &str = "# TYPE kubelet_runtime_operations counter\n\
kubelet_runtime_operations_total{operation_type=\"list_containers\"} 2\n\
kubelet_runtime_operations_total{operation_type=\"create_container\"} 1\n\
# TYPE process_cpu_seconds counter\n\
process_cpu_seconds_total{service=\"pod-sync\"} 2\n\
# TYPE h histogram\n\
h_sum 1.5\nh_count 2\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
# TYPE kubelet_running_pods gauge\nkubelet_running_pods 4\n# EOF\n";

    #[test]
    fn merges_families_across_services_and_renders_classic_text() {
        let mut all = Exposition::default();
        assert!(all.merge(parse(PLEG).expect("parses")).is_empty());
        assert!(all.merge(parse(POD_SYNC).expect("parses")).is_empty());
        let text = all.render();
        assert_eq!(
            text.matches("# TYPE kubelet_runtime_operations_total counter")
                .count(),
            1,
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_runtime_operations_total{operation_type=\"list_containers\"} 5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_runtime_operations_total{operation_type=\"create_container\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("process_cpu_seconds_total{service=\"pleg\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("process_cpu_seconds_total{service=\"pod-sync\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("h_bucket{le=\"+Inf\"} 3\nh_bucket")
                || text.contains("h_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("h_sum 2\n"), "{text}");
        assert!(text.contains("# HELP h A histogram.\n"), "{text}");
        assert!(!text.contains("EOF"), "{text}");
        // Rendering is parseable again, to the same families.
        let again = parse(&text).expect("parses");
        assert_eq!(again.len(), 4);
    }

    /// Upstream's counters without `_total` keep their exact name, from OpenMetrics
    /// (prometheus-client adds `_total`) and from classic text alike; summed across services.
    #[test]
    fn unsuffixed_counters_keep_upstream_names() {
        let openmetrics = "# HELP kubelet_server_expiration_renew_errors Counter of certificate renewal errors.\n\
# TYPE kubelet_server_expiration_renew_errors counter\n\
kubelet_server_expiration_renew_errors_total 0\n\
kubelet_server_expiration_renew_errors_created 1700000000.0\n\
# TYPE kubelet_evictions counter\n\
kubelet_evictions_total{eviction_signal=\"memory.available\"} 2\n# EOF\n";
        let classic = "# TYPE kubelet_evictions counter\n\
kubelet_evictions{eviction_signal=\"memory.available\"} 1\n";
        let mut all = Exposition::default();
        assert!(all.merge(parse(openmetrics).expect("parses")).is_empty());
        assert!(all.merge(parse(classic).expect("parses")).is_empty());
        let text = all.render();
        assert!(
            text.contains(
                "# TYPE kubelet_server_expiration_renew_errors counter\nkubelet_server_expiration_renew_errors 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubelet_evictions{eviction_signal=\"memory.available\"} 3\n"),
            "{text}"
        );
        assert!(!text.contains("_total"), "{text}");
        // And back: the same names.
        let again = parse(&text).expect("parses");
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|f| !f.name.ends_with("_total")));
    }

    #[test]
    fn a_type_conflict_leaves_the_later_family_out() {
        let mut all = Exposition::default();
        all.merge(parse("# TYPE x gauge\nx 1\n").expect("parses"));
        let refused = all.merge(parse("# TYPE x histogram\nx_count 1\n").expect("parses"));
        assert_eq!(refused.len(), 1);
        assert_eq!(all.render(), "# TYPE x gauge\nx 1\n");
    }

    #[test]
    fn labels_with_escapes_survive_a_round_trip() {
        let text = "# TYPE g gauge\ng{a=\"q\\\"uote\",b=\"back\\\\slash\",c=\"new\\nline\"} +Inf\n";
        let families = parse(text).expect("parses");
        assert_eq!(families[0].samples[0].labels[0].1, "q\"uote");
        assert_eq!(families[0].samples[0].labels[2].1, "new\nline");
        let mut all = Exposition::default();
        all.merge(families);
        assert_eq!(all.render(), text);
        assert!(parse("g{a=\"open} 1\n").is_err());
    }
}
