//! Argument parsing and per-program rules behind [`super::CommandPolicy`].
//!
//! Two layers, both pure (no I/O):
//!
//! 1. **Paths.** Every place an argument can carry a path is checked: the
//!    whole argument, the value of `--opt=value`, the rest of a glued short
//!    option (`-t/abs`, `-f../x`, `-xt/abs`), any suffix of a short-option
//!    bundle that starts with `/` or `~`, a `name=value` pair, and the part
//!    after a `file:` scheme. A candidate that is absolute, starts with `~`
//!    or contains `..` must normalise to a path inside the workspace.
//! 2. **Launchers.** Programs that run other programs or arbitrary code get
//!    rules: `find -exec/-execdir/-ok/-okdir`, `node -e/-p/-r/--import/…`,
//!    `npx -c`, `npm exec`, `pnpm exec/dlx`, and anything git would run from
//!    configuration are refused outright; running code the model wrote
//!    (`npm run`, `npx <pkg>`, `node file.js`, package lifecycle scripts) is
//!    allowed only as [`ScriptPolicy`] says.

use serde::{Deserialize, Serialize};

use crate::SandboxPath;

/// When commands may run code the model wrote (`npm run`, `npm test`,
/// `npx <pkg>`, `node app.js`, `pnpm <script>`, package lifecycle scripts).
///
/// Running a model-written script is **code execution**: whatever the script
/// does, the command does. Only a sandbox that isolates (a jail or a
/// container) keeps that inside the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptPolicy {
    /// Never (lifecycle scripts of installs are skipped with `--ignore-scripts`).
    Never,
    /// Only when the sandbox reports that it isolates commands (default).
    #[default]
    IfIsolated,
    /// Always, also in a sandbox that does not isolate. The operator accepts
    /// that model-written code runs with the host user's rights.
    Always,
}

impl ScriptPolicy {
    /// Whether scripts may run in a sandbox that does (or does not) isolate.
    pub fn allows(self, isolated: bool) -> bool {
        match self {
            ScriptPolicy::Never => false,
            ScriptPolicy::IfIsolated => isolated,
            ScriptPolicy::Always => true,
        }
    }
}

/// A command that passed the policy, with what the engine adds to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedCommand {
    /// The program (a bare name).
    pub program: String,
    /// Its arguments, with forced options prepended where the program needs them
    /// (git's `-c core.hooksPath=/dev/null …`).
    pub args: Vec<String>,
    /// Environment variables set for it (`GIT_CONFIG_GLOBAL=/dev/null`,
    /// `npm_config_ignore_scripts=true`, …).
    pub env: Vec<(String, String)>,
    /// The workspace's git configuration must be checked before running
    /// (see [`git_config_hazard`]).
    pub check_git_config: bool,
}

/// Git subcommands the model may run: builtins only (an alias can never
/// shadow a builtin, so `alias.x=!cmd` never runs), none that execute
/// programs by option or fetch from elsewhere.
const GIT_SUBCOMMANDS: &[&str] = &[
    "init",
    "status",
    "add",
    "commit",
    "diff",
    "log",
    "show",
    "branch",
    "checkout",
    "switch",
    "restore",
    "reset",
    "rm",
    "mv",
    "tag",
    "stash",
    "ls-files",
    "rev-parse",
    "blame",
    "describe",
    "shortlog",
    "merge-base",
    "cat-file",
    "ls-tree",
    "version",
    "help",
];

/// Forced in front of every git command: nothing configured runs a program.
const GIT_FORCED: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.editor=true",
    "sequence.editor=true",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "credential.helper=",
    "diff.external=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "protocol.allow=never",
];

/// Git configuration keys (last dotted segment, lower case) that make git
/// run a program or look outside the repository.
const GIT_HAZARD_KEYS: &[&str] = &[
    "textconv",
    "command",
    "driver",
    "program",
    "process",
    "clean",
    "smudge",
    "worktree",
    "hookspath",
    "fsmonitor",
    "sshcommand",
    "askpass",
    "editor",
    "pager",
    "helper",
    "external",
    "gitproxy",
    "packobjectshook",
    "alternaterefscommand",
];

