//! Docker sandbox latency and sync throughput against a real daemon (run
//! `scripts/dockerd.sh start && scripts/docker-image.sh` first):
//!
//! ```text
//! cargo bench -p edward-sandbox --features docker --bench docker
//! ```
//!
//! - **write batch**: 100 files of 10,240 bytes (~1 MB) as one
//!   `write_files` (one tar upload + one rename exec) versus the same files
//!   written one exec per file (`sh -c 'printf %s "$1" > "$2"'`), and the
//!   ratio;
//! - **cold provision** (create volume + container, start), **warm
//!   reattach** (provision of a running key) and an **exec round trip** of
//!   `true`: p50 / p95 over 20 each.
//!
//! Inputs are generated deterministically here. A bench program rather than
//! criterion: percentiles of second-scale operations are the point.

use std::time::{Duration, Instant};

use bytes::Bytes;
use edward_core::{ExecRequest, FileWrite, Sandbox, SandboxKey, SandboxPath, SandboxProvider};
use edward_sandbox::{DockerSandboxConfig, DockerSandboxProvider};
use tokio_util::sync::CancellationToken;

const FILES: usize = 100;
const FILE_BYTES: usize = 10_240;
const SAMPLES: usize = 20;

fn batch(round: usize) -> Vec<FileWrite> {
    (0..FILES)
        .map(|i| {
            let content: Vec<u8> = (0..FILE_BYTES)
                .map(|j| b'a' + ((i * 31 + j * 7 + round) % 26) as u8)
                .collect();
            FileWrite {
                path: SandboxPath::new(&format!("src/module{}/file{i}.ts", i % 10))
                    .expect("valid path"),
                content: Bytes::from(content),
            }
        })
        .collect()
}

fn request(program: &str, args: &[&str]) -> ExecRequest {
    ExecRequest {
        program: program.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        cwd: None,
        env: Vec::new(),
        timeout: Duration::from_secs(60),
        output_cap: 64 * 1024,
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(name: &str, samples: &mut [Duration]) {
    let p50 = percentile(samples, 0.5);
    let p95 = percentile(samples, 0.95);
    println!(
        "{name:<16} p50 {:>8.1} ms   p95 {:>8.1} ms   (n={})",
        ms(p50),
        ms(p95),
        samples.len()
    );
}

fn key(name: &str) -> SandboxKey {
    SandboxKey(format!("bench-{name}-{}", uuid::Uuid::new_v4().simple()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // and only wants to know the program builds and starts.
    if !std::env::args().any(|a| a == "--bench") {
        println!("docker bench: run with `cargo bench` to measure");
        return;
    }
    let mut config = DockerSandboxConfig::default();
    if let Ok(image) = std::env::var("EDWARD_DOCKER_IMAGE") {
        config.image = image;
    }
    let provider = DockerSandboxProvider::connect(config)
        .await
        .unwrap_or_else(|err| {
            panic!("{err}: run scripts/dockerd.sh start && scripts/docker-image.sh")
        });

    // ---- write batch: one tar upload vs one exec per file
    let write_key = key("write");
    let sandbox = provider
        .provision_docker(&write_key)
        .await
        .expect("provision");
    let bytes: usize = batch(0).iter().map(|f| f.content.len()).sum();
    // Warm-up.
    sandbox.write_files(batch(0)).await.expect("write");
    let mut tar_samples = Vec::new();
    for round in 1..=10 {
        let files = batch(round);
        let started = Instant::now();
        sandbox.write_files(files).await.expect("write");
        tar_samples.push(started.elapsed());
    }
    let mut exec_samples = Vec::new();
    for round in 11..=13 {
        let files = batch(round);
        let started = Instant::now();
        for file in &files {
            let content = String::from_utf8(file.content.to_vec()).expect("ascii");
            let out = sandbox
                .exec(
                    request(
                        "sh",
                        &[
                            "-c",
                            "mkdir -p \"$(dirname \"$2\")\" && printf %s \"$1\" > \"$2\"",
                            "sh",
                            &content,
                            file.path.as_str(),
                        ],
                    ),
                    CancellationToken::new(),
                )
                .await
                .expect("exec write");
            assert_eq!(out.exit_code, Some(0), "{out:?}");
        }
        exec_samples.push(started.elapsed());
    }
    // Both ways wrote the same kind of bytes.
    let listed = sandbox.list_files().await.expect("list");
    assert_eq!(listed.len(), FILES);
    let tar_p50 = percentile(&mut tar_samples, 0.5);
    let exec_p50 = percentile(&mut exec_samples, 0.5);
    println!(
        "write batch      {FILES} files, {bytes} bytes: one tar upload p50 {:.1} ms ({:.1} MB/s), \
         one exec per file p50 {:.1} ms ({:.2} MB/s), ratio {:.1}x",
        ms(tar_p50),
        bytes as f64 / tar_p50.as_secs_f64() / 1e6,
        ms(exec_p50),
        bytes as f64 / exec_p50.as_secs_f64() / 1e6,
        exec_p50.as_secs_f64() / tar_p50.as_secs_f64(),
    );

    // ---- exec round trip of `true`
    let mut samples = Vec::new();
    for _ in 0..SAMPLES {
        let started = Instant::now();
        let out = sandbox
            .exec(request("true", &[]), CancellationToken::new())
            .await
            .expect("exec");
        samples.push(started.elapsed());
        assert_eq!(out.exit_code, Some(0));
    }
    report("exec true", &mut samples);

    // ---- warm reattach
    let mut samples = Vec::new();
    for _ in 0..SAMPLES {
        let started = Instant::now();
        provider
            .provision_docker(&write_key)
            .await
            .expect("reattach");
        samples.push(started.elapsed());
    }
    report("warm reattach", &mut samples);
    provider.destroy(&write_key).await.expect("destroy");

    // ---- cold provision (destroy not timed)
    let mut samples = Vec::new();
    for _ in 0..SAMPLES {
        let cold = key("cold");
        let started = Instant::now();
        provider
            .provision(&cold, &Default::default())
            .await
            .expect("provision");
        samples.push(started.elapsed());
        provider.destroy(&cold).await.expect("destroy");
    }
    report("cold provision", &mut samples);
}
