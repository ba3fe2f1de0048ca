//! The HTTP API over real sockets: every route and error code, SSE resume,
//! isolation between users.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{ALICE, BOB, Opts, TestServer, expect_error, unique};
use edward_core::scripted::ScriptedModel;
use edward_http::{HttpConfig, RateLimit};
use serde_json::{Value, json};

fn slow_model() -> ScriptedModel {
    ScriptedModel::new(["streaming text ".repeat(200)])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(8))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_stream_get_and_list_a_run() {
    let s = TestServer::start(Opts::default()).await;
    let chat = unique("chat");
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": chat, "prompt": "build a todo app" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let location = res.headers()["location"].to_str().unwrap().to_string();
    let body: Value = res.json().await.unwrap();
    let id = body["run_id"].as_str().unwrap().to_string();
    assert_eq!(location, format!("/v1/runs/{id}"));
    assert_eq!(body["events_url"], format!("/v1/runs/{id}/events"));
    assert!(["queued", "running"].contains(&body["status"].as_str().unwrap()));

    let mut sse = s.sse(id.parse().unwrap(), ALICE, "", None).await;
    let first = sse.next_within(Duration::from_secs(10)).await.unwrap();
    assert_eq!(first.retry, Some(2000), "a retry hint comes first");
    let events = sse.collect_events().await;
    let seqs: Vec<u64> = events.iter().map(|f| f.seq().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "ids are seqs 1..=n"
    );
    for f in &events {
        let data = f.json();
        assert_eq!(data["run_id"], id.as_str());
        assert_eq!(data["seq"], f.seq().unwrap());
        assert_eq!(
            data["type"].as_str(),
            f.event.as_deref(),
            "event: is the type"
        );
        assert!(data["at"].is_string() && data["payload"].is_object());
    }
    let last = events.last().unwrap().json();
    assert_eq!(
        last["type"], "run_finished",
        "the stream ends after run_finished"
    );
    assert_eq!(last["payload"]["status"], "completed");

    let run: Value = s
        .get(&location, ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "completed");
    assert_eq!(run["reason"], "done");
    assert_eq!(run["chat_id"], chat.as_str());
    assert_eq!(run["last_seq"], seqs.len() as u64);
    assert!(run["turns"].as_u64().unwrap() >= 1);
    assert!(run["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert!(run["cost_usd"].is_number());
    assert!(run["finished_at"].is_string());

    let list: Value = s
        .get("/v1/runs", ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["runs"][0]["run_id"], id.as_str());
    let list: Value = s
        .get(&format!("/v1/runs?chat_id={chat}&status=completed"), ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["runs"].as_array().unwrap().len(), 1);
    let list: Value = s
        .get(&format!("/v1/runs?chat_id={chat}&status=running"), ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(list["runs"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_by_cursor() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(s.submit(ALICE, "p").await.to_string());
    }
    s.submit(BOB, "bob's").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/runs?limit=2&cursor={c}"),
            None => "/v1/runs?limit=2".to_string(),
        };
        let page: Value = s.get(&q, ALICE).send().await.unwrap().json().await.unwrap();
        let runs = page["runs"].as_array().unwrap();
        assert!(runs.len() <= 2);
        seen.extend(
            runs.iter()
                .map(|r| r["run_id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest first, every run once, only the caller's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_every_seq_of_a_finished_run() {
    let s = TestServer::start(Opts::default()).await;
    let id = s.submit(ALICE, "build a todo app").await;
    let run = s.wait_finished(id).await;
    let n = run.last_seq;
    assert!(n > 5, "a demo run has several events");
    for after in 0..=n {
        // Alternate the two cursors: `?after=` and `Last-Event-ID`.
        let mut sse = if after % 2 == 0 {
            s.sse(id, ALICE, &format!("?after={after}"), None).await
        } else {
            s.sse(id, ALICE, "?after=0", Some(after)).await
        };
        let seqs: Vec<u64> = sse
            .collect_events()
            .await
            .iter()
            .map(|f| f.seq().unwrap())
            .collect();
        assert_eq!(seqs, ((after + 1)..=n).collect::<Vec<_>>(), "after {after}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_run_resumes_and_sees_each_seq_once() {
    let s = TestServer::start(Opts {
        model: slow_model(),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "stream").await;
    let mut seen = Vec::new();
    {
        let mut sse = s.sse(id, ALICE, "", None).await;
        while seen.len() < 4 {
            let f = sse
                .next_within(Duration::from_secs(10))
                .await
                .expect("open");
            if let Some(seq) = f.seq() {
                seen.push(seq);
            }
        }
        // Dropping the reader closes the connection mid-run.
    }
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert!(
        !run.status.is_terminal(),
        "the run is still going after the disconnect"
    );
    let mut sse = s.sse(id, ALICE, "", Some(*seen.last().unwrap())).await;
    let rest: Vec<u64> = sse
        .collect_events()
        .await
        .iter()
        .map(|f| f.seq().unwrap())
        .collect();
    seen.extend(rest);
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert_eq!(
        run.status.as_str(),
        "completed",
        "a disconnect never cancels a run"
    );
    assert_eq!(
        seen,
        (1..=run.last_seq).collect::<Vec<_>>(),
        "each seq exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_quiet_stream_alive() {
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default()
            .rate_limit(None)
            .heartbeat(Duration::from_millis(100)),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "nobody runs this").await;
    let mut sse = s.sse(id, ALICE, "?after=1", None).await;
    assert!(
        sse.next_within(Duration::from_secs(5))
            .await
            .unwrap()
            .retry
            .is_some()
    );
    let start = Instant::now();
    let mut heartbeats = 0;
    while heartbeats < 3 {
        let f = sse
            .next_within(Duration::from_secs(2))
            .await
            .expect("still open");
        assert!(
            f.id.is_none() && f.data.is_none(),
            "only comments on a quiet stream: {f:?}"
        );
        assert!(!f.comments.is_empty());
        heartbeats += 1;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "heartbeats are paced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_max_age_or_at_shutdown_says_reconnect() {
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default()
            .rate_limit(None)
            .max_stream_age(Duration::from_millis(300)),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "quiet").await;
    let mut sse = s.sse(id, ALICE, "", None).await;
    let mut frames = Vec::new();
    while let Some(f) = sse.next_within(Duration::from_secs(5)).await {
        frames.push(f);
    }
    let reconnect = frames
        .iter()
        .find(|f| f.event.as_deref() == Some("reconnect"))
        .expect("reconnect");
    assert!(
        reconnect.id.is_none(),
        "no id: the last event id stays the last seq"
    );
    assert_eq!(reconnect.json()["after"], 1);
    assert_eq!(reconnect.json()["reason"], "max_stream_age");
    assert_eq!(
        frames.iter().filter_map(|f| f.seq()).collect::<Vec<_>>(),
        vec![1]
    );

    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "quiet").await;
    let mut sse = s.sse(id, ALICE, "", None).await;
    sse.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        sse.next_within(Duration::from_secs(5)).await.unwrap().seq(),
        Some(1)
    );
    s.api.begin_shutdown();
    let f = sse.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(f.event.as_deref(), Some("reconnect"));
    assert_eq!(f.json()["reason"], "shutdown");
    assert!(sse.next_within(Duration::from_secs(5)).await.is_none());
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert_eq!(
        run.status.as_str(),
        "queued",
        "shutting the API down does not touch runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_answers_json_arrays() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "quiet").await;
    let poll = |q: String| {
        s.get(&format!("/v1/runs/{id}/events{q}"), ALICE)
            .header("accept", "application/json")
            .send()
    };
    let res = poll("?after=0".into()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-next-after"], "1");
    let events: Vec<Value> = res.json().await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "run_queued");

    let start = Instant::now();
    let events: Vec<Value> = poll("?after=1&wait=300ms".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(events.is_empty());
    assert!(start.elapsed() >= Duration::from_millis(250), "it waited");

    // A waiting poll is answered as soon as an event exists.
    let waiting = tokio::spawn(poll("?after=1&wait=20s".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = s
        .post(&format!("/v1/runs/{id}/cancel"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let mut events: Vec<Value> = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(events[0]["seq"], 2);
    assert_eq!(events[0]["type"], "cancel_requested");
    // The cancel's terminal event follows (in the same answer or the next).
    while events.last().unwrap()["type"] != "run_finished" {
        let after = events.last().unwrap()["seq"].as_u64().unwrap();
        let more: Vec<Value> = poll(format!("?after={after}&wait=20s"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(more[0]["seq"].as_u64().unwrap(), after + 1, "no gap");
        events.extend(more);
    }
    let last = events.last().unwrap()["seq"].as_u64().unwrap();

    // After the end: nothing more, at once.
    let start = Instant::now();
    let events: Vec<Value> = poll(format!("?after={last}&wait=20s"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(events.is_empty());
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_is_202_then_200_and_wait_returns_the_final_state() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "queued").await;
    let res = s
        .post(&format!("/v1/runs/{id}/cancel"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let res = s
        .post(&format!("/v1/runs/{id}/cancel"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["reason"], "cancelled");

    let s = TestServer::start(Opts {
        model: slow_model(),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "running").await;
    let mut sse = s.sse(id, ALICE, "", None).await;
    loop {
        let f = sse.next_within(Duration::from_secs(10)).await.unwrap();
        if f.event.as_deref() == Some("text_delta") {
            break;
        }
    }
    let res = s
        .post(&format!("/v1/runs/{id}/cancel?wait=true"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "wait=true answers with the final state");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "cancelled");
    let rest = sse.collect_events().await;
    let last = rest.last().unwrap().json();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["payload"]["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_listed_with_sizes_and_served_with_a_content_type() {
    let s = TestServer::start(Opts::default()).await;
    let id = s.submit(ALICE, "build a todo app").await;
    s.wait_finished(id).await;
    let list: Value = s
        .get(&format!("/v1/runs/{id}/files"), ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let files = list["files"].as_array().unwrap();
    let names: BTreeSet<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert!(
        names.is_superset(&["app.js", "index.html", "style.css"].into()),
        "{names:?}"
    );
    for f in files {
        let path = f["path"].as_str().unwrap();
        let res = s
            .get(&format!("/v1/runs/{id}/files/{path}"), ALICE)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let ct = res.headers()["content-type"].to_str().unwrap().to_string();
        let expected = match path.rsplit('.').next() {
            Some("html") => "text/html; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            _ => "",
        };
        if !expected.is_empty() {
            assert_eq!(ct, expected, "{path}");
        }
        assert_eq!(res.headers()["x-content-type-options"], "nosniff");
        let bytes = res.bytes().await.unwrap();
        assert_eq!(
            bytes.len() as u64,
            f["size"].as_u64().unwrap(),
            "{path} size"
        );
    }
    let res = s
        .get(&format!("/v1/runs/{id}/files/%2E%2E%2Fetc%2Fpasswd"), ALICE)
        .send()
        .await
        .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert_eq!(body["error"]["field"], "path");
    let res = s
        .get(&format!("/v1/runs/{id}/files/missing.txt"), ALICE)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_a_sandbox_has_no_files_and_none_is_created() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "queued").await;
    let list: Value = s
        .get(&format!("/v1/runs/{id}/files"), ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["files"], json!([]));
    let res = s
        .get(&format!("/v1/runs/{id}/files/index.html"), ALICE)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
    let workspace = s
        .provider
        .workspace_path(&edward_core::engine::Engine::sandbox_key(
            &s.engine.get(id).await.unwrap().unwrap(),
        ));
    assert!(
        !workspace.exists(),
        "reading files never provisions a sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_run_is_404_on_every_route() {
    let s = TestServer::start(Opts::default()).await;
    let id = s.submit(ALICE, "build a todo app").await;
    s.wait_finished(id).await;
    let routes = [
        ("GET", format!("/v1/runs/{id}")),
        ("GET", format!("/v1/runs/{id}/events")),
        ("GET", format!("/v1/runs/{id}/events?after=0")),
        ("POST", format!("/v1/runs/{id}/cancel")),
        ("POST", format!("/v1/runs/{id}/cancel?wait=true")),
        ("GET", format!("/v1/runs/{id}/files")),
        ("GET", format!("/v1/runs/{id}/files/index.html")),
    ];
    for (method, path) in &routes {
        for accept in ["text/event-stream", "application/json"] {
            let req = if *method == "GET" {
                s.get(path, BOB)
            } else {
                s.post(path, BOB)
            };
            let res = req.header("accept", accept).send().await.unwrap();
            expect_error(res, 404, "not_found").await;
            // The same answer as for a run that does not exist.
            let unknown = path.replace(&id.to_string(), &edward_core::RunId::new().to_string());
            let req = if *method == "GET" {
                s.get(&unknown, ALICE)
            } else {
                s.post(&unknown, ALICE)
            };
            expect_error(
                req.header("accept", accept).send().await.unwrap(),
                404,
                "not_found",
            )
            .await;
        }
        // And every route needs a key.
        let req = if *method == "GET" {
            s.client.get(s.url(path))
        } else {
            s.client.post(s.url(path))
        };
        expect_error(req.send().await.unwrap(), 401, "unauthorized").await;
    }
    let list: Value = s
        .get("/v1/runs", BOB)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["runs"], json!([]));
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert_eq!(run.status.as_str(), "completed", "bob's cancel did nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_codes() {
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default().rate_limit(None).body_limit(4096),
        limits: edward_core::AdmissionLimits {
            global: 1000,
            per_user: 3,
            per_chat: 1,
        },
        ..Opts::default()
    })
    .await;
    let submit = |body: Value| s.post("/v1/runs", ALICE).json(&body).send();

    // 401
    expect_error(
        s.client.get(s.url("/v1/runs")).send().await.unwrap(),
        401,
        "unauthorized",
    )
    .await;
    expect_error(
        s.get("/v1/runs", "sk-wrong").send().await.unwrap(),
        401,
        "unauthorized",
    )
    .await;
    let res = s
        .client
        .get(s.url("/v1/runs"))
        .header("authorization", format!("Basic {ALICE}"))
        .send()
        .await
        .unwrap();
    expect_error(res, 401, "unauthorized").await;
    // 404 route, 405 method
    expect_error(
        s.get("/v1/nope", ALICE).send().await.unwrap(),
        404,
        "not_found",
    )
    .await;
    expect_error(
        s.client
            .delete(s.url("/v1/runs"))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap(),
        405,
        "method_not_allowed",
    )
    .await;
    expect_error(
        s.get("/v1/runs/not-a-uuid", ALICE).send().await.unwrap(),
        404,
        "not_found",
    )
    .await;
    // 400, 415, 413
    let res = s
        .post("/v1/runs", ALICE)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    expect_error(res, 400, "invalid_json").await;
    let res = s
        .post("/v1/runs", ALICE)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    expect_error(res, 415, "unsupported_media_type").await;
    let res = submit(json!({ "chat_id": "c", "prompt": "x".repeat(5000) }))
        .await
        .unwrap();
    expect_error(res, 413, "payload_too_large").await;
    // 422 naming the field
    for (body, field) in [
        (json!({ "chat_id": "c" }), "prompt"),
        (json!({ "chat_id": "c", "prompt": "  " }), "prompt"),
        (json!({ "chat_id": "", "prompt": "p" }), "chat_id"),
        (json!({ "chat_id": "c", "prompt": 5 }), "prompt"),
        (
            json!({ "chat_id": "c", "prompt": "p", "colour": 1 }),
            "colour",
        ),
        (
            json!({ "chat_id": "c", "prompt": "p", "model": "gpt-99" }),
            "model",
        ),
        (
            json!({ "chat_id": "c", "prompt": "p", "budgets": { "max_turns": 0 } }),
            "budgets.max_turns",
        ),
        (
            json!({ "chat_id": "c", "prompt": "p", "budgets": { "max_turns": "x" } }),
            "budgets.max_turns",
        ),
    ] {
        let res = submit(body.clone()).await.unwrap();
        let err = expect_error(res, 422, "validation_failed").await;
        assert_eq!(err["error"]["field"], field, "{body}");
    }
    for (q, field) in [
        ("/v1/runs?limit=0", "limit"),
        ("/v1/runs?limit=x", "limit"),
        ("/v1/runs?status=bogus", "status"),
        ("/v1/runs?cursor=zzz", "cursor"),
    ] {
        let err = expect_error(
            s.get(q, ALICE).send().await.unwrap(),
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(err["error"]["field"], field, "{q}");
    }
    let id = s.submit(ALICE, "p").await;
    for (q, h, field) in [
        ("?after=x", None, "after"),
        ("?wait=forever", None, "wait"),
        ("", Some("abc"), "Last-Event-ID"),
    ] {
        let mut req = s.get(&format!("/v1/runs/{id}/events{q}"), ALICE);
        if let Some(h) = h {
            req = req.header("last-event-id", h);
        }
        let err = expect_error(req.send().await.unwrap(), 422, "validation_failed").await;
        assert_eq!(err["error"]["field"], field);
    }
    // 429: admission limits, named, with Retry-After.
    let chat = unique("chat");
    assert_eq!(
        submit(json!({ "chat_id": chat, "prompt": "p" }))
            .await
            .unwrap()
            .status(),
        201
    );
    let res = submit(json!({ "chat_id": chat, "prompt": "p" }))
        .await
        .unwrap();
    assert!(res.headers().contains_key("retry-after"));
    let err = expect_error(res, 429, "limit_exceeded").await;
    assert_eq!(err["error"]["limit"], "chat");
    assert_eq!(
        submit(json!({ "chat_id": unique("c"), "prompt": "p" }))
            .await
            .unwrap()
            .status(),
        201
    );
    let err = expect_error(
        submit(json!({ "chat_id": unique("c"), "prompt": "p" }))
            .await
            .unwrap(),
        429,
        "limit_exceeded",
    )
    .await;
    assert_eq!(err["error"]["limit"], "user");

    // Metrics saw the rejections and the requests.
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("edward_admissions_rejected_total{limit=\"chat\"} 1"),
        "{text}"
    );
    assert!(text.contains("edward_http_request_duration_seconds_bucket"));
    assert!(text.contains("edward_runs{status=\"queued\"} 3"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_gives_the_same_run_once() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let body = json!({ "chat_id": unique("chat"), "prompt": "once" });
    let send = |key: &'static str, body: Value| {
        s.post("/v1/runs", ALICE)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let first = send("k1", body.clone()).await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first: Value = first.json().await.unwrap();
    // Same key, same body, concurrently and after: the same run, no second
    // admission (the chat limit of 1 would refuse a second one).
    let again = futures::future::join_all((0..8).map(|_| send("k1", body.clone()))).await;
    for res in again {
        let res = res.unwrap();
        assert_eq!(res.status(), 201);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        let b: Value = res.json().await.unwrap();
        assert_eq!(b["run_id"], first["run_id"]);
    }
    let mut other = body.clone();
    other["prompt"] = json!("different");
    expect_error(
        send("k1", other).await.unwrap(),
        409,
        "idempotency_conflict",
    )
    .await;
    let list: Value = s
        .get("/v1/runs", ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["runs"].as_array().unwrap().len(), 1);
    // Keys are per API key: bob's k1 is his own.
    let res = s
        .post("/v1/runs", BOB)
        .header("idempotency-key", "k1")
        .json(&json!({ "chat_id": unique("c"), "prompt": "bob" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_rate_limit_is_429_with_retry_after() {
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default().rate_limit(Some(RateLimit {
            per_second: 1,
            burst: 3,
        })),
        ..Opts::default()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(s.get("/v1/runs", ALICE).send().await.unwrap().status(), 200);
    }
    let res = s.get("/v1/runs", ALICE).send().await.unwrap();
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry));
    expect_error(res, 429, "rate_limited").await;
    assert_eq!(
        s.get("/v1/runs", BOB).send().await.unwrap().status(),
        200,
        "per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_openapi_and_page() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let res = s.client.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "ok");

    let id = s.submit(ALICE, "quiet").await;
    let _sse = s.sse(id, ALICE, "", None).await;
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("edward_sse_subscribers 1"), "{text}");
    assert!(text.contains("edward_active_runs 1"));
    assert!(text.contains("edward_runs_submitted_total 1"));
    assert!(
        text.contains("edward_events_appended_total 1\n"),
        "run_queued: {text}"
    );
    // Counted by the engine, watched or not: an unwatched run cancelled
    // while queued appends run_queued, cancel_requested and run_finished.
    let other = s.submit(BOB, "unwatched").await;
    let res = s
        .post(&format!("/v1/runs/{other}/cancel"), BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("edward_events_appended_total 4\n"), "{text}");
    assert!(text.contains("edward_sse_hubs 1\n"), "{text}");

    let doc: Value = s
        .client
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/events",
        "/v1/runs/{id}/cancel",
        "/v1/runs/{id}/files",
        "/v1/runs/{id}/files/{path}",
        "/healthz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    for schema in [
        "SubmitRun",
        "RunView",
        "EventView",
        "ErrorBody",
        "RunPage",
        "FileList",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());

    let page = s.client.get(s.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(page.text().await.unwrap().contains("/assets/app.js"));
    let js = s.client.get(s.url("/assets/app.js")).send().await.unwrap();
    assert_eq!(js.status(), 200);
    assert!(js.text().await.unwrap().contains("Last-Event-ID"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_configurable() {
    let preflight = |s: &TestServer| {
        s.client
            .request(reqwest::Method::OPTIONS, s.url("/v1/runs"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type,idempotency-key",
            )
            .send()
    };
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let res = preflight(&s).await.unwrap();
    assert!(!res.headers().contains_key("access-control-allow-origin"));

    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default()
            .rate_limit(None)
            .cors_origins(["https://app.example"]),
        ..Opts::default()
    })
    .await;
    let res = preflight(&s).await.unwrap();
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let allowed = res.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("idempotency-key"));
    let res = s
        .get("/v1/runs", ALICE)
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://app.example"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_408_after_the_request_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = Duration::from_millis(300);
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default()
            .rate_limit(None)
            .request_timeout(timeout),
        ..Opts::default()
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Headers promise 100 bytes; only a few arrive, then the client stalls.
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"chat_id\""
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = tcp.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || String::from_utf8_lossy(&answer).contains("request_timeout") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server answers a stalled body");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(start.elapsed() >= timeout, "not before the timeout");
    // Nothing was admitted.
    let list: Value = s
        .get("/v1/runs", ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(list["runs"].as_array().unwrap().is_empty());
}
