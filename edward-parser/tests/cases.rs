//! Data-driven cases: `tests/cases/NAME.txt` is a stream, `NAME.jsonl` the
//! expected events (merged with `merge_content`), one JSON object per line.
//! Every case is checked whole and cut into chunks of 1, 2, 3, 7 and 64
//! characters, through both APIs (owned `feed` and borrowing `feed_with` must
//! give the same events, unmerged). `UPDATE_SNAPSHOTS=1 cargo test --test cases` rewrites the
//! `.jsonl` files (review the diff by hand before committing).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use edward_parser::{Event, EventRef, MAX_BUFFERED, Parser, merge_content};

fn chunks(input: &str, chars: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let end = rest
            .char_indices()
            .nth(chars)
            .map_or(rest.len(), |(i, _)| i);
        let (a, b) = rest.split_at(end);
        out.push(a);
        rest = b;
    }
    out
}

fn run(pieces: &[&str]) -> Vec<Event> {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut borrowing = Parser::new();
    let mut borrowed = Vec::new();
    for p in pieces {
        parser.feed(p, &mut events);
        borrowing.feed_with(p, |e: EventRef<'_>| borrowed.push(e.to_event()));
        assert!(parser.buffered_len() <= MAX_BUFFERED);
        assert_eq!(borrowing.buffered_len(), parser.buffered_len());
    }
    parser.finish(&mut events);
    borrowing.finish_with(|e: EventRef<'_>| borrowed.push(e.to_event()));
    assert_eq!(parser.buffered_len(), 0);
    assert_eq!(borrowing.buffered_len(), 0);
    assert_eq!(borrowed, events, "borrowing and owned APIs differ");
    merge_content(events)
}

fn to_jsonl(events: &[Event]) -> String {
    let mut s = String::new();
    for e in events {
        let _ = writeln!(s, "{}", e.to_json());
    }
    s
}

fn case_inputs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("tests/cases exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn cases() {
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1");
    let inputs = case_inputs();
    assert!(inputs.len() >= 80, "only {} cases", inputs.len());
    let mut failures = Vec::new();
    for input_path in &inputs {
        let name = input_path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let input = fs::read_to_string(input_path).expect("case input is UTF-8");
        let whole = run(&[&input]);
        for size in [1, 2, 3, 7, 64] {
            let got = run(&chunks(&input, size));
            if got != whole {
                failures.push(format!(
                    "{name}: chunk size {size} differs from whole input\n--- whole\n{}--- chunked\n{}",
                    to_jsonl(&whole),
                    to_jsonl(&got)
                ));
            }
        }
        let actual = to_jsonl(&whole);
        let expected_path = input_path.with_extension("jsonl");
        if update {
            fs::write(&expected_path, &actual).expect("write snapshot");
            continue;
        }
        match fs::read_to_string(&expected_path) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!(
                "{name}: events differ\n--- expected\n{expected}--- actual\n{actual}"
            )),
            Err(_) => failures.push(format!("{name}: missing {}", expected_path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[cfg(feature = "serde")]
#[test]
fn snapshots_are_valid_serde_json() {
    for input_path in case_inputs() {
        let Ok(expected) = fs::read_to_string(input_path.with_extension("jsonl")) else {
            continue;
        };
        for line in expected.lines() {
            let event: Event = serde_json::from_str(line).expect(line);
            assert_eq!(serde_json::to_string(&event).unwrap(), line);
        }
    }
}
