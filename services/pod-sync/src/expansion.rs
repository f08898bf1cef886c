//! `$(VAR)` expansion in command, args and env values (upstream `third_party/forked/golang/expansion`):
//! `$(NAME)` becomes the variable's value when defined and stays as written otherwise;
//! `$$` escapes a `$`.

use std::collections::HashMap;

pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
