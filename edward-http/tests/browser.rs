//! The web page in a real headless Chromium, driven through chromedriver
//! (Debian's `chromium` + `chromium-driver`; `scripts/browser.sh` installs
//! them and `scripts/test.sh` runs it). Submits a prompt, sees the files and
//! the final status, survives stream reconnects without duplicating
//! anything, cancels a run, and saves a screenshot as a test artifact
//! (`$CARGO_TARGET_TMPDIR/artifacts/server-page.png`; with
//! `EDWARD_UPDATE_SCREENSHOT=1` also `docs/server-page.png`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{ALICE, Opts, TestServer};
use edward_core::scripted::ScriptedModel;
use edward_http::HttpConfig;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

fn chromedriver() -> PathBuf {
    if let Some(p) = std::env::var_os("EDWARD_CHROMEDRIVER") {
        return PathBuf::from(p);
    }
    for p in ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "chromedriver not found: run scripts/browser.sh (scripts/test.sh does) to install chromium and chromium-driver"
    );
}

fn chromium() -> &'static str {
    ["/usr/bin/chromium", "/usr/lib/chromium/chromium"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium not found: run scripts/browser.sh (scripts/test.sh does)")
}

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: tokio::process::Child,
    url: String,
    profile: tempfile::TempDir,
}

async fn driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = tokio::process::Command::new(chromedriver())
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while http.get(format!("{url}/status")).send().await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("chromedriver answers within 20 s");
    Driver {
        child,
        url,
        profile: tempfile::tempdir().expect("profile dir"),
    }
}

