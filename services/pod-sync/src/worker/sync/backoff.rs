//! The crash-loop back-off as upstream counts it, and Go's way of printing its durations.

use std::time::Duration;

/// Upstream crash-loop back-off: 10 s doubling to 5 min, forgotten after 10 min of running.
const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// A duration as Go's `time.Duration.String()` writes it (`10s`, `1m20s`, `5m0s`,
/// `1.5ms`): upstream's back-off messages print their durations so.
pub fn go_duration(d: Duration) -> String {
    fn decimal(v: u128, unit: u128) -> String {
        let (int, frac) = (v / unit, v % unit);
        if frac == 0 {
            return int.to_string();
        }
        let width = unit.ilog10() as usize;
        let frac = format!("{frac:0width$}");
        format!("{int}.{}", frac.trim_end_matches('0'))
    }
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", decimal(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", decimal(ns, 1_000_000));
    }
    let secs = ns / 1_000_000_000;
    let s = decimal(
        secs % 60 * 1_000_000_000 + ns % 1_000_000_000,
        1_000_000_000,
    );
    let (h, m) = (secs / 3600, secs / 60 % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// How long to wait before restarting a container that exited after `restarts` restarts.
pub fn crash_backoff(restarts: u32, ran_for: Duration) -> Duration {
    if restarts == 0 || ran_for >= BACKOFF_RESET {
        return Duration::ZERO;
    }
    let factor = 1u32
        .checked_shl(restarts.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    (BACKOFF_INITIAL * factor).min(BACKOFF_MAX)
}

/// The back-off base of the container that replaces one that exited after running for
/// `ran_for`: a run of 10 min or more resets the back-off, so restarts count from it.
pub fn next_backoff_base(exited_attempt: u32, exited_base: u32, ran_for: Duration) -> u32 {
    if ran_for >= BACKOFF_RESET {
        exited_attempt + 1
    } else {
        exited_base
    }
}
