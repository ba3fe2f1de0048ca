//! N concurrent runs at model pace in one process, one tailer per run: the
//! measurement behind docs/BENCHMARKS.md's concurrency table (issue 16).
//!
//! Each run's model streams a `--bytes` file in `--chunk-bytes` pieces
//! `--chunk-ms` apart (default 20 KB, 16 bytes, 12 ms: ~15 s, like a real
//! model). Every piece carries the time it was sent, so the tailer measures
//! chunk→client latency (model emits → client receives the event).
//!
//! ```text
//! cargo run --release --example load -- --runs 1000 --store sqlite
//! cargo run --release --example load -- --runs 2000 --store memory
//! cargo run --release --example load --features postgres -- --runs 1000 --store postgres --database-url postgres://…
//! ```
//!
//! Prints one Markdown table row: store, N, RSS/run, CPU/run, p50/p99
//! latency, wall/ideal, events/s, peak active runs, time to start p50/max.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use edward::spi::{FinishReason, ModelChunk, ModelClient, ModelRequest, ModelStream};
use edward::{
    AdmissionLimits, Backend, Budgets, CancellationToken, Engine, EngineEvent,
    LocalSandboxProvider, ModelError, RunRequest, Usage, WorkerConfig, async_trait,
};

#[derive(Debug, Parser)]
#[command(name = "load", about = "N concurrent Edward runs at model pace")]
struct Cli {
    /// Concurrent runs.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// `memory`, `sqlite` or `postgres`.
    #[arg(long, default_value = "memory")]
    store: String,
    /// Bytes of the file each run's model streams.
    #[arg(long, default_value_t = 20_000)]
    bytes: usize,
    /// Bytes per model chunk.
    #[arg(long, default_value_t = 16)]
    chunk_bytes: usize,
    /// Milliseconds between model chunks.
    #[arg(long, default_value_t = 12)]
    chunk_ms: u64,
    /// Runs submitted at once (as that many clients of a server would).
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Postgres URL (with `--store postgres`, feature `postgres`).
    #[arg(long, env = "EDWARD_DATABASE_URL")]
    database_url: Option<String>,
    /// Postgres pool size per process.
    #[arg(long, default_value_t = 32)]
    pool: u32,
    /// Run the runs in this many worker processes (children of this one, on
    /// the same Postgres database) instead of in this process, which then
    /// only submits and tails. RSS and CPU are summed over all processes.
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Also print chunk→client latency per 2 seconds of the run (stderr):
    /// where in the run the slow chunks are.
    #[arg(long)]
    timeline: bool,
    /// Internal: be one of those worker processes (run a worker until killed).
    #[arg(long, hide = true)]
    worker_only: bool,
}

/// Streams a file whose lines are the microsecond timestamps of their chunk.
struct PacedModel {
    bytes: usize,
    chunk_bytes: usize,
    every: Duration,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

#[async_trait]
impl ModelClient for PacedModel {
    fn provider(&self) -> &str {
        "paced"
    }

    async fn stream(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == edward::spi::Role::Assistant)
            .count();
        if turn > 0 {
            let done = vec![
                Ok(ModelChunk::Text("<edward_done/>".into())),
                Ok(ModelChunk::Finish(FinishReason::Stop)),
            ];
            return Ok(Box::pin(edward::spi::stream::iter(done)));
        }
        let chunks = self.bytes.div_ceil(self.chunk_bytes);
        let (chunk_bytes, every) = (self.chunk_bytes, self.every);
        // Chunk i: "\n" + the send time, padded to `chunk_bytes`; framed by the file tags.
        let stream = edward::spi::stream::unfold(0usize, move |i| {
            let cancel = cancel.clone();
            async move {
                let text = if i == 0 {
                    "<edward_sandbox>\n<file path=\"load.txt\">\n".to_string()
                } else if i <= chunks {
                    if cancel
                        .run_until_cancelled(tokio::time::sleep(every))
                        .await
                        .is_none()
                    {
                        return Some((Err(ModelError::Cancelled), usize::MAX));
                    }
                    let mut s = format!("{}", now_us());
                    while s.len() + 1 < chunk_bytes {
                        s.push('.');
                    }
                    s.push('\n');
                    s
                } else if i == chunks + 1 {
                    "</file>\n</edward_sandbox>\n<edward_done/>".to_string()
                } else if i == chunks + 2 {
                    return Some((
                        Ok(ModelChunk::Usage(Usage {
                            input_tokens: 100,
                            output_tokens: (chunks * chunk_bytes / 4) as u64,
                            estimated: false,
                        })),
                        i + 1,
                    ));
                } else {
                    return None;
                };
                Some((Ok(ModelChunk::Text(text)), i + 1))
            }
        });
        Ok(Box::pin(stream))
    }
}

