//! The two bits of JSON the parser needs without serde: reading a `command`'s
//! `args` (a JSON array of strings) and writing events (§7).

/// Parse `s` as a JSON array of strings (strict JSON: escapes `\" \\ \/ \b \f
/// \n \r \t \uXXXX` with surrogate pairs; no raw control characters; no
/// trailing comma; surrounding whitespace allowed). `None` if it is anything else.
///
/// ```
/// use edward_parser::json::parse_string_array;
/// assert_eq!(parse_string_array(r#" ["run", "a\"b\u00e9"] "#), Some(vec!["run".to_string(), "a\"bé".to_string()]));
/// assert_eq!(parse_string_array(r#"["a", 1]"#), None);
/// assert_eq!(parse_string_array("run build"), None);
/// ```
pub fn parse_string_array(s: &str) -> Option<Vec<String>> {
    let mut r = Reader {
        s: s.as_bytes(),
        pos: 0,
    };
    r.ws();
    r.expect(b'[')?;
    r.ws();
    let mut items = Vec::new();
    if r.peek() == Some(b']') {
        r.pos += 1;
    } else {
        loop {
            r.ws();
            items.push(r.string()?);
            r.ws();
            match r.next()? {
                b',' => continue,
                b']' => break,
                _ => return None,
            }
        }
    }
    r.ws();
    if r.pos == r.s.len() {
        Some(items)
    } else {
        None
    }
}

struct Reader<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }
    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }
    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }
    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.pos..self.pos + 4)?;
        let text = std::str::from_utf8(digits).ok()?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos += 4;
        u32::from_str_radix(text, 16).ok()
    }
    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let b = self.next()?;
            match b {
                b'"' => break,
                b'\\' => {
                    let c = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            if (0xD800..0xDC00).contains(&hi) {
                                self.expect(b'\\')?;
                                self.expect(b'u')?;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)?
                            }
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0x00..=0x1f => return None,
                _ => out.push(b),
            }
        }
        String::from_utf8(out).ok()
    }
}

/// Append `s` to `out` as a JSON string literal, escaped exactly as
/// `serde_json` does: `"` `\` and control characters below U+0020 are escaped
/// (`\b \t \n \f \r` short forms, others `\u00XX` in lower-case hex);
/// everything else, including non-ASCII, is copied as UTF-8.
pub fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(s.get(start..i).unwrap_or(""));
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(s.get(start..).unwrap_or(""));
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Option<Vec<String>> {
        Some(items.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn arrays() {
        assert_eq!(parse_string_array("[]"), v(&[]));
        assert_eq!(parse_string_array(" [ ] "), v(&[]));
        assert_eq!(parse_string_array(r#"["-la"]"#), v(&["-la"]));
        assert_eq!(
            parse_string_array("[\"a\" ,\n \"b\\n\\t\\/\\\\\"]"),
            v(&["a", "b\n\t/\\"])
        );
        assert_eq!(parse_string_array(r#"["\ud83d\ude00"]"#), v(&["😀"]));
        assert_eq!(parse_string_array(r#"["é😀"]"#), v(&["é😀"]));
    }

    #[test]
    fn not_arrays_of_strings() {
        for bad in [
            "",
            "[",
            "]",
            "[\"a\",]",
            "[,]",
            "[\"a\"] x",
            "[1]",
            "[null]",
            "[[\"a\"]]",
            "{\"a\":1}",
            "\"a\"",
            "['a']",
            "[\"a\nb\"]",
            r#"["\x"]"#,
            r#"["\ud83d"]"#,
            r#"["\ude00"]"#,
            r#"["\u12"]"#,
            r#"["unterminated]"#,
        ] {
            assert_eq!(parse_string_array(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn escaping() {
        let mut s = String::new();
        write_json_string(&mut s, "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f}é😀");
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f}é😀\"");
    }
}
