//! Context assembly for a chat's run: the system prompt plus a project
//! snapshot, then the chat's history (newest kept, oldest dropped first with
//! a marker), then the new prompt — fitted to a token limit. A pure function
//! ([`assemble_context`]); the engine gathers its inputs.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::framework::Detection;
use crate::chat::{ChatMessage, MessageRole, TurnEffects};
use crate::{Message, Role};

/// The first line of the new prompt's message when history precedes it:
/// tells the model (and [`ScriptedModel`](crate::scripted::ScriptedModel))
/// where this run's request begins.
pub const NEW_REQUEST: &str = "[New request in this chat]";

/// The workspace as the model is shown it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectSnapshot {
    /// Listed files `(path, bytes)`, at most the engine's listing cap.
    pub files: Vec<(String, u64)>,
    /// How many files the workspace has (may exceed `files.len()`).
    pub total_files: usize,
    /// Files whose full text is included, most important first.
    pub contents: Vec<(String, String)>,
}

/// What [`assemble_context`] fits together.
#[derive(Debug, Clone, Copy)]
pub struct ContextInput<'a> {
    /// The protocol's system prompt.
    pub system_prompt: &'a str,
    /// The new prompt.
    pub prompt: &'a str,
    /// The chat's earlier messages, oldest first.
    pub history: &'a [ChatMessage],
    /// The workspace.
    pub snapshot: &'a ProjectSnapshot,
    /// The detected framework.
    pub framework: &'a Detection,
    /// The estimated input (system + messages) must not exceed this.
    pub max_input_tokens: u64,
}

/// The numbers of the `context_prepared` event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextStats {
    /// History messages included.
    pub history_messages: u32,
    /// History messages dropped (oldest first) to fit.
    pub history_dropped: u32,
    /// Files listed in the snapshot.
    pub files_listed: u32,
    /// Files whose text is included.
    pub files_included: u32,
    /// Estimated input tokens of the assembled request.
    pub estimated_tokens: u64,
}

/// The assembled context.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedContext {
    /// The system prompt with the project section.
    pub system: String,
    /// History (alternating roles) and, last, the new prompt.
    pub messages: Vec<Message>,
    /// What was included and dropped.
    pub stats: ContextStats,
}

/// Fit system prompt + project snapshot + history + prompt into
/// `input.max_input_tokens` as estimated by `estimate`: history messages are
/// dropped oldest first (a marker says how many), then included file texts
/// last-first; if even the bare prompt does not fit, the result is returned
/// over the limit (the engine's pre-call check refuses it with a clear
/// reason). Consecutive messages of one role are merged, so roles alternate
/// and the first message is from the user.
pub fn assemble_context(
    input: &ContextInput<'_>,
    estimate: &dyn Fn(&str) -> u64,
) -> PreparedContext {
    let rendered: Vec<Vec<Message>> = input.history.iter().map(render_message).collect();
    let costs: Vec<u64> = rendered
        .iter()
        .map(|parts| parts.iter().map(|m| estimate(&m.content)).sum())
        .collect();
    let mut included = input.snapshot.contents.len();
    let mut system = project_system(input, included);
    let prompt_cost = estimate(input.prompt) + estimate(NEW_REQUEST) + 1;
    let mut fixed = estimate(&system) + prompt_cost;
    let mut history_cost: u64 = costs.iter().sum();
    let mut first = 0; // first history message kept
    let marker_cost = |dropped: usize| {
        if dropped == 0 {
            0
        } else {
            estimate(&marker(dropped))
        }
    };
    while fixed + history_cost + marker_cost(first) > input.max_input_tokens {
        if first < costs.len() {
            history_cost -= costs[first];
            first += 1;
        } else if included > 0 {
            included -= 1;
            system = project_system(input, included);
            fixed = estimate(&system) + prompt_cost;
        } else {
            break;
        }
    }
    let mut messages = Vec::new();
    if first > 0 {
        messages.push(Message {
            role: Role::User,
            content: marker(first),
        });
    }
    for parts in &rendered[first..] {
        messages.extend(parts.iter().cloned());
    }
    let content = if messages.is_empty() {
        input.prompt.to_string()
    } else {
        format!("{NEW_REQUEST}\n{}", input.prompt)
    };
    messages.push(Message {
        role: Role::User,
        content,
    });
    let messages = merge_roles(messages);
    let estimated_tokens =
        estimate(&system) + messages.iter().map(|m| estimate(&m.content)).sum::<u64>();
    PreparedContext {
        system,
        messages,
        stats: ContextStats {
            history_messages: (input.history.len() - first) as u32,
            history_dropped: first as u32,
            files_listed: input.snapshot.files.len() as u32,
            files_included: included as u32,
            estimated_tokens,
        },
    }
}

