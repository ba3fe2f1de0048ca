//! Property tests (PROTOCOL.md §6).
//!
//! Every chunked parse runs through both APIs (owned `feed`, borrowing
//! `feed_with`) and checks they give the same events, unmerged.
//!
//! 1. `junk_streams`: streams mixing every tag, partial tags, junk `<`, CRLF,
//!    fences and Unicode. Every chunking gives the same merged events; the
//!    hold-back stays under the cap; and the accounting holds: content and
//!    skipped bytes never exceed the input, and the content events, in order,
//!    are non-overlapping substrings of the input (nothing is invented,
//!    duplicated or reordered).
//! 2. `well_formed_streams`: streams built from a grammar that also builds the
//!    exact expected events. Every chunking reproduces them exactly, which
//!    accounts for every content byte of the input (everything else is tag
//!    syntax or the dropped newline after `<file>`).

use edward_parser::{Event, EventRef, MAX_BUFFERED, Parser, merge_content, parse_all};
use proptest::prelude::*;
use proptest::sample::select;

/// Cut `input` into chunks whose lengths (in chars) cycle through `cuts`.
fn cut<'a>(input: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = cuts.get(i % cuts.len().max(1)).copied().unwrap_or(1).max(1);
        i += 1;
        let end = rest.char_indices().nth(n).map_or(rest.len(), |(j, _)| j);
        let (a, b) = rest.split_at(end);
        out.push(a);
        rest = b;
    }
    out
}

/// Parse `chunks` with the owned API and the borrowing one; both must give
/// the same (unmerged) events.
fn parse_chunks(chunks: &[&str]) -> Vec<Event> {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut borrowing = Parser::new();
    let mut borrowed = Vec::new();
    for c in chunks {
        parser.feed(c, &mut events);
        borrowing.feed_with(c, |e: EventRef<'_>| borrowed.push(e.to_event()));
        assert!(parser.buffered_len() <= MAX_BUFFERED);
        assert!(borrowing.buffered_len() <= MAX_BUFFERED);
    }
    parser.finish(&mut events);
    borrowing.finish_with(|e: EventRef<'_>| borrowed.push(e.to_event()));
    assert_eq!(&borrowed, &events, "borrowing and owned APIs differ");
    events
}

/// Content events of a borrowing parse that are neither a slice of the chunk
/// being fed nor a held tag candidate (which starts with `<`). `files`: check
/// file content too (only valid when no file opens with a newline-less fence
/// or a lone `\r`, whose bytes the file filter holds).
fn copied_content(chunks: &[&str], files: bool) -> Vec<String> {
    let mut parser = Parser::new();
    let mut copied = Vec::new();
    for c in chunks {
        let range = c.as_bytes().as_ptr_range();
        parser.feed_with(c, |e: EventRef<'_>| {
            let content = match e {
                EventRef::Text { content } | EventRef::ThinkingContent { content } => content,
                EventRef::FileContent { content } if files => content,
                _ => return,
            };
            let inside = range.contains(&content.as_ptr())
                && content.as_bytes().as_ptr_range().end <= range.end;
            if !inside && !content.starts_with('<') {
                copied.push(content.to_string());
            }
        });
    }
    copied
}

fn content_of(e: &Event) -> Option<&str> {
    match e {
        Event::Text { content }
        | Event::ThinkingContent { content }
        | Event::FileContent { content } => Some(content),
        _ => None,
    }
}

const FRAGMENTS: &[&str] = &[
    "<Thinking>",
    "</Thinking>",
    "<THINKING>",
    "<thinking/>",
    "<edward_sandbox project=\"p\" base='b'>",
    "<edward_sandbox>",
    "</edward_sandbox>",
    "<edward_sandbox/>",
    "<file path=\"src/a.ts\">",
    "<FILE path=src/b.ts>\n",
    "<file path=\"/abs\">",
    "<file>",
    "<file path=\"c.txt\"/>",
    "</file>",
    "</FILE >",
    "<edward_install>",
    "</edward_install>",
    "react\n",
    "- zod@3\n",
    "framework: vite\n",
    "Bad Pkg\n",
    "<edward_command command=\"ls\" args='[\"-la\"]'/>",
    "<edward_command command=\"npm\" args=\"[\\\"run\\\"]\">",
    "<edward_command args=\"x\"/>",
    "</edward_command>",
    "<edward_web_search query=\"q > r\" max_results=\"9\"/>",
    "<edward_web_search maxResults=2 query=&quot;x&quot; />",
    "<edward_done/>",
    "<edward_done>",
    "</edward_done>",
    "</edward_url_scrape>",
    "<edward_",
    "<edward_sand",
    "<fil",
    "</fi",
    "</",
    "<",
    "<<",
    "a < b",
    "x<y",
    "<div class=\"a\">",
    "</div>",
    "<Response>",
    "<filename>",
    "\n",
    "\r\n",
    "\r",
    "```ts\n",
    "```\n",
    "```",
    "é",
    "😀",
    "日本",
    "text ",
    "&amp;",
    "\"",
    "'",
    "\\\"",
    "=",
    ">",
    "/>",
    " ",
    "\t",
];

fn junk_stream() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => select(FRAGMENTS).prop_map(str::to_string),
        1 => "[a-zé<>/=\"' \\n`\\\\]{0,6}",
    ];
    prop::collection::vec(piece, 0..48).prop_map(|v| v.concat())
}

