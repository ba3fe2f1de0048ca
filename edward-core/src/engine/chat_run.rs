//! The engine's side of chats: which earlier run a run waits for, the
//! project snapshot read from the chat's sandbox, the framework the chat
//! recorded, and the visible reply text of a turn.

use std::sync::Arc;

use edward_parser::{Event, Parser};

use super::config::ChatConfig;
use super::context::ProjectSnapshot;
use super::framework::Framework;
use crate::chat::ChatMessage;
use crate::{
    Run, RunFilter, RunId, RunStatus, RunStore, Sandbox, SandboxError, SandboxPath, StoreError,
};

/// The run `run` must wait for before it starts, if any: an earlier run of
/// its chat still queued, or any run of its chat running. Runs of one chat
/// share a workspace, so they never overlap; queued runs go in run id
/// (submission) order.
///
/// Checked in lifecycle order — queued first, then running — so a run
/// moving from queued to running between the two reads is still seen.
pub(crate) async fn blocked_by(
    store: &dyn RunStore,
    run: &Run,
) -> Result<Option<RunId>, StoreError> {
    let chat = || RunFilter::new().chat(run.chat_id.clone());
    let older_queued = store
        .list_user_runs(
            &run.user_id,
            &chat().status(RunStatus::Queued),
            Some(run.id),
            1,
        )
        .await?;
    if let Some(other) = older_queued.first() {
        return Ok(Some(other.id));
    }
    let running = store
        .list_user_runs(&run.user_id, &chat().status(RunStatus::Running), None, 2)
        .await?;
    Ok(running.iter().map(|r| r.id).find(|id| *id != run.id))
}

/// The framework the chat's history recorded last (an `<edward_install>`
/// body's `framework:` line).
pub(crate) fn recorded_framework(history: &[ChatMessage]) -> Option<Framework> {
    history
        .iter()
        .rev()
        .filter_map(|m| m.effects.as_ref())
        .flat_map(|fx| fx.installs.iter().rev())
        .find_map(|i| i.framework.as_deref().and_then(Framework::from_name))
}

/// What the snapshot read from the workspace: the snapshot, the root
/// `package.json` text, and every path (for framework detection).
pub(crate) struct Gathered {
    pub snapshot: ProjectSnapshot,
    pub package_json: Option<String>,
    pub paths: Vec<String>,
}

/// Read the project snapshot: list the files, include the text of
/// `package.json` first, then of the files the chat wrote most recently,
/// each at most `cfg.snapshot_file_bytes` and in total at most
/// `cfg.snapshot_bytes`. No sandbox yet (a new chat) is an empty snapshot.
pub(crate) async fn gather(
    sandbox: Option<Arc<dyn Sandbox>>,
    history: &[ChatMessage],
    cfg: &ChatConfig,
) -> Result<Gathered, SandboxError> {
    let Some(sandbox) = sandbox else {
        return Ok(Gathered {
            snapshot: ProjectSnapshot::default(),
            package_json: None,
            paths: Vec::new(),
        });
    };
    let mut entries = sandbox.list_files().await?;
    entries.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    let paths: Vec<String> = entries.iter().map(|e| e.path.clone()).collect();
    let size_of = |p: &str| entries.iter().find(|e| e.path == p).map(|e| e.size);
    let mut snapshot = ProjectSnapshot {
        files: entries
            .iter()
            .take(cfg.listed_files)
            .map(|e| (e.path.clone(), e.size))
            .collect(),
        total_files: entries.len(),
        contents: Vec::new(),
    };
    // Candidates: package.json, then recently written files, newest first.
    let mut candidates: Vec<String> = vec!["package.json".into()];
    for m in history.iter().rev() {
        if let Some(fx) = &m.effects {
            for f in fx.files.iter().rev() {
                if !candidates.contains(&f.path) {
                    candidates.push(f.path.clone());
                }
            }
        }
    }
    let mut package_json = None;
    let mut budget = cfg.snapshot_bytes;
    for path in candidates {
        let Some(size) = size_of(&path) else { continue };
        if size as usize > cfg.snapshot_file_bytes || size as usize > budget {
            continue;
        }
        let Ok(sp) = SandboxPath::new(&path) else {
            continue;
        };
        let bytes = match sandbox.read_file(&sp).await {
            Ok(b) => b,
            Err(SandboxError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let Ok(text) = String::from_utf8(bytes.to_vec()) else {
            continue; // binary: listed only
        };
        if path == "package.json" {
            package_json = Some(text.clone());
        }
        budget -= text.len().min(budget);
        snapshot.contents.push((path, text));
    }
    Ok(Gathered {
        snapshot,
        package_json,
        paths,
    })
}

/// The visible reply of a turn: the text outside tags of its raw output.
pub(crate) fn visible_text(raw: &str) -> String {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    parser.feed(raw, &mut events);
    parser.finish(&mut events);
    let mut text = String::new();
    for e in events {
        if let Event::Text { content } = e {
            text.push_str(&content);
        }
    }
    text.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_text_drops_tags_thinking_and_files() {
        let raw = "Sure.<Thinking>plan</Thinking>\n<edward_sandbox project=\"x\">\n<file path=\"a.txt\">\nA\n</file>\n</edward_sandbox>\nDone now.<edward_done/>";
        let t = visible_text(raw);
        assert!(t.starts_with("Sure."), "{t:?}");
        assert!(t.ends_with("Done now."), "{t:?}");
        assert!(!t.contains("plan") && !t.contains('A'), "{t:?}");
    }

    #[test]
    fn recorded_framework_is_the_newest_install_line() {
        use crate::chat::{InstallNote, MessageRole, TurnEffects};
        let m = |fw: Option<&str>| ChatMessage {
            run_id: RunId::new(),
            turn: 1,
            index: 0,
            role: MessageRole::Assistant,
            text: String::new(),
            effects: Some(TurnEffects {
                installs: vec![InstallNote {
                    packages: vec!["x".into()],
                    framework: fw.map(str::to_string),
                    exit_code: Some(0),
                }],
                ..Default::default()
            }),
            at: chrono::Utc::now(),
        };
        assert_eq!(recorded_framework(&[]), None);
        assert_eq!(
            recorded_framework(&[m(Some("vite")), m(None), m(Some("next"))]),
            Some(Framework::Next)
        );
        assert_eq!(
            recorded_framework(&[m(Some("vite")), m(Some("rails"))]),
            Some(Framework::Vite)
        );
    }
}
