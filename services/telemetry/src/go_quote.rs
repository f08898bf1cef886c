//! Go's `strconv.Quote`, which upstream uses where a value is shown quoted: klog's text
//! lines and the downward API's `FormatMap`.

/// Go's `strconv.Quote`: `"` and `\` escaped, printable characters kept, `\a \b \f \n \r
/// \t \v`, other ASCII controls as `\xNN`, other non-printable characters as `\uNNNN` or
/// `\UNNNNNNNN`. "Printable" follows Go's `unicode.IsPrint` for controls, spaces other than
/// U+0020, format characters, private use and noncharacters; code points unassigned in
/// Unicode are kept as they are (Go escapes them; std has no category tables).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c < ' ' || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn is_go_printable(c: char) -> bool {
    let u = c as u32;
    let format_char = matches!(
        u,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    );
    let private_use = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let noncharacter = matches!(u, 0xFDD0..=0xFDEF) || u & 0xFFFE == 0xFFFE;
    !(c.is_control()
        || (c.is_whitespace() && c != ' ')
        || format_char
        || private_use
        || noncharacter)
}

#[cfg(test)]
mod tests {
    use super::go_quote;

    #[test]
    fn values_are_quoted_as_go_does() {
        assert_eq!(go_quote(""), "\"\"");
        assert_eq!(go_quote("plain text ok"), "\"plain text ok\"");
        assert_eq!(
            go_quote("\u{7}\u{8}\u{c}\n\r\t\u{b}\u{0}\u{1b}\u{7f}"),
            "\"\\a\\b\\f\\n\\r\\t\\v\\x00\\x1b\\x7f\""
        );
        assert_eq!(
            go_quote("\u{85}\u{200b}\u{feff}\u{3000}"),
            "\"\\u0085\\u200b\\ufeff\\u3000\""
        );
        assert_eq!(go_quote("日本語 ✓ 😀"), "\"日本語 ✓ 😀\"");
        assert_eq!(
            go_quote("\u{f0000}\u{10ffff}"),
            "\"\\U000f0000\\U0010ffff\""
        );
    }
}
