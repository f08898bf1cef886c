use super::*;

const LOG: &[u8] = b"2024-05-01T10:00:01.5Z stdout F one\n\
2024-05-01T10:00:02.000000001Z stderr F two\n\
2024-05-01T10:00:03Z stdout P thr\n\
2024-05-01T10:00:03.1Z stdout F ee\n\
2024-05-01T10:00:04Z stdout F four\n";

fn render(log: &[u8], opts: &LogOptions) -> String {
    let now: Timestamp = "2024-05-01T10:00:05Z".parse().unwrap();
    let mut w = LogWriter::new(opts, now);
    let mut out = Vec::new();
    for line in log.split_inclusive(|b| *b == b'\n') {
        if let Ok(r) = parse(line)
            && w.write(&r, &mut out) == Flow::LimitReached
        {
            break;
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn parses_records() {
    let r = parse(b"2024-05-01T10:00:03Z stdout P a b \n").unwrap();
    assert_eq!(r.stream, Stream::Stdout);
    assert!(!r.full);
    assert_eq!(r.content, b"a b ");
    let r = parse(b"2024-05-01T12:00:03+02:00 stderr F:x \n").unwrap();
    assert!(r.full);
    assert_eq!(r.content, b"");
    assert_eq!(r.timestamp, "2024-05-01T10:00:03Z".parse().unwrap());
    for bad in [
        &b"no timestamp"[..],
        b"2024-05-01T10:00:03Z stdin F x",
        b"2024-05-01T10:00:03Z stdout",
        b"yesterday stdout F x",
    ] {
        assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn joins_partial_records() {
    assert_eq!(
        render(LOG, &LogOptions::default()),
        "one\ntwo\nthree\nfour\n"
    );
}

#[test]
fn timestamps_are_fixed_width_once_per_line() {
    let opts = LogOptions {
        timestamps: true,
        ..Default::default()
    };
    let out = render(LOG, &opts);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "2024-05-01T10:00:01.500000000Z one");
    assert_eq!(lines[1], "2024-05-01T10:00:02.000000001Z two");
    assert_eq!(lines[2], "2024-05-01T10:00:03.000000000Z three");
}

#[test]
fn since_and_stream_filter_whole_lines() {
    let opts = LogOptions {
        since_time: Some("2024-05-01T10:00:02.5Z".parse().unwrap()),
        ..Default::default()
    };
    assert_eq!(render(LOG, &opts), "three\nfour\n");
    let opts = LogOptions {
        since_seconds: Some(2),
        ..Default::default()
    };
    assert_eq!(render(LOG, &opts), "three\nfour\n");
    let opts = LogOptions {
        stream: LogStream::Stderr,
        ..Default::default()
    };
    assert_eq!(render(LOG, &opts), "two\n");
}

#[test]
fn limit_bytes_cuts_the_output() {
    let opts = LogOptions {
        limit_bytes: Some(6),
        ..Default::default()
    };
    assert_eq!(render(LOG, &opts), "one\ntw");
    let opts = LogOptions {
        limit_bytes: Some(8),
        ..Default::default()
    };
    assert_eq!(render(LOG, &opts), "one\ntwo\n");
}

#[test]
fn tail_counts_lines_not_records() {
    let len = LOG.len() as u64;
    let from =
        |n| String::from_utf8_lossy(&LOG[tail_start(LOG, len, n).unwrap() as usize..]).into_owned();
    assert_eq!(from(0), "");
    assert!(from(1).starts_with("2024-05-01T10:00:04Z"));
    // The line split into two records is one line.
    assert!(from(2).starts_with("2024-05-01T10:00:03Z stdout P"));
    assert!(from(3).starts_with("2024-05-01T10:00:02"));
    assert_eq!(from(4), String::from_utf8_lossy(LOG));
    assert_eq!(from(100), String::from_utf8_lossy(LOG));
}

#[test]
fn tail_ignores_a_record_being_written() {
    let mut log = LOG.to_vec();
    log.extend_from_slice(b"2024-05-01T10:00:05Z stdout F fi");
    let start = tail_start(&log[..], log.len() as u64, 1).unwrap() as usize;
    assert!(log[start..].starts_with(b"2024-05-01T10:00:04Z"));
}

#[test]
fn tail_crosses_blocks() {
    let mut log = Vec::new();
    for i in 0..20_000 {
        log.extend_from_slice(format!("2024-05-01T10:00:00Z stdout F line {i}\n").as_bytes());
    }
    let start = tail_start(&log[..], log.len() as u64, 15_000).unwrap() as usize;
    assert!(log[start..].starts_with(b"2024-05-01T10:00:00Z stdout F line 5000\n"));
    assert_eq!(tail_start(&[][..], 0, 3).unwrap(), 0);
}
