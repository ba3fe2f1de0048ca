//! Issue 13: budgets and limits the operator controls — request budgets are
//! capped by the engine's, provider reasoning counts as output, one turn can
//! persist only so much, oversized files are refused without being held.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{Harness, assert_log_ok, collect, kinds, terminal};
use edward::core::engine::{Budgets, EngineConfig, RunRequest};
use edward::core::scripted::ScriptedModel;
use edward::core::{FinishReason, ModelChunk, ModelClient, ModelError, ModelRequest, ModelStream};
use tokio_util::sync::CancellationToken;

/// A model streaming `chunks` copies of one chunk (a runaway provider).
struct Endless {
    chunk: ModelChunk,
    chunks: usize,
}

#[async_trait]
impl ModelClient for Endless {
    fn provider(&self) -> &str {
        "endless"
    }
    async fn stream(
        &self,
        _request: ModelRequest,
        _cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        let chunk = self.chunk.clone();
        let items = std::iter::repeat_n(chunk, self.chunks)
            .map(Ok)
            .chain(std::iter::once(Ok(ModelChunk::Finish(FinishReason::Stop))));
        Ok(Box::pin(futures::stream::iter(items)))
    }
}

fn persisted_bytes(events: &[edward::core::RunEvent], kind: &str) -> usize {
    kinds(events, kind)
        .iter()
        .map(|e| e.payload["content"].as_str().map_or(0, str::len))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_budgets_cannot_exceed_the_operators() {
    // Never done: a file every turn.
    let turn = "<edward_sandbox>\n<file path=\"a.txt\">\na\n</file>\n</edward_sandbox>\n";
    let model = ScriptedModel::new(vec![turn; 50]).with_final_reply(turn);
    let operator = Budgets {
        max_turns: 2,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), operator);
    h.start_worker(1, Duration::from_secs(5));
    let greedy = Budgets {
        max_turns: 100,
        max_cost_usd: 10_000.0,
        deadline_ms: 24 * 3600 * 1000,
        max_output_tokens: 10_000_000,
        ..Budgets::default()
    };
    let id = h
        .engine
        .submit(RunRequest::new("u", "c", "x").with_budgets(greedy))
        .await
        .unwrap();
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:turns", "{fin}");
    assert_eq!(fin["turns"], 2, "{fin}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_reasoning_counts_against_the_output_cut() {
    // 1 GiB of reasoning if nothing stopped it.
    let model = Arc::new(Endless {
        chunk: ModelChunk::Thinking("t".repeat(1024)),
        chunks: 1 << 20,
    });
    let budgets = Budgets {
        max_output_tokens: 10_000,
        ..Budgets::default()
    };
    let mut h = Harness::with(|b| b.model_client(model).budgets(budgets));
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:output_tokens", "{fin}");
    let thinking = persisted_bytes(&events, "thinking_delta");
    assert!(
        thinking <= 10_000 * 4 + 1024,
        "{thinking} bytes of reasoning persisted for a 10,000-token budget"
    );
    assert!(events.len() < 100, "{} events", events.len());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_persists_a_bounded_amount() {
    let model = Arc::new(Endless {
        chunk: ModelChunk::Text("x".repeat(4096)),
        chunks: 1 << 18, // 1 GiB
    });
    let config = EngineConfig {
        max_turn_output_bytes: 256 * 1024,
        ..EngineConfig::default()
    };
    let budgets = Budgets {
        max_output_tokens: 10_000_000,
        ..Budgets::default()
    };
    let mut h = Harness::with(|b| b.model_client(model).budgets(budgets).config(config));
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(
        fin["reason"]
            .as_str()
            .unwrap()
            .contains("max_turn_output_bytes"),
        "{fin}"
    );
    let text = persisted_bytes(&events, "text_delta");
    assert!(text <= 256 * 1024 + 4096, "{text} bytes persisted");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_file_is_refused_without_being_kept() {
    let big = "y".repeat(3 * 1024 * 1024);
    let turn = format!(
        "<edward_sandbox>\n<file path=\"big.txt\">\n{big}\n</file>\n<file path=\"small.txt\">\nok\n</file>\n</edward_sandbox>\n"
    );
    let model = ScriptedModel::new([turn]).with_chunk_bytes(64 * 1024);
    let config = EngineConfig {
        max_file_bytes: 1024 * 1024,
        ..EngineConfig::default()
    };
    let budgets = Budgets {
        max_output_tokens: 10_000_000,
        ..Budgets::default()
    };
    let mut h = Harness::new(model.clone(), config, budgets);
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let ws = h.workspace(id).await;
    assert!(!ws.join("big.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("small.txt")).unwrap(),
        "ok\n"
    );
    let failed = kinds(&events, "file_write_failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].payload["path"], "big.txt");
    let deltas = persisted_bytes(&events, "file_delta");
    assert!(
        deltas <= 1024 * 1024 + 64 * 1024,
        "{deltas} bytes of file deltas"
    );
    let requests = model.requests();
    let told = &requests[1].messages.last().unwrap().content;
    assert!(told.contains("big.txt: NOT written"), "{told}");
    h.shutdown().await;
}
