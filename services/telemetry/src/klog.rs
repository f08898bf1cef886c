//! Upstream's log lines, so that what operators' tools parse on a kubelet node parses here:
//! klog's text format (`--logging-format=text`, upstream's default) and component-base's
//! JSON format (`--logging-format=json`).
//!
//! Text, as klog writes a structured call (`InfoS`, `ErrorS`):
//!
//! ```text
//! I0102 15:04:05.067890    1234 sync.rs:321] "Pod started" logger="nodeagent-pod-sync" pod="default/web"
//! ```
//!
//! severity (`I`, `W`, `E`), month and day, local time to the microsecond, the process id
//! padded to 7, the source file's base name and line, then the quoted message and
//! `key=value` pairs: strings quoted as Go's `strconv.Quote` (a string with a line break as
//! klog's `<` block), numbers, booleans, lists and maps as compact JSON.
//!
//! JSON, as component-base's zap encoder writes it:
//!
//! ```text
//! {"ts":1136214245067.89,"logger":"nodeagent-pod-sync","caller":"src/sync.rs:321","msg":"Pod started","v":0,"pod":"default/web"}
//! ```
//!
//! `ts` in milliseconds since the epoch, `caller` the last directory and file, `v` the
//! verbosity of an info line, `err` last on an error line (which has no `v`). A warning is
//! an info line at `v` 0 there, as klog hands warnings to its JSON backend.
//!
//! Every line names its service in `logger` (upstream's key for a logger's name), and the
//! fields of the spans it is in come before its own, outermost first (as `WithValues`
//! before the call's pairs). A field named `error` is written `err`, upstream's key.

use serde_json::Value as Json;
use std::fmt::Write as _;
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// One field's value: a string (quoted in text), or compact JSON text written as it is
/// (numbers, booleans, and a `Debug` rendering that is JSON, such as a list of strings;
/// kept as text so that a map's keys keep their order).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Json(String),
}

/// When a line was written: the local wall clock for the text header, the epoch for `ts`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stamp {
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
    pub unix_nanos: i64,
}

impl Stamp {
    pub fn now() -> Stamp {
        use chrono::{Datelike, Timelike};
        let now = chrono::Local::now();
        Stamp {
            month: now.month(),
            day: now.day(),
            hour: now.hour(),
            minute: now.minute(),
            second: now.second(),
            // A leap second shows as 60, not as a 2-second microsecond count.
            micros: now.timestamp_subsec_micros().min(999_999),
            unix_nanos: now.timestamp_nanos_opt().unwrap_or_default(),
        }
    }
}

/// Everything one log line holds.
#[derive(Debug, Clone)]
pub struct Line<'a> {
    pub level: Level,
    pub stamp: Stamp,
    pub pid: u32,
    /// The source path as the compiler gave it (relative or absolute).
    pub file: &'a str,
    pub line: u32,
    /// The logger's name (the service): upstream's `logger` key. Always set by the layer.
    pub logger: Option<&'a str>,
    pub message: &'a str,
    /// Spans' fields (outermost first), then the event's, in the order written.
    pub fields: &'a [(String, Value)],
}

/// upstream's `v` for our levels, as `--v` maps onto them (0 info, 4 debug, 6 trace).
fn verbosity(level: Level) -> u8 {
    match level {
        Level::TRACE => 6,
        Level::DEBUG => 4,
        _ => 0,
    }
}

/// `err`, and the other pairs in their order.
fn split_err(fields: &[(String, Value)]) -> (Option<&Value>, Vec<&(String, Value)>) {
    let mut err = None;
    let mut rest = Vec::with_capacity(fields.len());
    for f in fields {
        if f.0 == "err" && err.is_none() {
            err = Some(&f.1);
        } else {
            rest.push(f);
        }
    }
    (err, rest)
}