/// Chunk lengths: mostly token-sized, sometimes past the borrowing API's
/// short-chunk fast path (128 bytes) and its eight-byte scan windows.
fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![3 => 1usize..24, 1 => 24usize..160], 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn junk_streams(input in junk_stream(), cuts in cuts()) {
        let whole = parse_all(&input);
        prop_assert_eq!(&merge_content(parse_chunks(&[&input])), &whole);
        let chunked = merge_content(parse_chunks(&cut(&input, &cuts)));
        prop_assert_eq!(&chunked, &whole);
        let one_char = merge_content(parse_chunks(&cut(&input, &[1])));
        prop_assert_eq!(&one_char, &whole);
        // Zero copy: text and thinking content is lent from the chunk.
        prop_assert_eq!(copied_content(&cut(&input, &cuts), false), Vec::<String>::new());
        prop_assert_eq!(copied_content(&[&input], false), Vec::<String>::new());

        // Accounting. Unmerged events of a whole-input feed emit each run of
        // content as one slice of the input, so every content event must be
        // found, in order and without overlap, in the input.
        let mut parser = Parser::new();
        let mut events = Vec::new();
        parser.feed(&input, &mut events);
        parser.finish(&mut events);
        let mut cursor = 0;
        let mut total = 0u64;
        for e in &events {
            if let Some(c) = content_of(e) {
                prop_assert!(!c.is_empty(), "empty content event");
                let found = input[cursor..].find(c);
                prop_assert!(found.is_some(), "content {:?} not found after byte {} of {:?}", c, cursor, input);
                cursor += found.unwrap_or(0) + c.len();
                total += c.len() as u64;
            }
            if let Event::Error { skipped_bytes: Some(n), .. } = e {
                total += n;
            }
        }
        prop_assert!(total <= input.len() as u64);
        // Without any `<` nothing can be a tag: everything is text.
        if !input.contains('<') {
            prop_assert_eq!(whole, if input.is_empty() { vec![] } else { vec![Event::Text { content: input.clone() }] });
        }
    }
}

// ---------------------------------------------------------------------------
// Well-formed streams with known events.

/// Text atoms that are content in every state (no tag can form across them:
/// none ends with `<`, none starts with a name character after a `<`).
const SAFE_TEXT: &[&str] = &[
    "a < b",
    "x<y ",
    "<div>",
    "</div>",
    "<edward_x>",
    "</edward_y>",
    "<Response>",
    "<filex>",
    "</filex>",
    "<thinkingx>",
    "<edward_sandboxes>",
    "héllo",
    "😀",
    "日本",
    " ",
    "\n",
    "\r\n",
    "&amp;",
    "\"q\"",
    "'s",
    ">",
    "=",
    "/",
    "word",
];

fn safe_text() -> impl Strategy<Value = String> {
    prop::collection::vec(select(SAFE_TEXT), 1..6).prop_map(|v| v.concat())
}

fn name_case() -> impl Strategy<Value = fn(&str) -> String> {
    select(vec![
        (|s: &str| s.to_string()) as fn(&str) -> String,
        |s: &str| s.to_uppercase(),
        |s: &str| {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        },
    ])
}

