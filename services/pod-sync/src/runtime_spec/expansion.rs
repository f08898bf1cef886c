//! `$(VAR)` expansion in command, args and env values (upstream `third_party/forked/golang/expansion`):
//! `$(NAME)` becomes the variable's value when defined and stays as written otherwise;
//! `$$` escapes a `$`.
//!
//! Expansion is bounded: each value refers to the ones before it, so a chain of doubling
//! references (`B=$(A)$(A)`, `C=$(B)$(B)`, ...) grows as 2^n. The kernel would refuse such an
//! environment at exec anyway (E2BIG), so the limits are the kernel's: one argument or
//! `NAME=value` string at most `MAX_ARG_STRLEN` (32 pages, 128 KiB), and everything a
//! container's argv or environment expands to at most `ARG_MAX` under the default 8 MiB stack
//! rlimit (a quarter of it, 2 MiB). Expansion stops as soon as a limit is passed, so neither
//! time nor memory grows with the chain.

use std::collections::HashMap;

/// The largest expanded string: the kernel's `MAX_ARG_STRLEN` (32 * 4 KiB pages).
pub const MAX_VALUE_BYTES: usize = 32 * 4096;

/// The most that all of one container's expanded env values (or its command and args)
/// may add up to: `ARG_MAX` with the default 8 MiB stack limit.
pub const MAX_TOTAL_BYTES: usize = 2 << 20;

/// How much expansion output is left for one container's env, or its command and args.
#[derive(Debug)]
pub struct Budget {
    left: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            left: MAX_TOTAL_BYTES,
        }
    }
}

impl Budget {
    /// Expands `input`; an error names `what` (e.g. `env "B"`) and the limit it passed.
    pub fn expand(
        &mut self,
        what: &str,
        input: &str,
        vars: &HashMap<String, String>,
    ) -> Result<String, String> {
        let limit = MAX_VALUE_BYTES.min(self.left);
        match expand_within(input, vars, limit) {
            Some(out) => {
                self.left -= out.len();
                Ok(out)
            }
            None if limit < MAX_VALUE_BYTES => Err(format!(
                "{what}: $(VAR) expansion exceeds {MAX_TOTAL_BYTES} bytes in total for the \
                 container (the kernel's ARG_MAX)"
            )),
            None => Err(format!(
                "{what}: $(VAR) expansion exceeds {MAX_VALUE_BYTES} bytes (the kernel's \
                 MAX_ARG_STRLEN)"
            )),
        }
    }
}

/// The expansion of `input`, or `None` as soon as it would pass `limit` bytes.
fn expand_within(input: &str, vars: &HashMap<String, String>, limit: usize) -> Option<String> {
    let mut out = String::with_capacity(input.len().min(limit));
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let (piece, used) = next_piece(input, i, vars);
        if out.len() + piece.len() > limit {
            return None;
        }
        out.push_str(piece);
        i += used;
    }
    Some(out)
}

/// The text that the input at `i` expands to, and how many input bytes it consumed.
fn next_piece<'a>(input: &'a str, i: usize, vars: &'a HashMap<String, String>) -> (&'a str, usize) {
    let bytes = input.as_bytes();
    if bytes[i] == b'$' && i + 1 < bytes.len() {
        match bytes[i + 1] {
            b'$' => return ("$", 2),
            b'(' => {
                if let Some(end) = input[i + 2..].find(')') {
                    let name = &input[i + 2..i + 2 + end];
                    let piece = match vars.get(name) {
                        Some(v) => v.as_str(),
                        None => &input[i..i + 3 + end],
                    };
                    return (piece, 3 + end);
                }
            }
            _ => {}
        }
    }
    let len = input[i..].chars().next().map_or(1, char::len_utf8);
    (&input[i..i + len], len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn expand(input: &str, vars: &HashMap<String, String>) -> String {
        Budget::default().expand("test", input, vars).unwrap()
    }

    #[test]
    fn expands_like_upstream() {
        let vars = HashMap::from([
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "x y".to_string()),
        ]);
        assert_eq!(expand("$(A)-$(B)", &vars), "1-x y");
        assert_eq!(expand("$(MISSING)", &vars), "$(MISSING)");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("cost $5 $(A", &vars), "cost $5 $(A");
        assert_eq!(expand("é$(A)", &vars), "é1");
        assert_eq!(expand("trailing $", &vars), "trailing $");
    }

    /// Expands a chain `V0=xx..`, `Vn=$(Vn-1)$(Vn-1)` as container_env does.
    fn doubling_chain(depth: usize) -> Result<(), String> {
        let mut vars = HashMap::new();
        let mut budget = Budget::default();
        vars.insert("V0".to_string(), "x".repeat(64));
        for n in 1..=depth {
            let value = format!("$(V{})$(V{})", n - 1, n - 1);
            let name = format!("V{n}");
            let out = budget.expand(&format!("env {name:?}"), &value, &vars)?;
            vars.insert(name, out);
        }
        Ok(())
    }

    #[test]
    fn a_doubling_chain_is_refused_quickly_naming_the_variable() {
        let start = Instant::now();
        let err = doubling_chain(30).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // 64 * 2^n passes 128 KiB at n = 12.
        assert!(err.starts_with("env \"V12\""), "{err}");
        assert!(err.contains("131072 bytes"), "{err}");
    }

    #[test]
    fn many_values_under_the_per_value_limit_hit_the_total() {
        let vars = HashMap::from([("BIG".to_string(), "y".repeat(100 << 10))]);
        let mut budget = Budget::default();
        let mut err = None;
        for n in 0..100 {
            if let Err(e) = budget.expand(&format!("env \"E{n}\""), "$(BIG)", &vars) {
                err = Some((n, e));
                break;
            }
        }
        let (n, err) = err.expect("the total limit applies");
        assert_eq!(n, MAX_TOTAL_BYTES / (100 << 10));
        assert!(err.contains("ARG_MAX"), "{err}");
    }
}