fn rusage_cpu_ms() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn status_kb(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| status_kb(&s, "VmHWM:"))
        .unwrap_or(0)
}

/// User + system CPU of a live process, from `/proc/PID/stat` (clock ticks).
fn proc_cpu_ms(pid: u32) -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11) + ticks(12)) * 1000.0 / hz.max(1.0))
}

/// Latency percentiles per 2 s of receive time, on stderr.
fn print_timeline(samples: Vec<(i64, f64)>) {
    let mut buckets: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
    for (bucket, latency) in samples {
        buckets.entry(bucket).or_default().push(latency);
    }
    let first = buckets.keys().next().copied().unwrap_or(0);
    for (bucket, mut v) in buckets {
        v.sort_by(f64::total_cmp);
        eprintln!(
            "t={:>3} s  chunks {:>6}  p50 {:>5.0} ms  p99 {:>5.0} ms  max {:>5.0} ms",
            (bucket - first) * 2,
            v.len(),
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            v.last().copied().unwrap_or(0.0)
        );
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn backend(cli: &Cli, dir: &std::path::Path) -> Result<Backend, Box<dyn std::error::Error>> {
    Ok(match cli.store.as_str() {
        "memory" => Backend::memory(),
        "sqlite" => edward::SqliteStore::open(dir.join("load.db"))
            .await?
            .backend(),
        #[cfg(feature = "postgres")]
        "postgres" => {
            let url = cli
                .database_url
                .as_deref()
                .ok_or("--store postgres needs --database-url")?;
            let options = edward::PgOptions::default()
                .store(edward::StoreOptions::default().max_connections(cli.pool));
            edward::PgStore::connect_with(url, options)
                .await?
                .backend()
                .await?
        }
        other => return Err(format!("unknown or unbuilt store `{other}`").into()),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    // Off unless RUST_LOG asks (e.g. `edward_store=trace` prints each group commit).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = tempfile::tempdir()?;
    let n = cli.runs.max(1);
    let model = PacedModel {
        bytes: cli.bytes,
        chunk_bytes: cli.chunk_bytes.max(16),
        every: Duration::from_millis(cli.chunk_ms),
    };
    let ideal = Duration::from_millis(cli.chunk_ms * cli.bytes.div_ceil(cli.chunk_bytes) as u64);
    let engine = Engine::builder()
        .backend(backend(&cli, dir.path()).await?)
        .sandbox_provider(Arc::new(LocalSandboxProvider::new(dir.path().join("sb"))))
        .model_client(Arc::new(model))
        .default_model("paced")
        .budgets(Budgets {
            max_cost_usd: 0.0,
            ..Budgets::default()
        })
        .admission_limits(AdmissionLimits {
            global: n as u32,
            per_user: n as u32,
            per_chat: 1,
        })
        .build()?;
    let shutdown = CancellationToken::new();
    if cli.worker_only {
        // A worker process: run until the parent sends SIGTERM.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let cfg = WorkerConfig::new(shutdown.clone()).with_concurrency(n);
        let worker = tokio::spawn({
            let engine = engine.clone();
            async move { engine.worker(cfg).await }
        });
        term.recv().await;
        shutdown.cancel();
        worker.await??;
        return Ok(());
    }
    let mut children = Vec::new();
    if cli.workers > 0 {
        if cli.store != "postgres" {
            return Err("--workers needs --store postgres (a database shared by processes)".into());
        }
        let me = std::env::current_exe()?;
        for _ in 0..cli.workers {
            let mut args: Vec<String> = std::env::args().skip(1).collect();
            args.push("--worker-only".into());
            children.push(std::process::Command::new(&me).args(&args).spawn()?);
        }
    }
    let worker = tokio::spawn({
        let engine = engine.clone();
        let in_process = cli.workers == 0;
        let cfg = WorkerConfig::new(shutdown.clone()).with_concurrency(n);
        async move {
            if in_process {
                engine.worker(cfg).await
            } else {
                Ok(())
            }
        }
    });

    let cpu0 = rusage_cpu_ms();
    let started = Instant::now();
    let active = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let events_total = Arc::new(AtomicU64::new(0));
    let mut tailers = Vec::with_capacity(n);
    // `--clients` submitters at once, as that many clients of a server would.
    let clients = Arc::new(tokio::sync::Semaphore::new(cli.clients.max(1)));
    let submitted_all = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    // Chats of their own: a database kept from an earlier invocation holds
    // chats of the same names, whose history would make these runs
    // follow-ups (and the paced model answers a follow-up with nothing).
    let invocation = now_us();
    for i in 0..n {
        let engine = engine.clone();
        let (active, peak, events_total) = (active.clone(), peak.clone(), events_total.clone());
        let (clients, submitted_all) = (clients.clone(), submitted_all.clone());
        let timeline = cli.timeline;
        tailers.push(tokio::spawn(async move {
            let id = {
                let _client = clients.acquire().await.map_err(|e| e.to_string())?;
                engine
                    .submit(RunRequest::new(
                        "load",
                        format!("load-{invocation:x}-{i}"),
                        "stream a file",
                    ))
                    .await
                    .map_err(|e| e.to_string())?
            };
            let submitted = Instant::now();
            {
                let mut all = submitted_all.lock().unwrap_or_else(|e| e.into_inner());
                *all = (*all).max(started.elapsed());
            }
            let mut latencies = Vec::new();
            let mut buckets: Vec<(i64, f64)> = Vec::new();
            let mut start_ms = None;
            let mut status = String::new();
            let mut partial = String::new();
            let mut events = engine.events(id, 0);
            while let Some(e) = events.next().await {
                let Ok(e) = e else { break };
                events_total.fetch_add(1, Ordering::Relaxed);
                match e.event {
                    EngineEvent::TurnStarted { turn: 1, .. } => {
                        start_ms = Some(submitted.elapsed().as_secs_f64() * 1000.0);
                        let now = active.fetch_add(1, Ordering::Relaxed) + 1;
                        peak.fetch_max(now, Ordering::Relaxed);
                    }
                    EngineEvent::FileDelta { content, .. } => {
                        let received = now_us();
                        partial.push_str(&content);
                        while let Some(nl) = partial.find('\n') {
                            let line: String = partial.drain(..=nl).collect();
                            if let Ok(sent) = line.trim_end_matches(['.', '\n']).parse::<i64>() {
                                latencies.push((received - sent) as f64 / 1000.0);
                                if timeline {
                                    buckets.push((
                                        received / 2_000_000,
                                        (received - sent) as f64 / 1000.0,
                                    ));
                                }
                            }
                        }
                    }
                    EngineEvent::RunFinished { status: s, .. } => {
                        if start_ms.is_some() {
                            active.fetch_sub(1, Ordering::Relaxed);
                        }
                        status = format!("{s:?}");
                    }
                    _ => {}
                }
            }
            Ok::<_, String>((latencies, start_ms, status, buckets))
        }));
    }
    let mut latencies = Vec::new();
    let mut starts = Vec::new();
    let mut completed = 0;
    let mut timeline = Vec::new();
    for t in tailers {
        let (l, s, status, b) = t.await??;
        timeline.extend(b);
        latencies.extend(l);
        starts.extend(s);
        if status == "Completed" {
            completed += 1;
        }
    }
    let wall = started.elapsed();
    let mut cpu = rusage_cpu_ms() - cpu0;
    shutdown.cancel();
    worker.await??;
    // Worker processes: their peak RSS and CPU time, then stop them.
    let mut children_rss_kb = 0;
    for child in &mut children {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
        children_rss_kb += status_kb(&status, "VmHWM:");
        cpu += proc_cpu_ms(child.id())?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        child.wait()?;
    }

    if cli.timeline {
        print_timeline(timeline);
    }
    latencies.sort_by(f64::total_cmp);
    starts.sort_by(f64::total_cmp);
    let rss_kb = peak_rss_kb() + children_rss_kb;
    println!(
        "| store | N | completed | RSS/run | CPU/run | chunk→client p50/p99 | wall / ideal | events/s | peak active | time to start p50/max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} KB | {:.0} ms | {:.0} / {:.0} ms | {:.2} | {:.0} | {} | {:.0} / {:.0} ms |",
        if cli.workers > 0 {
            format!("{} ({} worker processes)", cli.store, cli.workers)
        } else {
            cli.store.clone()
        },
        n,
        completed,
        rss_kb / n as u64,
        cpu / n as f64,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        wall.as_secs_f64() / ideal.as_secs_f64(),
        events_total.load(Ordering::Relaxed) as f64 / wall.as_secs_f64(),
        peak.load(Ordering::Relaxed),
        percentile(&starts, 0.5),
        starts.last().copied().unwrap_or(0.0),
    );
    eprintln!(
        "submitting all {n} runs took {} ms",
        submitted_all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_millis()
    );
    if completed != n {
        return Err(format!("{} of {n} runs did not complete", n - completed).into());
    }
    if latencies.is_empty() {
        return Err("no file chunk reached a tailer: the row above measures nothing".into());
    }
    Ok(())
}
