//! A small Server-Sent Events decoder (the WHATWG `text/event-stream` format).
//!
//! Bytes go in as they arrive from the network, in chunks of any size;
//! complete [`SseEvent`]s come out. The decoder buffers bytes and decodes only
//! complete lines, so a line — or a multi-byte UTF-8 character — split across
//! network chunks is reassembled before it is interpreted.
//!
//! Behaviour (the spec's, except where noted):
//! - Lines end with CRLF, LF or CR (a CR at the end of one chunk followed by LF
//!   at the start of the next is one line ending, not two).
//! - A leading UTF-8 byte-order mark is skipped.
//! - `data:` lines of one event are joined with `\n`.
//! - Lines starting with `:` are comments and are ignored.
//! - `event:`, `id:` and `retry:` (digits only) are recorded; unknown fields
//!   are ignored. One space after the colon is stripped.
//! - An event is dispatched at a blank line; an event without `data` is not
//!   dispatched (its `event:` name is discarded).
//! - **At end of input** (decision, deviating from the spec, which discards
//!   it): an unterminated final line is treated as complete and a pending
//!   event is dispatched, because some servers and proxies omit the final
//!   blank line and dropping the last event would silently lose output.
//! - A line longer than the configured limit (default 1 MiB) is an error
//!   ([`SseError::LineTooLong`]), and so are the joined `data:` lines of one
//!   event beyond theirs (default 4 MiB, [`SseError::EventTooLarge`]): the
//!   decoder never buffers without bound, even when a server sends endless
//!   short `data:` lines without the blank line that ends an event.
//! - Invalid UTF-8 is replaced with U+FFFD, as the spec requires.
//!
//! ```
//! use edward_core::providers::sse::SseDecoder;
//! let mut d = SseDecoder::new();
//! let mut events = d.feed(b"event: ping\ndata: {\"a\"").unwrap();
//! assert!(events.is_empty());
//! events = d.feed(b":1}\n\n").unwrap();
//! assert_eq!(events[0].event.as_deref(), Some("ping"));
//! assert_eq!(events[0].data, "{\"a\":1}");
//! ```

/// Default bound on one line (1 MiB).
pub const DEFAULT_MAX_LINE_BYTES: usize = 1024 * 1024;

/// Default bound on one event's joined `data:` lines (4 MiB).
pub const DEFAULT_MAX_DATA_BYTES: usize = 4 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any (the spec's default type is `message`).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen (it persists across events, as in the spec).
    pub id: Option<String>,
    /// The `retry:` field of this event, in milliseconds.
    pub retry: Option<u64>,
}

impl SseEvent {
    /// Whether this is the OpenAI-style end marker `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data.trim() == "[DONE]"
    }
}

/// Decoding failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// A line exceeded the limit.
    #[error("server-sent event line longer than {limit} bytes")]
    LineTooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// The `data:` lines of one event exceeded the limit.
    #[error("server-sent event data longer than {limit} bytes")]
    EventTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
}

impl SseError {
    /// Whether retrying may help: never (the server sent a malformed or
    /// oversized stream; the same request will likely do it again).
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Incremental SSE decoder. See the [module docs](self) for the rules.
#[derive(Debug)]
pub struct SseDecoder {
    max_line: usize,
    max_data: usize,
    /// Bytes of the current, incomplete line.
    line: Vec<u8>,
    /// The previous chunk ended with CR: a leading LF of the next one belongs to it.
    after_cr: bool,
    /// Still at the very start of the stream (BOM check).
    at_start: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    retry: Option<u64>,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl SseDecoder {
    /// A decoder with the default 1 MiB line limit.
    pub fn new() -> Self {
        Self::with_max_line(DEFAULT_MAX_LINE_BYTES)
    }

    /// A decoder with a custom line limit in bytes.
    pub fn with_max_line(max_line: usize) -> Self {
        SseDecoder {
            max_line,
            max_data: DEFAULT_MAX_DATA_BYTES,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            event: None,
            data: String::new(),
            has_data: false,
            last_id: None,
            retry: None,
        }
    }

    /// Set the bound on one event's joined `data:` lines, in bytes.
    pub fn with_max_data(mut self, max_data: usize) -> Self {
        self.max_data = max_data;
        self
    }

    /// Feed the next network chunk; returns the events it completed.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        while !chunk.is_empty() {
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(pos) => {
                    self.push_line_bytes(&chunk[..pos])?;
                    let was_cr = chunk[pos] == b'\r';
                    chunk = &chunk[pos + 1..];
                    if was_cr {
                        if chunk.is_empty() {
                            self.after_cr = true;
                        } else if chunk[0] == b'\n' {
                            chunk = &chunk[1..];
                        }
                    }
                    self.finish_line(&mut out)?;
                }
                None => {
                    self.push_line_bytes(chunk)?;
                    break;
                }
            }
        }
        Ok(out)
    }

    /// End of input: an unterminated last line counts as complete, and a
    /// pending event is dispatched (see the module docs).
    /// A last line that would push the event's data over its limit is
    /// dropped (with the event's data so far), as `feed` would have refused it.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() && self.finish_line(&mut out).is_err() {
            return None;
        }
        self.dispatch(&mut out);
        out.pop()
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > self.max_line {
            return Err(SseError::LineTooLong {
                limit: self.max_line,
            });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn finish_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut raw = std::mem::take(&mut self.line);
        if self.at_start {
            self.at_start = false;
            if raw.starts_with(&[0xEF, 0xBB, 0xBF]) {
                raw.drain(..3);
            }
        }
        if raw.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let line = String::from_utf8_lossy(&raw);
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "data" => {
                if self.data.len() + 1 + value.len() > self.max_data {
                    // Drop what was gathered: the event is refused whole.
                    self.data = String::new();
                    self.has_data = false;
                    return Err(SseError::EventTooLarge {
                        limit: self.max_data,
                    });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            // The spec ignores ids containing NUL.
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
        // Reuse the allocation for the next line.
        raw.clear();
        self.line = raw;
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        let retry = self.retry.take();
        if !self.has_data {
            self.data.clear();
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
            retry,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        let mut v = d.feed(input).unwrap();
        v.extend(d.finish());
        v
    }

    #[test]
    fn cr_split_from_lf_is_one_line_ending() {
        let mut d = SseDecoder::new();
        let mut v = d.feed(b"data: a\r").unwrap();
        v.extend(d.feed(b"\ndata: b\r\n\r\n").unwrap());
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].data, "a\nb");
    }

    #[test]
    fn bom_is_skipped_once() {
        let v = all(b"\xEF\xBB\xBFdata: x\n\n");
        assert_eq!(v[0].data, "x");
    }

    #[test]
    fn data_lines_of_one_event_are_capped() {
        // Endless short data lines without a blank line: refused with a
        // typed error once the joined data passes the cap, never buffered.
        let mut d = SseDecoder::new().with_max_data(1000);
        let line = b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n";
        let mut result = Ok(Vec::new());
        for _ in 0..100 {
            result = d.feed(line);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(SseError::EventTooLarge { limit: 1000 }));
        assert!(d.data.capacity() <= 1000, "{}", d.data.capacity());
        // Within the cap, events still pass.
        let mut d = SseDecoder::new().with_max_data(1000);
        let v = d.feed(b"data: a\ndata: b\n\n").unwrap();
        assert_eq!(v[0].data, "a\nb");
        assert!(!SseError::EventTooLarge { limit: 1 }.is_retryable());
    }

    #[test]
    fn event_without_data_is_not_dispatched() {
        let v = all(b"event: ping\n\ndata: y\n\n");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].event, None);
        assert_eq!(v[0].data, "y");
    }
}
