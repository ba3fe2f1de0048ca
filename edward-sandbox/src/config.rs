//! Configuration of [`crate::LocalSandboxProvider`].

use std::path::PathBuf;
use std::time::Duration;

/// Settings shared by every sandbox of a [`crate::LocalSandboxProvider`].
///
/// Construct with [`Default`] and change fields:
///
/// ```
/// let mut config = edward_sandbox::LocalSandboxConfig::default();
/// config.sync_writes = true;
/// config.env.push(("NODE_ENV".into(), "development".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LocalSandboxConfig {
    /// `fsync` each written file before the rename, and its directory after.
    /// Off by default: the workspace is a scratch copy the engine can rebuild,
    /// and the rename alone already makes each file appear whole.
    pub sync_writes: bool,
    /// Names of host environment variables copied into every command's
    /// environment when set on the host. Everything else is cleared.
    /// Default: `PATH`, `LANG`, `LC_ALL`, `LC_CTYPE`, `TERM`, `TZ`, `NODE_ENV`.
    pub env_passthrough: Vec<String>,
    /// Variables set for every command (after the passthrough ones, before the
    /// request's own `env`, which wins).
    pub env: Vec<(String, String)>,
    /// `HOME` for commands; `None` (default) = the sandbox's workspace, so tools
    /// that write caches and dotfiles under `$HOME` write them into the sandbox.
    pub home: Option<PathBuf>,
    /// `PATH` used when the host has none (or `PATH` is not passed through).
    pub default_path: String,
    /// At most this many entries from `list_files` (default 10,000).
    pub list_cap: usize,
    /// After killing a command's process group, how long to wait for it to be
    /// reaped and for its output pipes to close before giving up on them
    /// (a process that left the group can keep a pipe open). Default 2 s.
    pub kill_grace: Duration,
    /// Whether commands run inside a bubblewrap jail (default
    /// [`Confinement::Auto`]: when `bwrap` is installed and works).
    pub confinement: Confinement,
    /// Where `bwrap` is (default: looked for in `/usr/bin`, `/bin`, `/usr/local/bin`).
    pub bwrap_path: Option<PathBuf>,
    /// Network access of jailed commands (default: package managers only).
    pub network: NetworkAccess,
}

/// Whether [`crate::LocalSandbox`] confines its commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Confinement {
    /// Jail every command with bubblewrap when it is installed and works;
    /// otherwise run unconfined and say so (`Sandbox::isolation`).
    #[default]
    Auto,
    /// Jail every command; provisioning fails when bubblewrap is unusable.
    Required,
    /// Never jail (commands run with the host user's rights).
    Off,
}

/// Network access of jailed commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkAccess {
    /// No command has network (a private network namespace with only loopback).
    None,
    /// Package managers (`npm`, `pnpm`, `yarn`, `bun`, `npx`) share the host
    /// network, so installs work; everything else has none. Default.
    #[default]
    PackageManagers,
    /// Every command shares the host network.
    All,
}

impl Default for LocalSandboxConfig {
    fn default() -> Self {
        LocalSandboxConfig {
            sync_writes: false,
            env_passthrough: [
                "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "NODE_ENV",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            env: Vec::new(),
            home: None,
            default_path: "/usr/local/bin:/usr/bin:/bin".into(),
            list_cap: 10_000,
            kill_grace: Duration::from_secs(2),
            confinement: Confinement::Auto,
            bwrap_path: None,
            network: NetworkAccess::PackageManagers,
        }
    }
}
