//! Engine configuration: admission limits, command policy, package manager,
//! pipeline tuning, and the run request with its validation.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::budget::Budgets;
use crate::FlushPolicy;

mod commands;

pub use commands::{PreparedCommand, ScriptPolicy, git_config_hazard};

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
    /// When model-written code may run (`npm run`, `npx <pkg>`, `node app.js`,
    /// install lifecycle scripts). Default: only in a sandbox that isolates.
    #[serde(default)]
    pub scripts: ScriptPolicy,
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
            scripts: ScriptPolicy::default(),
        }
    }
}

impl CommandPolicy {
    /// Add a program to the allowlist.
    pub fn allow(mut self, program: impl Into<String>) -> Self {
        self.allowlist.insert(program.into());
        self
    }

    /// Set when model-written scripts may run.
    pub fn with_scripts(mut self, scripts: ScriptPolicy) -> Self {
        self.scripts = scripts;
        self
    }

    /// Why `program args` may not run in a sandbox that does not isolate,
    /// if it may not (see [`CommandPolicy::prepare`]).
    pub fn check(&self, program: &str, args: &[String]) -> Result<(), String> {
        self.prepare(program, args, false).map(|_| ())
    }

    /// Check `program args` and return it as it will run, or why it may not.
    ///
    /// The program must be a bare allowlisted name. Every path an argument
    /// can carry — the whole argument, `--opt=value`, a glued short option
    /// (`-t/abs`, `-f../x`), `name=value`, `file:…` — must stay inside the
    /// workspace. Launchers get per-program rules (`find -exec`, `node -e`,
    /// `npx -c`, `npm exec`, git options and subcommands that run programs are
    /// refused; scripts the model wrote run only as [`CommandPolicy::scripts`]
    /// allows, given whether the sandbox `isolated` commands).
    pub fn prepare(
        &self,
        program: &str,
        args: &[String],
        isolated: bool,
    ) -> Result<PreparedCommand, String> {
        if program.contains('/') || program.contains('\\') {
            return Err(format!("`{program}`: the program must be a bare name"));
        }
        if !self.allowlist.contains(program) {
            return Err(format!("`{program}` is not on the command allowlist"));
        }
        commands::check_paths(args)?;
        commands::program_rules(program, args, self.scripts.allows(isolated))
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
    /// A run whose earlier attempts ended abnormally this many times (the
    /// worker crashed or lost its lease mid-run, the model panicked) is
    /// finished `failed` instead of being claimed again (default 5).
    pub max_abnormal_attempts: u32,
    /// Bytes one turn may produce (parsed output plus provider reasoning)
    /// before the stream is cut and the run fails (default 8 MiB): bounds
    /// what a runaway model can make the engine persist.
    pub max_turn_output_bytes: usize,
    /// Largest file a model may write (default 16 MiB). A bigger file is not
    /// written (`file_write_failed` and a tool result) and its content is
    /// not kept in memory.
    pub max_file_bytes: usize,
    /// How runs of one chat continue each other: history and snapshot
    /// sizes, the double-texting policy, builds.
    pub chat: ChatConfig,
}

/// What happens when a run is submitted to a chat that already has an
/// active (queued or running) run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoubleTexting {
    /// Refuse the new run with [`SubmitError::ChatBusy`](super::SubmitError::ChatBusy)
    /// naming the active run (the default).
    #[default]
    Reject,
    /// Admit it `queued`; it starts when the earlier runs of the chat have
    /// finished, in submission (run id) order.
    Enqueue,
    /// Cancel the chat's active runs, then start it once they have ended.
    Interrupt,
}

impl DoubleTexting {
    /// `reject`, `enqueue` or `interrupt`.
    pub fn as_str(self) -> &'static str {
        match self {
            DoubleTexting::Reject => "reject",
            DoubleTexting::Enqueue => "enqueue",
            DoubleTexting::Interrupt => "interrupt",
        }
    }
}

impl std::str::FromStr for DoubleTexting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(DoubleTexting::Reject),
            "enqueue" => Ok(DoubleTexting::Enqueue),
            "interrupt" => Ok(DoubleTexting::Interrupt),
            other => Err(format!(
                "unknown double-texting policy `{other}` (reject, enqueue or interrupt)"
            )),
        }
    }
}

/// Builds after a run that changed files.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BuildConfig {
    /// Run a build at all (default `false`: builds are opt-in). Even when
    /// on, a project without a `build` script in `package.json` gets none.
    pub enabled: bool,
    /// The command (default: the package manager's `run build`).
    pub command: Option<Vec<String>>,
    /// How long a build may take (default 5 min).
    pub timeout: Duration,
    /// After a failed build, give the model one more turn with the build
    /// output to fix it, then build again (default `true`; the turn counts
    /// against the run's budgets).
    pub autofix: bool,
    /// Bytes of build output kept in the event, record and autofix prompt (8 KiB).
    pub output_cap: usize,
}