/// klog's text line, newline included.
pub fn text(line: &Line<'_>) -> String {
    let mut out = String::with_capacity(128 + line.message.len());
    let severity = match line.level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let s = &line.stamp;
    let _ = write!(
        out,
        "{severity}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{}] ",
        s.month,
        s.day,
        s.hour,
        s.minute,
        s.second,
        s.micros,
        line.pid,
        base_name(line.file),
        line.line
    );
    quote_into(&mut out, line.message);
    let mut pair = |key: &str, value: &Value| {
        out.push(' ');
        out.push_str(key);
        match value {
            Value::Str(v) => text_string(&mut out, v),
            Value::Json(v) => {
                out.push('=');
                out.push_str(v);
            }
        }
    };
    if let Some(logger) = line.logger {
        pair("logger", &Value::Str(logger.to_string()));
    }
    // ErrorS writes the error first, right after the message.
    if line.level == Level::ERROR {
        let (err, rest) = split_err(line.fields);
        if let Some(e) = err {
            pair("err", e);
        }
        for (k, v) in rest {
            pair(k, v);
        }
    } else {
        for (k, v) in line.fields {
            pair(k, v);
        }
    }
    out.push('\n');
    out
}

/// component-base's JSON line, newline included.
pub fn json(line: &Line<'_>) -> String {
    let mut out = String::with_capacity(160 + line.message.len());
    let millis = line.stamp.unix_nanos as f64 / 1e6;
    let _ = write!(out, "{{\"ts\":{millis}");
    if let Some(logger) = line.logger {
        let _ = write!(out, ",\"logger\":{}", Json::from(logger));
    }
    let _ = write!(
        out,
        ",\"caller\":{},\"msg\":{}",
        Json::from(format!("{}:{}", trimmed_path(line.file), line.line)),
        Json::from(line.message),
    );
    let pair = |out: &mut String, key: &str, value: &Value| {
        out.push(',');
        out.push_str(&Json::from(key).to_string());
        out.push(':');
        match value {
            Value::Str(v) => out.push_str(&Json::from(v.as_str()).to_string()),
            Value::Json(v) => out.push_str(v),
        }
    };
    if line.level == Level::ERROR {
        // zapr's Error: no "v", the error last.
        let (err, rest) = split_err(line.fields);
        for (k, v) in rest {
            pair(&mut out, k, v);
        }
        if let Some(e) = err {
            pair(&mut out, "err", e);
        }
    } else {
        let _ = write!(out, ",\"v\":{}", verbosity(line.level));
        for (k, v) in line.fields {
            pair(&mut out, k, v);
        }
    }
    out.push_str("}\n");
    out
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// zap's `ShortCallerEncoder`: the last directory and the file.
fn trimmed_path(path: &str) -> &str {
    match path.rfind('/') {
        None => path,
        Some(last) => match path[..last].rfind('/') {
            None => path,
            Some(before) => &path[before + 1..],
        },
    }
}

/// `=` and a string as klog writes it: quoted as Go's `strconv.Quote`, or, holding a line
/// break, as a block of tab-indented lines closed by ` >`.
fn text_string(out: &mut String, v: &str) {
    if !v.contains('\n') {
        out.push('=');
        quote_into(out, v);
        return;
    }
    out.push_str("=<\n");
    let mut rest = v;
    while let Some(i) = rest.find('\n') {
        out.push('\t');
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    if rest.is_empty() {
        out.push_str(" >");
    } else {
        out.push('\t');
        out.push_str(rest);
        out.push_str("\n >");
    }
}

/// Go's `strconv.Quote` of `s`, appended to `out`.
fn quote_into(out: &mut String, s: &str) {
    out.push_str(&crate::go_quote(s));
}

/// A field's `Debug` rendering as a value: JSON when it is JSON (numbers, lists, maps; a
/// quoted string is the string), a plain string otherwise (a `Display` value, an enum's
/// name).
fn debug_value(rendered: String) -> Value {
    let looks_json = rendered.bytes().next().is_some_and(|b| {
        matches!(
            b,
            b'[' | b'{' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
        )
    });
    if !looks_json || serde_json::from_str::<serde::de::IgnoredAny>(&rendered).is_err() {
        return Value::Str(rendered);
    }
    if rendered.starts_with('"')
        && let Ok(s) = serde_json::from_str::<String>(&rendered)
    {
        return Value::Str(s);
    }
    Value::Json(compact(&rendered))
}

/// Valid JSON text without the whitespace between its tokens, order kept.
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// The fields of a span or an event, in order; the message apart.
#[derive(Default)]
struct Collect {
    message: Option<String>,
    fields: Vec<(String, Value)>,
    /// Where a `log` crate record came from (tracing-log's fields).
    log_file: Option<String>,
    log_line: Option<u32>,
}

impl Collect {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => {
                let text = match value {
                    Value::Str(s) | Value::Json(s) => s,
                };
                // `error!(message = %why, "text")`: tracing records the format string
                // first; a `message` field after it is a pair like any other.
                if self.message.is_some() {
                    self.fields.push(("message".into(), Value::Str(text)));
                } else {
                    self.message = Some(text);
                }
            }
            "log.file" => {
                if let Value::Str(s) = value {
                    self.log_file = Some(s);
                }
            }
            "log.line" => {
                if let Value::Json(n) = value {
                    self.log_line = n.parse().ok();
                }
            }
            "log.target" | "log.module_path" => {}
            "error" => self.fields.push(("err".into(), value)),
            name => self.fields.push((name.into(), value)),
        }
    }
}