/// Why a workspace's `.git/config` text may not be used, if it may not:
/// an `include`/`includeIf` section or a key that makes git run a program
/// (`filter.*.clean`, `diff.*.textconv`, `core.fsmonitor`, …) or leave the
/// repository (`core.worktree`).
pub fn git_config_hazard(text: &str) -> Option<String> {
    let mut section = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut rest = line;
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').unwrap_or(after.len());
            section = after[..end]
                .split(|c: char| c.is_whitespace() || c == '"' || c == '.')
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            if section == "include" || section == "includeif" {
                return Some(format!(
                    "`[{}]` includes other configuration",
                    &after[..end]
                ));
            }
            rest = after.get(end + 1..).unwrap_or("").trim();
            if rest.is_empty() {
                continue;
            }
        }
        let key = rest
            .split(['=', ' ', '\t'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        if GIT_HAZARD_KEYS.contains(&key.as_str()) || section == "alias" && rest.contains('!') {
            return Some(format!(
                "`{section}.{key}` in .git/config can make git run a program or leave the workspace"
            ));
        }
    }
    None
}

/// The path candidates inside one argument.
fn candidates(arg: &str) -> Vec<&str> {
    let mut out = vec![arg];
    if let Some(long) = arg.strip_prefix("--") {
        if let Some((_, v)) = long.split_once('=') {
            out.push(v);
        }
    } else if let Some(short) = arg.strip_prefix('-') {
        if short.len() > 1 {
            // `-t/abs`, `-f../x`: the rest after the option letter …
            let mut chars = short.char_indices();
            chars.next();
            if let Some((i, _)) = chars.next() {
                out.push(&short[i..]);
            }
            // … and any suffix of a bundle starting like a path (`-xt/abs`).
            for (i, c) in short.char_indices() {
                if c == '/' || c == '~' || c == '\\' {
                    out.push(&short[i..]);
                    break;
                }
            }
            if let Some((_, v)) = short.split_once('=') {
                out.push(v);
            }
        }
    } else if let Some((_, v)) = arg.split_once('=') {
        out.push(v);
    }
    // `file:/abs`, `file:../x`, `link:../x` (npm specs), `@/abs` (response files).
    let mut extra = Vec::new();
    for c in &out {
        if let Some((scheme, rest)) = c.split_once(':') {
            let s = scheme.to_ascii_lowercase();
            if !rest.starts_with("//") || s == "file" {
                extra.push(rest);
            }
        }
        if let Some(rest) = c.strip_prefix('@') {
            extra.push(rest);
        }
    }
    out.extend(extra);
    out
}

/// Check every path candidate of every argument.
pub(super) fn check_paths(args: &[String]) -> Result<(), String> {
    for arg in args {
        for c in candidates(arg) {
            if c.starts_with('~') {
                return Err(format!("argument `{arg}` refers to the home directory"));
            }
            if c == ".." {
                return Err(format!("argument `{arg}` points outside the workspace"));
            }
            let looks_like_path = c.starts_with('/') || c.starts_with('\\') || c.contains("..");
            if looks_like_path && SandboxPath::new(c).is_err() {
                return Err(format!("argument `{arg}` points outside the workspace"));
            }
        }
    }
    Ok(())
}

/// Whether `arg` is option `name` in any spelling: `-e`, `-e=…`, `-eCODE`
/// (short, when `name` is one letter), `--eval`, `--eval=…`.
fn is_opt(arg: &str, short: Option<char>, long: &[&str]) -> bool {
    if let Some(l) = arg.strip_prefix("--") {
        let name = l.split_once('=').map_or(l, |(n, _)| n);
        return long.contains(&name);
    }
    if let (Some(s), Some(bundle)) = (short, arg.strip_prefix('-')) {
        return bundle.starts_with(s);
    }
    false
}

/// A node short-option bundle containing any of `letters` (`-pe`, `-ep`).
fn bundle_has(arg: &str, letters: &[char]) -> bool {
    match arg.strip_prefix('-') {
        Some(b) if !b.starts_with('-') && !b.is_empty() => b
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .any(|c| letters.contains(&c)),
        _ => false,
    }
}