impl Default for BuildConfig {
    fn default() -> Self {
        BuildConfig {
            enabled: false,
            command: None,
            timeout: Duration::from_secs(300),
            autofix: true,
            output_cap: 8 * 1024,
        }
    }
}

impl BuildConfig {
    /// Builds on, with the defaults otherwise.
    pub fn enabled() -> Self {
        BuildConfig {
            enabled: true,
            ..Self::default()
        }
    }

    /// Use `command` instead of `<package manager> run build`.
    pub fn with_command(mut self, command: Vec<String>) -> Self {
        self.command = Some(command);
        self
    }

    /// Turn the autofix turn on or off.
    pub fn with_autofix(mut self, autofix: bool) -> Self {
        self.autofix = autofix;
        self
    }
}

/// How a run continues its chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatConfig {
    /// The default double-texting policy (a request may override it).
    pub double_texting: DoubleTexting,
    /// At most this many earlier messages are loaded (200); fewer may fit.
    pub history_limit: usize,
    /// At most this many files are listed in the project snapshot (200).
    pub listed_files: usize,
    /// Bytes of file text included in the snapshot, in total (24 KiB)…
    pub snapshot_bytes: usize,
    /// … and per file (8 KiB; bigger files are listed only).
    pub snapshot_file_bytes: usize,
    /// Builds after runs that changed files.
    pub build: BuildConfig,
}

impl Default for ChatConfig {
    fn default() -> Self {
        ChatConfig {
            double_texting: DoubleTexting::Reject,
            history_limit: 200,
            listed_files: 200,
            snapshot_bytes: 24 * 1024,
            snapshot_file_bytes: 8 * 1024,
            build: BuildConfig::default(),
        }
    }
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
            max_abnormal_attempts: 5,
            max_turn_output_bytes: 8 * 1024 * 1024,
            max_file_bytes: 16 * 1024 * 1024,
            chat: ChatConfig::default(),
        }
    }
}