fn marker(dropped: usize) -> String {
    format!(
        "[{dropped} earlier message{} of this conversation {} dropped to fit the context \
         window; the project files below are current.]",
        if dropped == 1 { "" } else { "s" },
        if dropped == 1 { "was" } else { "were" }
    )
}

/// The system prompt followed by the project section with the first
/// `included` file texts.
fn project_system(input: &ContextInput<'_>, included: usize) -> String {
    let snap = input.snapshot;
    let mut s = String::with_capacity(input.system_prompt.len() + 1024);
    s.push_str(input.system_prompt);
    s.push_str("\n\n## This chat's project\n\n");
    s.push_str(
        "The workspace is kept between the messages of this chat: files written by \
         earlier messages are still there. Change only what the new request needs.\n\n",
    );
    let _ = writeln!(
        s,
        "Framework: {} ({})",
        input.framework.framework.as_str(),
        input.framework.evidence
    );
    if snap.total_files == 0 {
        s.push_str("Files: none yet (the workspace is empty).\n");
    } else {
        let _ = writeln!(s, "Files ({}):", snap.total_files);
        for (path, bytes) in &snap.files {
            let _ = writeln!(s, "- {path} ({bytes} bytes)");
        }
        if snap.total_files > snap.files.len() {
            let _ = writeln!(s, "- … and {} more", snap.total_files - snap.files.len());
        }
    }
    for (path, text) in &snap.contents[..included] {
        let _ = write!(s, "\n--- {path} (current content) ---\n{text}");
        if !text.ends_with('\n') {
            s.push('\n');
        }
        let _ = writeln!(s, "--- end of {path} ---");
    }
    s
}

/// One stored message as model messages: a prompt is a user message; a
/// turn is the reply (assistant) and, when it did something, a user
/// message reporting what happened.
fn render_message(m: &ChatMessage) -> Vec<Message> {
    match m.role {
        MessageRole::User => vec![Message {
            role: Role::User,
            content: m.text.clone(),
        }],
        MessageRole::Assistant => {
            let reply = if m.text.trim().is_empty() {
                "(no reply text)".to_string()
            } else {
                m.text.clone()
            };
            let mut out = vec![Message {
                role: Role::Assistant,
                content: reply,
            }];
            if let Some(fx) = m.effects.as_ref().filter(|fx| !fx.is_empty()) {
                out.push(Message {
                    role: Role::User,
                    content: render_effects(fx),
                });
            }
            out
        }
    }
}

/// A turn's side effects in a few lines.
pub fn render_effects(fx: &TurnEffects) -> String {
    let mut s = String::from("[What that turn did]\n");
    for f in &fx.files {
        let _ = writeln!(s, "- wrote {} ({} bytes)", f.path, f.bytes);
    }
    for i in &fx.installs {
        let code = i
            .exit_code
            .map_or("did not run".to_string(), |c| format!("exit {c}"));
        let _ = writeln!(s, "- installed {}: {code}", i.packages.join(" "));
    }
    for c in &fx.commands {
        let code = c
            .exit_code
            .map_or("no exit code".to_string(), |c| format!("exit {c}"));
        let _ = writeln!(s, "- ran `{}`: {code}", c.command);
        if !c.output.trim().is_empty() {
            for line in c.output.trim_end().lines() {
                let _ = writeln!(s, "    {line}");
            }
        }
    }
    s
}

