//! The Edward HTTP API with embedded defaults: a durable SQLite store and
//! queue (`--db`, default `./edward.db`), local sandboxes under
//! `./edward-data/sandboxes` (`--dir`), the scripted demo model unless
//! `EDWARD_MODEL` names a provider (docs/PROVIDERS.md), and a worker in the
//! same process. `GET /` serves a page that runs a prompt and shows it live.
//!
//! ```text
//! cargo run --example server                       # prints a development API key
//! cargo run --example server -- --api-key alice:sk-alice --api-key bob:sk-bob
//! cargo run --example server --features postgres -- --database-url postgres://…
//! cargo run --example server --features docker -- --sandbox docker
//! EDWARD_REDIS_URL=redis://127.0.0.1:6379 cargo run --example server --features redis
//! ```
//!
//! `--sandbox docker` runs each run in a container (image `--image`,
//! default `edward-sandbox:busybox`, built by `scripts/docker-image.sh`;
//! docs/DOCKER.md). `EDWARD_REDIS_URL` (or `--redis-url`) takes the queue,
//! notifier and write buffer from Redis (docs/REDIS.md).
//!
//! Every `/v1` request needs `Authorization: Bearer <key>` (`401` without).
//! See docs/HTTP.md for the routes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use edward::core::engine::{Backend, Engine, EngineBuilder, WorkerConfig};
use edward::core::{AdmissionLimits, SandboxProvider};
use edward::http::{Api, ApiKeys, HttpConfig, RateLimit, WebhookConfig};
use edward::sandbox::LocalSandboxProvider;
use tokio_util::sync::CancellationToken;