impl Driver {
    async fn browser(&self) -> Client {
        let mut args: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", self.profile.path().display()));
        let caps = json!({
            "goog:chromeOptions": { "binary": chromium(), "args": args }
        });
        let serde_json::Value::Object(caps) = caps else {
            unreachable!()
        };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

async fn wait_for(c: &Client, css: &str, secs: u64) {
    c.wait()
        .at_most(Duration::from_secs(secs))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("waiting for {css}: {e}"));
}

async fn use_key(c: &Client, base: &str) {
    c.goto(base).await.expect("open the page");
    c.find(Locator::Id("key"))
        .await
        .expect("key input")
        .send_keys(ALICE)
        .await
        .expect("type the key");
    c.find(Locator::Id("save-key"))
        .await
        .expect("key button")
        .click()
        .await
        .expect("click");
    wait_for(c, "#submit:not([disabled])", 10).await;
}

async fn submit(c: &Client, prompt: &str) {
    let area = c.find(Locator::Id("prompt")).await.expect("prompt");
    area.clear().await.expect("clear");
    area.send_keys(prompt).await.expect("type the prompt");
    c.find(Locator::Id("submit"))
        .await
        .expect("run button")
        .click()
        .await
        .expect("click run");
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_runs_a_prompt_shows_files_and_status_and_takes_a_screenshot() {
    let s = TestServer::start(Opts {
        model: ScriptedModel::demo(),
        ..Opts::default()
    })
    .await;
    let d = driver().await;
    let c = d.browser().await;
    use_key(&c, &s.base).await;
    submit(&c, "build a todo app").await;
    wait_for(&c, "#status[data-status='completed']", 60).await;

    let run_id = text(&c, "#run-id").await;
    let id = run_id.parse().expect("the page shows the run id");
    let run = s.engine.get(id).await.unwrap().expect("the run exists");
    let expected = s
        .provider
        .workspace_path(&edward_core::engine::Engine::sandbox_key(&run));
    for name in ["index.html", "style.css", "app.js"] {
        let li = c
            .find(Locator::Css(&format!("#files li[data-path='{name}']")))
            .await
            .unwrap_or_else(|e| panic!("{name} listed: {e}"));
        let size: u64 = li
            .attr("data-size")
            .await
            .unwrap()
            .unwrap()
            .parse()
            .unwrap();
        let on_disk = std::fs::metadata(expected.join(name)).unwrap().len();
        assert_eq!(size, on_disk, "{name}: the page shows the written size");
    }
    let log = text(&c, "#log").await;
    assert!(log.contains("ls -la"), "the command is shown: {log}");
    assert!(log.contains("exit 0"), "with its exit code: {log}");
    assert!(text(&c, "#budget").await.contains("turns 2"));

    // Open a file.
    c.find(Locator::Css("#files li[data-path='index.html']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&c, "#viewer:not([hidden])", 10).await;
    let shown = text(&c, "#viewer-body").await;
    assert!(shown.contains("<html") || shown.contains("<!DOCTYPE") || shown.contains("<!doctype"));

    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"));
    let out = artifacts().join("server-page.png");
    std::fs::write(&out, &png).expect("write the screenshot");
    if std::env::var_os("EDWARD_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/server-page.png");
        std::fs::write(docs, &png).expect("write docs/server-page.png");
    }

    // A follow-up message continues the same chat: same workspace, the
    // first run's files still listed, the conversation in its context.
    let chat = c
        .find(Locator::Id("chat"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap()
        .expect("the chat id is kept in the input");
    assert_eq!(chat, run.chat_id, "the page shows the chat it continues");
    submit(&c, "add a dark mode toggle").await;
    wait_new_run(&c, &run_id).await;
    wait_for(&c, "#status[data-status='completed']", 60).await;
    let second: edward_core::RunId = text(&c, "#run-id").await.parse().unwrap();
    let second = s.engine.get(second).await.unwrap().expect("the second run");
    assert_eq!(second.chat_id, run.chat_id, "the same chat");
    for name in ["index.html", "style.css", "app.js", "theme.js"] {
        wait_for(&c, &format!("#files li[data-path='{name}']"), 10).await;
    }
    let log = text(&c, "#log").await;
    assert!(
        log.contains("context: 3 earlier messages"),
        "the context line shows the first run's history: {log}"
    );
    assert!(log.contains("framework: static"), "{log}");
    std::fs::write(
        artifacts().join("server-page-follow-up.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // "New chat" starts a new chat: a new workspace without those files.
    c.find(Locator::Id("new-chat"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&c, "#run[hidden]", 10).await;
    submit(&c, "build a todo app").await;
    wait_new_run(&c, &second.id.to_string()).await;
    wait_for(&c, "#status[data-status='completed']", 60).await;
    let third: edward_core::RunId = text(&c, "#run-id").await.parse().unwrap();
    let third = s.engine.get(third).await.unwrap().expect("the third run");
    assert_ne!(third.chat_id, run.chat_id, "a new chat");
    wait_for(&c, "#files li[data-path='app.js']", 10).await;
    assert!(
        c.find(Locator::Css("#files li[data-path='theme.js']"))
            .await
            .is_err(),
        "the new chat's workspace is its own"
    );
    c.close().await.expect("close");
}

/// Wait until the page shows a run other than `previous`.
async fn wait_new_run(c: &Client, previous: &str) {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let shown = text(c, "#run-id").await;
            if !shown.is_empty() && shown != previous {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the page opens the new run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_reconnects_without_duplicates_and_cancels_a_run() {
    let text_out = "streaming text ".repeat(120);
    let s = TestServer::start(Opts {
        model: ScriptedModel::new([text_out.clone()])
            .with_chunk_bytes(16)
            .with_delay(Duration::from_millis(15)),
        // Streams end every 400 ms with `reconnect`: the page must resume
        // from its last seq each time.
        http: HttpConfig::default()
            .rate_limit(None)
            .max_stream_age(Duration::from_millis(400)),
        ..Opts::default()
    })
    .await;
    let d = driver().await;
    let c = d.browser().await;
    use_key(&c, &s.base).await;

    submit(&c, "stream something").await;
    wait_for(&c, "#status[data-status='completed']", 60).await;
    let id = text(&c, "#run-id").await.parse().unwrap();
    let run = s.engine.get(id).await.unwrap().unwrap();
    let last_seq = c
        .find(Locator::Id("conn"))
        .await
        .unwrap()
        .attr("data-last-seq")
        .await
        .unwrap();
    assert_eq!(
        last_seq,
        Some(run.last_seq.to_string()),
        "every event arrived"
    );
    let shown = c
        .execute(
            "return [...document.querySelectorAll('#log .text')].map(e => e.textContent).join('')",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        shown.as_str().unwrap(),
        text_out,
        "the text appears exactly once across reconnects"
    );
    let turn_notes = c
        .execute(
            "return [...document.querySelectorAll('#log .note')].filter(e => e.textContent === 'turn 1').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(turn_notes, json!(1));

    // Cancel a running run from the page.
    let first = text(&c, "#run-id").await;
    submit(&c, "stream and get cancelled").await;
    wait_new_run(&c, &first).await;
    wait_for(&c, "#log .text", 30).await;
    c.find(Locator::Id("cancel"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&c, "#status[data-status='cancelled']", 30).await;
    let id = text(&c, "#run-id").await.parse().unwrap();
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert_eq!(run.status.as_str(), "cancelled");
    std::fs::write(
        artifacts().join("server-page-cancelled.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();
    c.close().await.expect("close");
}
