//! Go-style durations ("1m0s", "20s", "500ms", "1.5h"), the form `KubeletConfiguration`
//! uses for every period and timeout.

use std::time::Duration;

/// Parses a Go duration string (`time.ParseDuration`). A bare "0" is zero.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(format!(
            "invalid duration {text:?}: must be a positive Go duration like \"20s\""
        ));
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("invalid duration {text:?}: missing unit"))?;
        if num_len == 0 {
            return Err(format!("invalid duration {text:?}"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            unit => return Err(format!("invalid duration {text:?}: unknown unit {unit:?}")),
        };
        total += value * nanos_per_unit;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Formats a duration the way Go prints it ("1m0s", "20s", "500ms").
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let secs = d.as_secs_f64();
    let hours = (secs / 3600.0).floor() as u64;
    let minutes = ((secs - hours as f64 * 3600.0) / 60.0).floor() as u64;
    let s = secs - hours as f64 * 3600.0 - minutes as f64 * 60.0;
    let s = if s.fract() == 0.0 {
        format!("{}s", s as u64)
    } else {
        format!("{s}s")
    };
    match (hours, minutes) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

/// Serde adapter for `Duration` fields written as Go durations.
pub mod serde_go {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_go_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_go_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// A number in [0, 1) from the standard library's random hash keys (fresh keys per call:
/// enough for spreading timers, not for secrets).
pub fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let n = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// Upstream's `wait.Jitter(duration, maxFactor)`: `duration` and a random part of
/// `max_factor` times it (`duration + rand.Float64() * maxFactor * duration`).
pub fn jitter(duration: Duration, max_factor: f64) -> Duration {
    duration + duration.mul_f64(random_fraction() * max_factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        assert_eq!(parse_go_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_go_duration("1m0s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_nonsense_with_the_text() {
        for bad in ["", "20", "s", "-1s", "3 days", "1x"] {
            let err = parse_go_duration(bad).unwrap_err();
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(format_go_duration(Duration::from_secs(20)), "20s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::from_secs(7260)), "2h1m0s");
    }

    /// `wait.Jitter`'s contract (apimachinery wait/jitter.go): never less than the
    /// duration, less than duration × (1 + maxFactor), and different draw to draw.
    #[test]
    fn jitter_stays_within_its_factor_and_varies() {
        let d = Duration::from_secs(10);
        let draws: Vec<Duration> = (0..200).map(|_| jitter(d, 0.5)).collect();
        assert!(
            draws.iter().all(|j| *j >= d && *j < d.mul_f64(1.5)),
            "{draws:?}"
        );
        let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(*max - *min > Duration::from_secs(3), "{min:?}..{max:?}");
    }
}
