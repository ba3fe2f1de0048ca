//! Streaming parser for the Edward tag protocol.
//!
//! Feed `&str` chunks with [`Parser::feed`], end with [`Parser::finish`].
//! The parser does no I/O, is not async, never panics, and gives the same
//! events (after merging adjacent content) for every chunking of a stream.
//!
//! **Architecture invariant:** this crate knows nothing about runs, sandboxes
//! or HTTP; its only dependency is `memchr` (and `serde` behind a feature).

mod event;

pub use event::{ErrorCode, Event, Severity};

/// The streaming parser (implementation in progress).
#[derive(Debug, Default)]
pub struct Parser {
    _private: (),
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next chunk; events are pushed to `out`.
    pub fn feed(&mut self, chunk: &str, out: &mut Vec<Event>) {
        if !chunk.is_empty() {
            out.push(Event::Text {
                content: chunk.to_string(),
            });
        }
    }

    /// End the stream: closes open scopes and flushes held text.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        let _ = out;
    }
}
