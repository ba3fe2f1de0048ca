//! The streaming state machine (PROTOCOL.md §1, §2, §6).
//!
//! Content is found with `memchr` on `<`; a `<` is only held back while the
//! bytes after it can still become a tag that means something in the current
//! state. Content is emitted as slices of the chunk (one event per run).

use crate::attr::{self, Attributes, Lexer, is_space};
use crate::file::{FENCE_WINDOW, FileFilter, MAX_FENCE_LINE};
use crate::install::{MAX_DEPENDENCIES, parse_install_body};
use crate::json::parse_string_array;
use crate::path::normalize_path;
use crate::{ErrorCode, Event, EventRef, Severity};

/// Longest tag, from `<` to `>` inclusive, in bytes. A longer tag candidate is
/// not a tag: its bytes are content, with a `tag_too_long` error.
pub const MAX_TAG_LEN: usize = 4096;
/// Longest install body, in bytes; a longer one is closed implicitly
/// (`unclosed_install`) at this size and the rest is read in the enclosing state.
pub const MAX_INSTALL_BODY: usize = 16 * 1024;
/// The most bytes a [`Parser`] ever holds back ([`Parser::buffered_len`]): a
/// tag candidate ([`MAX_TAG_LEN`]) plus either an install body
/// ([`MAX_INSTALL_BODY`]) or, in a file that opened with a code fence, the
/// fence line and up to [`crate::file::FENCE_WINDOW`] bytes after it.
/// 20 544 bytes; it does not grow with file or stream size.
pub const MAX_BUFFERED: usize = MAX_TAG_LEN
    + if FENCE_WINDOW + MAX_FENCE_LINE > MAX_INSTALL_BODY {
        FENCE_WINDOW + MAX_FENCE_LINE
    } else {
        MAX_INSTALL_BODY
    };
/// `max_results` of a web search when absent or not a number.
pub const DEFAULT_MAX_RESULTS: u8 = 5;
/// Largest `max_results` of a web search (values are clamped to `1..=8`).
pub const MAX_MAX_RESULTS: u8 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Thinking,
    Sandbox,
    File,
    Install,
    Command,
    WebSearch,
    Done,
    UrlScrape,
}

struct Name {
    text: &'static [u8],
    tag: Tag,
    closer: bool,
}

const fn name(text: &'static [u8], tag: Tag, closer: bool) -> Name {
    Name { text, tag, closer }
}

/// Every tag name the parser knows, lower case, closers with their `/`.
/// No name is a prefix of another.
const NAMES: [Name; 15] = [
    name(b"thinking", Tag::Thinking, false),
    name(b"edward_sandbox", Tag::Sandbox, false),
    name(b"file", Tag::File, false),
    name(b"edward_install", Tag::Install, false),
    name(b"edward_command", Tag::Command, false),
    name(b"edward_web_search", Tag::WebSearch, false),
    name(b"edward_done", Tag::Done, false),
    name(b"/thinking", Tag::Thinking, true),
    name(b"/edward_sandbox", Tag::Sandbox, true),
    name(b"/file", Tag::File, true),
    name(b"/edward_install", Tag::Install, true),
    name(b"/edward_command", Tag::Command, true),
    name(b"/edward_web_search", Tag::WebSearch, true),
    name(b"/edward_done", Tag::Done, true),
    name(b"/edward_url_scrape", Tag::UrlScrape, true),
];

const O_THINKING: u16 = 1 << 0;
const O_SANDBOX: u16 = 1 << 1;
const O_FILE: u16 = 1 << 2;
const O_INSTALL: u16 = 1 << 3;
const O_COMMAND: u16 = 1 << 4;
const O_WEB_SEARCH: u16 = 1 << 5;
const O_DONE: u16 = 1 << 6;
const C_THINKING: u16 = 1 << 7;
const C_SANDBOX: u16 = 1 << 8;
const C_FILE: u16 = 1 << 9;
const C_INSTALL: u16 = 1 << 10;
/// Closers that carry no meaning and are dropped silently.
const C_DROPPED: u16 = (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14);
/// Openers that end thinking (and install) implicitly.
const ACTIONS: u16 = O_SANDBOX | O_COMMAND | O_WEB_SEARCH | O_DONE;

/// Where the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Text,
    Thinking,
    Sandbox,
    /// Inside a file with a valid path.
    File,
    /// Inside a file whose path was rejected: the body is counted, not emitted.
    SkipFile,
    Install {
        in_sandbox: bool,
    },
}

impl Mode {
    /// The tag names that mean something here (everything else is content).
    const fn tags(self) -> u16 {
        match self {
            Mode::Text => O_THINKING | O_FILE | O_INSTALL | ACTIONS | C_DROPPED,
            Mode::Thinking => C_THINKING | O_FILE | O_INSTALL | ACTIONS | C_DROPPED,
            Mode::Sandbox => O_FILE | O_INSTALL | ACTIONS | C_SANDBOX | C_DROPPED,
            Mode::File | Mode::SkipFile => C_FILE | C_SANDBOX,
            Mode::Install { in_sandbox } => {
                O_FILE | ACTIONS | C_INSTALL | C_DROPPED | if in_sandbox { C_SANDBOX } else { 0 }
            }
        }
    }
}

impl Mode {
    /// Whether only closers (`</…`) mean something here: then only `</`
    /// (or a `<` ending the chunk) needs a look.
    #[inline]
    fn closers_only(self) -> bool {
        matches!(self, Mode::File | Mode::SkipFile)
    }
}

/// Longest name in [`NAMES`].
const MAX_NAME: usize = 18;

/// `POS[k][b]`: the names whose byte `k` is `b` (ASCII case-insensitively), so
/// matching a name costs one table lookup per byte.
static POS: [[u16; 256]; MAX_NAME] = build_pos();

/// `FULL[k]`: the names that are `k` bytes long.
static FULL: [u16; MAX_NAME + 1] = build_full();