impl Visit for Collect {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let rendered = format!("{value:?}");
        // The message is written with format_args!: its Debug is its text.
        if field.name() == "message" {
            self.put(field, Value::Str(rendered));
        } else {
            self.put(field, debug_value(rendered));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Json(value.to_string()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::Json(value.to_string()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: those go as strings.
        if value.is_finite() {
            self.put(field, Value::Json(value.to_string()));
        } else {
            self.put(field, Value::Str(value.to_string()));
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Json(value.to_string()));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
}

/// The pairs of a line: the spans' fields (outermost first, as klog's `WithValues`) and
/// then the event's. A span's key that an inner span or the event sets again is left out,
/// the later value written in its own place (klog's "override WithValues" case); keys
/// repeated within the event are all kept (its "print duplicate keys in arguments").
fn with_values(
    spans: Vec<Vec<(String, Value)>>,
    event: Vec<(String, Value)>,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (i, level) in spans.iter().enumerate() {
        for (k, v) in level {
            let again = spans[i + 1..].iter().chain(std::iter::once(&event));
            if !again.flatten().any(|(key, _)| key == k) {
                out.push((k.clone(), v.clone()));
            }
        }
    }
    out.extend(event);
    out
}

/// A span's fields, kept in its extensions for the lines written inside it.
struct SpanFields(Vec<(String, Value)>);

/// The output format of [`KlogLayer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

type Sink = Box<dyn Fn(&[u8]) + Send + Sync>;

/// The layer that writes each event to stderr as one of upstream's lines.
pub struct KlogLayer {
    format: Format,
    logger: String,
    pid: u32,
    sink: Sink,
}

impl KlogLayer {
    pub fn new(format: Format, logger: &str) -> KlogLayer {
        // One write per line: lines of concurrent threads never interleave.
        KlogLayer::with_sink(
            format,
            logger,
            Box::new(|line| {
                let _ = std::io::stderr().lock().write_all(line);
            }),
        )
    }

    /// The layer writing each line to `sink` instead of stderr.
    pub fn with_sink(format: Format, logger: &str, sink: Sink) -> KlogLayer {
        KlogLayer {
            format,
            logger: logger.to_string(),
            pid: std::process::id(),
            sink,
        }
    }
}

impl<S> Layer<S> for KlogLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut collect = Collect::default();
        attrs.record(&mut collect);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(collect.fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut collect = Collect::default();
        values.record(&mut collect);
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<SpanFields>()
        {
            for (k, v) in collect.fields {
                match fields.0.iter_mut().find(|(key, _)| *key == k) {
                    Some(slot) => slot.1 = v,
                    None => fields.0.push((k, v)),
                }
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut collect = Collect::default();
        event.record(&mut collect);
        let mut levels: Vec<Vec<(String, Value)>> = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<SpanFields>() {
                    levels.push(f.0.clone());
                }
            }
        }
        let fields = with_values(levels, std::mem::take(&mut collect.fields));
        let meta = event.metadata();
        let file = meta
            .file()
            .map(str::to_string)
            .or(collect.log_file)
            .unwrap_or_else(|| "???".to_string());
        let line = Line {
            level: *meta.level(),
            stamp: Stamp::now(),
            pid: self.pid,
            file: &file,
            line: meta.line().or(collect.log_line).unwrap_or(1),
            logger: Some(&self.logger),
            message: collect.message.as_deref().unwrap_or(""),
            fields: &fields,
        };
        let rendered = match self.format {
            Format::Text => text(&line),
            Format::Json => json(&line),
        };
        (self.sink)(rendered.as_bytes());
    }
}

#[cfg(test)]
mod tests;
