//! The SSE decoder: line endings, multi-line data, comments, fields, chunk
//! boundaries anywhere (inside lines, inside CRLF, inside UTF-8
//! characters), end of input, and the line bound.
#![cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]

use edward_core::providers::sse::{SseDecoder, SseError, SseEvent};

fn decode_whole(input: &[u8]) -> Vec<SseEvent> {
    let mut d = SseDecoder::new();
    let mut v = d.feed(input).unwrap();
    v.extend(d.finish());
    v
}

/// Decode `input` split at every pair of positions (three chunks).
fn assert_chunk_invariant(input: &[u8]) {
    let expected = decode_whole(input);
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let mut d = SseDecoder::new();
            let mut v = d.feed(&input[..i]).unwrap();
            v.extend(d.feed(&input[i..j]).unwrap());
            v.extend(d.feed(&input[j..]).unwrap());
            v.extend(d.finish());
            assert_eq!(v, expected, "split at {i},{j}");
        }
    }
}

fn ev(event: Option<&str>, data: &str) -> SseEvent {
    SseEvent {
        event: event.map(str::to_owned),
        data: data.to_owned(),
        id: None,
        retry: None,
    }
}

#[test]
fn lf_crlf_and_cr_line_endings_are_equivalent() {
    for eol in ["\n", "\r\n", "\r"] {
        let input = format!("event: a{eol}data: 1{eol}{eol}data: 2{eol}{eol}");
        assert_eq!(
            decode_whole(input.as_bytes()),
            vec![ev(Some("a"), "1"), ev(None, "2")],
            "eol {eol:?}"
        );
    }
}

#[test]
fn multi_line_data_is_joined_with_newline() {
    let v = decode_whole(b"data: line one\ndata:line two\ndata\ndata:  three\n\n");
    assert_eq!(v, vec![ev(None, "line one\nline two\n\n three")]);
}

#[test]
fn comments_and_unknown_fields_are_ignored() {
    let v = decode_whole(b": keep-alive\n\n:another\nfoo: bar\ndata: x\n: inside\n\n");
    assert_eq!(v, vec![ev(None, "x")]);
}

#[test]
fn id_persists_and_retry_is_per_event() {
    let v = decode_whole(b"id: 7\nretry: 1500\ndata: a\n\ndata: b\n\nretry: soon\ndata: c\n\n");
    assert_eq!(v[0].id.as_deref(), Some("7"));
    assert_eq!(v[0].retry, Some(1500));
    assert_eq!(v[1].id.as_deref(), Some("7"));
    assert_eq!(v[1].retry, None);
    assert_eq!(v[2].retry, None);
}

#[test]
fn done_marker() {
    let v = decode_whole(b"data: [DONE]\n\n");
    assert!(v[0].is_done());
    assert!(!ev(None, "[DONE] no").is_done());
}

#[test]
fn final_event_without_blank_line_is_dispatched_at_eof() {
    assert_eq!(decode_whole(b"data: last\n"), vec![ev(None, "last")]);
    // Even without the final line terminator.
    assert_eq!(decode_whole(b"data: [DONE]"), vec![ev(None, "[DONE]")]);
    // Nothing pending: nothing dispatched.
    assert_eq!(decode_whole(b"data: x\n\n: bye"), vec![ev(None, "x")]);
}

#[test]
fn every_split_gives_the_same_events() {
    assert_chunk_invariant(
        "event: message\r\ndata: {\"t\":\"héllo ✓ 🦀\"}\r\n\r\n: c\rdata: a\rdata: b\r\r\ndata: [DONE]\n\n"
            .as_bytes(),
    );
}

#[test]
fn utf8_split_inside_a_character() {
    let text = "🦀✓é";
    let input = format!("data: {text}\n\n");
    let bytes = input.as_bytes();
    for i in 7..bytes.len() - 2 {
        let mut d = SseDecoder::new();
        let mut v = d.feed(&bytes[..i]).unwrap();
        assert!(v.is_empty());
        v.extend(d.feed(&bytes[i..]).unwrap());
        assert_eq!(v, vec![ev(None, text)], "split at {i}");
    }
}

#[test]
fn crlf_split_between_cr_and_lf_is_one_line_ending() {
    let mut d = SseDecoder::new();
    let mut v = d.feed(b"data: a\r").unwrap();
    v.extend(d.feed(b"\n").unwrap());
    v.extend(d.feed(b"\r").unwrap());
    v.extend(d.feed(b"\n").unwrap());
    assert_eq!(v, vec![ev(None, "a")]);
}

#[test]
fn invalid_utf8_is_replaced_not_dropped() {
    let v = decode_whole(b"data: a\xFFb\n\n");
    assert_eq!(v[0].data, "a\u{FFFD}b");
}

#[test]
fn overlong_line_is_an_error() {
    let mut d = SseDecoder::with_max_line(16);
    assert!(d.feed(b"data: 0123456789").is_ok());
    assert_eq!(
        d.feed(b"abc").unwrap_err(),
        SseError::LineTooLong { limit: 16 }
    );
    // Lines within the bound keep working in a fresh decoder; the limit is per line.
    let mut d = SseDecoder::with_max_line(16);
    for _ in 0..100 {
        assert_eq!(d.feed(b"data: 0123456\n\n").unwrap().len(), 1);
    }
}

#[test]
fn default_limit_is_one_mebibyte() {
    let mut d = SseDecoder::new();
    let big = vec![b'x'; 1024 * 1024];
    assert!(matches!(
        d.feed(b"data: ").and_then(|_| d.feed(&big)),
        Err(SseError::LineTooLong { limit: 1_048_576 })
    ));
}

/// Throughput of the decoder on an OpenAI-shaped stream fed in 1.5 KiB
/// network-sized chunks. Run with `--ignored --nocapture` (ideally `--release`).
#[test]
#[ignore]
fn decoder_throughput() {
    let event = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"héllo wörld ✓ \"},\"finish_reason\":null}]}\n\n";
    let body = event.repeat(200_000);
    let start = std::time::Instant::now();
    let mut d = SseDecoder::new();
    let mut n = 0usize;
    for chunk in body.as_bytes().chunks(1500) {
        n += d.feed(chunk).unwrap().len();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(n, 200_000);
    println!(
        "sse decoder: {} events, {:.1} MiB in {:.3} s = {:.1} MiB/s, {:.0} events/s",
        n,
        body.len() as f64 / 1048576.0,
        secs,
        body.len() as f64 / 1048576.0 / secs,
        n as f64 / secs
    );
}