const fn build_pos() -> [[u16; 256]; MAX_NAME] {
    let mut table = [[0u16; 256]; MAX_NAME];
    let mut j = 0;
    while j < NAMES.len() {
        let text = NAMES[j].text;
        let mut k = 0;
        while k < text.len() {
            let c = text[k];
            table[k][c as usize] |= 1 << j;
            if c.is_ascii_lowercase() {
                table[k][c.to_ascii_uppercase() as usize] |= 1 << j;
            }
            k += 1;
        }
        j += 1;
    }
    table
}

const fn build_full() -> [u16; MAX_NAME + 1] {
    let mut table = [0u16; MAX_NAME + 1];
    let mut j = 0;
    while j < NAMES.len() {
        table[NAMES[j].text.len()] |= 1 << j;
        j += 1;
    }
    table
}

/// The names of `mask` whose byte `k` is `b`.
#[inline]
fn names_with(mask: u16, k: usize, b: u8) -> u16 {
    POS.get(k).map_or(0, |row| row[usize::from(b)] & mask)
}

/// Whether the bytes after a `<` (as many as are available) can still start
/// a tag from `mask`. Checks at most two bytes: a cheap filter before the
/// candidate machinery.
#[inline]
fn could_start(mask: u16, after: &[u8]) -> bool {
    match after {
        [] => true,
        [a] => names_with(mask, 0, *a) != 0,
        [a, b, ..] => names_with(names_with(mask, 0, *a), 1, *b) != 0,
    }
}

/// Length of the UTF-8 sequence that starts with `b` (0 for a continuation byte).
fn utf8_len(b: u8) -> usize {
    match b {
        0x00..=0x7f => 1,
        0x80..=0xbf => 0,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Matching the name: `k` bytes after `<` matched the names in `mask`.
    Name { mask: u16, k: u8 },
    /// After a closer's name: only whitespace and `/` until `>`.
    CloserTail,
    /// After an opener's name: attributes until an unquoted `>`.
    Body(Lexer),
}

/// A possible tag that started at a `<`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cand {
    phase: Phase,
    /// Index into [`NAMES`] once the name matched.
    entry: usize,
    /// Bytes so far, `<` included.
    len: usize,
}

enum Outcome {
    /// Every byte given belongs to the candidate; more are needed.
    Need,
    /// The tag ends just before the returned offset.
    Complete,
    /// Not a tag: the byte at the returned offset is not part of it.
    Reject,
    /// Over [`MAX_TAG_LEN`]: the byte at the returned offset does not fit.
    TooLong,
}

impl Cand {
    fn new(mask: u16) -> Self {
        Cand {
            phase: Phase::Name { mask, k: 0 },
            entry: 0,
            len: 1,
        }
    }

    /// Run the candidate over `bytes`; returns the outcome and an offset into `bytes`.
    fn advance(&mut self, bytes: &[u8]) -> (Outcome, usize) {
        for (i, &b) in bytes.iter().enumerate() {
            let char_len = utf8_len(b);
            if char_len > 0 && self.len + char_len > MAX_TAG_LEN {
                return (Outcome::TooLong, i);
            }
            match self.phase {
                Phase::Name { mask, k } => {
                    let k = usize::from(k);
                    let full_mask = mask & FULL.get(k).copied().unwrap_or(0);
                    // names are prefix-free: a full match is the only candidate
                    let full = (full_mask != 0)
                        .then(|| full_mask.trailing_zeros() as usize)
                        .and_then(|j| NAMES.get(j).map(|n| (j, n)));
                    if let Some((j, n)) = full {
                        self.entry = j;
                        if b == b'>' {
                            self.len += 1;
                            return (Outcome::Complete, i + 1);
                        }
                        if !(is_space(b) || b == b'/') {
                            return (Outcome::Reject, i);
                        }
                        self.phase = if n.closer {
                            Phase::CloserTail
                        } else if b == b'/' {
                            Phase::Body(Lexer::after_slash())
                        } else {
                            Phase::Body(Lexer::new())
                        };
                    } else {
                        let next = names_with(mask, k, b);
                        if next == 0 {
                            return (Outcome::Reject, i);
                        }
                        // names are < 255 bytes
                        self.phase = Phase::Name {
                            mask: next,
                            k: u8::try_from(k + 1).unwrap_or(u8::MAX),
                        };
                    }
                }
                Phase::CloserTail => {
                    if b == b'>' {
                        self.len += 1;
                        return (Outcome::Complete, i + 1);
                    }
                    if !(is_space(b) || b == b'/') {
                        return (Outcome::Reject, i);
                    }
                }
                Phase::Body(mut lexer) => {
                    let end = lexer.step(b, &mut attr::Ignore);
                    self.phase = Phase::Body(lexer);
                    if end.is_some() {
                        self.len += 1;
                        return (Outcome::Complete, i + 1);
                    }
                }
            }
            self.len += 1;
        }
        (Outcome::Need, bytes.len())
    }
}

/// Chunks shorter than this may take the fast path of [`Parser::feed_with`].
const FAST_CHUNK: usize = 128;

/// What the fast path does with a short chunk that holds no possible tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fast {
    /// No fast path (a candidate is pending, or the state needs the general path).
    General,
    /// `text` outside any scope.
    Text,
    /// `text` in a sandbox, between files.
    SandboxText,
    /// `thinking_content`.
    Thinking,
    /// `file_content`, passed straight through.
    File,
    /// File content held in the fence window.
    FileHold,
}