#[derive(Debug, Clone)]
struct Piece {
    text: String,
    events: Vec<Event>,
}

fn text_piece(kind: fn(String) -> Event) -> impl Strategy<Value = Piece> {
    safe_text().prop_map(move |t| Piece {
        events: vec![kind(t.clone())],
        text: t,
    })
}

fn file_piece() -> impl Strategy<Value = Piece> {
    (
        "[a-z]{1,8}(/[a-z0-9_-]{1,8}){0,2}\\.(ts|tsx|css|html)",
        any::<bool>(),
        any::<bool>(),
        safe_text(),
        name_case(),
    )
        .prop_map(|(path, newline, crlf, body, case)| {
            // The body starts with a letter so it is neither a newline to drop
            // nor a fence.
            let body = format!("B{body}");
            let nl = match (newline, crlf) {
                (false, _) => "",
                (true, false) => "\n",
                (true, true) => "\r\n",
            };
            Piece {
                text: format!(
                    "<{} path=\"./{path}\">{nl}{body}</{}>",
                    case("file"),
                    case("file")
                ),
                events: vec![
                    Event::FileStart { path },
                    Event::FileContent { content: body },
                    Event::FileEnd,
                ],
            }
        })
}

fn command_piece() -> impl Strategy<Value = Piece> {
    (
        "[a-z]{1,6}",
        prop::collection::vec("[a-z0-9 ._-]{0,6}", 0..4),
        name_case(),
    )
        .prop_map(|(command, args, case)| {
            let json: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
            Piece {
                text: format!(
                    "<{} command=\"{command}\" args='[{}]'/>",
                    case("edward_command"),
                    json.join(",")
                ),
                events: vec![Event::Command { command, args }],
            }
        })
}

fn search_piece() -> impl Strategy<Value = Piece> {
    ("[a-z][a-z <>&]{0,10}", 0u8..12).prop_map(|(query, n)| Piece {
        text: format!(
            "<edward_web_search query=\"{}\" max_results=\"{n}\"/>",
            query.replace('&', "&amp;")
        ),
        events: vec![Event::WebSearch {
            query,
            max_results: n.clamp(1, 8),
        }],
    })
}

fn install_piece() -> impl Strategy<Value = Piece> {
    (
        prop::collection::btree_set("[a-z][a-z0-9-]{0,8}", 0..6),
        any::<bool>(),
    )
        .prop_map(|(deps, bullets)| {
            let deps: Vec<String> = deps.into_iter().collect();
            let lines: String = deps
                .iter()
                .map(|d| {
                    if bullets {
                        format!("- {d}\n")
                    } else {
                        format!("{d}\n")
                    }
                })
                .collect();
            Piece {
                text: format!("<edward_install>\n{lines}</edward_install>"),
                events: vec![
                    Event::InstallStart,
                    Event::InstallContent {
                        dependencies: deps,
                        framework: None,
                    },
                    Event::InstallEnd,
                ],
            }
        })
}

fn concat(
    open: String,
    open_events: Vec<Event>,
    inner: Vec<Piece>,
    close: &str,
    close_event: Event,
) -> Piece {
    let mut text = open;
    let mut events = open_events;
    for p in inner {
        text.push_str(&p.text);
        events.extend(p.events);
    }
    text.push_str(close);
    events.push(close_event);
    Piece { text, events }
}

fn sandbox_piece() -> impl Strategy<Value = Piece> {
    let item = prop_oneof![
        3 => file_piece(),
        2 => text_piece(|content| Event::Text { content }),
        1 => command_piece(),
        1 => search_piece(),
        1 => install_piece(),
    ];
    ("[a-z]{0,6}", prop::collection::vec(item, 0..6), name_case()).prop_map(
        |(project, items, case)| {
            concat(
                format!("<{} project=\"{project}\">", case("edward_sandbox")),
                vec![Event::SandboxStart {
                    project: Some(project),
                    base: None,
                }],
                items,
                &format!("</{}>", case("edward_sandbox")),
                Event::SandboxEnd,
            )
        },
    )
}