/// Serve the Edward HTTP API and its web page.
#[derive(Debug, Parser)]
#[command(
    name = "server",
    about = "Serve the Edward HTTP API with embedded defaults"
)]
struct Cli {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: SocketAddr,
    /// An API key as USER:KEY (repeatable). Without any, a development key
    /// for user `dev` is generated and printed.
    #[arg(long = "api-key", value_name = "USER:KEY", value_parser = ApiKeys::parse_pair)]
    api_keys: Vec<(String, String)>,
    /// SQLite database file holding runs, events and the queue.
    #[arg(long, default_value = "edward.db")]
    db: PathBuf,
    /// A `postgres://` URL to use instead of the SQLite file (feature `postgres`).
    #[arg(long, env = "EDWARD_DATABASE_URL")]
    database_url: Option<String>,
    /// Where sandboxes live.
    #[arg(long, default_value = "./edward-data/sandboxes")]
    dir: PathBuf,
    /// Sandbox backend: `local` (a directory per run under `--dir`) or
    /// `docker` (a container per run; needs the `docker` feature).
    #[arg(long, value_enum, default_value = "local")]
    sandbox: SandboxKind,
    /// The image of Docker sandboxes (default `edward-sandbox:busybox`,
    /// built by `scripts/docker-image.sh`).
    #[arg(long)]
    image: Option<String>,
    /// A `redis://` URL: queue, notifier and write buffer from Redis (runs
    /// stay in SQLite or Postgres; feature `redis`, docs/REDIS.md).
    #[arg(long, env = "EDWARD_REDIS_URL")]
    redis_url: Option<String>,
    /// Runs this process works on at once (0 = serve the API only).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Active (queued or running) runs allowed in total.
    #[arg(long, default_value_t = AdmissionLimits::default().global)]
    limit_global: u32,
    /// Active runs allowed per user.
    #[arg(long, default_value_t = AdmissionLimits::default().per_user)]
    limit_user: u32,
    /// Active runs allowed per chat.
    #[arg(long, default_value_t = AdmissionLimits::default().per_chat)]
    limit_chat: u32,
    /// Requests per second per API key (0 = no limit); bursts of twice that.
    #[arg(long, default_value_t = 20)]
    rate_limit: u32,
    /// An origin allowed by CORS (repeatable; `*` for any).
    #[arg(long = "cors-origin")]
    cors_origins: Vec<String>,
    /// POST `run_finished` (with `--webhook-all-events`, every event) of the
    /// runs this server admits to this URL, signed with `--webhook-secret`.
    #[arg(long, env = "EDWARD_WEBHOOK_URL", requires = "webhook_secret")]
    webhook_url: Option<String>,
    /// The webhook signing secret (`whsec_<base64>`).
    #[arg(long, env = "EDWARD_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Deliver every event, not only `run_finished`.
    #[arg(long)]
    webhook_all_events: bool,
    /// Allow webhook targets on loopback/private addresses.
    #[arg(long)]
    webhook_allow_private: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SandboxKind {
    Local,
    Docker,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match serve(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn serve(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let sandboxes: Arc<dyn SandboxProvider> = match cli.sandbox {
        SandboxKind::Local => {
            std::fs::create_dir_all(&cli.dir)?;
            Arc::new(LocalSandboxProvider::new(&cli.dir))
        }
        SandboxKind::Docker => docker_provider(&cli).await?,
    };
    let (backend, redis_write_buffer) = with_redis(&cli, open_backend(&cli).await?).await?;
    let mut builder = Engine::builder()
        .backend(backend)
        .sandbox_provider(sandboxes)
        .admission_limits(AdmissionLimits {
            global: cli.limit_global,
            per_user: cli.limit_user,
            per_chat: cli.limit_chat,
        });
    if let Some(w) = redis_write_buffer {
        builder = builder.write_buffer(w);
    }
    let engine = with_model_from_env(builder)?.build()?;

    let mut keys = ApiKeys::new();
    for (user, key) in &cli.api_keys {
        keys.insert(user.clone(), key);
    }
    let generated = keys.is_empty().then(|| {
        let key = format!("edk_dev_{:032x}", rand::random::<u128>());
        keys.insert("dev", &key);
        key
    });
    let mut config = HttpConfig::default()
        .rate_limit((cli.rate_limit > 0).then(|| RateLimit {
            per_second: cli.rate_limit,
            burst: cli.rate_limit.saturating_mul(2),
        }))
        .cors_origins(cli.cors_origins.clone());
    if let (Some(url), Some(secret)) = (&cli.webhook_url, &cli.webhook_secret) {
        config = config.webhook(
            WebhookConfig::new(url, secret)?
                .all_events(cli.webhook_all_events)
                .allow_private(cli.webhook_allow_private),
        );
    }
    let api = Api::new(engine.clone(), keys, config);

    let listener = tokio::net::TcpListener::bind(cli.bind).await?;
    let addr = listener.local_addr()?;
    println!("Edward server listening on http://{addr}");
    match &generated {
        Some(key) => println!("development API key (user `dev`): {key}"),
        None => println!("API keys: {} configured", cli.api_keys.len()),
    }

    let shutdown = CancellationToken::new();
    let worker = (cli.workers > 0).then(|| {
        let engine = engine.clone();
        let cfg = WorkerConfig::new(shutdown.clone()).with_concurrency(cli.workers);
        tokio::spawn(async move { engine.worker(cfg).await })
    });
    api.serve(listener, shutdown_signal()).await?;
    // Runs in flight are left to their leases: another worker, or this
    // server's next start, resumes them from their checkpoints.
    shutdown.cancel();
    if let Some(worker) = worker {
        let _ = worker.await;
    }
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
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
    Err("--sandbox docker needs the `docker` feature (cargo run --example server --features docker -- --sandbox docker)".into())
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

/// Postgres when a URL is given (store, queue and LISTEN/NOTIFY, so several
/// server processes work together), else the SQLite file.
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
    Ok(edward::store::SqliteStore::open(&cli.db).await?.backend())
}

/// `EDWARD_MODEL=openai:gpt-4o-mini` (or `anthropic:…`, `gemini:…`) picks
/// the model; unset keeps the scripted demo.
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
fn with_model_from_env(
    builder: EngineBuilder,
) -> Result<EngineBuilder, Box<dyn std::error::Error>> {
    Ok(match edward::core::providers::from_env()? {
        Some(selected) => builder
            .model_client(selected.client)
            .default_model(selected.model),
        None => builder,
    })
}

#[cfg(not(any(feature = "openai", feature = "anthropic", feature = "gemini")))]
fn with_model_from_env(
    builder: EngineBuilder,
) -> Result<EngineBuilder, Box<dyn std::error::Error>> {
    if std::env::var("EDWARD_MODEL").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "scripted") {
        return Err("EDWARD_MODEL is set but this build has no model provider features".into());
    }
    Ok(builder)
}