/// Join consecutive messages of one role (providers want alternation) and
/// make the first message a user message.
fn merge_roles(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for m in messages {
        match out.last_mut() {
            Some(last) if last.role == m.role => {
                last.content.push_str("\n\n");
                last.content.push_str(&m.content);
            }
            _ => out.push(m),
        }
    }
    if out.first().is_some_and(|m| m.role != Role::User) {
        out.insert(
            0,
            Message {
                role: Role::User,
                content: "[Earlier conversation follows.]".into(),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::RunId;
    use crate::chat::{CommandNote, FileNote};
    use crate::engine::framework::Framework;

    /// One token per 4 bytes, like the crude estimators.
    fn est(s: &str) -> u64 {
        s.len().div_ceil(4) as u64
    }

    fn msg(run: RunId, turn: u32, role: MessageRole, text: &str) -> ChatMessage {
        ChatMessage {
            run_id: run,
            turn,
            index: 0,
            role,
            text: text.into(),
            effects: (role == MessageRole::Assistant).then(TurnEffects::default),
            at: Utc::now(),
        }
    }

    fn history(runs: usize) -> Vec<ChatMessage> {
        let mut h = Vec::new();
        for i in 0..runs {
            let run = RunId::new();
            h.push(msg(
                run,
                0,
                MessageRole::User,
                &format!("prompt {i} {}", "p".repeat(200)),
            ));
            let mut a = msg(
                run,
                1,
                MessageRole::Assistant,
                &format!("reply {i} {}", "r".repeat(200)),
            );
            a.effects = Some(TurnEffects {
                files: vec![FileNote {
                    path: format!("f{i}.js"),
                    bytes: 10,
                }],
                installs: vec![],
                commands: vec![CommandNote {
                    command: "npm run build".into(),
                    exit_code: Some(1),
                    output: "boom".into(),
                }],
            });
            h.push(a);
        }
        h
    }

    fn detection() -> Detection {
        Detection {
            framework: Framework::Vite,
            evidence: "package.json dependency \"vite\"".into(),
        }
    }

    fn snapshot() -> ProjectSnapshot {
        ProjectSnapshot {
            files: vec![("package.json".into(), 40), ("src/main.js".into(), 300)],
            total_files: 2,
            contents: vec![
                (
                    "package.json".into(),
                    r#"{"devDependencies":{"vite":"5"}}"#.into(),
                ),
                ("src/main.js".into(), "x".repeat(300)),
            ],
        }
    }

    fn assemble(history: &[ChatMessage], max: u64) -> PreparedContext {
        let snap = snapshot();
        let det = detection();
        assemble_context(
            &ContextInput {
                system_prompt: "SYSTEM",
                prompt: "add a dark mode toggle",
                history,
                snapshot: &snap,
                framework: &det,
                max_input_tokens: max,
            },
            &est,
        )
    }

    #[test]
    fn everything_fits_when_the_limit_is_large() {
        let h = history(3);
        let c = assemble(&h, 1_000_000);
        assert_eq!(
            c.stats,
            ContextStats {
                history_messages: 6,
                history_dropped: 0,
                files_listed: 2,
                files_included: 2,
                estimated_tokens: c.stats.estimated_tokens,
            }
        );
        assert!(c.system.starts_with("SYSTEM"));
        assert!(c.system.contains("Framework: vite"));
        assert!(c.system.contains("- src/main.js (300 bytes)"));
        assert!(c.system.contains("--- package.json (current content) ---"));
        // prompt, reply, effects report … alternating, the new prompt last.
        assert_eq!(c.messages[0].role, Role::User);
        assert!(c.messages[0].content.starts_with("prompt 0"));
        assert_eq!(c.messages[1].role, Role::Assistant);
        assert!(c.messages[2].content.contains("- wrote f0.js (10 bytes)"));
        assert!(
            c.messages[2]
                .content
                .contains("- ran `npm run build`: exit 1")
        );
        for pair in c.messages.windows(2) {
            assert_ne!(pair[0].role, pair[1].role, "roles alternate");
        }
        let last = c.messages.last().unwrap();
        assert_eq!(last.role, Role::User);
        assert!(last.content.ends_with("add a dark mode toggle"));
        let total = est(&c.system) + c.messages.iter().map(|m| est(&m.content)).sum::<u64>();
        assert_eq!(c.stats.estimated_tokens, total);
    }

    #[test]
    fn oldest_history_goes_first_with_a_marker_and_the_result_fits() {
        let h = history(5);
        let full = assemble(&h, 1_000_000).stats.estimated_tokens;
        for limit in [full - 1, full - 200, full / 2, full / 3] {
            let c = assemble(&h, limit);
            assert!(
                c.stats.estimated_tokens <= limit,
                "{} > {limit}",
                c.stats.estimated_tokens
            );
            assert!(c.stats.history_dropped > 0);
            assert_eq!(c.stats.history_dropped + c.stats.history_messages, 10);
            assert!(
                c.messages[0]
                    .content
                    .contains(&format!("[{} earlier message", c.stats.history_dropped))
            );
            // The newest history survives: the last run's reply is there.
            if c.stats.history_messages > 0 {
                assert!(c.messages.iter().any(|m| m.content.contains("reply 4")));
            }
            assert_eq!(c.stats.files_included, 2, "files go only after all history");
        }
    }

    #[test]
    fn file_texts_are_dropped_after_history_and_the_prompt_always_stays() {
        let h = history(2);
        let no_history = assemble(&[], 1_000_000).stats.estimated_tokens;
        let c = assemble(&h, no_history - 10);
        assert_eq!(c.stats.history_messages, 0);
        assert_eq!(c.stats.history_dropped, 4);
        assert_eq!(
            c.stats.files_included, 1,
            "the last (least important) text goes"
        );
        assert!(c.system.contains("--- package.json (current content)"));
        assert!(!c.system.contains("--- src/main.js (current content)"));
        // A limit nothing fits: all dropped, prompt kept, over the limit.
        let c = assemble(&h, 1);
        assert_eq!(c.stats.files_included, 0);
        assert!(c.stats.estimated_tokens > 1);
        assert!(
            c.messages
                .last()
                .unwrap()
                .content
                .ends_with("add a dark mode toggle")
        );
    }

    #[test]
    fn empty_chat_is_just_the_prompt() {
        let snap = ProjectSnapshot::default();
        let det = Detection {
            framework: Framework::None,
            evidence: "the workspace is empty".into(),
        };
        let c = assemble_context(
            &ContextInput {
                system_prompt: "S",
                prompt: "build a todo app",
                history: &[],
                snapshot: &snap,
                framework: &det,
                max_input_tokens: 10_000,
            },
            &est,
        );
        assert_eq!(c.messages.len(), 1);
        assert_eq!(c.messages[0].content, "build a todo app");
        assert!(c.system.contains("Files: none yet"));
        assert_eq!(c.stats.history_messages, 0);
        assert_eq!(c.stats.files_listed, 0);
    }

    #[test]
    fn a_history_starting_with_a_reply_gets_a_user_message_first() {
        let run = RunId::new();
        let h = vec![msg(run, 1, MessageRole::Assistant, "reply")];
        let c = assemble(&h, 1_000_000);
        assert_eq!(c.messages[0].role, Role::User);
        assert_eq!(c.messages[1].role, Role::Assistant);
    }
}
