//! Parse a model response from stdin and print its events.
//!
//! ```text
//! cargo run --release -p edward-parser --example parse -- [OPTIONS] < stream.txt
//!
//!   --chunk-size N        feed chunks of N characters (default 4096)
//!   --random-chunks SEED  feed chunks of 1..=64 characters, lengths drawn from
//!                         a splitmix64 generator seeded with SEED
//!   --summary             print only {"bytes":B,"events":E,"content_bytes":C,"elapsed_ns":T}
//!   -h, --help            print this help
//! ```
//!
//! The whole of stdin is read first (invalid UTF-8 is replaced with U+FFFD),
//! then fed to one parser and finished. By default every event is printed as
//! one JSON object per line, in emitted order, without merging adjacent content
//! events. `--summary` times feeding and finishing only, through the
//! borrowing API (`Parser::feed_with`, the fastest: no allocation per
//! event), and counts events and content bytes. Bad options print a message
//! on stderr and exit with status 2.

use std::io::{self, BufWriter, Read, Write};
use std::process::ExitCode;
use std::time::Instant;

use edward_parser::{EventRef, Parser};

const USAGE: &str = "usage: parse [--chunk-size N | --random-chunks SEED] [--summary] < stream.txt";

enum Chunking {
    Fixed(usize),
    Random(u64),
}

struct Options {
    chunking: Chunking,
    summary: bool,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut chunk_size: Option<usize> = None;
    let mut seed: Option<u64> = None;
    let mut summary = false;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone().or_else(|| args.next()) {
                Some(v) => Ok(v),
                None => Err(format!("{name} needs a value")),
            }
        };
        match flag.as_str() {
            "--chunk-size" => {
                let v = value("--chunk-size")?;
                let n: usize = v
                    .parse()
                    .map_err(|_| format!("--chunk-size: not a positive integer: {v:?}"))?;
                if n == 0 {
                    return Err("--chunk-size must be at least 1".into());
                }
                chunk_size = Some(n);
            }
            "--random-chunks" => {
                let v = value("--random-chunks")?;
                seed = Some(
                    v.parse()
                        .map_err(|_| format!("--random-chunks: not an unsigned integer: {v:?}"))?,
                );
            }
            "--summary" if inline.is_none() => summary = true,
            "-h" | "--help" if inline.is_none() => return Ok(None),
            _ => return Err(format!("unknown option {arg:?}")),
        }
    }
    let chunking = match (chunk_size, seed) {
        (Some(_), Some(_)) => {
            return Err("--chunk-size and --random-chunks cannot be combined".into());
        }
        (_, Some(seed)) => Chunking::Random(seed),
        (n, None) => Chunking::Fixed(n.unwrap_or(4096)),
    };
    Ok(Some(Options { chunking, summary }))
}

/// splitmix64: a tiny deterministic generator, enough to pick chunk lengths.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Cut `input` into chunks of characters (never inside a UTF-8 sequence).
fn split<'a>(input: &'a str, chunking: &Chunking) -> Vec<&'a str> {
    let mut rng = match chunking {
        Chunking::Random(seed) => Some(SplitMix64(*seed)),
        Chunking::Fixed(_) => None,
    };
    let mut chunks = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let chars = match (&mut rng, chunking) {
            (Some(rng), _) => (rng.next() % 64) as usize + 1,
            (None, Chunking::Fixed(n)) => *n,
            (None, Chunking::Random(_)) => 4096,
        };
        let end = rest
            .char_indices()
            .nth(chars)
            .map_or(rest.len(), |(i, _)| i);
        let (chunk, tail) = rest.split_at(end);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("parse: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut raw = Vec::new();
    if let Err(e) = io::stdin().lock().read_to_end(&mut raw) {
        eprintln!("parse: reading stdin: {e}");
        return ExitCode::FAILURE;
    }
    let input = String::from_utf8_lossy(&raw);
    let chunks = split(&input, &options.chunking);

    let stdout = io::stdout();
    let mut w = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut parser = Parser::new();
    let result = if options.summary {
        let mut count: u64 = 0;
        let mut content: u64 = 0;
        let mut on_event = |e: EventRef<'_>| {
            count += 1;
            if let Some(c) = e.content() {
                content += c.len() as u64;
            }
        };
        let started = Instant::now();
        for chunk in &chunks {
            parser.feed_with(chunk, &mut on_event);
        }
        parser.finish_with(&mut on_event);
        let elapsed = started.elapsed().as_nanos();
        writeln!(
            w,
            "{{\"bytes\":{},\"events\":{count},\"content_bytes\":{content},\"elapsed_ns\":{elapsed}}}",
            input.len()
        )
    } else {
        // Events are written as they come; the first write error stops the
        // output (the rest of the input is still parsed, cheaply).
        let mut line = String::new();
        let mut result: io::Result<()> = Ok(());
        let mut print = |e: EventRef<'_>| {
            if result.is_ok() {
                line.clear();
                e.write_json(&mut line);
                line.push('\n');
                result = w.write_all(line.as_bytes());
            }
        };
        for chunk in &chunks {
            parser.feed_with(chunk, &mut print);
        }
        parser.finish_with(&mut print);
        result
    };
    match result.and_then(|()| w.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // `parse | head` is fine.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("parse: writing stdout: {e}");
            ExitCode::FAILURE
        }
    }
}