fn thinking_piece() -> impl Strategy<Value = Piece> {
    (safe_text(), name_case()).prop_map(|(t, case)| Piece {
        text: format!("<{}>{t}</{}>", case("Thinking"), case("thinking")),
        events: vec![
            Event::ThinkingStart,
            Event::ThinkingContent { content: t },
            Event::ThinkingEnd,
        ],
    })
}

fn well_formed() -> impl Strategy<Value = Piece> {
    let block = prop_oneof![
        3 => text_piece(|content| Event::Text { content }),
        2 => thinking_piece(),
        3 => sandbox_piece(),
        1 => command_piece(),
        1 => search_piece(),
        1 => install_piece(),
        1 => Just(Piece { text: "<edward_done/>".into(), events: vec![Event::Done] }),
    ];
    prop::collection::vec(block, 0..8).prop_map(|blocks| {
        let mut text = String::new();
        let mut events = Vec::new();
        for b in blocks {
            text.push_str(&b.text);
            events.extend(b.events);
        }
        Piece { text, events }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn well_formed_streams(piece in well_formed(), cuts in cuts()) {
        let expected = merge_content(piece.events.clone());
        prop_assert_eq!(&parse_all(&piece.text), &expected, "stream {:?}", piece.text);
        let chunked = merge_content(parse_chunks(&cut(&piece.text, &cuts)));
        prop_assert_eq!(&chunked, &expected);
        // Zero copy: all content, file bodies included, is lent from the chunk.
        prop_assert_eq!(copied_content(&cut(&piece.text, &cuts), true), Vec::<String>::new());
        prop_assert_eq!(copied_content(&[&piece.text], true), Vec::<String>::new());
    }
}

// ---------------------------------------------------------------------------
// Boundaries: the install body limit (the rest is re-read in the enclosing
// state) and the fence window (holding switches to streaming).

const EDGE_FRAGMENTS: &[&str] = &[
    "<edward_install>",
    "</edward_install>",
    "<edward_i",
    "<edward_done/>",
    "<Thinking>t</Thinking>",
    "</edward_sandbox>",
    "<file path=\"a\">f</file>",
    "<edward_",
    "<",
    "é",
    "😀",
    "\n",
    "\r\n",
    "```",
    "```\n",
    "\n```",
    "``",
    "</file>",
    "</fil",
    "x",
    "react\n",
];

fn edge_tail() -> impl Strategy<Value = String> {
    prop::collection::vec(select(EDGE_FRAGMENTS), 0..8).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn install_limit_boundaries(
        in_sandbox in any::<bool>(),
        short in 0usize..24,
        filler in select(&["a", "é", "😀"][..]),
        tail in edge_tail(),
        cuts in cuts(),
    ) {
        let open = if in_sandbox { "<edward_sandbox><edward_install>" } else { "<edward_install>" };
        let mut body = String::new();
        while body.len() + filler.len() <= edward_parser::MAX_INSTALL_BODY - short {
            body.push_str(filler);
        }
        let input = format!("{open}{body}{tail}");
        let whole = parse_all(&input);
        prop_assert_eq!(&merge_content(parse_chunks(&cut(&input, &cuts))), &whole);
        prop_assert_eq!(&merge_content(parse_chunks(&cut(&input, &[1, 2, 3]))), &whole);
    }

    #[test]
    fn fence_window_boundaries(
        short in 0usize..12,
        filler in select(&["x", "é\n", "😀"][..]),
        tail in edge_tail(),
        cuts in cuts(),
    ) {
        let mut body = String::new();
        while body.len() + filler.len() <= edward_parser::FENCE_WINDOW - short {
            body.push_str(filler);
        }
        let input = format!("<edward_sandbox><file path=\"a\">\n```ts\n{body}{tail}</file></edward_sandbox>");
        let whole = parse_all(&input);
        prop_assert_eq!(&merge_content(parse_chunks(&cut(&input, &cuts))), &whole);
        prop_assert_eq!(&merge_content(parse_chunks(&cut(&input, &[7, 1, 64]))), &whole);
        // nothing lost: content + fence lines + tag syntax = input
        let content: usize = whole.iter().filter_map(content_of).map(str::len).sum();
        prop_assert!(content <= input.len());
        prop_assert!(content + 200 >= body.len() + tail.len());
    }
}
