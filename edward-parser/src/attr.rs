//! Tag attributes (PROTOCOL.md §2): quote-aware lexing, JSON-escaped quotes,
//! entity decoding.
//!
//! The streaming parser and [`parse_attributes`] share one byte-level lexer
//! ([`Lexer`]), so where the parser decides a tag ends and where the attribute
//! parser finds the values can never disagree.

use std::borrow::Cow;

/// The attributes of one tag, in document order.
///
/// ```
/// use edward_parser::attr::parse_attributes;
///
/// let attrs = parse_attributes(r#" query="a > b" maxResults=3 />rest"#);
/// assert_eq!(attrs.get("query"), Some("a > b"));
/// assert_eq!(attrs.get("maxresults"), Some("3"));
/// assert!(attrs.self_closing());
/// assert_eq!(attrs.end(), Some(30));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    list: Vec<(String, String)>,
    self_closing: bool,
    end: Option<usize>,
}

impl Attributes {
    /// The value of the first attribute called `name` (ASCII case-insensitive),
    /// entity-decoded. A name given without a value (`<x flag>`) has the value `""`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every attribute as `(name, value)`, in document order, duplicates included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.list.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of attributes (duplicates included).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether the tag ended with `/>` (outside any quoted value).
    pub fn self_closing(&self) -> bool {
        self.self_closing
    }

    /// Byte offset just past the tag's closing `>` in the parsed input, or
    /// `None` if the input ended before the tag did.
    pub fn end(&self) -> Option<usize> {
        self.end
    }
}

/// Parse the attributes of a tag.
///
/// `input` is the text right after the tag name (`<file` has been consumed), for
/// example `` path="a.ts">`` or `` command="ls" args='["-la"]' />…``. Parsing stops
/// at the first `>` that is not inside a quoted value; whatever follows is ignored
/// ([`Attributes::end`] tells where it stopped).
///
/// Rules (PROTOCOL.md §2): `name="v"`, `name='v'`, `name=v` (unquoted ends at
/// whitespace, `/>` or `>`); whitespace around `=` is allowed; `\"` or `\'`
/// right after `=` opens a value that ends at the next quote of the same kind
/// (a backslash just before that quote is dropped); inside a value opened by a
/// plain quote, a backslash before that quote makes it part of the value (JSON
/// style, so `args="[\"a\"]"` works) and `\\` is kept as is. Values are then
/// entity-decoded with [`decode_entities`]. If the input ends inside the tag,
/// the attributes completed so far are returned.
pub fn parse_attributes(input: &str) -> Attributes {
    let mut lexer = Lexer::new();
    let mut sink = Collect::default();
    let mut attrs = Attributes::default();
    for (i, b) in input.bytes().enumerate() {
        if let Some(self_closing) = lexer.step(b, &mut sink) {
            attrs.self_closing = self_closing;
            attrs.end = Some(i + 1);
            break;
        }
    }
    attrs.list = sink.list;
    attrs
}

