//! Streaming parser for the Edward tag protocol (docs/PROTOCOL.md).
//!
//! Feed `&str` chunks with [`Parser::feed_with`] (events borrowed, handed to
//! a closure: no allocation per event) or [`Parser::feed`] (owned events
//! pushed to a `Vec`), end with [`Parser::finish_with`] / [`Parser::finish`].
//! The parser does no I/O, is not async, never panics, and gives the same
//! events (after [`merge_content`]) for every chunking of a stream, through
//! either API.
//!
//! ```
//! use edward_parser::{merge_content, Event, Parser};
//!
//! let stream = r#"Sure.<edward_sandbox project="demo"><file path="./a.txt">
//! hi
//! </file></edward_sandbox><edward_done/>"#;
//! let mut parser = Parser::new();
//! let mut events = Vec::new();
//! for chunk in [&stream[..10], &stream[10..47], &stream[47..]] {
//!     parser.feed(chunk, &mut events);
//! }
//! parser.finish(&mut events);
//! let events = merge_content(events);
//! assert_eq!(events[2], Event::FileStart { path: "a.txt".into() });
//! assert_eq!(events[3], Event::FileContent { content: "hi\n".into() });
//! assert_eq!(events.last(), Some(&Event::Done));
//! ```
//!
//! The sub-parsers are public for reuse and fuzzing: [`attr`] (tag
//! attributes and entities), [`path`] (path normalisation), [`install`]
//! (install bodies) and [`json`] (`args` arrays, JSON output).
//!
//! **Architecture invariant:** this crate knows nothing about runs, sandboxes
//! or HTTP; its only dependency is `memchr` (and `serde` behind a feature).

#![deny(missing_docs)]

pub mod attr;
mod event;
mod file;
pub mod install;
pub mod json;
mod parser;
pub mod path;

pub use event::{ErrorCode, Event, EventRef, Severity};
pub use file::{FENCE_WINDOW, MAX_FENCE_LINE};
pub use install::{InstallBody, parse_install_body};
pub use parser::{
    DEFAULT_MAX_RESULTS, MAX_BUFFERED, MAX_INSTALL_BODY, MAX_MAX_RESULTS, MAX_TAG_LEN, Parser,
    parse_max_results,
};
pub use path::{PathError, normalize_path};

/// Not part of the API: the `memchr` this crate scans with, for the
/// benchmark's physical reference (a plain `<` scan over the same bytes).
#[doc(hidden)]
pub use memchr as __memchr;

/// Parse a whole stream at once, with adjacent content events merged as
/// [`merge_content`] does (merged as they come, so no unmerged list is ever
/// built). This is the canonical event sequence that every chunking of
/// `input` reproduces.
pub fn parse_all(input: &str) -> Vec<Event> {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut push = |e: EventRef<'_>| push_merged(&mut events, e);
    parser.feed_with(input, &mut push);
    parser.finish_with(&mut push);
    events
}

/// Push `event` to `events`, appending its content to the last event instead
/// when both are content of the same kind ([`merge_content`], one at a time).
///
/// ```
/// use edward_parser::{push_merged, Event, EventRef};
/// let mut events = Vec::new();
/// push_merged(&mut events, EventRef::Text { content: "a" });
/// push_merged(&mut events, EventRef::Text { content: "b" });
/// push_merged(&mut events, EventRef::Done);
/// assert_eq!(events, [Event::Text { content: "ab".into() }, Event::Done]);
/// ```
pub fn push_merged(events: &mut Vec<Event>, event: EventRef<'_>) {
    match (events.last_mut(), event) {
        (Some(Event::Text { content: a }), EventRef::Text { content: b })
        | (Some(Event::ThinkingContent { content: a }), EventRef::ThinkingContent { content: b })
        | (Some(Event::FileContent { content: a }), EventRef::FileContent { content: b }) => {
            a.push_str(b);
        }
        (_, event) => events.push(event.to_event()),
    }
}

/// Concatenate adjacent content events of the same kind (`text`,
/// `thinking_content`, `file_content`), the normal form in which chunk
/// invariance holds (PROTOCOL.md §6).
///
/// ```
/// use edward_parser::{merge_content, Event};
/// let t = |s: &str| Event::Text { content: s.into() };
/// assert_eq!(merge_content(vec![t("a"), t("b"), Event::Done, t("c")]), [t("ab"), Event::Done, t("c")]);
/// ```
pub fn merge_content(events: Vec<Event>) -> Vec<Event> {
    let mut merged: Vec<Event> = Vec::with_capacity(events.len());
    for event in events {
        match (merged.last_mut(), event) {
            (Some(Event::Text { content: a }), Event::Text { content: b })
            | (
                Some(Event::ThinkingContent { content: a }),
                Event::ThinkingContent { content: b },
            )
            | (Some(Event::FileContent { content: a }), Event::FileContent { content: b }) => {
                a.push_str(&b);
            }
            (_, event) => merged.push(event),
        }
    }
    merged
}