/// Largest accepted prompt, in bytes.
pub const MAX_PROMPT_BYTES: usize = 100 * 1024;
/// Largest accepted user or chat id, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// A request to start a run: [`RunRequest::new`], then `with_*` (or set the
/// public fields); new fields may be added, so it is not built literally.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// What to do if the chat already has an active run; `None` = the
    /// engine's [`ChatConfig::double_texting`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub double_texting: Option<DoubleTexting>,
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
            double_texting: None,
        }
    }

    /// Override the engine's double-texting policy for this request.
    pub fn with_double_texting(mut self, policy: DoubleTexting) -> Self {
        self.double_texting = Some(policy);
        self
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

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The bypasses of issue 13 (and more of the same kinds): paths glued to
    /// short options or after `=`, and launchers that run arbitrary code.
    #[test]
    fn glued_and_equals_forms_cannot_leave_the_workspace() {
        let p = CommandPolicy::default();
        for (prog, a) in [
            ("cp", vec!["-t/abs", "a.txt"]),
            ("cp", vec!["-t..", "a.txt"]),
            ("cp", vec!["-t../sibling", "a.txt"]),
            ("cp", vec!["-rt/abs", "a.txt"]),
            ("cp", vec!["-vt~/x", "a.txt"]),
            ("cp", vec!["--target-directory=/abs", "a.txt"]),
            ("cp", vec!["--target-directory=..", "a.txt"]),
            ("mv", vec!["-t/tmp", "a.txt"]),
            ("grep", vec!["-f/etc/hostname", "x"]),
            ("grep", vec!["-rf../x", "y"]),
            ("grep", vec!["--file=/etc/hostname", "x"]),
            ("grep", vec!["-r", "x", "/"]),
            ("cat", vec!["src/../../x"]),
            ("npm", vec!["install", "file:/etc"]),
            ("npm", vec!["install", "file:../other"]),
            ("npm", vec!["--prefix=/etc", "ls"]),
            ("tsc", vec!["@/etc/args"]),
            ("find", vec!["-fprint/abs"]),
            ("ls", vec!["X=/abs"]),
        ] {
            let r = p.check(prog, &args(&a));
            assert!(r.is_err(), "{prog} {a:?} passed");
        }
        for (prog, a) in [
            ("cp", vec!["-t", "dist", "a.txt"]),
            ("cp", vec!["-r", "src/", "dist/"]),
            ("grep", vec!["-rn", "TODO", "src"]),
            ("ls", vec!["-la"]),
            ("npm", vec!["install", "https://example.com/x.tgz"]),
            ("cat", vec!["src/../a.txt"]),
        ] {
            let r = p.check(prog, &args(&a));
            assert!(r.is_ok(), "{prog} {a:?} refused: {r:?}");
        }
    }

    #[test]
    fn launchers_are_refused_or_gated() {
        let p = CommandPolicy::default();
        let always_denied: &[(&str, &[&str])] = &[
            ("find", &[".", "-exec", "touch", "/tmp/x", ";"]),
            ("find", &[".", "-execdir", "sh", ";"]),
            ("find", &[".", "-ok", "sh", ";"]),
            ("find", &[".", "-okdir", "sh", ";"]),
            ("node", &["-e", "require('fs')"]),
            ("node", &["-pe", "1"]),
            ("node", &["--eval=1"]),
            ("node", &["--print", "1"]),
            ("node", &["-r", "./x.js"]),
            ("node", &["--require=./x.js", "app.js"]),
            ("node", &["--import=./x.mjs", "app.js"]),
            ("node", &["--inspect=0.0.0.0:9229", "app.js"]),
            ("npx", &["-c", "touch /tmp/x"]),
            ("npx", &["--call=touch x"]),
            ("npm", &["exec", "--", "touch", "x"]),
            ("npm", &["x", "cowsay"]),
            ("npm", &["exec", "-c", "touch x"]),
            ("npm", &["--script-shell=./evil", "run", "x"]),
            ("pnpm", &["exec", "touch", "x"]),
            ("pnpm", &["dlx", "cowsay"]),
            ("git", &["-c", "alias.x=!touch /tmp/x", "x"]),
            ("git", &["-calias.x=!sh", "x"]),
            ("git", &["--config-env=core.pager=X", "log"]),
            ("git", &["--exec-path=.", "status"]),
            ("git", &["x"]),
            ("git", &["config", "core.fsmonitor", "./evil"]),
            ("git", &["submodule", "update"]),
            ("git", &["grep", "-O", "x"]),
            ("git", &["diff", "--ext-diff"]),
        ];
        for (prog, a) in always_denied {
            for isolated in [false, true] {
                let r =
                    p.clone()
                        .with_scripts(ScriptPolicy::Always)
                        .prepare(prog, &args(a), isolated);
                assert!(r.is_err(), "{prog} {a:?} passed (isolated {isolated})");
            }
        }
        let scripts: &[(&str, &[&str])] = &[
            ("npm", &["run", "build"]),
            ("npm", &["test"]),
            ("npm", &["start"]),
            ("npx", &["vite", "build"]),
            ("node", &["app.js"]),
            ("pnpm", &["build"]),
        ];
        for (prog, a) in scripts {
            assert!(p.prepare(prog, &args(a), false).is_err(), "{prog} {a:?}");
            assert!(p.prepare(prog, &args(a), true).is_ok(), "{prog} {a:?}");
            let never = p.clone().with_scripts(ScriptPolicy::Never);
            assert!(never.prepare(prog, &args(a), true).is_err(), "{prog} {a:?}");
            let always = p.clone().with_scripts(ScriptPolicy::Always);
            assert!(
                always.prepare(prog, &args(a), false).is_ok(),
                "{prog} {a:?}"
            );
        }
        // Harmless forms stay allowed everywhere.
        assert!(p.prepare("node", &args(&["--version"]), false).is_ok());
        assert!(
            p.prepare("npm", &args(&["install", "react"]), false)
                .is_ok()
        );
        assert!(p.prepare("git", &args(&["status"]), false).is_ok());
        assert!(
            p.prepare("find", &args(&[".", "-name", "*.ts"]), false)
                .is_ok()
        );
    }

    #[test]
    fn git_runs_with_configured_programs_disabled() {
        let p = CommandPolicy::default();
        let prepared = p
            .prepare("git", &args(&["commit", "-m", "x"]), false)
            .unwrap();
        let joined = prepared.args.join(" ");
        assert!(joined.contains("-c core.hooksPath=/dev/null"), "{joined}");
        assert!(joined.contains("-c core.fsmonitor=false"), "{joined}");
        assert!(joined.ends_with("commit -m x"), "{joined}");
        assert!(prepared.check_git_config);
        assert!(
            prepared
                .env
                .contains(&("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()))
        );
        // npm never runs lifecycle scripts where scripts are not allowed.
        let npm = p.prepare("npm", &args(&["install"]), false).unwrap();
        assert!(
            npm.env
                .contains(&("npm_config_ignore_scripts".into(), "true".into()))
        );
    }

    #[test]
    fn git_config_hazards() {
        assert!(git_config_hazard("[core]\n\tfsmonitor = ./evil.sh\n").is_some());
        assert!(git_config_hazard("[core]\nhooksPath=/tmp\n").is_some());
        assert!(git_config_hazard("[filter \"x\"]\n clean = sh -c evil\n").is_some());
        assert!(git_config_hazard("[diff \"x\"]\n textconv = evil\n").is_some());
        assert!(git_config_hazard("[include]\n path = ../../x\n").is_some());
        assert!(git_config_hazard("[includeIf \"gitdir:/\"]\n path = x\n").is_some());
        assert!(git_config_hazard("[core]\n worktree = /\n").is_some());
        assert!(git_config_hazard("[alias]\n x = !sh\n").is_some());
        assert!(git_config_hazard("[core] sshCommand = evil").is_some());
        let plain = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n";
        assert_eq!(git_config_hazard(plain), None);
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
