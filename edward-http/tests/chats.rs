//! Chats over real sockets: double-texting on `POST /v1/runs`, a chat's
//! messages, runs and shared workspace, a run's builds, and two users with
//! the same chat id kept apart.

mod common;

use std::time::Duration;

use common::{ALICE, BOB, Opts, TestServer, expect_error, unique};
use edward_core::RunId;
use edward_core::engine::{BuildConfig, EngineConfig};
use edward_core::scripted::ScriptedModel;
use serde_json::{Value, json};

fn slow_model() -> ScriptedModel {
    ScriptedModel::new(["streaming text ".repeat(400)])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(10))
}

async fn get_json(s: &TestServer, path: &str, key: &str) -> Value {
    let res = s.get(path, key).send().await.expect("get");
    assert_eq!(res.status(), 200, "GET {path}: {:?}", res.text().await);
    res.json().await.expect("json")
}

fn paths(files: &Value) -> Vec<String> {
    files["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().expect("path").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_chat_names_its_active_run_and_the_policy_is_per_request() {
    let s = TestServer::start(Opts {
        model: slow_model(),
        ..Opts::default()
    })
    .await;
    let chat = unique("busy");
    let first = s.submit_in(ALICE, &chat, "one").await;

    // Default policy (reject): 429, limit `chat`, Retry-After, the active run named.
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": chat, "prompt": "two" }))
        .send()
        .await
        .unwrap();
    assert!(res.headers().contains_key("retry-after"));
    let body = expect_error(res, 429, "limit_exceeded").await;
    assert_eq!(body["error"]["limit"], "chat");
    assert_eq!(body["error"]["active_run"], first.to_string(), "{body}");
    // Explicit `reject` is the same.
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": chat, "prompt": "two", "double_texting": "reject" }))
        .send()
        .await
        .unwrap();
    let body = expect_error(res, 429, "limit_exceeded").await;
    assert_eq!(body["error"]["active_run"], first.to_string());

    // An unknown policy is 422 naming the field.
    for bad in [json!("later"), json!(3), json!("Enqueue")] {
        let res = s
            .post("/v1/runs", ALICE)
            .json(&json!({ "chat_id": chat, "prompt": "two", "double_texting": bad }))
            .send()
            .await
            .unwrap();
        let body = expect_error(res, 422, "validation_failed").await;
        assert_eq!(body["error"]["field"], "double_texting", "{body}");
    }

    // Enqueue: admitted queued behind the first.
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": chat, "prompt": "two", "double_texting": "enqueue" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "queued");
    let second: RunId = body["run_id"].as_str().unwrap().parse().unwrap();

    // Interrupt: the chat's active runs are cancelled, the new one completes.
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": chat, "prompt": "three", "double_texting": "interrupt" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let body: Value = res.json().await.unwrap();
    let third: RunId = body["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(s.wait_finished(first).await.status.as_str(), "cancelled");
    assert_eq!(s.wait_finished(second).await.status.as_str(), "cancelled");
    assert_eq!(s.wait_finished(third).await.status.as_str(), "completed");

    // Another user's chat of the same id is another chat: not busy.
    let bobs = s.submit_in(BOB, &chat, "bob's").await;
    assert_ne!(bobs, third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_keeps_its_messages_runs_and_files_across_runs_per_user() {
    let s = TestServer::start(Opts::default()).await;
    let chat = unique("todo");
    let r1 = s.submit_in(ALICE, &chat, "build a todo app").await;
    assert_eq!(s.wait_finished(r1).await.status.as_str(), "completed");
    let r2 = s.submit_in(ALICE, &chat, "add a dark mode toggle").await;
    assert_eq!(s.wait_finished(r2).await.status.as_str(), "completed");

    // Messages: oldest first, both prompts, each turn's reply with effects.
    let list = get_json(&s, &format!("/v1/chats/{chat}/messages"), ALICE).await;
    assert_eq!(list["chat_id"], chat.as_str());
    let msgs = list["messages"].as_array().expect("messages");
    let prompts: Vec<(&str, &str)> = msgs
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| (m["run_id"].as_str().unwrap(), m["text"].as_str().unwrap()))
        .collect();
    let (s1, s2) = (r1.to_string(), r2.to_string());
    assert_eq!(
        prompts,
        vec![
            (s1.as_str(), "build a todo app"),
            (s2.as_str(), "add a dark mode toggle")
        ]
    );
    assert_eq!(msgs[0]["turn"], 0);
    assert_eq!(msgs[0]["role"], "user");
    let order: Vec<(String, u64, u64)> = msgs
        .iter()
        .map(|m| {
            (
                m["run_id"].as_str().unwrap().to_string(),
                m["turn"].as_u64().unwrap(),
                m["index"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "conversation order");
    let written = |run: &str| -> Vec<String> {
        msgs.iter()
            .filter(|m| m["run_id"] == run && m["role"] == "assistant")
            .flat_map(|m| {
                m["effects"]["files"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(written(&s1).contains(&"app.js".to_string()), "{list}");
    assert!(written(&s2).contains(&"theme.js".to_string()), "{list}");
    assert!(
        msgs.iter()
            .filter(|m| m["role"] == "assistant")
            .all(|m| m["at"].is_string() && m["text"].is_string())
    );
    // `limit`: the newest N, still oldest first.
    let last2 = get_json(&s, &format!("/v1/chats/{chat}/messages?limit=2"), ALICE).await;
    assert_eq!(
        last2["messages"].as_array().unwrap()[..],
        msgs[msgs.len() - 2..]
    );
    for bad in ["0", "1001", "x"] {
        let res = s
            .get(&format!("/v1/chats/{chat}/messages?limit={bad}"), ALICE)
            .send()
            .await
            .unwrap();
        let body = expect_error(res, 422, "validation_failed").await;
        assert_eq!(body["error"]["field"], "limit");
    }

    // Runs: newest first, paginated by cursor.
    let page = get_json(&s, &format!("/v1/chats/{chat}/runs?limit=1"), ALICE).await;
    assert_eq!(page["runs"][0]["run_id"], s2);
    assert_eq!(page["runs"][0]["chat_id"], chat.as_str());
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let page = get_json(
        &s,
        &format!("/v1/chats/{chat}/runs?limit=1&cursor={cursor}"),
        ALICE,
    )
    .await;
    assert_eq!(page["runs"][0]["run_id"], s1);
    assert!(page["next_cursor"].is_null());
    let done = get_json(
        &s,
        &format!("/v1/chats/{chat}/runs?status=completed"),
        ALICE,
    )
    .await;
    assert_eq!(done["runs"].as_array().unwrap().len(), 2);
    let res = s
        .get(&format!("/v1/chats/{chat}/runs?status=nope"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(
        expect_error(res, 422, "validation_failed").await["error"]["field"],
        "status"
    );

    // Files: one workspace, the first run's files still there.
    let files = get_json(&s, &format!("/v1/chats/{chat}/files"), ALICE).await;
    assert_eq!(files["run_id"], s2, "the newest run's workspace");
    let names = paths(&files);
    for f in ["index.html", "style.css", "app.js", "theme.js"] {
        assert!(names.contains(&f.to_string()), "{f} in {names:?}");
    }
    // The run route lists the same shared workspace.
    let run1_files = get_json(&s, &format!("/v1/runs/{r1}/files"), ALICE).await;
    assert_eq!(paths(&run1_files), names);
    let res = s
        .get(&format!("/v1/chats/{chat}/files/theme.js"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("javascript")
    );
    assert_eq!(res.headers()["content-security-policy"], "sandbox");
    assert!(res.text().await.unwrap().contains("edward-theme"));
    let res = s
        .get(&format!("/v1/chats/{chat}/files/nope.txt"), ALICE)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
    let res = s
        .get(&format!("/v1/chats/{chat}/files/..%2Fescape"), ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(
        expect_error(res, 422, "validation_failed").await["error"]["field"],
        "path"
    );

    // Bob: the same chat id is not his — 404 on every chat route …
    for path in [
        format!("/v1/chats/{chat}/messages"),
        format!("/v1/chats/{chat}/runs"),
        format!("/v1/chats/{chat}/files"),
        format!("/v1/chats/{chat}/files/index.html"),
    ] {
        let res = s.get(&path, BOB).send().await.unwrap();
        let body = expect_error(res, 404, "not_found").await;
        assert_eq!(body["error"]["message"], "no such chat", "{path}");
        // … exactly as for an id nobody used.
        let res = s
            .get(&path.replace(&chat, &unique("never")), ALICE)
            .send()
            .await
            .unwrap();
        expect_error(res, 404, "not_found").await;
    }
    // … and once he runs in it, it is his own chat with his own workspace.
    let rb = s.submit_in(BOB, &chat, "build a todo app").await;
    assert_eq!(s.wait_finished(rb).await.status.as_str(), "completed");
    let bobs = get_json(&s, &format!("/v1/chats/{chat}/messages"), BOB).await;
    let bob_msgs = bobs["messages"].as_array().unwrap();
    assert!(bob_msgs.iter().all(|m| m["run_id"] == rb.to_string()));
    assert_eq!(bob_msgs[0]["text"], "build a todo app");
    let bob_files = paths(&get_json(&s, &format!("/v1/chats/{chat}/files"), BOB).await);
    assert!(bob_files.contains(&"index.html".to_string()));
    assert!(
        !bob_files.contains(&"theme.js".to_string()),
        "{bob_files:?}"
    );
    let res = s
        .get(&format!("/v1/chats/{chat}/files/theme.js"), BOB)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
    let bob_runs = get_json(&s, &format!("/v1/chats/{chat}/runs"), BOB).await;
    assert_eq!(bob_runs["runs"].as_array().unwrap().len(), 1);
    // Alice's chat is untouched.
    let again = get_json(&s, &format!("/v1/chats/{chat}/messages"), ALICE).await;
    assert_eq!(again["messages"], list["messages"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_builds_are_listed_and_other_users_get_404() {
    let mut engine = EngineConfig::default();
    engine.chat.build = BuildConfig::enabled().with_command(vec!["ls".into(), "index.html".into()]);
    let s = TestServer::start(Opts {
        engine,
        ..Opts::default()
    })
    .await;
    let run = s
        .submit_in(ALICE, &unique("build"), "build a todo app")
        .await;
    assert_eq!(s.wait_finished(run).await.status.as_str(), "completed");
    let list = get_json(&s, &format!("/v1/runs/{run}/builds"), ALICE).await;
    assert_eq!(list["run_id"], run.to_string());
    let builds = list["builds"].as_array().expect("builds");
    assert_eq!(builds.len(), 1, "{list}");
    let b = &builds[0];
    assert_eq!(b["number"], 1);
    assert_eq!(b["status"], "succeeded");
    assert_eq!(b["command"], json!(["ls", "index.html"]));
    assert_eq!(b["exit_code"], 0);
    assert!(b["output"].as_str().unwrap().contains("index.html"));
    assert!(b["duration_ms"].is_u64());
    assert!(b.get("claim_fence").is_none(), "no worker internals");

    let res = s
        .get(&format!("/v1/runs/{run}/builds"), BOB)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
    let res = s
        .get(&format!("/v1/runs/{}/builds", RunId::new()), ALICE)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_builds_lists_none() {
    let s = TestServer::start(Opts::default()).await;
    let run = s.submit(ALICE, "build a todo app").await;
    s.wait_finished(run).await;
    let list = get_json(&s, &format!("/v1/runs/{run}/builds"), ALICE).await;
    assert_eq!(list["builds"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_the_chat_routes_and_the_busy_error() {
    let s = TestServer::start(Opts {
        worker: false,
        ..Opts::default()
    })
    .await;
    let doc: Value = s
        .client
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for path in [
        "/v1/runs/{id}/builds",
        "/v1/chats/{chat_id}/messages",
        "/v1/chats/{chat_id}/runs",
        "/v1/chats/{chat_id}/files",
        "/v1/chats/{chat_id}/files/{path}",
    ] {
        assert!(doc["paths"][path]["get"].is_object(), "{path} documented");
    }
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["ErrorDetail"]["properties"]["active_run"].is_object());
    assert!(schemas["SubmitRun"]["properties"]["double_texting"].is_object());
    assert_eq!(
        schemas["DoubleTextingPolicy"]["enum"],
        json!(["reject", "enqueue", "interrupt"])
    );
    for name in [
        "ChatMessageView",
        "MessageList",
        "BuildList",
        "ChatFileList",
    ] {
        assert!(schemas[name].is_object(), "{name}");
    }
}
