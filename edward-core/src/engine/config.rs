//! Engine configuration: admission limits, command policy, package manager,
//! pipeline tuning, and the run request with its validation.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::budget::Budgets;
use crate::{FlushPolicy, SandboxPath};

/// The package manager used for `<edward_install>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackageManager {
    /// `npm install --no-audit --no-fund <deps>`.
    #[default]
    Npm,
    /// `pnpm add <deps>`.
    Pnpm,
    /// `yarn add <deps>`.
    Yarn,
    /// `bun add <deps>`.
    Bun,
    /// Installs are recorded as skipped.
    None,
}

impl PackageManager {
    /// Its name in events.
    pub fn as_str(self) -> &'static str {
        match self {
            PackageManager::Npm => "npm",
            PackageManager::Pnpm => "pnpm",
            PackageManager::Yarn => "yarn",
            PackageManager::Bun => "bun",
            PackageManager::None => "none",
        }
    }

    /// The argv installing `deps` (`None` for [`PackageManager::None`]).
    pub fn install_argv(self, deps: &[String]) -> Option<(String, Vec<String>)> {
        let (program, mut args): (&str, Vec<String>) = match self {
            PackageManager::Npm => (
                "npm",
                vec!["install".into(), "--no-audit".into(), "--no-fund".into()],
            ),
            PackageManager::Pnpm => ("pnpm", vec!["add".into()]),
            PackageManager::Yarn => ("yarn", vec!["add".into()]),
            PackageManager::Bun => ("bun", vec!["add".into()]),
            PackageManager::None => return None,
        };
        args.extend(deps.iter().cloned());
        Some((program.to_string(), args))
    }
}

/// Which commands the model may run and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandPolicy {
    /// Programs the model may run (bare names).
    pub allowlist: BTreeSet<String>,
    /// Kill a command after this long (default 120 s).
    pub timeout: Duration,
    /// Kill an install after this long (default 300 s).
    pub install_timeout: Duration,
    /// Stdout and stderr kept per command, each (default 16 KiB).
    pub output_cap: usize,
}

impl Default for CommandPolicy {
    fn default() -> Self {
        CommandPolicy {
            allowlist: [
                "npm", "pnpm", "node", "npx", "ls", "cat", "mkdir", "mv", "cp", "rm", "grep",
                "find", "head", "tail", "wc", "echo", "pwd", "tsc", "git",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            timeout: Duration::from_secs(120),
            install_timeout: Duration::from_secs(300),
            output_cap: 16 * 1024,
        }
    }
}

impl CommandPolicy {
    /// Add a program to the allowlist.
    pub fn allow(mut self, program: impl Into<String>) -> Self {
        self.allowlist.insert(program.into());
        self
    }

    /// Why `program args` may not run, if it may not.
    ///
    /// The program must be a bare allowlisted name. An argument that looks
    /// like a path — absolute, starting with `~`, or containing `..` (also
    /// after a `--flag=` prefix) — must normalise to a path inside the workspace.
    pub fn check(&self, program: &str, args: &[String]) -> Result<(), String> {
        if program.contains('/') || program.contains('\\') {
            return Err(format!("`{program}`: the program must be a bare name"));
        }
        if !self.allowlist.contains(program) {
            return Err(format!("`{program}` is not on the command allowlist"));
        }
        for arg in args {
            let candidates = match arg.split_once('=') {
                Some((_, v)) if arg.starts_with('-') => vec![arg.as_str(), v],
                _ => vec![arg.as_str()],
            };
            for c in candidates {
                if c.starts_with('~') {
                    return Err(format!("argument `{arg}` refers to the home directory"));
                }
                let looks_like_path = c.starts_with('/') || c.starts_with('\\') || c.contains("..");
                if looks_like_path && c != ".." && SandboxPath::new(c).is_err() {
                    return Err(format!("argument `{arg}` points outside the workspace"));
                }
                if c == ".." {
                    return Err(format!("argument `{arg}` points outside the workspace"));
                }
            }
        }
        Ok(())
    }
}

/// Tuning of the engine; the defaults suit most uses.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Command allowlist, timeouts and output caps.
    pub commands: CommandPolicy,
    /// Package manager for installs.
    pub package_manager: PackageManager,
    /// Write-buffer debounce (100 ms) and max wait (1 s).
    pub flush: FlushPolicy,
    /// How often the flush scheduler asks `WriteBuffer::due` (25 ms).
    pub flush_poll: Duration,
    /// Content deltas are coalesced for at most this long (50 ms)…
    pub coalesce_window: Duration,
    /// … or until this many bytes are pending (16 KiB).
    pub coalesce_bytes: usize,
    /// Bytes of each tool result shown to the model (4 KiB).
    pub result_cap: usize,
    /// Bytes of a turn's own output kept in the conversation (24 KiB).
    pub output_view_cap: usize,
    /// Output-token cap per model call (further limited by the budget).
    pub max_output_tokens_per_call: u32,
    /// Model attempts per turn for retryable errors before output begins.
    pub model_attempts: u32,
    /// Capacity of the parser → side-effect channel.
    pub effect_channel: usize,
    /// Tailers re-read the store at least this often (1 s): the backstop for
    /// lost hints, and the pace of live events written by another process
    /// whose notifier does not reach this one.
    pub tail_backstop: Duration,
    /// Destroy the sandbox of a finished run this long after it finished
    /// (`None`, the default: keep sandboxes until
    /// [`Engine::destroy_sandbox`](super::Engine::destroy_sandbox)). Workers
    /// do it; a worker starting up also reaps runs finished while no worker
    /// was running.
    pub sandbox_retention: Option<Duration>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            commands: CommandPolicy::default(),
            package_manager: PackageManager::Npm,
            flush: FlushPolicy::default(),
            flush_poll: Duration::from_millis(25),
            coalesce_window: Duration::from_millis(50),
            coalesce_bytes: 16 * 1024,
            result_cap: 4 * 1024,
            output_view_cap: 24 * 1024,
            max_output_tokens_per_call: 32_000,
            model_attempts: 3,
            effect_channel: 256,
            tail_backstop: Duration::from_secs(1),
            sandbox_retention: None,
        }
    }
}