/// The first `<` in `hay`. Small chunks (a token or two, as models stream)
/// are scanned directly: cheaper than memchr's setup.
#[inline]
fn find_lt(hay: &[u8]) -> Option<usize> {
    if hay.len() >= 32 {
        return memchr::memchr(b'<', hay);
    }
    // SWAR: eight bytes at a time; a zero byte of `word ^ LT` is a `<`. The
    // lowest flagged byte is always a real match (false flags only occur
    // above a real one).
    const LT: u64 = 0x3c3c_3c3c_3c3c_3c3c;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut words = hay.chunks_exact(8);
    let mut offset = 0;
    for w in words.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(w);
        let x = u64::from_le_bytes(bytes) ^ LT;
        let found = x.wrapping_sub(ONES) & !x & HIGHS;
        if found != 0 {
            return Some(offset + (found.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == b'<')
        .map(|i| offset + i)
}

/// Where a `<` that can start a closer may be in `hay`: the first `</`, or a
/// `<` that is the last byte (its `/` may come in the next chunk). Content
/// of files is mostly code, full of `<` but with few `</`: looking for the
/// pair stops far less often than a scan for every `<`.
#[inline(always)]
fn find_closer_lt(hay: &[u8]) -> Option<usize> {
    static CLOSER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"</"));
    let pair = if hay.len() < SHORT_CLOSER_SCAN {
        // short chunks (streamed tokens): memmem's setup costs more than the scan
        find_lt_slash(hay)
    } else {
        CLOSER.find(hay)
    };
    pair.or_else(|| (hay.last() == Some(&b'<')).then(|| hay.len() - 1))
}

/// Below this many bytes [`find_closer_lt`] scans with [`find_lt_slash`]
/// rather than `memmem` (whose per-call setup dominates on short input).
const SHORT_CLOSER_SCAN: usize = 128;

/// `w` (eight bytes) as a little-endian word.
#[inline(always)]
fn word(w: &[u8]) -> u64 {
    <[u8; 8]>::try_from(w).map_or(0, u64::from_le_bytes)
}

/// The first `</` in `hay`, eight positions at a time (SWAR): byte `i` of
/// `(w ^ LT) | (w' ^ SLASH)`, with `w'` the word one byte further on, is zero
/// exactly where `<` is followed by `/`. The positions the whole words leave
/// are covered by one more window flush with the end of `hay` (re-reading a
/// few bytes already known to hold no pair).
#[inline(always)]
fn find_lt_slash(hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const LT: u64 = 0x3c * ONES;
    const SLASH: u64 = 0x2f * ONES;
    // the lowest flagged byte is a real zero (borrows only run upwards)
    let first = |a: &[u8], b: &[u8]| {
        let x = (word(a) ^ LT) | (word(b) ^ SLASH);
        let found = x.wrapping_sub(ONES) & !x & HIGHS;
        (found != 0).then(|| (found.trailing_zeros() / 8) as usize)
    };
    let n = hay.len();
    if n < 9 {
        return hay.windows(2).position(|w| w == b"</");
    }
    let lead = hay.get(..n - 1).unwrap_or(&[]);
    let next = hay.get(1..).unwrap_or(&[]);
    let mut at = 0;
    for (a, b) in lead.chunks_exact(8).zip(next.chunks_exact(8)) {
        if let Some(i) = first(a, b) {
            return Some(at + i);
        }
        at += 8;
    }
    // pairs starting at `at..n - 1` are left: one window flush with the end
    if at + 1 >= n {
        return None;
    }
    let a = hay.get(n - 9..n - 1).unwrap_or(&[]);
    let b = hay.get(n - 8..).unwrap_or(&[]);
    first(a, b).map(|i| n - 9 + i)
}

/// `s[a..b]`, or `""` if that is not a valid slice (never happens for the
/// offsets the parser computes: they are at ASCII bytes or char boundaries).
#[inline]
fn sub(s: &str, a: usize, b: usize) -> &str {
    s.get(a..b).unwrap_or("")
}

/// Largest char boundary of `s` that is `<= at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Whether a `<` of `bytes` may start one of the tags of `mask`.
#[inline(always)]
fn may_hold_tag(mask: u16, bytes: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(off) = find_lt(bytes.get(pos..).unwrap_or(&[])) {
        let lt = pos + off;
        if could_start(mask, bytes.get(lt + 1..).unwrap_or(&[])) {
            return true;
        }
        pos = lt + 1;
    }
    false
}

/// [`may_hold_tag`] in a file, where only closers mean something: only a
/// `</` or a final `<` needs a look.
#[inline(always)]
fn may_close(bytes: &[u8]) -> bool {
    let mut pos = 0;
    while let Some(off) = find_closer_lt(bytes.get(pos..).unwrap_or(&[])) {
        let lt = pos + off;
        if could_start(Mode::File.tags(), bytes.get(lt + 1..).unwrap_or(&[])) {
            return true;
        }
        pos = lt + 1;
    }
    false
}

