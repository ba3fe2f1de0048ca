//! One run with embedded defaults: a durable SQLite store and queue in
//! `./edward.db` (or `--db`; `EDWARD_DATABASE_URL=postgres://…` for Postgres
//! when built with the `postgres` feature), a local sandbox under
//! `./edward-data/sandboxes` (or `--dir`), and the scripted demo model
//! (`--model openai:gpt-4o-mini` or `EDWARD_MODEL=…`; `anthropic:…` or `gemini:…` picks a real
//! provider; see docs/PROVIDERS.md). With the `redis` feature,
//! `EDWARD_REDIS_URL=redis://…` takes the queue, write buffer and notifier
//! from Redis (runs stay in SQLite or Postgres; see docs/REDIS.md).
//! A run interrupted by a crash is resumed by the next invocation's worker.
//!
//! ```text
//! cargo run --example run -- "build a todo app"
//! cargo run --example run -- --json "build a todo app"   # raw run events as JSON lines
//! cargo run --example run --features docker -- --sandbox docker "build a todo app"
//! ```
//!
//! `--sandbox docker` writes into a container (image `--image`, default
//! `edward-sandbox:busybox`, built by `scripts/docker-image.sh`).
//!
//! Exits 0 when the run completes, 1 otherwise.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use edward::core::engine::{Backend, Engine, EngineEvent, RunRequest, WorkerConfig};
use edward::core::{RunEvent, RunId, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

/// Run one Edward run and watch it.
#[derive(Debug, Parser)]
#[command(name = "run", about = "Run one Edward run with embedded defaults")]
struct Cli {
    /// What to build.
    #[arg(default_value = "build a todo app")]
    prompt: String,
    /// Where sandboxes live (with `--sandbox local`).
    #[arg(long, default_value = "./edward-data/sandboxes")]
    dir: PathBuf,
    /// `local` (a directory per chat) or `docker` (a container per chat;
    /// needs the `docker` feature).
    #[arg(long, value_enum, default_value = "local")]
    sandbox: SandboxKind,
    /// The image of Docker sandboxes (default `edward-sandbox:busybox`).
    #[arg(long)]
    image: Option<String>,
    /// Print the raw run events as JSON lines instead of progress.
    #[arg(long)]
    json: bool,
    /// The user id the run belongs to.
    #[arg(long, default_value = "local")]
    user: String,
    /// The chat to continue: runs of one chat share its workspace and see
    /// its history (default: a new chat per invocation).
    #[arg(long)]
    chat: Option<String>,
    /// SQLite database file holding runs, events and the queue.
    #[arg(long, default_value = "edward.db")]
    db: PathBuf,
    /// A `postgres://` URL to use instead of the SQLite file.
    #[arg(long, env = "EDWARD_DATABASE_URL")]
    database_url: Option<String>,
    /// Replay recorded model output instead of the demo: one file per turn,
    /// in order (repeat the option). Each file is streamed as is, in 64-byte
    /// chunks, so a response that stops inside a `<file>` is replayed
    /// truncated; after the last one the model says `<edward_done/>`.
    #[arg(long = "replay", value_name = "FILE")]
    replay: Vec<PathBuf>,
    /// A `redis://` URL: queue, write buffer and notifier from Redis.
    #[arg(long, env = "EDWARD_REDIS_URL")]
    redis_url: Option<String>,
    /// The model as `provider:model` (`openai:gpt-4o-mini`, `anthropic:…`,
    /// `gemini:…`) or `scripted` (the default).
    #[arg(long, env = "EDWARD_MODEL")]
    model: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SandboxKind {
    Local,
    Docker,
}

/// Backends chosen from the command line. New options (a database URL, a
/// model provider) plug in here without touching the rest.
struct Backends {
    engine: Engine,
    provider: Arc<dyn SandboxProvider>,
}

async fn build_backends(cli: &Cli) -> Result<Backends, Box<dyn std::error::Error>> {
    let provider: Arc<dyn SandboxProvider> = match cli.sandbox {
        SandboxKind::Local => {
            std::fs::create_dir_all(&cli.dir)?;
            Arc::new(LocalSandboxProvider::new(&cli.dir))
        }
        SandboxKind::Docker => docker_provider(cli).await?,
    };
    let backend = open_backend(cli).await?;
    let (backend, redis_write_buffer) = with_redis(cli, backend).await?;
    let builder = Engine::builder()
        .backend(backend)
        .sandbox_provider(provider.clone());
    let builder = match redis_write_buffer {
        Some(w) => builder.write_buffer(w),
        None => builder,
    };
    let engine = if cli.replay.is_empty() {
        with_model(builder, cli.model.as_deref())?.build()?
    } else {
        let turns = cli.replay.iter().map(|f| {
            std::fs::read_to_string(f).map_err(|e| format!("--replay {}: {e}", f.display()))
        });
        let model =
            edward::core::scripted::ScriptedModel::new(turns.collect::<Result<Vec<_>, _>>()?);
        builder.model_client(Arc::new(model)).build()?
    };
    Ok(Backends { engine, provider })
}

#[cfg(feature = "docker")]
async fn docker_provider(
    cli: &Cli,
) -> Result<Arc<dyn SandboxProvider>, Box<dyn std::error::Error>> {
    let mut config = edward::sandbox::DockerSandboxConfig::default();
    if let Some(image) = &cli.image {
        config.image = image.clone();
    }
    Ok(Arc::new(
        edward::sandbox::DockerSandboxProvider::connect(config).await?,
    ))
}

#[cfg(not(feature = "docker"))]
async fn docker_provider(_: &Cli) -> Result<Arc<dyn SandboxProvider>, Box<dyn std::error::Error>> {
    Err("--sandbox docker needs the `docker` feature (cargo run --example run --features docker -- --sandbox docker …)".into())
}

/// `--model openai:gpt-4o-mini` (or `EDWARD_MODEL`; `anthropic:…`,
/// `gemini:…`, `scripted`) picks the model; unset keeps the scripted demo.
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
fn with_model(
    builder: edward::core::engine::EngineBuilder,
    model: Option<&str>,
) -> Result<edward::core::engine::EngineBuilder, Box<dyn std::error::Error>> {
    use edward::core::providers::{ModelSpec, client_for};
    let model = model.map(str::trim).filter(|m| !m.is_empty());
    Ok(match model.map(ModelSpec::parse).transpose()? {
        Some(spec) => {
            let selected = client_for(&spec)?;
            builder
                .model_client(selected.client)
                .default_model(selected.model)
        }
        None => builder,
    })
}

#[cfg(not(any(feature = "openai", feature = "anthropic", feature = "gemini")))]
fn with_model(
    builder: edward::core::engine::EngineBuilder,
    model: Option<&str>,
) -> Result<edward::core::engine::EngineBuilder, Box<dyn std::error::Error>> {
    if model.is_some_and(|v| !v.trim().is_empty() && v.trim() != "scripted") {
        return Err("--model is set but this build has no model provider features".into());
    }
    Ok(builder)
}

/// `EDWARD_REDIS_URL` replaces the queue (with recovery from the store after
/// Redis loses its data), the notifier and the write buffer.
async fn with_redis(
    cli: &Cli,
    backend: Backend,
) -> Result<(Backend, Option<Arc<dyn edward::spi::WriteBuffer>>), Box<dyn std::error::Error>> {
    let Some(url) = cli.redis_url.as_deref().filter(|u| !u.is_empty()) else {
        return Ok((backend, None));
    };
    #[cfg(feature = "redis")]
    {
        let redis = edward::store::RedisBackend::connect(url).await?;
        let store = backend.store().clone();
        let backend = backend
            .with_queue(Arc::new(redis.queue_with_recovery(store)))
            .with_notifier(Arc::new(redis.notifier().await?));
        Ok((backend, Some(Arc::new(redis.write_buffer()))))
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = backend;
        Err(format!("{url:.8}…: built without the `redis` feature").into())
    }
}

/// Postgres when a URL is given, else the SQLite file.
async fn open_backend(cli: &Cli) -> Result<Backend, Box<dyn std::error::Error>> {
    if let Some(url) = cli.database_url.as_deref().filter(|u| !u.is_empty()) {
        #[cfg(feature = "postgres")]
        {
            let store = edward::store::PgStore::connect(url).await?;
            return Ok(store.backend().await?);
        }
        #[cfg(not(feature = "postgres"))]
        return Err(format!("{url:.11}…: built without the `postgres` feature").into());
    }
    let store = edward::store::SqliteStore::open(&cli.db).await?;
    Ok(store.backend())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<bool, Box<dyn std::error::Error>> {
    let Backends { engine, provider } = build_backends(&cli).await?;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let engine = engine.clone();
        let cfg = WorkerConfig::new(shutdown.clone()).with_concurrency(1);
        async move { engine.worker(cfg).await }
    });

    let chat = cli
        .chat
        .clone()
        .unwrap_or_else(|| format!("chat-{}", RunId::new()));
    let id = engine
        .submit(RunRequest::new(
            cli.user.clone(),
            chat.clone(),
            cli.prompt.clone(),
        ))
        .await?;

    // Ctrl-C cancels the run (it still ends with its terminal event).
    let ctrl_c = tokio::spawn({
        let engine = engine.clone();
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                let _ = engine.cancel(id).await;
            }
        }
    });

    let mut view = View::new(cli.json);
    view.line(&format!("run {id}: {}", cli.prompt));
    let mut events = engine.raw_events(id, 0);
    let mut last: Option<RunEvent> = None;
    while let Some(e) = events.next().await {
        let e = e?;
        view.event(&e)?;
        last = Some(e);
    }
    ctrl_c.abort();
    shutdown.cancel();
    worker.await??;

    let completed = last
        .as_ref()
        .is_some_and(|e| e.payload["status"] == "completed");
    // Reattach to learn where the files are (a directory, a container id).
    let location = provider
        .provision(
            &edward::core::chat::chat_sandbox_key(&cli.user, &chat),
            &Default::default(),
        )
        .await
        .map_or_else(|e| format!("unavailable ({e})"), |s| s.location());
    view.finish(last.as_ref(), &location);
    Ok(completed)
}