/// The first argument that is not an option.
fn first_positional(args: &[String]) -> Option<(usize, &str)> {
    args.iter()
        .enumerate()
        .find(|(_, a)| !a.starts_with('-'))
        .map(|(i, a)| (i, a.as_str()))
}

fn denied(program: &str, what: &str) -> String {
    format!("`{program} {what}` runs arbitrary code and is not allowed")
}

fn script_gate(program: &str, what: &str, scripts_ok: bool) -> Result<(), String> {
    if scripts_ok {
        Ok(())
    } else {
        Err(format!(
            "`{program} {what}` runs code written in this run; the sandbox does not isolate \
             commands, so the command policy does not allow it (install bubblewrap for the \
             local sandbox, or set CommandPolicy::scripts to Always to accept the risk)"
        ))
    }
}

/// Per-program rules. `scripts_ok`: running model-written code is allowed.
pub(super) fn program_rules(
    program: &str,
    args: &[String],
    scripts_ok: bool,
) -> Result<PreparedCommand, String> {
    let mut prepared = PreparedCommand {
        program: program.to_string(),
        args: args.to_vec(),
        env: Vec::new(),
        check_git_config: false,
    };
    let ignore_scripts = || {
        vec![
            ("npm_config_ignore_scripts".to_string(), "true".to_string()),
            ("YARN_IGNORE_SCRIPTS".to_string(), "true".to_string()),
        ]
    };
    match program {
        "find" => {
            for a in args {
                if matches!(a.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
                    return Err(denied("find", a));
                }
            }
        }
        "node" | "nodejs" | "bun" | "deno" => {
            for a in args {
                if is_opt(a, Some('e'), &["eval"])
                    || is_opt(a, Some('p'), &["print"])
                    || is_opt(a, Some('r'), &["require"])
                    || is_opt(a, Some('i'), &["interactive"])
                    || is_opt(
                        a,
                        None,
                        &["import", "loader", "experimental-loader", "env-file"],
                    )
                    || bundle_has(a, &['e', 'p', 'r', 'i'])
                    || a == "-"
                {
                    return Err(denied(program, a));
                }
                if a.starts_with("--inspect") {
                    return Err(denied(program, a));
                }
            }
            if program == "bun" {
                return bun_rules(args, scripts_ok, prepared);
            }
            let harmless = args.iter().all(|a| {
                matches!(
                    a.as_str(),
                    "-v" | "--version" | "-h" | "--help" | "-c" | "--check"
                )
            });
            let check_only = args.iter().any(|a| a == "-c" || a == "--check");
            if !harmless && !check_only {
                let what = first_positional(args).map_or("…", |(_, a)| a);
                script_gate(program, what, scripts_ok)?;
            }
        }
        "npx" => {
            for a in args {
                if is_opt(a, Some('c'), &["call", "shell-auto-fallback", "shell"]) {
                    return Err(denied("npx", a));
                }
            }
            let only_meta = args
                .iter()
                .all(|a| matches!(a.as_str(), "-v" | "--version" | "-h" | "--help"));
            if !only_meta {
                let what = first_positional(args).map_or("…", |(_, a)| a);
                script_gate("npx", what, scripts_ok)?;
            }
            if !scripts_ok {
                prepared.env.extend(ignore_scripts());
            }
        }
        "npm" => {
            for a in args {
                if is_opt(
                    a,
                    Some('c'),
                    &[
                        "call",
                        "script-shell",
                        "shell",
                        "editor",
                        "node-options",
                        "init-module",
                    ],
                ) {
                    return Err(denied("npm", a));
                }
            }
            let sub = first_positional(args).map(|(_, s)| s).unwrap_or("");
            match sub {
                "exec" | "x" | "explore" | "edit" | "init" | "create" | "innit" => {
                    return Err(denied("npm", sub));
                }
                "run" | "run-script" | "rum" | "urn" | "test" | "t" | "tst" | "start" | "stop"
                | "restart" | "install-test" | "it" | "install-ci-test" | "cit" | "rebuild"
                | "rb" | "pack" | "publish" => script_gate("npm", sub, scripts_ok)?,
                _ => {}
            }
            if !scripts_ok {
                prepared.env.extend(ignore_scripts());
            }
        }
        "pnpm" | "yarn" => {
            for a in args {
                if is_opt(a, Some('c'), &["shell-mode", "call"]) {
                    return Err(denied(program, a));
                }
            }
            let sub = first_positional(args).map(|(_, s)| s).unwrap_or("");
            match sub {
                "exec" | "dlx" | "create" | "x" | "node" => return Err(denied(program, sub)),
                "" | "install" | "i" | "add" | "remove" | "rm" | "un" | "uninstall" | "update"
                | "up" | "upgrade" | "list" | "ls" | "why" | "outdated" | "info" | "view"
                | "audit" | "licenses" | "config" | "store" | "prune" | "dedupe" | "import"
                | "fetch" | "link" | "unlink" | "--version" => {}
                // Anything else is a package script by name (`pnpm build`).
                other => script_gate(program, other, scripts_ok)?,
            }
            if !scripts_ok {
                prepared.env.extend(ignore_scripts());
            }
        }
        "git" => return git_rules(args, prepared),
        _ => {}
    }
    Ok(prepared)
}

