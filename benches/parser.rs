//! Parser throughput (criterion). Inputs are generated deterministically here.
//!
//! ```text
//! cargo bench --bench parser -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Groups:
//! - `parser/chunks`: a ~1 MiB realistic response (thinking, prose with stray
//!   `<`, an install block, a sandbox of ~100 code files full of `<`, commands,
//!   done) fed in chunks of 1, 16, 256, 4096 characters and whole; plus
//!   `memchr_lt`, a `memchr` scan for every `<` of the same bytes (the physical
//!   reference: the parser must at least stop at each `<`).
//! - `parser/file_size`: one file of 10 KiB vs 10 MiB at 4096-char chunks
//!   (per-byte cost must not depend on file size).
//!
//! Chunks are cut before the timed loop; the output `Vec` is reused (cleared).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use edward_parser::{Event, Parser};

/// splitmix64, for deterministic variety.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "state", "render", "count", "items", "value", "props", "index", "filter", "todo", "list",
    "button", "handler", "event", "result", "config", "theme", "layout", "route",
];

/// ~10 KiB of code-like text: JSX tags, comparisons, generics, shifts.
fn code_file(rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 256);
    s.push_str("import { useState } from \"react\";\n\n");
    while s.len() < target {
        let a = rng.pick(WORDS);
        let b = rng.pick(WORDS);
        match rng.next() % 6 {
            0 => s.push_str(&format!(
                "export function {a}{b}({{ {a}, {b} }}: Props<{a}>) {{\n  return <div className=\"{a}\"><span>{{{b}}}</span></div>;\n}}\n"
            )),
            1 => s.push_str(&format!(
                "  if ({a} < {b} && {b} <= limit) {{ {a} = {a} << 1; }}\n"
            )),
            2 => s.push_str(&format!(
                "  const {a}List = {b}.map((x) => <li key={{x.id}}>{{x.{a}}}</li>);\n"
            )),
            3 => s.push_str(&format!(
                "  // {a} {b}: keep the {a} in sync with {b} (see docs)\n"
            )),
            4 => s.push_str(&format!(
                "  const {a}: Map<string, Array<{b}>> = new Map();\n"
            )),
            _ => s.push_str(&format!(
                "  for (let i = 0; i < {a}.length; i++) {{ total += {a}[i] * {b}; }}\n"
            )),
        }
    }
    s
}

/// A realistic ~1 MiB model response.
fn corpus() -> String {
    let mut rng = Rng(42);
    let mut s = String::with_capacity(1 << 21);
    s.push_str("<Thinking>\n");
    for _ in 0..20 {
        s.push_str("The user wants a todo app. I need a list where 0 <= index < items.length, ");
        s.push_str("and a form; a < b comparisons in filters. Use <ul> and <li> elements.\n");
    }
    s.push_str("</Thinking>\n");
    for _ in 0..10 {
        s.push_str("I'll create the app now. Note that x<y and a < b are fine in prose; ");
        s.push_str("tags like <div> stay text here.\n");
    }
    s.push_str("<edward_install>\nframework: react\n- react@^18.2.0\n- react-dom@^18.2.0\n- zod\n- clsx\n</edward_install>\n");
    s.push_str("<edward_sandbox project=\"todo\" base=\"vite-react\">\n");
    let mut i = 0;
    while s.len() < 1024 * 1024 - 12 * 1024 {
        let fenced = i % 4 == 0;
        s.push_str(&format!(
            "<file path=\"src/components/{}{i}.tsx\">\n",
            rng.pick(WORDS)
        ));
        if fenced {
            s.push_str("```tsx\n");
        }
        s.push_str(&code_file(&mut rng, 10 * 1024));
        if fenced {
            s.push_str("```\n");
        }
        s.push_str("</file>\n");
        i += 1;
    }
    s.push_str("</edward_sandbox>\n");
    s.push_str("<edward_command command=\"npm\" args='[\"run\",\"build\"]'/>\n");
    s.push_str("<edward_web_search query=\"react todo a11y\" max_results=\"3\"/>\n");
    s.push_str("All done.\n<edward_done/>\n");
    s
}

fn single_file(size: usize) -> String {
    let mut rng = Rng(7);
    let mut s = String::from("<edward_sandbox><file path=\"src/big.tsx\">\n");
    s.push_str(&code_file(&mut rng, size));
    s.push_str("</file></edward_sandbox>");
    s
}

/// Cut into chunks of `n` characters (`None`: whole).
fn chunks(input: &str, n: Option<usize>) -> Vec<&str> {
    let Some(n) = n else {
        return vec![input];
    };
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let end = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        let (a, b) = rest.split_at(end);
        out.push(a);
        rest = b;
    }
    out
}

fn run(chunks: &[&str], out: &mut Vec<Event>) -> usize {
    let mut parser = Parser::new();
    let mut events = 0;
    for c in chunks {
        parser.feed(c, out);
        events += out.len();
        out.clear();
    }
    parser.finish(out);
    events += out.len();
    out.clear();
    events
}

fn bench_chunks(c: &mut Criterion) {
    let input = corpus();
    let mut group = c.benchmark_group("parser/chunks");
    group.throughput(Throughput::Bytes(input.len() as u64));
    let mut out = Vec::with_capacity(1024);
    for (name, n) in [
        ("1", Some(1)),
        ("16", Some(16)),
        ("256", Some(256)),
        ("4096", Some(4096)),
        ("whole", None),
    ] {
        let pieces = chunks(&input, n);
        group.bench_with_input(BenchmarkId::new("feed", name), &pieces, |b, pieces| {
            b.iter(|| black_box(run(black_box(pieces), &mut out)));
        });
    }
    // Stop at every `<`, as the parser must (`count()` would not: memchr
    // counts without stopping).
    group.bench_function("memchr_lt", |b| {
        b.iter(|| {
            let mut acc = 0usize;
            for i in edward_parser::__memchr::memchr_iter(b'<', black_box(input.as_bytes())) {
                acc ^= black_box(i);
            }
            acc
        });
    });
    group.finish();
}

fn bench_file_size(c: &mut Criterion) {
    let mut group = c.benchmark_group("parser/file_size");
    let mut out = Vec::with_capacity(1024);
    for (name, size) in [("10KiB", 10 * 1024), ("10MiB", 10 * 1024 * 1024)] {
        let input = single_file(size);
        let pieces = chunks(&input, Some(4096));
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_with_input(BenchmarkId::new("file_4096", name), &pieces, |b, pieces| {
            b.iter(|| black_box(run(black_box(pieces), &mut out)));
        });
    }
    group.finish();
}

criterion_group!(benches, bench_chunks, bench_file_size);
criterion_main!(benches);