/// Human-friendly progress (spinner on a TTY, plain lines otherwise) or JSON lines.
struct View {
    json: bool,
    bar: Option<ProgressBar>,
    files: u64,
    bytes: u64,
    command: String,
}

impl View {
    fn new(json: bool) -> Self {
        let bar = if !json && std::io::stdout().is_terminal() {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template("{spinner:.green} {elapsed:>4} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.enable_steady_tick(Duration::from_millis(100));
            Some(pb)
        } else {
            None
        };
        View {
            json,
            bar,
            files: 0,
            bytes: 0,
            command: String::new(),
        }
    }

    fn line(&self, s: &str) {
        if self.json {
            return;
        }
        match &self.bar {
            Some(pb) => pb.println(s),
            None => println!("{s}"),
        }
    }

    fn status(&self, s: &str) {
        if let Some(pb) = &self.bar {
            pb.set_message(s.to_string());
        }
    }

    fn event(&mut self, e: &RunEvent) -> Result<(), serde_json::Error> {
        if self.json {
            println!("{}", serde_json::to_string(e)?);
            return Ok(());
        }
        let Some(ev) = EngineEvent::from_stored(&e.kind, &e.payload) else {
            return Ok(());
        };
        match ev {
            EngineEvent::RunStarted {
                model, provider, ..
            } => self.line(&format!("▶ started (model {model} via {provider})")),
            EngineEvent::RunResumed { from_turn, .. } => {
                self.line(&format!("↻ resumed after turn {from_turn}"))
            }
            EngineEvent::RunWaiting { behind } => {
                self.line(&format!("… waiting for run {behind} of this chat"))
            }
            EngineEvent::FrameworkDetected {
                framework,
                evidence,
            } => self.line(&format!("◆ framework: {framework} ({evidence})")),
            EngineEvent::ContextPrepared {
                history_messages,
                history_dropped,
                files_listed,
                files_included,
                estimated_tokens,
            } => self.line(&format!(
                "◆ context: {history_messages} earlier messages ({history_dropped} dropped), \
                 {files_listed} files listed ({files_included} with text), ~{estimated_tokens} tokens"
            )),
            EngineEvent::BuildFinished {
                number,
                status,
                exit_code,
                ..
            } => self.line(&format!(
                "⚒ build {number}: {status} (exit {})",
                exit_code.map_or("-".to_string(), |c| c.to_string())
            )),
            EngineEvent::TurnStarted { turn, .. } => {
                self.line(&format!("— turn {turn}"));
                self.status(&format!("turn {turn}: thinking…"));
            }
            EngineEvent::FileDelta { path, .. } => self.status(&format!("writing {path}")),
            EngineEvent::TextDelta { .. } => self.status("writing reply"),
            EngineEvent::FileWritten { path, bytes, .. } => {
                self.files += 1;
                self.bytes += bytes;
                self.line(&format!("  ✎ {path} ({bytes} bytes)"));
            }
            EngineEvent::FileWriteFailed { path, error, .. } => {
                self.line(&format!("  ✗ {path}: {error}"))
            }
            EngineEvent::FileTruncated {
                path,
                bytes,
                finish_reason,
                ..
            } => self.line(&format!(
                "  ✂ {path}: cut off after {bytes} bytes ({finish_reason}); not written"
            )),
            EngineEvent::SandboxNotIsolated { reason, .. } => {
                self.line(&format!("  ⚠ sandbox not isolated: {reason}"))
            }
            EngineEvent::InstallStarted { dependencies, .. } => {
                self.status(&format!("installing {}", dependencies.join(" ")))
            }
            EngineEvent::InstallFinished { result, .. } => self.line(&format!(
                "  ⬇ install → {}",
                exit(result.exit_code, result.error.as_deref())
            )),
            EngineEvent::CommandStarted { command, args, .. } => {
                self.command = std::iter::once(command)
                    .chain(args)
                    .collect::<Vec<_>>()
                    .join(" ");
                self.status(&format!("running {}", self.command))
            }
            EngineEvent::CommandFinished { result, .. } => self.line(&format!(
                "  $ {} → {} ({} ms)",
                self.command,
                exit(result.exit_code, result.error.as_deref()),
                result.duration_ms
            )),
            EngineEvent::CommandRejected {
                command, reason, ..
            } => self.line(&format!("  ⊘ {command} rejected: {reason}")),
            EngineEvent::ToolSkipped { tool, budget, .. } => {
                self.line(&format!("  ⊘ {tool} skipped ({budget} budget)"))
            }
            EngineEvent::ParseError { code, message, .. } => {
                self.line(&format!("  ! parse error {code}: {message}"))
            }
            EngineEvent::BudgetWarning {
                budget,
                used,
                limit,
            } => self.line(&format!("  ⚠ budget {budget}: {used} of {limit} used")),
            EngineEvent::TurnFinished {
                turn,
                usage,
                outcome,
                ..
            } => self.line(&format!(
                "  turn {turn} done: {} in / {} out tokens{} → {outcome}",
                usage.input_tokens,
                usage.output_tokens,
                if usage.estimated { " (estimated)" } else { "" }
            )),
            _ => {}
        }
        Ok(())
    }

    fn finish(&self, last: Option<&RunEvent>, location: &str) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
        if self.json {
            return;
        }
        let Some(last) = last else {
            println!("the run produced no events");
            return;
        };
        let p = &last.payload;
        println!();
        println!(
            "run {}: {} ({})",
            last.run_id,
            p["status"].as_str().unwrap_or("?"),
            p["reason"].as_str().unwrap_or("?")
        );
        println!(
            "  turns {}, tool calls {}, tokens {} in / {} out, cost ${:.4}, {} ms",
            p["turns"],
            p["tool_calls"],
            p["usage"]["input_tokens"],
            p["usage"]["output_tokens"],
            p["cost_usd"].as_f64().unwrap_or(0.0),
            p["duration_ms"]
        );
        println!("  files written: {} ({} bytes)", self.files, self.bytes);
        println!("  sandbox: {location}");
    }
}

fn exit(code: Option<i32>, error: Option<&str>) -> String {
    match (code, error) {
        (_, Some(e)) => format!("error: {e}"),
        (Some(c), None) => format!("exit {c}"),
        (None, None) => "killed".into(),
    }
}
