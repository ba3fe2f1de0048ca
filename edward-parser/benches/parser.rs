// Parser throughput and allocations (criterion). Inputs are generated
// deterministically here. Also compiled as the workspace root's
// `benches/parser.rs` (which `include!`s this file), so no inner attributes
// or `//!` docs here.
//
// ```text
// cargo bench -p edward-parser --bench parser -- --warm-up-time 1 --measurement-time 3
// ```
//
// Groups, each with chunk sizes 1, 16, 64, 256, 4096, 65536 characters and
// `whole` (the input in one call):
// - `parser/corpus`: a ~1 MiB realistic response (thinking, prose with stray
//   `<`, an install block, a sandbox of ~100 code files full of `<` — a
//   quarter of them fenced — commands, done).
// - `parser/file_10mib`: one 10 MiB unfenced code file in a sandbox.
//
// In each group, per chunk size:
// - `borrowed/N`: `Parser::feed_with` + `finish_with`; the callback counts
//   events and content bytes (nothing is copied).
// - `owned/N`: `Parser::feed` + `finish` into a reused `Vec<Event>`, cleared
//   after each call (so each event's `String`s are made and dropped).
// - `memchr/N`: the physical reference, a `memchr` scan that stops at every
//   `<` of the same chunks (the parser has to look at each one).
//
// Chunks are cut (by characters) before the timed loop. After the criterion
// output, two tables:
// - `fastest of N interleaved passes`: per (input, size), the three
//   contenders run one pass each, in turn, N times; the best time of each is
//   kept. On a machine shared with other work the minimum is the pass that
//   was least disturbed, and interleaving exposes all three to the same load,
//   so the ratios are far steadier than criterion's means there.
// - `allocations per pass`: one untimed pass per (input, size, API) with a
//   counting global allocator: allocations per MB, bytes allocated per MB and
//   the peak of live heap bytes during the pass (the parser's own memory plus
//   what the consumer keeps; the input and its chunk list exist before).
//
// Instruction counts (load-independent): with `EDWARD_PARSER_PASSES=INPUT,
// CHUNK,API,N` (INPUT `corpus` or `file_10mib`, CHUNK a size or `whole`, API
// `borrowed`, `owned` or `memchr`) the binary runs just N passes in
// `measured_passes` and exits, for
// `valgrind --tool=callgrind --toggle-collect='*measured_passes*' BINARY`;
// instructions per byte = the `Collected` count / (N * input bytes, printed).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use edward_parser::{Event, EventRef, Parser};

