//! Engine throughput (criterion): one run replaying a ~1 MB transcript
//! generated deterministically here (prose, thinking, a sandbox of 100 files,
//! an `echo` command, done) with no delays, on the embedded defaults
//! (in-memory store/queue/buffer, a local sandbox in a temp dir).
//!
//! ```text
//! cargo bench --bench engine -- --warm-up-time 2 --measurement-time 15
//! ```
//!
//! Benchmarks:
//! - `engine/run_1mb`: submit → worker → parse → files written → command →
//!   `run_finished`, timed until the terminal event is read back.
//! - `engine/parse_1mb`: the same transcript through the parser alone, in the
//!   same chunks — the floor the engine is compared against.
//!
//! After the criterion output it prints events per run, events/s and the
//! engine / parser time ratio.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use edward::core::AdmissionLimits;
use edward::core::engine::{Engine, RunRequest, WorkerConfig};
use edward::core::scripted::ScriptedModel;
use edward::core::{RunId, SandboxProvider};
use edward::parser::Parser;
use edward::sandbox::LocalSandboxProvider;
use tokio_util::sync::CancellationToken;

const CHUNK: usize = 256;

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
    "state",
    "render",
    "count",
    "items",
    "value",
    "props",
    "index",
    "filter",
    "todo",
    "list",
    "user",
    "fetch",
    "data",
    "button",
    "click",
    "update",
    "component",
    "layout",
    "style",
    "theme",
];

fn prose(rng: &mut Rng, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        s.push_str(rng.pick(WORDS));
        s.push(if i % 12 == 11 { '.' } else { ' ' });
    }
    s
}

fn code_file(rng: &mut Rng, i: usize, bytes: usize) -> String {
    let mut s = format!(
        "// file {i}\nimport {{ {} }} from \"./lib\";\n",
        rng.pick(WORDS)
    );
    while s.len() < bytes {
        let (a, b) = (rng.pick(WORDS), rng.pick(WORDS));
        s.push_str(&format!(
            "export function {a}_{n}(x) {{ return x < {n} ? <div>{b}</div> : x && {a}; }}\n",
            n = rng.next() % 1000
        ));
    }
    s
}

/// ~1 MB: prose, thinking, 100 files of ~9.5 KB, an echo command, done.
fn transcript() -> String {
    let mut rng = Rng(42);
    let mut t = String::new();
    t.push_str(&prose(&mut rng, 300));
    t.push_str("\n<Thinking>");
    t.push_str(&prose(&mut rng, 2000));
    t.push_str("</Thinking>\n<edward_sandbox project=\"bench\">\n");
    for i in 0..100 {
        t.push_str(&format!("<file path=\"src/mod{}/file{i}.tsx\">\n", i % 10));
        t.push_str(&code_file(&mut rng, i, 9_500));
        t.push_str("</file>\n");
    }
    t.push_str("</edward_sandbox>\n");
    t.push_str(&prose(&mut rng, 300));
    t.push_str("\n<edward_command command=\"echo\" args='[\"built\"]' />\n<edward_done/>\n");
    t
}

struct Setup {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

fn setup(text: &str) -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let provider: Arc<dyn SandboxProvider> = Arc::new(LocalSandboxProvider::new(dir.path()));
    let model = ScriptedModel::new([text.to_string()]).with_chunk_bytes(CHUNK);
    let engine = Engine::builder()
        .sandbox_provider(provider)
        .model_client(Arc::new(model))
        .admission_limits(AdmissionLimits {
            global: 1000,
            per_user: 1000,
            per_chat: 1,
        })
        .build()
        .expect("engine");
    let shutdown = CancellationToken::new();
    {
        let engine = engine.clone();
        let cfg = WorkerConfig::new(shutdown.clone()).with_concurrency(1);
        rt.spawn(async move { engine.worker(cfg).await.expect("worker config") });
    }
    Setup {
        rt,
        engine,
        shutdown,
        _dir: dir,
    }
}

/// One run; returns (events written, terminal status).
async fn one_run(engine: &Engine) -> (u64, String) {
    let id = engine
        .submit(RunRequest::new(
            "bench",
            format!("c-{}", RunId::new()),
            "bench",
        ))
        .await
        .expect("submit");
    let mut events = engine.raw_events(id, 0);
    let mut last = None;
    while let Some(e) = events.next().await {
        last = Some(e.expect("event"));
    }
    let last = last.expect("terminal event");
    (
        last.seq,
        last.payload["status"].as_str().unwrap_or("?").to_string(),
    )
}

fn parse_all(chunks: &[&str]) -> usize {
    let mut p = Parser::new();
    let mut out = Vec::new();
    let mut n = 0;
    for c in chunks {
        p.feed(c, &mut out);
        n += out.len();
        out.clear();
    }
    p.finish(&mut out);
    n + out.len()
}

fn chunked(text: &str) -> Vec<&str> {
    let mut v = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + CHUNK).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        v.push(&text[start..end]);
        start = end;
    }
    v
}

fn bench(c: &mut Criterion) {
    let text = transcript();
    let chunks = chunked(&text);
    let s = setup(&text);

    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.sample_size(10);
    g.bench_function("run_1mb", |b| {
        b.iter(|| black_box(s.rt.block_on(one_run(&s.engine))))
    });
    g.bench_function("parse_1mb", |b| b.iter(|| black_box(parse_all(&chunks))));
    g.finish();

    // Plain numbers for BENCHMARKS.md.
    let runs = 10;
    let t = Instant::now();
    let mut events = 0;
    for _ in 0..runs {
        let (n, status) = s.rt.block_on(one_run(&s.engine));
        assert_eq!(status, "completed");
        events = n;
    }
    let per_run = t.elapsed() / runs;
    let t = Instant::now();
    let parses = 50;
    for _ in 0..parses {
        black_box(parse_all(&chunks));
    }
    let per_parse = t.elapsed() / parses;
    println!(
        "transcript {} bytes in {} chunks of {CHUNK}; parser events {}",
        text.len(),
        chunks.len(),
        parse_all(&chunks)
    );
    println!(
        "engine run: {:.1} ms/run, {events} events/run, {:.0} events/s, {:.1} MB/s",
        per_run.as_secs_f64() * 1e3,
        events as f64 / per_run.as_secs_f64(),
        text.len() as f64 / per_run.as_secs_f64() / 1e6
    );
    println!(
        "parser alone: {:.2} ms; engine/parser ratio {:.1}x",
        per_parse.as_secs_f64() * 1e3,
        per_run.as_secs_f64() / per_parse.as_secs_f64().max(1e-9)
    );
    s.shutdown.cancel();
    s.rt.shutdown_timeout(Duration::from_secs(5));
}

criterion_group!(benches, bench);
criterion_main!(benches);
