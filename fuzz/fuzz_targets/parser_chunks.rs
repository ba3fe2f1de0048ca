//! The whole parser under a chunking derived from the input, through both
//! APIs: no panic, the borrowing API (`feed_with`) gives the same events as
//! the owned one (`feed`), the merged events equal the whole-input parse
//! (both APIs fed the whole input too), the hold-back stays under the cap,
//! and content + skipped bytes never exceed the input.
#![no_main]

use edward_parser::{Event, EventRef, MAX_BUFFERED, Parser, merge_content, parse_all};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First bytes pick the cut lengths (in chars); the rest is the stream.
    let (control, body) = data.split_at(data.len().min(8));
    let input = String::from_utf8_lossy(body);
    let whole = parse_all(&input);

    // whole input, owned and borrowing
    let mut parser = Parser::new();
    let mut events: Vec<Event> = Vec::new();
    parser.feed(&input, &mut events);
    parser.finish(&mut events);
    let mut borrowed: Vec<Event> = Vec::new();
    parser.feed_with(&input, |e: EventRef<'_>| borrowed.push(e.to_event()));
    parser.finish_with(|e: EventRef<'_>| borrowed.push(e.to_event()));
    assert_eq!(borrowed, events);
    assert_eq!(merge_content(events), whole);

    let mut parser = Parser::new();
    let mut events: Vec<Event> = Vec::new();
    let mut borrowing = Parser::new();
    let mut borrowed: Vec<Event> = Vec::new();
    let mut rest: &str = &input;
    let mut i = 0usize;
    while !rest.is_empty() {
        // 1..=17 chars, or (control byte ≥ 0xf0) 17..=152: past the borrowing
        // API's short-chunk fast path and its eight-byte scan windows
        let c = control.get(i % control.len().max(1)).copied().unwrap_or(7);
        let len = if c >= 0xf0 {
            usize::from(c & 0x0f) * 9 + 17
        } else {
            usize::from(c % 17) + 1
        };
        i += 1;
        let end = rest.char_indices().nth(len).map_or(rest.len(), |(j, _)| j);
        let (chunk, tail) = rest.split_at(end);
        parser.feed(chunk, &mut events);
        borrowing.feed_with(chunk, |e: EventRef<'_>| borrowed.push(e.to_event()));
        assert!(parser.buffered_len() <= MAX_BUFFERED);
        assert_eq!(borrowing.buffered_len(), parser.buffered_len());
        rest = tail;
    }
    parser.finish(&mut events);
    borrowing.finish_with(|e: EventRef<'_>| borrowed.push(e.to_event()));
    assert_eq!(parser.buffered_len(), 0);
    assert_eq!(borrowed, events);
    let merged = merge_content(events);
    assert_eq!(merged, whole);

    let mut accounted = 0u64;
    for e in &whole {
        match e {
            Event::Text { content }
            | Event::ThinkingContent { content }
            | Event::FileContent { content } => {
                assert!(!content.is_empty());
                accounted += content.len() as u64;
            }
            Event::Error {
                skipped_bytes: Some(n),
                ..
            } => accounted += n,
            _ => {}
        }
        // the hand-written JSON is always valid enough to round-trip the type
        assert!(
            e.to_json()
                .starts_with(&format!("{{\"type\":\"{}\"", e.kind()))
        );
    }
    assert!(accounted <= input.len() as u64);
});