/// Largest accepted prompt, in bytes.
pub const MAX_PROMPT_BYTES: usize = 100 * 1024;
/// Largest accepted user or chat id, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// A request to start a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Who owns the run (non-empty, ≤ 128 bytes, no control characters).
    pub user_id: String,
    /// The chat it belongs to (same rules).
    pub chat_id: String,
    /// What to build (non-empty, ≤ 100 KiB).
    pub prompt: String,
    /// Model name; `None` = the engine's default model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Budgets; `None` = the engine's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Budgets>,
    /// Which of the user's stored credentials to use (its name); `None` =
    /// the user's default for the provider, or the operator's key where the
    /// registry allows it. Only meaningful with a provider registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl RunRequest {
    /// A request with the engine's default model and budgets.
    pub fn new(
        user_id: impl Into<String>,
        chat_id: impl Into<String>,
        prompt: impl Into<String>,
    ) -> Self {
        RunRequest {
            user_id: user_id.into(),
            chat_id: chat_id.into(),
            prompt: prompt.into(),
            model: None,
            budgets: None,
            credential: None,
        }
    }

    /// Name the stored credential to use (see [`RunRequest::credential`]).
    pub fn with_credential(mut self, name: impl Into<String>) -> Self {
        self.credential = Some(name.into());
        self
    }

    /// Set the model.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Set the budgets.
    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = Some(budgets);
        self
    }
}

/// Validate an id field.
pub(crate) fn check_id(field: &'static str, v: &str) -> Result<(), (&'static str, String)> {
    if v.trim().is_empty() {
        return Err((field, "must not be empty".into()));
    }
    if v.len() > MAX_ID_BYTES {
        return Err((field, format!("longer than {MAX_ID_BYTES} bytes")));
    }
    if v.chars().any(char::is_control) {
        return Err((field, "contains control characters".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_policy() {
        let p = CommandPolicy::default();
        assert!(p.check("ls", &["-la".into()]).is_ok());
        assert!(p.check("cat", &["src/../a.txt".into()]).is_ok());
        assert!(p.check("cat", &["/etc/passwd".into()]).is_err());
        assert!(p.check("cat", &["../x".into()]).is_err());
        assert!(p.check("ls", &["..".into()]).is_err());
        assert!(p.check("ls", &["~".into()]).is_err());
        assert!(p.check("npm", &["--prefix=/etc".into()]).is_err());
        assert!(p.check("bash", &[]).is_err());
        assert!(p.check("/bin/ls", &[]).is_err());
        assert!(
            p.clone()
                .allow("sleep")
                .check("sleep", &["1".into()])
                .is_ok()
        );
    }

    #[test]
    fn install_argv() {
        let deps = vec!["react@18".to_string()];
        assert_eq!(
            PackageManager::Npm.install_argv(&deps).unwrap().1,
            vec!["install", "--no-audit", "--no-fund", "react@18"]
        );
        assert_eq!(PackageManager::Pnpm.install_argv(&deps).unwrap().0, "pnpm");
        assert!(PackageManager::None.install_argv(&deps).is_none());
    }
}
