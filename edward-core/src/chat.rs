//! Chats: the records that let a follow-up run continue a project — the
//! chat's messages (kept apart from run events), its build jobs, and the
//! sandbox key every run of one chat shares.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::types::{Fence, RunId, SandboxKey};

/// The sandbox key of a chat: `chat-` and 32 hex digits of
/// SHA-256(`user_id` NUL `chat_id`). Every run of one chat shares it; two
/// chats never do, another user's chat of the same id names another
/// sandbox, and ids with any characters give a safe key.
pub fn chat_sandbox_key(user_id: &str, chat_id: &str) -> SandboxKey {
    let mut h = Sha256::new();
    h.update((user_id.len() as u64).to_le_bytes());
    h.update(user_id.as_bytes());
    h.update([0]);
    h.update(chat_id.as_bytes());
    let digest = h.finalize();
    let mut key = String::with_capacity(5 + 32);
    key.push_str("chat-");
    for b in &digest[..16] {
        key.push_str(&format!("{b:02x}"));
    }
    SandboxKey(key)
}

/// Who a chat message is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    /// The user's prompt.
    User,
    /// The model's visible reply of one turn, with that turn's side effects.
    Assistant,
}

impl MessageRole {
    /// `user` or `assistant`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageRole::User => "user",
            MessageRole::Assistant => "assistant",
        }
    }
}

impl std::str::FromStr for MessageRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "user" => Ok(MessageRole::User),
            "assistant" => Ok(MessageRole::Assistant),
            other => Err(format!("unknown message role `{other}`")),
        }
    }
}

/// A file a turn wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileNote {
    /// Workspace-relative path.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
}

/// An install a turn asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallNote {
    /// The packages (npm specs).
    pub packages: Vec<String>,
    /// The body's `framework:` line, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// The install's exit code (`None`: refused or did not run).
    pub exit_code: Option<i32>,
}

/// A command a turn ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandNote {
    /// The program and its arguments, joined by spaces for display.
    pub command: String,
    /// Its exit code (`None`: refused, timed out or failed to start).
    pub exit_code: Option<i32>,
    /// Its output, capped.
    pub output: String,
}

/// The compact record of one turn's side effects kept with its message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnEffects {
    /// Files written.
    pub files: Vec<FileNote>,
    /// Installs.
    pub installs: Vec<InstallNote>,
    /// Commands.
    pub commands: Vec<CommandNote>,
}

impl TurnEffects {
    /// Whether nothing happened.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.installs.is_empty() && self.commands.is_empty()
    }
}

/// A message to store (see [`crate::RunStore::put_messages`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Who.
    pub role: MessageRole,
    /// The prompt, or the turn's visible reply text.
    pub text: String,
    /// The turn's side effects (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<TurnEffects>,
}

impl NewMessage {
    /// The user's prompt.
    pub fn user(text: impl Into<String>) -> Self {
        NewMessage {
            role: MessageRole::User,
            text: text.into(),
            effects: None,
        }
    }

    /// One turn's reply and effects.
    pub fn assistant(text: impl Into<String>, effects: TurnEffects) -> Self {
        NewMessage {
            role: MessageRole::Assistant,
            text: text.into(),
            effects: Some(effects),
        }
    }
}

/// A chat message as stored: ordered by `(run_id, turn, index)`; run ids are
/// time-ordered, so this is conversation order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The run that wrote it.
    pub run_id: RunId,
    /// The turn (0 = the run's prompt).
    pub turn: u32,
    /// Order within the turn.
    pub index: u32,
    /// Who.
    pub role: MessageRole,
    /// The text.
    pub text: String,
    /// The turn's side effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<TurnEffects>,
    /// When it was stored.
    pub at: DateTime<Utc>,
}

/// A build job's status: `queued → building → succeeded | failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildStatus {
    /// Created; nobody builds it yet.
    Queued,
    /// Claimed by a worker.
    Building,
    /// Exit code 0.
    Succeeded,
    /// Non-zero exit, timeout, or the command could not run.
    Failed,
}

impl BuildStatus {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Queued => "queued",
            BuildStatus::Building => "building",
            BuildStatus::Succeeded => "succeeded",
            BuildStatus::Failed => "failed",
        }
    }

    /// `Succeeded` or `Failed`.
    pub fn is_terminal(self) -> bool {
        matches!(self, BuildStatus::Succeeded | BuildStatus::Failed)
    }
}

impl std::str::FromStr for BuildStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => BuildStatus::Queued,
            "building" => BuildStatus::Building,
            "succeeded" => BuildStatus::Succeeded,
            "failed" => BuildStatus::Failed,
            other => return Err(format!("unknown build status `{other}`")),
        })
    }
}

/// A build job of a run: its own record, claimed by compare-and-set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildJob {
    /// The run.
    pub run_id: RunId,
    /// 1 for the run's first build, 2 for the build after an autofix turn.
    pub number: u32,
    /// Where it is.
    pub status: BuildStatus,
    /// The program and arguments.
    pub command: Vec<String>,
    /// Who claimed it (a worker id), once claimed.
    pub claimed_by: Option<String>,
    /// The fence of the attempt that claimed it (0 = unclaimed).
    pub claim_fence: Fence,
    /// The exit code, once finished (`None` if it could not run).
    pub exit_code: Option<i32>,
    /// Output, capped, once finished.
    pub output: Option<String>,
    /// How long it took, once finished.
    pub duration_ms: Option<u64>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// How a build ended (see [`crate::RunStore::finish_build`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildResult {
    /// `Succeeded` or `Failed`.
    pub status: BuildStatus,
    /// The exit code (`None` if it could not run).
    pub exit_code: Option<i32>,
    /// Output, capped.
    pub output: String,
    /// How long it took.
    pub duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_keys_differ_by_user_and_chat_and_are_safe() {
        let a = chat_sandbox_key("alice", "demo");
        assert_eq!(a, chat_sandbox_key("alice", "demo"));
        assert_ne!(a, chat_sandbox_key("bob", "demo"));
        assert_ne!(a, chat_sandbox_key("alice", "demo2"));
        // The length prefix keeps ("a\0b", "c") apart from ("a", "b\0c").
        assert_ne!(chat_sandbox_key("a\0b", "c"), chat_sandbox_key("a", "b\0c"));
        let odd = chat_sandbox_key("../../etc", "x/y z\u{e9}");
        assert!(odd.0.starts_with("chat-"));
        assert_eq!(odd.0.len(), 5 + 32);
        assert!(odd.0[5..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
