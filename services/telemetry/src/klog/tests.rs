//! The oracles are upstream's own tests: klog's `TestHeader` (klog_test.go) for the text
//! header, the expected lines of klog's `test/output.go` for the text after it, and
//! component-base's `logs/json/json_test.go` (`TestZapLoggerInfo`, `TestZapLoggerV`,
//! `TestZapLoggerError`, `TestZapLoggerStreams`) for the JSON keys. Names and values are
//! upstream's; where upstream passes a Go value we pass what our fields hold (a string, a
//! number, a `Debug` rendering that is JSON).

use super::*;
use std::sync::{Arc, Mutex};

fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}
fn j(v: &str) -> Value {
    Value::Json(v.to_string())
}
fn kv(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// An upstream case: its name, level, logger name, message, pairs, expected output.
type Row<'a> = (
    &'a str,
    Level,
    Option<&'a str>,
    &'a str,
    Vec<(String, Value)>,
    &'a str,
);

/// `TestHeader`'s clock: 2006-01-02 15:04:05.067890 local.
const HEADER_STAMP: Stamp = Stamp {
    month: 1,
    day: 2,
    hour: 15,
    minute: 4,
    second: 5,
    micros: 67890,
    unix_nanos: 1_136_214_245_067_890_000,
};

fn line<'a>(
    level: Level,
    file: &'a str,
    logger: Option<&'a str>,
    message: &'a str,
    fields: &'a [(String, Value)],
) -> Line<'a> {
    Line {
        level,
        stamp: HEADER_STAMP,
        pid: 1234,
        file,
        line: 42,
        logger,
        message,
        fields,
    }
}

#[test]
fn the_text_header_is_klogs() {
    // klog_test.go TestHeader: "I0102 15:04:05.067890    1234 klog_test.go:%d] test\n"
    // (the pid padded to 7 columns; the file's base name, never its directory).
    let out = text(&line(
        Level::INFO,
        "pkg/klog/klog_test.go",
        None,
        "test",
        &[],
    ));
    assert!(
        out.starts_with("I0102 15:04:05.067890    1234 klog_test.go:42] "),
        "{out:?}"
    );
    let warn = text(&line(Level::WARN, "a/b.rs", None, "hello world", &[]));
    assert!(warn.starts_with("W0102 "), "{warn:?}");
    let err = text(&line(Level::ERROR, "a/b.rs", None, "hello world", &[]));
    assert!(err.starts_with("E0102 "), "{err:?}");
    // Debug and trace lines are info lines at a higher -v in klog.
    let debug = text(&line(Level::DEBUG, "a/b.rs", None, "x", &[]));
    assert!(debug.starts_with("I0102 "), "{debug:?}");
}

