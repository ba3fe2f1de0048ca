//! SSE fan-out on loopback: delivery latency from append to client receipt
//! (p50/p99), server RSS per idle subscriber, and requests/s of
//! `GET /v1/runs/{id}`.
//!
//! ```text
//! cargo bench -p edward-http --bench sse_fanout            # both scenarios
//! cargo bench -p edward-http --bench sse_fanout -- 200 2   # 200 subscribers, 2 runs × 100
//! ```
//!
//! The server runs in a child process (this binary with `--serve`) so its
//! RSS is measured alone; it uses the in-memory store and appends events on
//! command, each stamped with the wall-clock time it was appended.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edward_core::engine::{Engine, RunRequest};
use edward_core::memory::MemoryBackends;
use edward_core::{Fence, NewEvent, Notifier, RunId, RunStore, SandboxProvider};
use edward_http::{Api, ApiKeys, HttpConfig};
use futures::StreamExt;

const KEY: &str = "bench-key";
const EVENTS: usize = 40;
const EVENT_GAP: Duration = Duration::from_millis(25);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if args.iter().any(|a| a == "--serve") {
        rt.block_on(serve());
        return;
    }
    let nums: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let scenarios: Vec<(usize, usize)> = match nums.as_slice() {
        [subs, runs] => vec![(*subs, *runs)],
        _ => vec![(1000, 1), (1000, 100)],
    };
    for (subs, runs) in scenarios {
        rt.block_on(scenario(subs, runs));
    }
}

// ------------------------------------------------------------------ server