/// Decode the entities of PROTOCOL.md §2 in an attribute value: `&quot;`
/// `&apos;` `&lt;` `&gt;` `&amp;`, decimal `&#NN;` and hexadecimal `&#xNN;`
/// (any Unicode scalar value except NUL). Decoding is a single pass
/// (`&amp;lt;` gives `&lt;`); anything else, including unknown names and
/// invalid numbers, is left as written.
///
/// ```
/// use edward_parser::attr::decode_entities;
/// assert_eq!(decode_entities("a &lt; b &amp;&amp; &#39;c&#x27; &nope;"), "a < b && 'c' &nope;");
/// ```
pub fn decode_entities(s: &str) -> Cow<'_, str> {
    let Some(first) = memchr::memchr(b'&', s.as_bytes()) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len());
    out.push_str(s.get(..first).unwrap_or(""));
    let mut rest = s.get(first..).unwrap_or("");
    while let Some(amp) = memchr::memchr(b'&', rest.as_bytes()) {
        out.push_str(rest.get(..amp).unwrap_or(""));
        let tail = rest.get(amp..).unwrap_or("");
        match decode_one(tail) {
            Some((c, len)) => {
                out.push(c);
                rest = tail.get(len..).unwrap_or("");
            }
            None => {
                out.push('&');
                rest = tail.get(1..).unwrap_or("");
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Decode one entity at the start of `s` (which starts with `&`): the char and
/// the entity's length in bytes.
fn decode_one(s: &str) -> Option<(char, usize)> {
    const NAMED: [(&str, char); 5] = [
        ("&quot;", '"'),
        ("&apos;", '\''),
        ("&lt;", '<'),
        ("&gt;", '>'),
        ("&amp;", '&'),
    ];
    for (name, c) in NAMED {
        if s.starts_with(name) {
            return Some((c, name.len()));
        }
    }
    let body = s.strip_prefix("&#")?;
    let (digits_start, radix, max_digits) = match body.as_bytes().first() {
        Some(b'x' | b'X') => (1, 16, 6),
        _ => (0, 10, 7),
    };
    let digits_part = body.get(digits_start..)?;
    let n_digits = digits_part
        .bytes()
        .take_while(|b| b.is_ascii_hexdigit() && (radix == 16 || b.is_ascii_digit()))
        .count();
    if n_digits == 0 || n_digits > max_digits {
        return None;
    }
    if digits_part.as_bytes().get(n_digits) != Some(&b';') {
        return None;
    }
    let value = u32::from_str_radix(digits_part.get(..n_digits)?, radix).ok()?;
    let c = char::from_u32(value).filter(|&c| c != '\0')?;
    Some((c, 2 + digits_start + n_digits + 1))
}

/// Receives what the [`Lexer`] recognises. The tag-end scanner uses a sink
/// that ignores everything; [`parse_attributes`] collects.
pub(crate) trait Sink {
    fn name_start(&mut self) {}
    fn name_byte(&mut self, _b: u8) {}
    /// The current attribute has no value (`<x flag>`).
    fn no_value(&mut self) {}
    fn value_start(&mut self) {}
    fn value_byte(&mut self, _b: u8) {}
    /// The value ended; `strip_backslash` drops one trailing `\` (the escape
    /// of a closing `\"`).
    fn value_end(&mut self, _strip_backslash: bool) {}
}

/// A sink that ignores everything: used to find where a tag ends.
pub(crate) struct Ignore;

impl Sink for Ignore {}

#[derive(Default)]
struct Collect {
    list: Vec<(String, String)>,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Collect {
    fn finish(&mut self, value: Option<Vec<u8>>) {
        let name = bytes_to_string(std::mem::take(&mut self.name));
        let value = match value {
            Some(v) => decode_entities(&bytes_to_string(v)).into_owned(),
            None => String::new(),
        };
        self.list.push((name, value));
    }
}

fn bytes_to_string(v: Vec<u8>) -> String {
    // The lexer only splits at ASCII bytes, so this is valid UTF-8 whenever the
    // input was; fall back to lossy conversion rather than fail.
    String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Sink for Collect {
    fn name_start(&mut self) {
        self.name.clear();
    }
    fn name_byte(&mut self, b: u8) {
        self.name.push(b);
    }
    fn no_value(&mut self) {
        self.finish(None);
    }
    fn value_start(&mut self) {
        self.value.clear();
    }
    fn value_byte(&mut self, b: u8) {
        self.value.push(b);
    }
    fn value_end(&mut self, strip_backslash: bool) {
        let mut v = std::mem::take(&mut self.value);
        if strip_backslash && v.last() == Some(&b'\\') {
            v.pop();
        }
        self.finish(Some(v));
    }
}

/// The byte-level state machine of a tag's attribute section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lexer {
    /// Between attributes; `slash` when the last non-space byte was `/`.
    Gap {
        slash: bool,
    },
    Name,
    AfterName,
    AfterEq,
    AfterEqBackslash,
    /// Inside a quoted value; `escaped_open` when it was opened by `\"`/`\'`.
    Quoted {
        quote: u8,
        escaped_open: bool,
    },
    QuotedBackslash {
        quote: u8,
    },
    Unquoted,
    UnquotedSlash,
}

pub(crate) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')
}

impl Lexer {
    /// A lexer right after the tag name.
    pub(crate) fn new() -> Self {
        Lexer::Gap { slash: false }
    }

    /// A lexer right after a tag name that was followed by `/`.
    pub(crate) fn after_slash() -> Self {
        Lexer::Gap { slash: true }
    }

    /// Feed one byte. Returns `Some(self_closing)` when this byte is the `>`
    /// that ends the tag.
    pub(crate) fn step<S: Sink>(&mut self, b: u8, sink: &mut S) -> Option<bool> {
        // A few states hand the byte on to another state ("reprocess"); the
        // loop runs at most twice.
        loop {
            match *self {
                Lexer::Gap { slash } => {
                    if is_space(b) {
                        return None;
                    }
                    match b {
                        b'>' => return Some(slash),
                        b'/' => *self = Lexer::Gap { slash: true },
                        _ => {
                            sink.name_start();
                            sink.name_byte(b);
                            *self = Lexer::Name;
                        }
                    }
                    return None;
                }
                Lexer::Name => {
                    if is_space(b) {
                        *self = Lexer::AfterName;
                        return None;
                    }
                    match b {
                        b'=' => *self = Lexer::AfterEq,
                        b'>' => {
                            sink.no_value();
                            return Some(false);
                        }
                        b'/' => {
                            sink.no_value();
                            *self = Lexer::Gap { slash: true };
                        }
                        _ => sink.name_byte(b),
                    }
                    return None;
                }
                Lexer::AfterName => {
                    if is_space(b) {
                        return None;
                    }
                    match b {
                        b'=' => *self = Lexer::AfterEq,
                        b'>' => {
                            sink.no_value();
                            return Some(false);
                        }
                        b'/' => {
                            sink.no_value();
                            *self = Lexer::Gap { slash: true };
                        }
                        _ => {
                            sink.no_value();
                            sink.name_start();
                            sink.name_byte(b);
                            *self = Lexer::Name;
                        }
                    }
                    return None;
                }
                Lexer::AfterEq => {
                    if is_space(b) {
                        return None;
                    }
                    match b {
                        b'"' | b'\'' => {
                            sink.value_start();
                            *self = Lexer::Quoted {
                                quote: b,
                                escaped_open: false,
                            };
                        }
                        b'\\' => *self = Lexer::AfterEqBackslash,
                        b'>' => {
                            sink.value_start();
                            sink.value_end(false);
                            return Some(false);
                        }
                        b'/' => {
                            sink.value_start();
                            *self = Lexer::UnquotedSlash;
                        }
                        _ => {
                            sink.value_start();
                            sink.value_byte(b);
                            *self = Lexer::Unquoted;
                        }
                    }
                    return None;
                }
                Lexer::AfterEqBackslash => {
                    sink.value_start();
                    if b == b'"' || b == b'\'' {
                        *self = Lexer::Quoted {
                            quote: b,
                            escaped_open: true,
                        };
                        return None;
                    }
                    sink.value_byte(b'\\');
                    *self = Lexer::Unquoted;
                    // reprocess `b` as part of an unquoted value
                }
                Lexer::Quoted {
                    quote,
                    escaped_open: false,
                } => {
                    if b == quote {
                        sink.value_end(false);
                        *self = Lexer::Gap { slash: false };
                    } else if b == b'\\' {
                        *self = Lexer::QuotedBackslash { quote };
                    } else {
                        sink.value_byte(b);
                    }
                    return None;
                }
                Lexer::QuotedBackslash { quote } => {
                    *self = Lexer::Quoted {
                        quote,
                        escaped_open: false,
                    };
                    if b == quote {
                        sink.value_byte(quote);
                        return None;
                    }
                    sink.value_byte(b'\\');
                    if b == b'\\' {
                        sink.value_byte(b'\\');
                        return None;
                    }
                    // reprocess `b` inside the quoted value
                }
                Lexer::Quoted {
                    quote,
                    escaped_open: true,
                } => {
                    if b == quote {
                        sink.value_end(true);
                        *self = Lexer::Gap { slash: false };
                    } else {
                        sink.value_byte(b);
                    }
                    return None;
                }
                Lexer::Unquoted => {
                    if is_space(b) {
                        sink.value_end(false);
                        *self = Lexer::Gap { slash: false };
                        return None;
                    }
                    match b {
                        b'>' => {
                            sink.value_end(false);
                            return Some(false);
                        }
                        b'/' => *self = Lexer::UnquotedSlash,
                        _ => sink.value_byte(b),
                    }
                    return None;
                }
                Lexer::UnquotedSlash => {
                    if b == b'>' {
                        sink.value_end(false);
                        return Some(true);
                    }
                    sink.value_byte(b'/');
                    *self = Lexer::Unquoted;
                    // reprocess `b` as part of the unquoted value
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(s: &str) -> Vec<(String, String)> {
        parse_attributes(s)
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn quoting_styles() {
        assert_eq!(
            attrs(r#" a="1" b='2' c=3 d = "4" e>"#),
            pairs(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "")])
        );
    }

    #[test]
    fn gt_inside_quotes_does_not_end_the_tag() {
        let a = parse_attributes(r#" query="a > b" x='>'>tail"#);
        assert_eq!(a.get("query"), Some("a > b"));
        assert_eq!(a.get("x"), Some(">"));
        assert_eq!(a.end(), Some(21));
        assert!(!a.self_closing());
    }

    #[test]
    fn json_escaped_quotes() {
        let a = parse_attributes(r#" path=\"src/a.ts\" other=\'x y\'>"#);
        assert_eq!(a.get("path"), Some("src/a.ts"));
        assert_eq!(a.get("other"), Some("x y"));
        let a = parse_attributes(r#" args="[\"run\", \"build\"]" />"#);
        assert_eq!(a.get("args"), Some(r#"["run", "build"]"#));
        assert!(a.self_closing());
        let a = parse_attributes(r#" p="a\\" q=1>"#);
        assert_eq!(a.get("p"), Some(r"a\\"));
        assert_eq!(a.get("q"), Some("1"));
        // an escaped-open value may also end at a plain quote
        let a = parse_attributes(r#" path=\"x.ts">"#);
        assert_eq!(a.get("path"), Some("x.ts"));
    }

    #[test]
    fn unquoted_values_end_at_space_slash_gt() {
        let a = parse_attributes(" path=src/a.ts/>");
        assert_eq!(a.get("path"), Some("src/a.ts"));
        assert!(a.self_closing());
        let a = parse_attributes(" path=src/a.ts>");
        assert_eq!(a.get("path"), Some("src/a.ts"));
        assert!(!a.self_closing());
        let a = parse_attributes(r" path=\x y=2>");
        assert_eq!(a.get("path"), Some(r"\x"));
        assert_eq!(a.get("y"), Some("2"));
        let a = parse_attributes(" v=/>");
        assert_eq!(a.get("v"), Some(""));
        assert!(a.self_closing());
    }

    #[test]
    fn names_are_whole_and_case_insensitive_first_wins() {
        let a = parse_attributes(r#" filepath="no" PATH="yes" path="later">"#);
        assert_eq!(a.get("path"), Some("yes"));
        assert_eq!(a.get("filepath"), Some("no"));
        assert_eq!(a.get("file"), None);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn entities_in_values_are_decoded_once() {
        let a = parse_attributes(r#" q="&quot;x&quot; &amp;lt; &#60;&#x3E;">"#);
        assert_eq!(a.get("q"), Some("\"x\" &lt; <>"));
    }

    #[test]
    fn self_closing_forms() {
        assert!(parse_attributes("/>").self_closing());
        assert!(parse_attributes(" / >").self_closing());
        assert!(!parse_attributes(" >").self_closing());
        assert!(parse_attributes(r#" a="/"/>"#).self_closing());
        assert!(!parse_attributes(r#" a="/>">"#).self_closing());
    }

    #[test]
    fn incomplete_input_has_no_end() {
        let a = parse_attributes(r#" a="1" b="unterminated >"#);
        assert_eq!(a.end(), None);
        assert_eq!(a.get("a"), Some("1"));
        assert_eq!(a.get("b"), None);
    }

    #[test]
    fn entity_decoding() {
        assert_eq!(decode_entities("plain"), "plain");
        assert_eq!(decode_entities("&apos;&#39;&#X41;&#x1F600;"), "''A😀");
        assert_eq!(
            decode_entities("&#0; &#xD800; &#99999999; &#; &#x; &amp"),
            "&#0; &#xD800; &#99999999; &#; &#x; &amp"
        );
        assert_eq!(decode_entities("&&amp;&"), "&&&");
        assert_eq!(decode_entities("é&lt;ü"), "é<ü");
    }
}
