//! Bounded memory (PROTOCOL.md §6): a 100 MiB file body streamed in 64 KiB
//! chunks never makes the parser hold more than `MAX_BUFFERED` bytes, and
//! every content byte comes out.

use edward_parser::{Event, MAX_BUFFERED, Parser};

const TOTAL: usize = 100 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;

/// 64 KiB of code-like text full of `<` (JSX, comparisons, near-closers) but
/// without `</file` or `</edward_sandbox`.
fn block() -> String {
    let lines = [
        "export function Row({ a, b }) { return a < b ? <div className=\"x\">{a}</div> : <span/>; }\n",
        "if (i <= n && j<k) { x = y << 2; } // </fil </edward_ <edward_done/> <file path=\"x\">\n",
        "  <li key={i}>{\"é😀\"} &amp; &lt;</li>\n",
    ];
    let mut s = String::with_capacity(CHUNK);
    let mut i = 0;
    while s.len() < CHUNK {
        s.push_str(lines[i % lines.len()]);
        i += 1;
    }
    // cut at a char boundary at or below 64 KiB
    let mut end = CHUNK;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

/// Stream `open`, then `TOTAL` bytes of body, then `close`; returns
/// (file content bytes, max buffered, events other than file content).
fn stream(open: &str, close: &str, total: usize) -> (usize, usize, Vec<Event>) {
    let body = block();
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut content = 0usize;
    let mut max_buffered = 0usize;
    let mut others = Vec::new();
    let mut drain = |events: &mut Vec<Event>, content: &mut usize| {
        for e in events.drain(..) {
            match e {
                Event::FileContent { content: c } => *content += c.len(),
                other => others.push(other),
            }
        }
    };
    parser.feed(open, &mut events);
    let mut sent = 0;
    while sent < total {
        parser.feed(&body, &mut events);
        sent += body.len();
        max_buffered = max_buffered.max(parser.buffered_len());
        drain(&mut events, &mut content);
    }
    parser.feed(close, &mut events);
    parser.finish(&mut events);
    drain(&mut events, &mut content);
    (content, max_buffered, others)
}

fn body_len(total: usize) -> usize {
    let b = block().len();
    total.div_ceil(b) * b
}

#[test]
fn hundred_mib_file_streams_in_bounded_memory() {
    let (content, max_buffered, others) = stream(
        "<edward_sandbox><file path=\"big.jsx\">\n",
        "</file></edward_sandbox>",
        TOTAL,
    );
    assert!(max_buffered <= MAX_BUFFERED, "held {max_buffered} bytes");
    // Plain content is not held at all: only a `<` candidate at a chunk edge.
    assert!(
        max_buffered < 64,
        "held {max_buffered} bytes of a plain file"
    );
    assert_eq!(content, body_len(TOTAL));
    assert_eq!(
        others,
        [
            Event::SandboxStart {
                project: None,
                base: None
            },
            Event::FileStart {
                path: "big.jsx".into()
            },
            Event::FileEnd,
            Event::SandboxEnd,
        ]
    );
}

#[test]
fn twenty_mib_fenced_file_streams_in_bounded_memory() {
    let (content, max_buffered, others) = stream(
        "<edward_sandbox><file path=\"big.jsx\">\n```jsx\n",
        "\n```\n</file></edward_sandbox>",
        TOTAL / 5,
    );
    assert!(max_buffered <= MAX_BUFFERED, "held {max_buffered} bytes");
    // both fence lines dropped; the newline before the closing fence is content
    assert_eq!(content, body_len(TOTAL / 5) + 1);
    assert_eq!(others.len(), 4);
}
