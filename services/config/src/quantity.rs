//! Kubernetes resource quantities ("100m", "0.5", "128Mi", "1G", "1e3") as numbers.

/// CPU in millicores, rounded up as upstream does (`MilliValue`).
pub fn cpu_millis(q: &str) -> Option<i64> {
    let value = parse(q)?;
    Some((value * 1000.0).ceil() as i64)
}

/// Memory (or any count) in whole units, rounded up.
pub fn bytes(q: &str) -> Option<i64> {
    Some(parse(q)?.ceil() as i64)
}

fn parse(q: &str) -> Option<f64> {
    let q = q.trim();
    if q.is_empty() {
        return None;
    }
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = num * mult;
    (v >= 0.0).then_some(v)
}

/// A size in bytes for a config field (`containerLogMaxSize: 10Mi`), with the reason when
/// it is not one.
pub fn parse_bytes(q: &str) -> Result<u64, String> {
    bytes(q)
        .map(|b| b as u64)
        .ok_or_else(|| format!("{q:?} is not a quantity (such as 10Mi)"))
}