/// output.go's tests strip the header with `^(.).... ..:..:......... ....... output.go`
/// and compare the rest; so does this.
fn strip_header(out: &str) -> String {
    out.lines()
        .map(|l| {
            if l.len() > 30 && l.as_bytes()[5] == b' ' && l.as_bytes()[29] == b' ' {
                format!("{} {}", &l[..1], &l[30..])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn the_text_after_the_header_is_klogs_output_go() {
    let multi = "{\n  \"Name\": \"worker\",\n  \"Kind\": \"pod\"\n}";
    // (test/output.go's case name, level, logger name, message, pairs, expected output)
    let rows: Vec<Row> = vec![
        (
            "log with values",
            Level::INFO,
            None,
            "test",
            kv(&[("akey", s("avalue"))]),
            "I output.go:<LINE>] \"test\" akey=\"avalue\"\n",
        ),
        (
            "log with name and values",
            Level::INFO,
            Some("me"),
            "test",
            kv(&[("akey", s("avalue"))]),
            "I output.go:<LINE>] \"test\" logger=\"me\" akey=\"avalue\"\n",
        ),
        (
            "log with multiple names and values",
            Level::INFO,
            Some("hello.world"),
            "test",
            kv(&[("akey", s("avalue"))]),
            "I output.go:<LINE>] \"test\" logger=\"hello.world\" akey=\"avalue\"\n",
        ),
        (
            "multiple WithValues (its second line)",
            Level::INFO,
            None,
            "test",
            kv(&[("firstKey", j("1")), ("secondKey", j("2"))]),
            "I output.go:<LINE>] \"test\" firstKey=1 secondKey=2\n",
        ),
        (
            "empty WithValues",
            Level::INFO,
            None,
            "test",
            vec![],
            "I output.go:<LINE>] \"test\"\n",
        ),
        (
            "print duplicate keys in arguments",
            Level::INFO,
            None,
            "test",
            kv(&[("akey", s("avalue")), ("akey", s("avalue2"))]),
            "I output.go:<LINE>] \"test\" akey=\"avalue\" akey=\"avalue2\"\n",
        ),
        (
            "preserve order of key/value pairs",
            Level::INFO,
            None,
            "test",
            kv(&[
                ("akey9", s("avalue9")),
                ("akey8", s("avalue8")),
                ("akey1", s("avalue1")),
                ("akey5", s("avalue5")),
                ("akey4", s("avalue4")),
            ]),
            "I output.go:<LINE>] \"test\" akey9=\"avalue9\" akey8=\"avalue8\" akey1=\"avalue1\" akey5=\"avalue5\" akey4=\"avalue4\"\n",
        ),
        (
            "html characters",
            Level::INFO,
            None,
            "test",
            kv(&[("akey", s("<&>"))]),
            "I output.go:<LINE>] \"test\" akey=\"<&>\"\n",
        ),
        (
            "quotation",
            Level::INFO,
            None,
            "\"quoted\"",
            kv(&[("key", s("\"quoted value\""))]),
            "I output.go:<LINE>] \"\\\"quoted\\\"\" key=\"\\\"quoted value\\\"\"\n",
        ),
        (
            "KObj",
            Level::INFO,
            None,
            "test",
            kv(&[("pod", s("kube-system/pod-1"))]),
            "I output.go:<LINE>] \"test\" pod=\"kube-system/pod-1\"\n",
        ),
        (
            "KObjSlice okay",
            Level::INFO,
            None,
            "KObjSlice",
            kv(&[("pods", j(r#"["kube-system/pod-1","kube-system/pod-2"]"#))]),
            "I output.go:<LINE>] \"KObjSlice\" pods=[\"kube-system/pod-1\",\"kube-system/pod-2\"]\n",
        ),
        (
            "regular error types as value",
            Level::INFO,
            None,
            "test",
            kv(&[("err", s("whoops"))]),
            "I output.go:<LINE>] \"test\" err=\"whoops\"\n",
        ),
        (
            "regular error types when using logr.Error",
            Level::ERROR,
            None,
            "test",
            kv(&[("err", s("whoops"))]),
            "E output.go:<LINE>] \"test\" err=\"whoops\"\n",
        ),
        (
            "map values",
            Level::INFO,
            None,
            "maps",
            kv(&[
                ("s", j(r#"{"hello":"world"}"#)),
                ("i", j(r#"{"1":2,"3":4}"#)),
            ]),
            "I output.go:<LINE>] \"maps\" s={\"hello\":\"world\"} i={\"1\":2,\"3\":4}\n",
        ),
        (
            "slice values",
            Level::INFO,
            None,
            "slices",
            kv(&[("s", j(r#"["hello","world"]"#)), ("i", j("[1,2,3]"))]),
            "I output.go:<LINE>] \"slices\" s=[\"hello\",\"world\"] i=[1,2,3]\n",
        ),
        (
            "struct values",
            Level::INFO,
            None,
            "structs",
            kv(&[("s", j(r#"{"Name":"worker","Kind":"pod"}"#))]),
            "I output.go:<LINE>] \"structs\" s={\"Name\":\"worker\",\"Kind\":\"pod\"}\n",
        ),
        (
            "klog.Format (a value with line breaks)",
            Level::INFO,
            None,
            "klog.Format",
            kv(&[("s", s(multi))]),
            "I output.go:<LINE>] \"klog.Format\" s=<\n\t{\n\t  \"Name\": \"worker\",\n\t  \"Kind\": \"pod\"\n\t}\n >\n",
        ),
        (
            "InfoS",
            Level::INFO,
            None,
            "hello",
            kv(&[("what", s("world"))]),
            "I output.go:<LINE>] \"hello\" what=\"world\"\n",
        ),
        (
            "V().InfoS",
            Level::DEBUG,
            None,
            "hello",
            kv(&[("what", s("one world"))]),
            "I output.go:<LINE>] \"hello\" what=\"one world\"\n",
        ),
        (
            "ErrorS",
            Level::ERROR,
            None,
            "world",
            kv(&[("err", s("hello"))]),
            "E output.go:<LINE>] \"world\" err=\"hello\"\n",
        ),
    ];
    let mut failed = vec![];
    for (name, level, logger, message, fields, want) in &rows {
        let out = text(&line(
            *level,
            "k8s.io/klog/test/output.go",
            *logger,
            message,
            fields,
        ));
        let got = strip_header(&out);
        let want = want.replace("<LINE>", "42");
        if got != want {
            failed.push(format!("{name}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn errors_come_first_in_text_and_last_in_json() {
    // klog's ErrorS writes err right after the message; zapr's Error writes it last.
    let fields = kv(&[("err", s("boom")), ("pod", s("default/web"))]);
    let wrong_order = kv(&[("pod", s("default/web")), ("err", s("boom"))]);
    let t = text(&line(Level::ERROR, "x/y.rs", None, "m", &wrong_order));
    assert!(
        t.ends_with("] \"m\" err=\"boom\" pod=\"default/web\"\n"),
        "{t:?}"
    );
    let js = json(&line(Level::ERROR, "x/y.rs", None, "m", &fields));
    assert!(
        js.ends_with(",\"pod\":\"default/web\",\"err\":\"boom\"}\n"),
        "{js:?}"
    );
}

/// json_test.go compares with `%f` for ts and `%d` for the line; so does this.
fn json_with_placeholders(out: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(out).expect(out);
    assert!(v["ts"].is_f64() || v["ts"].is_u64(), "{out}");
    let ts_end = out.find(',').expect(out);
    format!("{{\"ts\":%f{}", &out[ts_end..]).replacen(":42\"", ":%d\"", 1)
}

#[test]
fn the_json_keys_are_component_bases() {
    let file = "k8s.io/component-base/logs/json/json_test.go";
    // (json_test.go's case, level, logger, message, pairs, expected line)
    let rows: Vec<Row> = vec![
        (
            "TestZapLoggerInfo: test",
            Level::INFO,
            None,
            "test",
            kv(&[("ns", s("default")), ("podnum", j("2"))]),
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"test\",\"v\":0,\"ns\":\"default\",\"podnum\":2}\n",
        ),
        (
            "TestZapLoggerInfo: duration value",
            Level::INFO,
            None,
            "test for duration value argument",
            kv(&[("duration", s("5s"))]),
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"test for duration value argument\",\"v\":0,\"duration\":\"5s\"}\n",
        ),
        (
            "TestZapLoggerInfo: WithName",
            Level::INFO,
            Some("hello.world"),
            "test for WithName",
            vec![],
            "{\"ts\":%f,\"logger\":\"hello.world\",\"caller\":\"json/json_test.go:%d\",\"msg\":\"test for WithName\",\"v\":0}\n",
        ),
        (
            "TestZapLoggerInfo: duplicate keys",
            Level::INFO,
            None,
            "test for duplicate keys",
            kv(&[("akey", s("avalue")), ("akey", s("anothervalue"))]),
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"test for duplicate keys\",\"v\":0,\"akey\":\"avalue\",\"akey\":\"anothervalue\"}\n",
        ),
        (
            "TestZapLoggerError",
            Level::ERROR,
            None,
            "wrong namespace",
            kv(&[
                ("err", s("invalid namespace:default")),
                ("ns", s("default")),
                ("podnum", j("2")),
                ("time", s("1µs")),
            ]),
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"wrong namespace\",\"ns\":\"default\",\"podnum\":2,\"time\":\"1µs\",\"err\":\"invalid namespace:default\"}\n",
        ),
        (
            "TestZapLoggerStreams: error",
            Level::ERROR,
            None,
            "failed",
            kv(&[("err", s("some error"))]),
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"failed\",\"err\":\"some error\"}\n",
        ),
        (
            "TestZapLoggerStreams: info",
            Level::INFO,
            None,
            "hello world",
            vec![],
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"hello world\",\"v\":0}\n",
        ),
        (
            // klog hands a warning to its JSON backend as an info line at v 0.
            "a warning",
            Level::WARN,
            None,
            "hello world",
            vec![],
            "{\"ts\":%f,\"caller\":\"json/json_test.go:%d\",\"msg\":\"hello world\",\"v\":0}\n",
        ),
    ];
    let mut failed = vec![];
    for (name, level, logger, message, fields, want) in &rows {
        let out = json(&line(*level, file, *logger, message, fields));
        let got = json_with_placeholders(&out);
        if got != *want {
            failed.push(format!("{name}:\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn json_ts_is_milliseconds_and_v_the_verbosity() {
    // TestZapLoggerV: 123 ns after the epoch is "ts":0.000123 (milliseconds).
    let mut l = line(Level::INFO, "a/b/c.rs", None, "test", &[]);
    l.stamp.unix_nanos = 123;
    assert!(json(&l).starts_with("{\"ts\":0.000123,"), "{}", json(&l));
    // TestHeader's instant, in milliseconds (float64(nanos) / 1e6, as upstream divides).
    let l = json(&line(Level::INFO, "a/b/c.rs", None, "test", &[]));
    let ts = serde_json::from_str::<serde_json::Value>(&l).unwrap()["ts"]
        .as_f64()
        .unwrap();
    assert!((ts - 1_136_214_245_067.89).abs() < 0.001, "{l}");
    // `--v` 4 is our debug, 6 our trace: the v each line was written at.
    for (level, v) in [(Level::INFO, 0), (Level::DEBUG, 4), (Level::TRACE, 6)] {
        let out = json(&line(level, "a/b/c.rs", None, "test", &[]));
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["v"], v, "{out}");
    }
}

/// `?` values: JSON as compact JSON in its own order (a map's keys unsorted), a quoted
/// string as the string, anything else as a string.
#[test]
fn debug_renderings_become_values() {
    assert_eq!(debug_value(r#"["a", "b"]"#.into()), j(r#"["a","b"]"#));
    assert_eq!(
        debug_value("{\"Name\": \"worker\", \"Kind\": \"pod\"}".into()),
        j(r#"{"Name":"worker","Kind":"pod"}"#)
    );
    assert_eq!(
        debug_value(r#"["a b", "c\" d"]"#.into()),
        j(r#"["a b","c\" d"]"#)
    );
    assert_eq!(debug_value(r#""quoted""#.into()), s("quoted"));
    assert_eq!(debug_value("42".into()), j("42"));
    assert_eq!(debug_value("default/web".into()), s("default/web"));
    assert_eq!(debug_value("Some(\"x\")".into()), s("Some(\"x\")"));
    assert_eq!(debug_value("1.5s".into()), s("1.5s"));
    assert_eq!(debug_value("node-1".into()), s("node-1"));
}

/// output.go's "override WithValues" (`withValues: duration 1h, X y; values: duration
/// 1m, A b` gives `X="y" duration="1m0s" A="b"`) and "override single value": a span's
/// key set again later is written once, with the later value, where the later one is.
/// Nested spans that both carry `k8s.pod.name` write it once.
#[test]
fn a_key_set_again_overrides_the_spans() {
    let spans = vec![
        kv(&[("duration", s("1h")), ("X", s("y"))]),
        kv(&[("pod", s("default/web"))]),
    ];
    let event = kv(&[("duration", s("1m0s")), ("A", s("b"))]);
    assert_eq!(
        with_values(spans, event),
        kv(&[
            ("X", s("y")),
            ("pod", s("default/web")),
            ("duration", s("1m0s")),
            ("A", s("b"))
        ])
    );
    let nested = vec![
        kv(&[("k8s.pod.name", s("web")), ("probe", s("Readiness"))]),
        kv(&[("k8s.pod.name", s("web"))]),
    ];
    assert_eq!(
        with_values(nested, kv(&[("akey", s("1")), ("akey", s("2"))])),
        kv(&[
            ("probe", s("Readiness")),
            ("k8s.pod.name", s("web")),
            ("akey", s("1")),
            ("akey", s("2"))
        ])
    );
}

/// What the layer makes of real tracing events: span fields first, `error` as `err`,
/// `?` values that are JSON as JSON, `%` values as strings, numbers bare, the service as
/// `logger`, one line per event.
#[test]
fn the_layer_writes_tracing_events_as_klog_lines() {
    use tracing_subscriber::layer::SubscriberExt;
    for format in [Format::Text, Format::Json] {
        let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = seen.clone();
        let layer = KlogLayer::with_sink(
            format,
            "nodeagent-pod-sync",
            Box::new(move |l| sink.lock().unwrap().extend_from_slice(l)),
        );
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("sync_pod", pod = %"default/web", attempt = 1u64);
            let _in = span.enter();
            let flags = vec!["vmodule", "runtime-cgroups"];
            tracing::warn!(flags = ?flags, ok = true, "flags \"ignored\"");
            let e = std::io::Error::other("disk full");
            tracing::error!(error = %e, container = "c", "Failed to write");
            let why = "too big";
            tracing::info!(reason = "OutOfmemory", message = %why, "pod refused");
        });
        let out = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        match format {
            Format::Text => {
                assert!(lines[0].starts_with('W'), "{out}");
                assert!(
                    lines[0].ends_with(
                        r#"] "flags \"ignored\"" logger="nodeagent-pod-sync" pod="default/web" attempt=1 flags=["vmodule","runtime-cgroups"] ok=true"#
                    ),
                    "{out}"
                );
                assert!(lines[1].starts_with('E'), "{out}");
                assert!(
                    lines[1].ends_with(
                        r#"] "Failed to write" logger="nodeagent-pod-sync" err="disk full" pod="default/web" attempt=1 container="c""#
                    ),
                    "{out}"
                );
                assert!(lines[0].contains(" tests.rs:"), "{out}");
                assert!(
                    lines[2].ends_with(
                        r#"] "pod refused" logger="nodeagent-pod-sync" pod="default/web" attempt=1 reason="OutOfmemory" message="too big""#
                    ),
                    "{out}"
                );
            }
            Format::Json => {
                let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
                assert_eq!(first["logger"], "nodeagent-pod-sync");
                assert_eq!(first["msg"], "flags \"ignored\"");
                assert_eq!(first["v"], 0);
                assert_eq!(first["pod"], "default/web");
                assert_eq!(first["attempt"], 1);
                assert_eq!(
                    first["flags"],
                    serde_json::json!(["vmodule", "runtime-cgroups"])
                );
                assert!(
                    first["caller"]
                        .as_str()
                        .unwrap()
                        .starts_with("klog/tests.rs:")
                );
                assert!(
                    lines[1].ends_with(r#""container":"c","err":"disk full"}"#),
                    "{out}"
                );
                let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
                assert!(second.get("v").is_none(), "{out}");
            }
        }
    }
}