async fn serve() {
    let mem = MemoryBackends::new();
    let dir = std::env::temp_dir().join(format!("edward-bench-{}", std::process::id()));
    let sandboxes: Arc<dyn SandboxProvider> =
        Arc::new(edward_sandbox::LocalSandboxProvider::new(&dir));
    let engine = Engine::builder()
        .backend(edward_core::engine::Backend::new(
            mem.store.clone(),
            mem.queue.clone(),
            mem.notifier.clone(),
        ))
        .sandbox_provider(sandboxes.clone())
        .admission_limits(edward_core::AdmissionLimits {
            global: 100_000,
            per_user: 100_000,
            per_chat: 100_000,
        })
        .build()
        .expect("engine");
    let mut keys = ApiKeys::new();
    keys.insert("bench", KEY);
    let api = Api::new(engine.clone(), keys, HttpConfig::default().rate_limit(None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { api.serve(listener, std::future::pending()).await });

    // Commands on stdin: `runs N`, `append`, `finish`.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let store = mem.store.clone();
    let mut runs: Vec<RunId> = Vec::new();
    while let Some(cmd) = rx.recv().await {
        let mut parts = cmd.split_whitespace();
        match parts.next() {
            Some("runs") => {
                let n: usize = parts.next().and_then(|s| s.parse().ok()).unwrap_or(1);
                runs.clear();
                for i in 0..n {
                    let id = engine
                        .submit(RunRequest::new(
                            "bench",
                            format!("chat-{i}-{}", now_us()),
                            "bench",
                        ))
                        .await
                        .expect("submit");
                    store.start_run(id, Fence(1)).await.expect("start");
                    runs.push(id);
                }
                let ids: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
                println!("{}", ids.join(" "));
            }
            Some("append") => {
                for _ in 0..EVENTS {
                    for &id in &runs {
                        let ev = NewEvent::new("bench", serde_json::json!({ "t": now_us() }));
                        let done = store
                            .append_events(id, Fence(1), vec![ev])
                            .await
                            .expect("append");
                        let seq = done.last().map_or(0, |e| e.seq);
                        let _ = mem.notifier.notify_events(id, seq).await;
                    }
                    tokio::time::sleep(EVENT_GAP).await;
                }
                println!("appended");
            }
            Some("finish") => {
                for &id in &runs {
                    let ev = NewEvent::new(
                        "run_finished",
                        serde_json::json!({ "status": "completed", "t": now_us() }),
                    );
                    let done = store
                        .finish_run(
                            id,
                            Some(Fence(1)),
                            edward_core::RunStatus::Completed,
                            "done",
                            vec![ev],
                        )
                        .await
                        .expect("finish");
                    let _ = mem
                        .notifier
                        .notify_events(id, done.last().map_or(0, |e| e.seq))
                        .await;
                }
                println!("finished");
            }
            _ => {}
        }
        let _ = std::io::stdout().flush();
    }
}

// ------------------------------------------------------------------ client

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of `pid`, in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the parenthesised command name; utime, stime are 14, 15.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn scenario(subs: usize, runs: usize) {
    let exe = std::env::current_exe().expect("exe");
    // `SSE_FANOUT_SERVER_WRAPPER=heaptrack` runs the server under a profiler.
    let mut cmd = match std::env::var("SSE_FANOUT_SERVER_WRAPPER") {
        Ok(w) if !w.is_empty() => {
            let mut c = Command::new(w);
            c.arg(exe);
            c
        }
        _ => Command::new(exe),
    };
    let mut child = cmd
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut read = move || stdout.next().expect("line").expect("read");
    // The first line that is an address (a wrapper may print its own lines).
    let addr = loop {
        let line = read();
        if line.parse::<std::net::SocketAddr>().is_ok() {
            break line;
        }
    };
    let base = format!("http://{addr}");
    writeln!(stdin, "runs {runs}").expect("cmd");
    let ids: Vec<String> = read().split_whitespace().map(String::from).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = rss_kib(pid);

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut tasks = Vec::with_capacity(subs);
    for i in 0..subs {
        let url = format!("{base}/v1/runs/{}/events", ids[i % ids.len()]);
        let http = http.clone();
        let ready = ready_tx.clone();
        tasks.push(tokio::spawn(async move {
            let res = http
                .get(url)
                .bearer_auth(KEY)
                .header("accept", "text/event-stream")
                .send()
                .await
                .expect("connect");
            let mut body = res.bytes_stream();
            let mut buf = String::new();
            let mut latencies = Vec::with_capacity(EVENTS + 1);
            let mut said_ready = false;
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                        continue;
                    };
                    let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
                    if v["type"] == "run_queued" && !said_ready {
                        said_ready = true;
                        let _ = ready.send(());
                    }
                    if let Some(t) = v["payload"]["t"].as_u64() {
                        latencies.push(now_us().saturating_sub(t));
                    }
                }
            }
            latencies
        }));
    }
    drop(ready_tx);
    for _ in 0..subs {
        ready_rx.recv().await.expect("every subscriber connected");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = rss_kib(pid);

    // Requests/s of GET /v1/runs/{id} while the subscribers are connected.
    let rps = {
        let deadline = Instant::now() + Duration::from_secs(3);
        let url = format!("{base}/v1/runs/{}", ids[0]);
        let getters: Vec<_> = (0..32)
            .map(|_| {
                let http = reqwest::Client::new();
                let url = url.clone();
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        if let Ok(r) = http.get(&url).bearer_auth(KEY).send().await {
                            if r.status() == 200 && r.bytes().await.is_ok() {
                                n += 1;
                            }
                        }
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for g in getters {
            total += g.await.unwrap_or(0);
        }
        total as f64 / 3.0
    };

    let cpu_before = cpu_ticks(pid);
    writeln!(stdin, "append").expect("cmd");
    assert_eq!(read(), "appended");
    writeln!(stdin, "finish").expect("cmd");
    assert_eq!(read(), "finished");
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("subscriber"));
    }
    let cpu_ms = cpu_ticks(pid).saturating_sub(cpu_before) * 10;
    all.sort_unstable();
    let expected = subs * (EVENTS + 1);
    println!(
        "sse_fanout: {subs} subscribers on {runs} run(s) ({} per run): delivered {}/{} events, \
         latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; server RSS {} KiB before, {} KiB with idle subscribers \
         = {:.1} KiB per subscriber; GET /v1/runs/{{id}} {:.0} req/s (32 clients, {subs} streams open); \
         server CPU while appending and streaming {cpu_ms} ms = {:.1} µs per delivered event",
        subs / runs,
        all.len(),
        expected,
        percentile(&all, 0.50) as f64 / 1000.0,
        percentile(&all, 0.99) as f64 / 1000.0,
        all.last().copied().unwrap_or(0) as f64 / 1000.0,
        rss_before,
        rss_idle,
        (rss_idle.saturating_sub(rss_before)) as f64 / subs as f64,
        rps,
        (cpu_ms as f64 * 1000.0) / all.len().max(1) as f64,
    );
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}