/// Emit a recoverable error without skipped bytes.
fn error(out: &mut impl FnMut(EventRef<'_>), code: ErrorCode, message: &str) {
    out(EventRef::Error {
        code,
        message,
        severity: Severity::Recoverable,
        skipped_bytes: None,
    });
}

/// The streaming parser.
///
/// Two ways to get the events, the same events either way:
///
/// - **Borrowing** (the fast one): [`Parser::feed_with`] and
///   [`Parser::finish_with`] call a closure with each [`EventRef`]. Content
///   is a slice of the chunk wherever its bytes are contiguous in it; nothing
///   is allocated per event and nothing is collected, so feeding a whole
///   input at once holds no more memory than feeding it in chunks.
/// - **Owned**: [`Parser::feed`] and [`Parser::finish`] push [`Event`]s to the
///   caller's `Vec` (reuse it, clearing it between calls). A thin layer over
///   the borrowing API ([`EventRef::to_event`] of each event).
///
/// For every cutting of a stream into chunks the events are the same once
/// adjacent content events are concatenated ([`crate::merge_content`]).
///
/// ```
/// use edward_parser::{EventRef, Parser};
///
/// let mut parser = Parser::new();
/// let mut file = String::new();
/// let mut on_event = |e: EventRef<'_>| {
///     if let EventRef::FileContent { content } = e {
///         file.push_str(content); // straight from the chunk
///     }
/// };
/// parser.feed_with("<edward_sandbox><file path=\"a.txt\">\nhi <", &mut on_event);
/// parser.feed_with("b>\n</file></edward_sandbox>", &mut on_event);
/// parser.finish_with(&mut on_event);
/// assert_eq!(file, "hi <b>\n");
/// ```
///
/// ```
/// use edward_parser::{Event, Parser};
///
/// let mut parser = Parser::new();
/// let mut events = Vec::new();
/// parser.feed("a < b <edward_do", &mut events);
/// assert_eq!(events, [Event::Text { content: "a < b ".into() }]);
/// assert_eq!(parser.buffered_len(), "<edward_do".len());
/// parser.feed("ne/>", &mut events);
/// parser.finish(&mut events);
/// assert_eq!(events.last(), Some(&Event::Done));
/// ```
#[derive(Debug, Clone)]
pub struct Parser {
    mode: Mode,
    /// What a short chunk with no possible tag becomes now: it follows from
    /// the state, which only the general path changes, so it refreshes it
    /// ([`Parser::refresh_fast`]).
    fast: Fast,
    /// The tag candidate whose bytes are in `hold`.
    cand: Option<Cand>,
    hold: String,
    file: FileFilter,
    /// The current file's normalised path (for messages).
    file_path: String,
    /// `SkipFile`: body bytes so far, and the error message to emit at its end.
    skipped: u64,
    skip_message: String,
    install_body: String,
}

impl Default for Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Parser {
            mode: Mode::Text,
            fast: Fast::Text,
            cand: None,
            hold: String::new(),
            file: FileFilter::default(),
            file_path: String::new(),
            skipped: 0,
            skip_message: String::new(),
            install_body: String::new(),
        }
    }

    /// Bytes of input currently held back (a possible tag, an install body, a
    /// possible code fence). Never more than [`MAX_BUFFERED`].
    pub fn buffered_len(&self) -> usize {
        self.hold.len() + self.file.buffered_len() + self.install_body.len()
    }

    /// Feed the next chunk of the stream; each event is passed to `on_event`,
    /// borrowed (from `chunk` where its bytes are contiguous there, otherwise
    /// from the parser's own hold-back buffer), in stream order.
    #[inline(always)]
    pub fn feed_with<F: FnMut(EventRef<'_>)>(&mut self, chunk: &str, mut on_event: F) {
        self.feed_into(chunk, &mut on_event);
    }

    /// End the stream as [`Parser::finish`] does, passing each event to
    /// `on_event`. The parser is then ready for a new stream.
    pub fn finish_with<F: FnMut(EventRef<'_>)>(&mut self, mut on_event: F) {
        self.finish_into(&mut on_event);
    }

    /// Feed the next chunk of the stream; events are pushed to `out` (owned:
    /// [`Parser::feed_with`] does not allocate per event).
    pub fn feed(&mut self, chunk: &str, out: &mut Vec<Event>) {
        self.feed_into(chunk, &mut |e: EventRef<'_>| out.push(e.to_event()));
    }

    /// End the stream: held text is flushed as content, then every open scope
    /// is closed in the order file, sandbox, thinking, install, each with its
    /// recoverable `unclosed_*` error. The parser is then ready for a new stream.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        self.finish_into(&mut |e: EventRef<'_>| out.push(e.to_event()));
    }

    #[inline(always)]
    fn feed_into(&mut self, chunk: &str, out: &mut impl FnMut(EventRef<'_>)) {
        // Fast path for short chunks (a streamed token or two) that are plain
        // content as a whole: no `<` in them can start a tag here. Kept small
        // and inline; everything else takes the general path.
        let bytes = chunk.as_bytes();
        if bytes.len() < FAST_CHUNK && !bytes.is_empty() {
            match self.fast {
                Fast::General => {}
                Fast::File => {
                    if !may_close(bytes) {
                        return out(EventRef::FileContent { content: chunk });
                    }
                }
                Fast::FileHold => {
                    if self.file.can_hold(bytes.len()) && !may_close(bytes) {
                        return self.file.hold(chunk);
                    }
                }
                Fast::Text => {
                    if !may_hold_tag(Mode::Text.tags(), bytes) {
                        return out(EventRef::Text { content: chunk });
                    }
                }
                Fast::SandboxText => {
                    if !may_hold_tag(Mode::Sandbox.tags(), bytes) {
                        return out(EventRef::Text { content: chunk });
                    }
                }
                Fast::Thinking => {
                    if !may_hold_tag(Mode::Thinking.tags(), bytes) {
                        return out(EventRef::ThinkingContent { content: chunk });
                    }
                }
            }
        }
        self.feed_general(chunk, out);
    }

    /// Set what the fast path of [`Parser::feed_into`] may do in the state
    /// the parser is now in.
    fn refresh_fast(&mut self) {
        self.fast = if self.cand.is_some() {
            Fast::General
        } else {
            match self.mode {
                Mode::Text => Fast::Text,
                Mode::Sandbox => Fast::SandboxText,
                Mode::Thinking => Fast::Thinking,
                Mode::File if self.file.is_plain() => Fast::File,
                Mode::File if self.file.is_holding() => Fast::FileHold,
                Mode::File | Mode::SkipFile | Mode::Install { .. } => Fast::General,
            }
        };
    }

    #[inline(never)]
    fn feed_general(&mut self, chunk: &str, out: &mut impl FnMut(EventRef<'_>)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            rest = if self.cand.is_some() {
                self.continue_candidate(rest, out)
            } else {
                self.scan(rest, out)
            };
        }
        self.refresh_fast();
    }

    fn finish_into(&mut self, out: &mut impl FnMut(EventRef<'_>)) {
        if self.cand.take().is_some() {
            // An unfinished tag is not a tag.
            let held = std::mem::take(&mut self.hold);
            self.content_all(&held, out);
        }
        const END: &str = "the end of the stream";
        match self.mode {
            Mode::Text => {}
            Mode::File | Mode::SkipFile => {
                self.close_file_implicitly(END, out);
                self.close_sandbox_at_end(out);
            }
            Mode::Sandbox => self.close_sandbox_at_end(out),
            Mode::Thinking => {
                error(
                    out,
                    ErrorCode::UnclosedThinking,
                    "<Thinking> was not closed before the end of the stream",
                );
                out(EventRef::ThinkingEnd);
            }
            Mode::Install { in_sandbox } => {
                if in_sandbox {
                    self.close_sandbox_at_end(out);
                }
                self.close_install(Some(END), out);
            }
        }
        *self = Parser::new();
        self.refresh_fast();
    }

    /// The sandbox part of [`Parser::finish`] (the mode is reset by the caller).
    fn close_sandbox_at_end(&mut self, out: &mut impl FnMut(EventRef<'_>)) {
        error(
            out,
            ErrorCode::UnclosedSandbox,
            "<edward_sandbox> was not closed before the end of the stream",
        );
        out(EventRef::SandboxEnd);
    }

    /// Scan `s` with no candidate pending. Returns what is left to feed (non-empty
    /// only when an install body overflowed and the rest must be read in the new state).
    fn scan<'a>(&mut self, s: &'a str, out: &mut impl FnMut(EventRef<'_>)) -> &'a str {
        let bytes = s.as_bytes();
        let mut start = 0; // start of content not yet emitted
        let mut pos = 0; // where to look for the next `<`
        // The mode changes only at a tag; what to look for is computed then.
        let mut tags = None;
        let mut closers_only = self.mode.closers_only();
        loop {
            let hay = bytes.get(pos..).unwrap_or(&[]);
            let found = if closers_only {
                find_closer_lt(hay)
            } else {
                find_lt(hay)
            };
            let Some(off) = found else {
                let rest = sub(s, start, s.len());
                let consumed = self.content(rest, out);
                return if consumed == rest.len() {
                    ""
                } else {
                    sub(rest, consumed, rest.len())
                };
            };
            let lt = pos + off;
            let after = bytes.get(lt + 1..).unwrap_or(&[]);
            let mask = *tags.get_or_insert_with(|| self.mode.tags());
            if !could_start(mask, after) {
                pos = lt + 1;
                continue;
            }
            let mut cand = Cand::new(mask);
            let (outcome, n) = cand.advance(after);
            let end = lt + 1 + n;
            if let Outcome::Reject = outcome {
                pos = end;
                continue;
            }
            // Content before the `<` goes out first, in the current mode.
            let consumed = self.content(sub(s, start, lt), out);
            if start + consumed < lt {
                return sub(s, start + consumed, s.len());
            }
            match outcome {
                Outcome::Need => {
                    self.hold.clear();
                    self.hold.push_str(sub(s, lt, s.len()));
                    self.cand = Some(cand);
                    return "";
                }
                Outcome::Complete => self.tag(cand.entry, sub(s, lt, end), out),
                Outcome::TooLong => self.too_long(sub(s, lt, end), out),
                Outcome::Reject => {}
            }
            tags = None;
            closers_only = self.mode.closers_only();
            start = end;
            pos = end;
        }
    }

    /// Continue the pending candidate with `s`; returns the rest of `s`.
    fn continue_candidate<'a>(
        &mut self,
        s: &'a str,
        out: &mut impl FnMut(EventRef<'_>),
    ) -> &'a str {
        let Some(mut cand) = self.cand.take() else {
            return s;
        };
        let (outcome, n) = cand.advance(s.as_bytes());
        match outcome {
            Outcome::Need => {
                self.hold.push_str(s);
                self.cand = Some(cand);
                return "";
            }
            Outcome::Complete => {
                let mut tag = std::mem::take(&mut self.hold);
                tag.push_str(sub(s, 0, n));
                self.tag(cand.entry, &tag, out);
                self.recycle(tag);
            }
            Outcome::Reject => {
                // The candidate's bytes (`<` and part of a name, up to the
                // rejecting byte, which is read again) are content. If an
                // install body overflows on them, the rest is read again in
                // the enclosing state.
                let mut held = std::mem::take(&mut self.hold);
                held.push_str(sub(s, 0, n));
                let consumed = self.content(&held, out);
                if consumed < held.len() {
                    self.feed_general(sub(&held, consumed, held.len()), out);
                }
                self.recycle(held);
            }
            Outcome::TooLong => {
                let mut held = std::mem::take(&mut self.hold);
                held.push_str(sub(s, 0, n));
                self.too_long(&held, out);
                self.recycle(held);
            }
        }
        sub(s, n, s.len())
    }

    /// Give a taken buffer back to `hold` (keeps its capacity) if nothing else is held.
    fn recycle(&mut self, mut buf: String) {
        if self.cand.is_none() && self.hold.is_empty() {
            buf.clear();
            self.hold = buf;
        }
    }

    fn too_long(&mut self, text: &str, out: &mut impl FnMut(EventRef<'_>)) {
        error(
            out,
            ErrorCode::TagTooLong,
            &format!("a tag longer than {MAX_TAG_LEN} bytes is not a tag; its text is content"),
        );
        self.content_all(text, out);
    }

    /// Emit all of `text` as content, without looking for tags in it.
    fn content_all(&mut self, text: &str, out: &mut impl FnMut(EventRef<'_>)) {
        let mut rest = text;
        while !rest.is_empty() {
            let consumed = self.content(rest, out);
            rest = sub(rest, consumed, rest.len());
        }
    }

    /// Emit content in the current mode. Returns how much was taken: all of
    /// it, except when an install body reaches its limit (the install is then
    /// closed and the rest belongs to the enclosing state).
    #[inline(always)]
    fn content(&mut self, s: &str, out: &mut impl FnMut(EventRef<'_>)) -> usize {
        if s.is_empty() {
            return 0;
        }
        match self.mode {
            Mode::Text | Mode::Sandbox => out(EventRef::Text { content: s }),
            Mode::Thinking => out(EventRef::ThinkingContent { content: s }),
            Mode::File if self.file.is_plain() => out(EventRef::FileContent { content: s }),
            Mode::File => self.file_content(s, out),
            Mode::SkipFile => self.skipped += s.len() as u64,
            Mode::Install { .. } => return self.install_content(s, out),
        }
        s.len()
    }

    /// [`Parser::content`] of a file whose content is being shaped (kept out
    /// of line: the inlined hot path is plain content).
    #[inline(never)]
    fn file_content(&mut self, s: &str, out: &mut impl FnMut(EventRef<'_>)) {
        self.file.push(s, out);
    }

    /// [`Parser::content`] of an install body.
    #[inline(never)]
    fn install_content(&mut self, s: &str, out: &mut impl FnMut(EventRef<'_>)) -> usize {
        let room = MAX_INSTALL_BODY.saturating_sub(self.install_body.len());
        if s.len() <= room {
            self.install_body.push_str(s);
            s.len()
        } else {
            let cut = floor_char_boundary(s, room);
            self.install_body.push_str(sub(s, 0, cut));
            self.close_install(
                Some("a body longer than 16384 bytes (the rest is read as text)"),
                out,
            );
            cut
        }
    }

    /// A complete tag `text` (from `<` to `>`) whose name is `NAMES[entry]`.
    fn tag(&mut self, entry: usize, text: &str, out: &mut impl FnMut(EventRef<'_>)) {
        let Some(name) = NAMES.get(entry) else {
            self.content_all(text, out);
            return;
        };
        if name.closer {
            self.closer(name.tag, text, out);
        } else {
            let attrs = attr::parse_attributes(sub(text, 1 + name.text.len(), text.len()));
            self.opener(name.tag, &attrs, text, out);
        }
    }

    fn closer(&mut self, tag: Tag, text: &str, out: &mut impl FnMut(EventRef<'_>)) {
        match (self.mode, tag) {
            (_, Tag::Command | Tag::WebSearch | Tag::Done | Tag::UrlScrape) => {}
            (Mode::Thinking, Tag::Thinking) => {
                out(EventRef::ThinkingEnd);
                self.mode = Mode::Text;
            }
            (Mode::Sandbox, Tag::Sandbox) => {
                out(EventRef::SandboxEnd);
                self.mode = Mode::Text;
            }
            (Mode::File, Tag::File) => {
                self.file.finish(out);
                out(EventRef::FileEnd);
                self.mode = Mode::Sandbox;
            }
            (Mode::SkipFile, Tag::File) => {
                self.emit_skipped_file(out);
                self.mode = Mode::Sandbox;
            }
            (Mode::File | Mode::SkipFile, Tag::Sandbox) => {
                self.close_file_implicitly("</edward_sandbox>", out);
                out(EventRef::SandboxEnd);
                self.mode = Mode::Text;
            }
            (Mode::Install { .. }, Tag::Install) => self.close_install(None, out),
            (Mode::Install { in_sandbox: true }, Tag::Sandbox) => {
                self.close_install(Some("</edward_sandbox>"), out);
                out(EventRef::SandboxEnd);
                self.mode = Mode::Text;
            }
            // Not reachable: the mode's tag set excludes the rest.
            _ => self.content_all(text, out),
        }
    }

    fn opener(
        &mut self,
        tag: Tag,
        attrs: &Attributes,
        text: &str,
        out: &mut impl FnMut(EventRef<'_>),
    ) {
        match self.mode {
            Mode::Thinking => match tag {
                Tag::File => self.file_outside_sandbox(text, out),
                Tag::Sandbox | Tag::Install | Tag::Command | Tag::WebSearch | Tag::Done => {
                    out(EventRef::ThinkingEnd);
                    self.mode = Mode::Text;
                    self.opener(tag, attrs, text, out);
                }
                _ => self.content_all(text, out),
            },
            Mode::Install { .. } => match tag {
                Tag::Sandbox | Tag::File | Tag::Command | Tag::WebSearch | Tag::Done => {
                    let why = match tag {
                        Tag::Sandbox => "<edward_sandbox>",
                        Tag::File => "<file>",
                        Tag::Command => "<edward_command>",
                        Tag::WebSearch => "<edward_web_search>",
                        _ => "<edward_done>",
                    };
                    self.close_install(Some(why), out);
                    self.opener(tag, attrs, text, out);
                }
                _ => self.content_all(text, out),
            },
            Mode::Text | Mode::Sandbox => {
                let in_sandbox = self.mode == Mode::Sandbox;
                match tag {
                    Tag::Thinking if !in_sandbox => {
                        out(EventRef::ThinkingStart);
                        if attrs.self_closing() {
                            out(EventRef::ThinkingEnd);
                        } else {
                            self.mode = Mode::Thinking;
                        }
                    }
                    Tag::Sandbox if in_sandbox => error(
                        out,
                        ErrorCode::NestedSandbox,
                        "<edward_sandbox> inside a sandbox is ignored",
                    ),
                    Tag::Sandbox => {
                        out(EventRef::SandboxStart {
                            project: attrs.get("project"),
                            base: attrs.get("base"),
                        });
                        if attrs.self_closing() {
                            out(EventRef::SandboxEnd);
                        } else {
                            self.mode = Mode::Sandbox;
                        }
                    }
                    Tag::File if in_sandbox => self.open_file(attrs, out),
                    Tag::File => self.file_outside_sandbox(text, out),
                    Tag::Install => {
                        out(EventRef::InstallStart);
                        self.install_body.clear();
                        self.mode = Mode::Install { in_sandbox };
                        if attrs.self_closing() {
                            self.close_install(None, out);
                        }
                    }
                    Tag::Command => self.command(attrs, out),
                    Tag::WebSearch => self.web_search(attrs, out),
                    Tag::Done => {
                        if in_sandbox {
                            out(EventRef::SandboxEnd);
                            self.mode = Mode::Text;
                        }
                        out(EventRef::Done);
                    }
                    _ => self.content_all(text, out),
                }
            }
            Mode::File | Mode::SkipFile => self.content_all(text, out),
        }
    }

    fn file_outside_sandbox(&mut self, text: &str, out: &mut impl FnMut(EventRef<'_>)) {
        error(
            out,
            ErrorCode::FileOutsideSandbox,
            "<file> outside <edward_sandbox> is not a file; its text is content",
        );
        self.content_all(text, out);
    }

    fn open_file(&mut self, attrs: &Attributes, out: &mut impl FnMut(EventRef<'_>)) {
        let result = match attrs.get("path") {
            Some(raw) => normalize_path(raw).map_err(|e| format!("invalid file path {raw:?}: {e}")),
            None => Err("<file> without a path attribute".to_string()),
        };
        match result {
            Ok(path) => {
                out(EventRef::FileStart { path: &path });
                if attrs.self_closing() {
                    out(EventRef::FileEnd);
                } else {
                    self.file.reset();
                    self.file_path = path;
                    self.mode = Mode::File;
                }
            }
            Err(message) => {
                self.skip_message = message;
                self.skipped = 0;
                if attrs.self_closing() {
                    self.emit_skipped_file(out);
                } else {
                    self.mode = Mode::SkipFile;
                }
            }
        }
    }

    fn emit_skipped_file(&mut self, out: &mut impl FnMut(EventRef<'_>)) {
        let message = std::mem::take(&mut self.skip_message);
        out(EventRef::Error {
            code: ErrorCode::InvalidFilePath,
            message: &format!(
                "{message}; its content was skipped ({} bytes)",
                self.skipped
            ),
            severity: Severity::Recoverable,
            skipped_bytes: Some(self.skipped),
        });
        self.skipped = 0;
    }

    /// Close the current (valid or skipped) file because of `why`.
    fn close_file_implicitly(&mut self, why: &str, out: &mut impl FnMut(EventRef<'_>)) {
        match self.mode {
            Mode::File => {
                self.file.finish(out);
                error(
                    out,
                    ErrorCode::UnclosedFile,
                    &format!("file {:?} was closed by {why}, not </file>", self.file_path),
                );
                out(EventRef::FileEnd);
            }
            Mode::SkipFile => {
                error(
                    out,
                    ErrorCode::UnclosedFile,
                    &format!("a file with an invalid path was closed by {why}, not </file>"),
                );
                self.emit_skipped_file(out);
            }
            _ => {}
        }
        self.mode = Mode::Sandbox;
    }

    /// End the install block; `implicit` names what closed it when it was not
    /// `</edward_install>`.
    fn close_install(&mut self, implicit: Option<&str>, out: &mut impl FnMut(EventRef<'_>)) {
        let Mode::Install { in_sandbox } = self.mode else {
            return;
        };
        if let Some(why) = implicit {
            error(
                out,
                ErrorCode::UnclosedInstall,
                &format!("<edward_install> was closed by {why}, not </edward_install>"),
            );
        }
        let body = parse_install_body(&self.install_body);
        self.install_body.clear();
        if !body.invalid.is_empty() {
            error(
                out,
                ErrorCode::InvalidDependency,
                &format!(
                    "not valid npm package specs, not installed: {}",
                    quote_list(&body.invalid)
                ),
            );
        }
        if !body.over_limit.is_empty() {
            error(
                out,
                ErrorCode::InvalidDependency,
                &format!(
                    "more than {MAX_DEPENDENCIES} packages, not installed: {}",
                    quote_list(&body.over_limit)
                ),
            );
        }
        out(EventRef::InstallContent {
            dependencies: &body.dependencies,
            framework: body.framework.as_deref(),
        });
        out(EventRef::InstallEnd);
        self.mode = if in_sandbox {
            Mode::Sandbox
        } else {
            Mode::Text
        };
    }

    fn command(&mut self, attrs: &Attributes, out: &mut impl FnMut(EventRef<'_>)) {
        let Some(command) = attrs.get("command").filter(|c| !c.trim().is_empty()) else {
            error(
                out,
                ErrorCode::MalformedCommand,
                "<edward_command> without a command attribute",
            );
            return;
        };
        let args = match attrs.get("args") {
            None => Vec::new(),
            Some(raw) => match parse_string_array(raw) {
                Some(args) => args,
                None => {
                    error(
                        out,
                        ErrorCode::MalformedCommand,
                        &format!(
                            "args of command {command:?} is not a JSON array of strings: {raw:?}; the command was not run"
                        ),
                    );
                    return;
                }
            },
        };
        out(EventRef::Command {
            command,
            args: &args,
        });
    }

    fn web_search(&mut self, attrs: &Attributes, out: &mut impl FnMut(EventRef<'_>)) {
        let Some(query) = attrs.get("query").filter(|q| !q.trim().is_empty()) else {
            error(
                out,
                ErrorCode::MalformedWebSearch,
                "<edward_web_search> without a query attribute",
            );
            return;
        };
        let max_results = attrs
            .get("max_results")
            .or_else(|| attrs.get("maxResults"))
            .map_or(DEFAULT_MAX_RESULTS, parse_max_results);
        out(EventRef::WebSearch { query, max_results });
    }
}

/// `max_results`: an optionally signed decimal integer (surrounding whitespace
/// allowed) clamped to `1..=8`; anything else is the default 5.
pub fn parse_max_results(value: &str) -> u8 {
    let t = value.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return DEFAULT_MAX_RESULTS;
    }
    if negative {
        return 1;
    }
    let n: u64 = digits.parse().unwrap_or(u64::MAX);
    u8::try_from(n.clamp(1, u64::from(MAX_MAX_RESULTS))).unwrap_or(MAX_MAX_RESULTS)
}

fn quote_list(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefix_free_and_lower_case() {
        assert_eq!(NAMES.iter().map(|n| n.text.len()).max(), Some(MAX_NAME));
        for (i, a) in NAMES.iter().enumerate() {
            assert!(a.text.iter().all(|b| !b.is_ascii_uppercase()));
            for (j, b) in NAMES.iter().enumerate() {
                if i != j {
                    assert!(!b.text.starts_with(a.text));
                }
            }
        }
    }

    #[test]
    fn max_results() {
        assert_eq!(parse_max_results("3"), 3);
        assert_eq!(parse_max_results(" 8 "), 8);
        assert_eq!(parse_max_results("+2"), 2);
        assert_eq!(parse_max_results("0"), 1);
        assert_eq!(parse_max_results("-4"), 1);
        assert_eq!(parse_max_results("9"), 8);
        assert_eq!(parse_max_results("99999999999999999999999"), 8);
        assert_eq!(parse_max_results(""), 5);
        assert_eq!(parse_max_results("five"), 5);
        assert_eq!(parse_max_results("3.5"), 5);
        assert_eq!(parse_max_results("0x3"), 5);
    }

    const _: () = assert!(MAX_BUFFERED >= MAX_TAG_LEN + MAX_INSTALL_BODY);

    #[test]
    fn buffered_cap_value() {
        assert_eq!(MAX_BUFFERED, 20544);
    }

    #[test]
    fn find_lt_matches_a_plain_search() {
        let samples: [&[u8]; 9] = [
            b"",
            b"<",
            b"abc",
            b"abcdefgh<",
            b"abcdefg<h<",
            b"\x3d\x3c\xbc<<",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x3c",
            b"\x01\x3c\x00\x00\x00\x00\x00\x00",
            b"0123456789012345678901234567890123456789<",
        ];
        for s in samples {
            for start in 0..s.len() {
                let hay = &s[start..];
                assert_eq!(find_lt(hay), hay.iter().position(|&b| b == b'<'), "{hay:?}");
            }
        }
        for n in 0..40 {
            let mut v = vec![b'a'; n];
            for k in 0..n {
                v[k] = b'<';
                assert_eq!(find_lt(&v), Some(k));
                v[k] = 0x3d;
                assert_eq!(find_lt(&v), None);
                v[k] = b'a';
            }
        }
    }

    /// `len` bytes drawn from `alphabet` (xorshift64 on `rng`).
    fn random_bytes(rng: &mut u64, len: usize, alphabet: &[u8]) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                alphabet[(*rng % alphabet.len() as u64) as usize]
            })
            .collect()
    }

    #[test]
    fn find_closer_lt_stops_at_every_possible_closer() {
        // the first `</`, or a final `<`
        let reference = |hay: &[u8]| {
            (0..hay.len()).find(|&i| hay[i] == b'<' && hay.get(i + 1).is_none_or(|&b| b == b'/'))
        };
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for len in [
            0, 1, 2, 8, 9, 10, 16, 17, 31, 63, 64, 65, 100, 127, 128, 129, 1000,
        ] {
            for _ in 0..200 {
                let hay = random_bytes(&mut rng, len, b"</a>");
                assert_eq!(
                    find_closer_lt(&hay),
                    reference(&hay),
                    "{:?}",
                    String::from_utf8_lossy(&hay)
                );
            }
        }
        let mut long = vec![b'a'; 200];
        long[199] = b'<';
        assert_eq!(find_closer_lt(&long), Some(199));
        long[50] = b'<';
        assert_eq!(find_closer_lt(&long), Some(199));
        long[120] = b'/';
        long[119] = b'<';
        assert_eq!(find_closer_lt(&long), Some(119));
    }

    #[test]
    fn find_lt_slash_matches_a_plain_search() {
        let reference = |hay: &[u8]| hay.windows(2).position(|w| w == b"</");
        // bytes next to `<` and `/` in value, which a careless SWAR test confuses
        let alphabet = [b'<', b'/', 0x3d, 0x3b, 0x2e, 0x30, 0x00, 0xbc, 0xaf, b'a'];
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0usize..40 {
            for _ in 0..300 {
                let hay = random_bytes(&mut rng, len, &alphabet);
                assert_eq!(find_lt_slash(&hay), reference(&hay), "{hay:?}");
            }
            // a single pair at every position
            for k in 0..len.saturating_sub(1) {
                let mut v = vec![b'a'; len];
                v[k] = b'<';
                v[k + 1] = b'/';
                assert_eq!(find_lt_slash(&v), Some(k), "len {len} at {k}");
                v[k + 1] = 0x2e;
                assert_eq!(find_lt_slash(&v), None, "len {len} at {k}");
            }
        }
    }

    #[test]
    fn quick_filter() {
        let file = Mode::File.tags();
        assert!(could_start(file, b""));
        assert!(could_start(file, b"/"));
        assert!(could_start(file, b"/F"));
        assert!(could_start(file, b"/e"));
        assert!(!could_start(file, b"/d"));
        assert!(!could_start(file, b"fi"));
        let text = Mode::Text.tags();
        assert!(could_start(text, b"Th"));
        assert!(could_start(text, b"ED"));
        assert!(!could_start(text, b" b"));
        assert!(!could_start(text, b"di"));
        assert!(!could_start(text, b"/t"));
        assert!(could_start(Mode::Thinking.tags(), b"/t"));
    }

    #[test]
    fn candidate_rejects_at_first_divergent_byte() {
        let mut c = Cand::new(Mode::Text.tags());
        let (o, n) = c.advance(b"edward_x");
        assert!(matches!(o, Outcome::Reject));
        assert_eq!(n, 7);
        let mut c = Cand::new(Mode::File.tags());
        assert!(matches!(c.advance(b"file>").0, Outcome::Reject));
        let mut c = Cand::new(Mode::File.tags());
        let (o, n) = c.advance(b"/FILE >x");
        assert!(matches!(o, Outcome::Complete));
        assert_eq!(n, 7);
    }
}