/// Counts allocations while `COUNTING` is set (a plain load otherwise, so the
/// timed benchmarks pay almost nothing for it).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static ALLOC_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grow(size: usize) {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            ALLOC_BYTES.fetch_add(size, Relaxed);
            let live = LIVE.fetch_add(size, Relaxed) + size;
            PEAK.fetch_max(live, Relaxed);
        }
    }
    fn shrink(size: usize) {
        if COUNTING.load(Relaxed) {
            // saturating: blocks allocated before counting began may be freed
            let _ = LIVE.fetch_update(Relaxed, Relaxed, |l| Some(l.saturating_sub(size)));
        }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::grow(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::shrink(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::grow(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::shrink(layout.size());
        Self::grow(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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

/// Code-like text of about `target` bytes: JSX tags, comparisons, generics, shifts.
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

/// One unfenced code file of about `size` bytes in a sandbox.
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

const SIZES: [(&str, Option<usize>); 7] = [
    ("1", Some(1)),
    ("16", Some(16)),
    ("64", Some(64)),
    ("256", Some(256)),
    ("4096", Some(4096)),
    ("65536", Some(65536)),
    ("whole", None),
];

/// The borrowing API; returns (events, content bytes).
fn borrowed(chunks: &[&str]) -> (usize, usize) {
    let mut parser = Parser::new();
    let mut events = 0;
    let mut bytes = 0;
    let mut on_event = |e: EventRef<'_>| {
        events += 1;
        if let Some(c) = e.content() {
            bytes += c.len();
        }
    };
    for c in chunks {
        parser.feed_with(c, &mut on_event);
    }
    parser.finish_with(&mut on_event);
    (events, bytes)
}

/// The owned API into a reused `Vec`; returns the number of events.
fn owned(chunks: &[&str], out: &mut Vec<Event>) -> usize {
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

/// Stop at every `<` of every chunk, as the parser must (`memchr`'s `count`
/// would not: it counts without stopping).
fn memchr_lt(chunks: &[&str]) -> usize {
    let mut acc = 0usize;
    for c in chunks {
        for i in edward_parser::__memchr::memchr_iter(b'<', c.as_bytes()) {
            acc ^= black_box(i);
        }
    }
    acc
}

fn bench_input(c: &mut Criterion, group_name: &str, input: &str, samples: usize) {
    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.sample_size(samples);
    let mut out = Vec::with_capacity(1024);
    for (name, n) in SIZES {
        let pieces = chunks(input, n);
        group.bench_with_input(BenchmarkId::new("borrowed", name), &pieces, |b, p| {
            b.iter(|| borrowed(black_box(p)));
        });
        group.bench_with_input(BenchmarkId::new("owned", name), &pieces, |b, p| {
            b.iter(|| owned(black_box(p), &mut out));
        });
        group.bench_with_input(BenchmarkId::new("memchr", name), &pieces, |b, p| {
            b.iter(|| memchr_lt(black_box(p)));
        });
    }
    group.finish();
}

fn bench_corpus(c: &mut Criterion) {
    bench_input(c, "parser/corpus", &corpus(), 100);
}

fn bench_file_10mib(c: &mut Criterion) {
    bench_input(c, "parser/file_10mib", &single_file(10 * 1024 * 1024), 10);
}

/// Allocations of one pass of `f`: (count, bytes, peak live bytes above the
/// live bytes at the start).
fn count_allocations(f: impl FnOnce()) -> (usize, usize, usize) {
    ALLOCS.store(0, Relaxed);
    ALLOC_BYTES.store(0, Relaxed);
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    f();
    COUNTING.store(false, Relaxed);
    (
        ALLOCS.load(Relaxed),
        ALLOC_BYTES.load(Relaxed),
        PEAK.load(Relaxed),
    )
}

fn allocations(_: &mut Criterion) {
    println!();
    println!("allocations per pass (counting global allocator, untimed)");
    println!(
        "{:<18} {:>6} {:>9} {:>12} {:>14} {:>14}",
        "input", "chunk", "api", "allocs/MB", "alloc KB/MB", "peak live KB"
    );
    for (input_name, input) in [
        ("corpus", corpus()),
        ("file_10mib", single_file(10 * 1024 * 1024)),
    ] {
        let mb = input.len() as f64 / 1e6;
        for (name, n) in SIZES {
            let pieces = chunks(&input, n);
            let mut out: Vec<Event> = Vec::new();
            for api in ["borrowed", "owned"] {
                let (allocs, bytes, peak) = count_allocations(|| {
                    if api == "borrowed" {
                        black_box(borrowed(&pieces));
                    } else {
                        black_box(owned(&pieces, &mut out));
                    }
                });
                println!(
                    "{input_name:<18} {name:>6} {api:>9} {:>12.1} {:>14.1} {:>14.1}",
                    allocs as f64 / mb,
                    bytes as f64 / 1e3 / mb,
                    peak as f64 / 1e3,
                );
            }
        }
    }
}

fn fastest(_: &mut Criterion) {
    println!();
    println!("fastest of N interleaved passes (MB/s = 10^6 bytes/s; ratio = time / memchr time)");
    println!(
        "{:<12} {:>6} {:>4} {:>10} {:>10} {:>7} {:>10} {:>7}",
        "input", "chunk", "N", "memchr", "borrowed", "ratio", "owned", "ratio"
    );
    for (input_name, input) in [
        ("corpus", corpus()),
        ("file_10mib", single_file(10 * 1024 * 1024)),
    ] {
        let mb = input.len() as f64 / 1e6;
        let mut out: Vec<Event> = Vec::with_capacity(1024);
        for (name, n) in SIZES {
            let pieces = chunks(&input, n);
            let rounds = match (n, input.len() > 4 << 20) {
                (Some(1), true) => 3,
                (Some(1), false) => 10,
                (_, true) => 15,
                _ => 40,
            };
            let mut best = [f64::MAX; 3];
            for _ in 0..rounds {
                for (k, slot) in best.iter_mut().enumerate() {
                    let started = std::time::Instant::now();
                    match k {
                        0 => {
                            black_box(memchr_lt(black_box(&pieces)));
                        }
                        1 => {
                            black_box(borrowed(black_box(&pieces)));
                        }
                        _ => {
                            black_box(owned(black_box(&pieces), &mut out));
                        }
                    }
                    *slot = slot.min(started.elapsed().as_secs_f64());
                }
            }
            println!(
                "{input_name:<12} {name:>6} {rounds:>4} {:>10.0} {:>10.0} {:>7.2} {:>10.0} {:>7.2}",
                mb / best[0],
                mb / best[1],
                best[1] / best[0],
                mb / best[2],
                best[2] / best[0],
            );
        }
    }
}

/// `N` passes of one contender (kept out of line so callgrind can count it alone).
#[inline(never)]
fn measured_passes(pieces: &[&str], api: &str, n: usize) -> usize {
    let mut out: Vec<Event> = Vec::with_capacity(1024);
    let mut acc = 0;
    for _ in 0..n {
        acc += match api {
            "borrowed" => borrowed(black_box(pieces)).0,
            "owned" => owned(black_box(pieces), &mut out),
            _ => memchr_lt(black_box(pieces)),
        };
    }
    acc
}

/// `EDWARD_PARSER_PASSES=INPUT,CHUNK,API,N`: see the top of this file.
fn passes_only(spec: &str) {
    let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
    let [input_name, size, api, n] = parts[..] else {
        eprintln!("EDWARD_PARSER_PASSES: expected INPUT,CHUNK,API,N, got {spec:?}");
        std::process::exit(2);
    };
    let input = if input_name == "corpus" {
        corpus()
    } else {
        single_file(10 * 1024 * 1024)
    };
    let chunk = size.parse::<usize>().ok();
    let n: usize = n.parse().unwrap_or(1);
    let pieces = chunks(&input, chunk);
    black_box(measured_passes(&pieces, api, n));
    println!(
        "{input_name} {size} {api}: {n} passes over {} bytes",
        input.len()
    );
}

criterion_group!(
    benches,
    bench_corpus,
    bench_file_10mib,
    fastest,
    allocations
);

fn main() {
    if let Ok(spec) = std::env::var("EDWARD_PARSER_PASSES") {
        passes_only(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
