//! File content shaping (PROTOCOL.md §3): drop one newline after the opening
//! tag, drop a code-fence pair, change nothing else. Chunk-invariant by
//! construction: every stage accepts its input split anywhere.

use crate::EventRef;

/// Longest opening fence line (```` ``` ```` + language word + line end), in bytes.
pub const MAX_FENCE_LINE: usize = 64;
/// How much content after an opening fence line is held back to decide, in
/// order, whether a closing fence follows (see docs/PROTOCOL.md, Decisions).
pub const FENCE_WINDOW: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing seen since the opening tag.
    Start,
    /// Saw a `\r` right after the opening tag.
    StartCr,
    /// Collecting the first line in `buf` while it may be an opening fence.
    FirstLine(FenceLine),
    /// Opening fence in `fence_line`; content after it is held in `buf`.
    Fenced,
    /// Content after the fence exceeded [`FENCE_WINDOW`]: stream it, holding
    /// only a possible closing fence (`tail`); `fence_line` waits for the end.
    Committed,
    /// No fence: content passes straight through.
    Plain,
}

/// Matcher for ```` ```[ \t]*word?[ \t]*\r?\n ````.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FenceLine {
    Ticks(u8),
    Space,
    Word,
    TrailingSpace,
    Cr,
}

enum FenceStep {
    More(FenceLine),
    Done,
    Fail,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'#' | b'.' | b'-')
}

impl FenceLine {
    fn step(self, b: u8) -> FenceStep {
        use FenceLine::*;
        use FenceStep::*;
        match (self, b) {
            (Ticks(n), b'`') if n < 3 => More(Ticks(n + 1)),
            (Ticks(n), _) if n < 3 => Fail,
            (Ticks(_) | Space, b' ' | b'\t') => More(Space),
            (Ticks(_) | Space | Word, b) if is_word_byte(b) => More(Word),
            (Word | TrailingSpace, b' ' | b'\t') => More(TrailingSpace),
            (Ticks(_) | Space | Word | TrailingSpace, b'\r') => More(Cr),
            (Ticks(_) | Space | Word | TrailingSpace | Cr, b'\n') => Done,
            _ => Fail,
        }
    }
}

/// Where a possible closing fence starts in `s`: the start of its last line,
/// if that line is a prefix of ```` ```\r\n ```` / ```` ```\n ````. Returns
/// `s.len()` when nothing needs holding. `at_line_start`: whether `s` itself
/// starts at the beginning of a line.
fn fence_tail_start(s: &str, at_line_start: bool) -> usize {
    let bytes = s.as_bytes();
    let search_end = if bytes.last() == Some(&b'\n') {
        bytes.len() - 1
    } else {
        bytes.len()
    };
    let line_start = match memchr::memrchr(b'\n', bytes.get(..search_end).unwrap_or(&[])) {
        Some(i) => i + 1,
        None if at_line_start => 0,
        None => return bytes.len(),
    };
    let candidate = bytes.get(line_start..).unwrap_or(&[]);
    if !candidate.is_empty() && is_fence_tail_prefix(candidate) {
        line_start
    } else {
        bytes.len()
    }
}

fn is_fence_tail_prefix(c: &[u8]) -> bool {
    matches!(c, b"`" | b"``" | b"```" | b"```\r" | b"```\n" | b"```\r\n")
}

fn is_closing_fence(c: &[u8]) -> bool {
    matches!(c, b"```" | b"```\r" | b"```\n" | b"```\r\n")
}

/// The content shaper of one file.
#[derive(Debug, Clone)]
pub(crate) struct FileFilter {
    stage: Stage,
    buf: String,
    fence_line: String,
    tail: String,
    /// `Committed` with an empty `tail`: whether the next byte starts a line.
    line_start: bool,
}

impl Default for FileFilter {
    fn default() -> Self {
        FileFilter {
            stage: Stage::Start,
            buf: String::new(),
            fence_line: String::new(),
            tail: String::new(),
            line_start: false,
        }
    }
}