fn bun_rules(
    args: &[String],
    scripts_ok: bool,
    mut prepared: PreparedCommand,
) -> Result<PreparedCommand, String> {
    let sub = first_positional(args).map(|(_, s)| s).unwrap_or("");
    match sub {
        "x" | "exec" | "create" | "repl" => return Err(denied("bun", sub)),
        "" | "install" | "i" | "add" | "remove" | "rm" | "update" | "outdated" | "pm" => {}
        other => script_gate("bun", other, scripts_ok)?,
    }
    if !scripts_ok {
        prepared
            .env
            .push(("npm_config_ignore_scripts".into(), "true".into()));
    }
    Ok(prepared)
}

fn git_rules(args: &[String], mut prepared: PreparedCommand) -> Result<PreparedCommand, String> {
    // Global options before the subcommand: a few harmless ones, `-C <dir>`.
    let mut i = 0;
    while let Some(a) = args.get(i) {
        match a.as_str() {
            "--no-pager"
            | "-P"
            | "--no-optional-locks"
            | "--literal-pathspecs"
            | "--no-replace-objects"
            | "--version"
            | "--help" => i += 1,
            "-C" => i += 2,
            s if s.starts_with('-') => return Err(denied("git", s)),
            _ => break,
        }
    }
    if let Some(sub) = args.get(i) {
        if !GIT_SUBCOMMANDS.contains(&sub.as_str()) {
            return Err(format!(
                "`git {sub}` is not allowed (allowed: {})",
                GIT_SUBCOMMANDS.join(", ")
            ));
        }
    }
    for a in &args[i.min(args.len())..] {
        // Options of allowed subcommands that run a program.
        if is_opt(
            a,
            None,
            &[
                "exec",
                "upload-pack",
                "receive-pack",
                "ext-diff",
                "textconv",
            ],
        ) || a.starts_with("--open-files-in-pager")
            || a == "-O"
        {
            return Err(denied("git", a));
        }
    }
    let mut forced = Vec::with_capacity(GIT_FORCED.len() * 2 + args.len());
    for f in GIT_FORCED {
        forced.push("-c".to_string());
        forced.push((*f).to_string());
    }
    forced.extend(args.iter().cloned());
    prepared.args = forced;
    prepared.env.extend(
        [
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_EDITOR", "true"),
            ("GIT_SEQUENCE_EDITOR", "true"),
            ("GIT_PAGER", "cat"),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_ASKPASS", "true"),
            ("GIT_EXTERNAL_DIFF", ""),
            ("GIT_SSH_COMMAND", "false"),
            ("GIT_ALLOW_PROTOCOL", "none"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    prepared.check_git_config = true;
    Ok(prepared)
}