#[inline]
fn emit(out: &mut impl FnMut(EventRef<'_>), s: &str) {
    if !s.is_empty() {
        out(EventRef::FileContent { content: s });
    }
}

impl FileFilter {
    /// Whether content now passes straight through (no fence, nothing held).
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.stage == Stage::Plain
    }

    /// Whether content after an opening fence is being held (in the window).
    #[inline]
    pub(crate) fn is_holding(&self) -> bool {
        self.stage == Stage::Fenced
    }

    /// Whether [`FileFilter::hold`] can take `len` more bytes: content after an
    /// opening fence, inside the window.
    #[inline]
    pub(crate) fn can_hold(&self, len: usize) -> bool {
        self.stage == Stage::Fenced && self.buf.len() + len <= FENCE_WINDOW
    }

    /// [`FileFilter::push`] when [`FileFilter::can_hold`] said yes.
    #[inline]
    pub(crate) fn hold(&mut self, s: &str) {
        self.buf.push_str(s);
    }

    /// Bytes currently held back.
    pub(crate) fn buffered_len(&self) -> usize {
        let cr = usize::from(self.stage == Stage::StartCr);
        self.buf.len() + self.fence_line.len() + self.tail.len() + cr
    }

    /// Start a new file.
    pub(crate) fn reset(&mut self) {
        self.stage = Stage::Start;
        self.buf.clear();
        self.fence_line.clear();
        self.tail.clear();
        self.line_start = false;
    }

    /// More content of the current file.
    pub(crate) fn push(&mut self, mut s: &str, out: &mut impl FnMut(EventRef<'_>)) {
        while !s.is_empty() {
            match self.stage {
                Stage::Start => {
                    if let Some(rest) = s.strip_prefix('\n') {
                        s = rest;
                        self.stage = Stage::FirstLine(FenceLine::Ticks(0));
                    } else if let Some(rest) = s.strip_prefix('\r') {
                        s = rest;
                        self.stage = Stage::StartCr;
                    } else {
                        self.stage = Stage::FirstLine(FenceLine::Ticks(0));
                    }
                }
                Stage::StartCr => {
                    if let Some(rest) = s.strip_prefix('\n') {
                        s = rest;
                        self.stage = Stage::FirstLine(FenceLine::Ticks(0));
                    } else {
                        // A lone `\r` is not a newline: it is content, and a
                        // first line starting with it is no fence.
                        emit(out, "\r");
                        self.stage = Stage::Plain;
                    }
                }
                Stage::FirstLine(mut m) => {
                    // (accepted bytes, Some(is_fence) once decided)
                    let mut verdict = None;
                    for (i, b) in s.bytes().enumerate() {
                        if self.buf.len() + i + 1 > MAX_FENCE_LINE {
                            verdict = Some((i, false));
                            break;
                        }
                        match m.step(b) {
                            FenceStep::More(next) => m = next,
                            FenceStep::Done => {
                                verdict = Some((i + 1, true));
                                break;
                            }
                            FenceStep::Fail => {
                                verdict = Some((i, false));
                                break;
                            }
                        }
                    }
                    match verdict {
                        None => {
                            // All of `s` may still be part of a fence line
                            // (the matcher accepts only ASCII).
                            self.buf.push_str(s);
                            self.stage = Stage::FirstLine(m);
                            s = "";
                        }
                        Some((end, true)) => {
                            // copied, not taken: `buf` keeps its capacity for the window
                            self.fence_line.clear();
                            self.fence_line.push_str(&self.buf);
                            self.buf.clear();
                            self.fence_line.push_str(s.get(..end).unwrap_or(""));
                            self.stage = Stage::Fenced;
                            s = s.get(end..).unwrap_or("");
                        }
                        Some((_, false)) => {
                            // Not a fence: what was held goes out, then all
                            // of `s` (Plain) in order.
                            emit(out, &self.buf);
                            self.buf.clear();
                            self.stage = Stage::Plain;
                        }
                    }
                }
                Stage::Fenced => {
                    if self.buf.len() + s.len() <= FENCE_WINDOW {
                        self.buf.push_str(s);
                        s = "";
                    } else {
                        self.stage = Stage::Committed;
                        self.line_start = true;
                        let held = std::mem::take(&mut self.buf);
                        self.push_committed(&held, out);
                        self.buf = held;
                        self.buf.clear();
                        self.push_committed(s, out);
                        s = "";
                    }
                }
                Stage::Committed => {
                    self.push_committed(s, out);
                    s = "";
                }
                Stage::Plain => {
                    emit(out, s);
                    s = "";
                }
            }
        }
    }

    fn push_committed(&mut self, s: &str, out: &mut impl FnMut(EventRef<'_>)) {
        if s.is_empty() {
            return;
        }
        if self.tail.is_empty() {
            let hold = fence_tail_start(s, self.line_start);
            emit(out, s.get(..hold).unwrap_or(""));
            self.tail.push_str(s.get(hold..).unwrap_or(""));
            if self.tail.is_empty() {
                self.line_start = s.ends_with('\n');
            }
        } else {
            let mut combined = std::mem::take(&mut self.tail);
            combined.push_str(s);
            let hold = fence_tail_start(&combined, true);
            emit(out, combined.get(..hold).unwrap_or(""));
            self.tail.push_str(combined.get(hold..).unwrap_or(""));
            if self.tail.is_empty() {
                self.line_start = combined.ends_with('\n');
            }
        }
    }

    /// The file ended (by its closer, an implicit close or the end of the stream).
    pub(crate) fn finish(&mut self, out: &mut impl FnMut(EventRef<'_>)) {
        match self.stage {
            Stage::Start | Stage::Plain => {}
            Stage::StartCr => emit(out, "\r"),
            Stage::FirstLine(_) => emit(out, &self.buf),
            Stage::Fenced => {
                let at = fence_tail_start(&self.buf, true);
                let closing = self.buf.as_bytes().get(at..).unwrap_or(&[]);
                if is_closing_fence(closing) {
                    emit(out, self.buf.get(..at).unwrap_or(""));
                } else {
                    let mut all = std::mem::take(&mut self.fence_line);
                    all.push_str(&self.buf);
                    emit(out, &all);
                }
            }
            Stage::Committed => {
                if !is_closing_fence(self.tail.as_bytes()) {
                    // No closing fence after all: nothing is lost, but the
                    // opening fence line can only come last (Decisions, D7).
                    emit(out, &self.tail);
                    emit(out, &self.fence_line);
                }
            }
        }
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pieces: &[&str]) -> String {
        let mut f = FileFilter::default();
        let mut out = String::new();
        let mut sink = |e: EventRef<'_>| match e {
            EventRef::FileContent { content } => out.push_str(content),
            _ => out.push('?'),
        };
        for p in pieces {
            f.push(p, &mut sink);
        }
        f.finish(&mut sink);
        out
    }

    /// Every way of cutting `s` in up to three pieces gives `expected`.
    fn check(s: &str, expected: &str) {
        let idx: Vec<usize> = (0..=s.len()).filter(|&i| s.is_char_boundary(i)).collect();
        for &a in &idx {
            for &b in idx.iter().filter(|&&b| b >= a) {
                let got = shape(&[&s[..a], &s[a..b], &s[b..]]);
                assert_eq!(got, expected, "input {s:?} cut at {a},{b}");
            }
        }
    }

    #[test]
    fn leading_newline() {
        check("\nabc\n", "abc\n");
        check("\r\nabc", "abc");
        check("\n\nabc", "\nabc");
        check("\rabc", "\rabc");
        check("\r", "\r");
        check("", "");
        check("abc", "abc");
        check("\n", "");
    }

    #[test]
    fn fences() {
        check("\n```ts\nconst a = 1;\n```\n", "const a = 1;\n");
        check("```\na\n```", "a\n");
        check("\r\n```tsx\r\na\r\n```\r\n", "a\r\n");
        check("``` c++ \nx\n```\n", "x\n");
        check("```ts\n```\n", "");
        check("```ts\n```", "");
        // not a pair
        check("```ts\nabc\n", "```ts\nabc\n");
        check("```ts\nabc\n```x\n", "```ts\nabc\n```x\n");
        check("```ts\nabc\n```\n\n", "```ts\nabc\n```\n\n");
        check("abc\n```\n", "abc\n```\n");
        check("```", "```");
        check("```\n", "```\n");
        check("````\nx\n```", "````\nx\n```");
        check("``` two words\nx\n```", "``` two words\nx\n```");
        check("``x\n", "``x\n");
        // a fence line inside the content is content
        check("```\na\n```\nb\n```\n", "a\n```\nb\n");
        check("```\n``\n```", "``\n");
    }

    #[test]
    fn long_first_line_is_not_a_fence() {
        let word = "a".repeat(MAX_FENCE_LINE);
        let s = format!("```{word}\nx\n```\n");
        assert_eq!(shape(&[&s]), s);
    }

    #[test]
    fn beyond_the_window() {
        let body = "x".repeat(FENCE_WINDOW) + "\n";
        let s = format!("\n```js\n{body}```\n");
        assert_eq!(shape(&[&s]), body);
        // split anywhere near the window edge, same result
        for cut in [
            7,
            FENCE_WINDOW,
            FENCE_WINDOW + 6,
            FENCE_WINDOW + 8,
            s.len() - 2,
        ] {
            assert_eq!(shape(&[&s[..cut], &s[cut..]]), body, "cut {cut}");
        }
        // unclosed fence beyond the window: the fence line comes last
        let s = format!("```js\n{body}");
        assert_eq!(shape(&[&s]), format!("{body}```js\n"));
        // a held tail that turns out to be content
        let s = format!("```js\n{body}``x");
        assert_eq!(
            shape(&[&s[..s.len() - 1], "x"]),
            format!("{body}``x```js\n")
        );
    }

    #[test]
    fn buffered_is_bounded() {
        let mut f = FileFilter::default();
        let mut out = |_: EventRef<'_>| {};
        f.push("```rust\n", &mut out);
        for _ in 0..1000 {
            f.push("let x = 1;\n``", &mut out);
            assert!(f.buffered_len() <= FENCE_WINDOW + MAX_FENCE_LINE);
        }
        f.finish(&mut out);
        assert_eq!(f.buffered_len(), 0);
    }
}
