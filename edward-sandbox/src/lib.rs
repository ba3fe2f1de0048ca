//! Edward sandboxes: where a run's files are written and its commands run.
//!
//! This crate provides [`LocalSandboxProvider`], which implements
//! [`edward_core::SandboxProvider`] with one directory per sandbox under a root
//! directory and plain child processes. It is the embedded default: no daemon,
//! no container runtime, nothing to install.
//!
//! # Confinement: the bubblewrap jail
//!
//! When bubblewrap (`bwrap`, Debian package `bubblewrap`) is installed and
//! works, **every command runs in a jail** ([`Confinement::Auto`], the
//! default; [`Confinement::Required`] refuses to provision without it):
//!
//! - its own user, mount, pid, network, ipc and uts namespaces
//!   (`--unshare-all`): no network except for package managers
//!   ([`NetworkAccess`]), no view of host processes;
//! - the workspace is the only writable directory; `/usr`, `/bin`, `/lib*`,
//!   `/opt` are read-only, `/etc` holds only what programs need to start
//!   (users, name resolution, TLS roots, the dynamic linker), `/tmp` is a
//!   private tmpfs, other workspaces and the sandboxes' root do not exist;
//! - `--die-with-parent` and a pid namespace whose init exits with the
//!   command: nothing it starts — background jobs, `setsid`/`nohup`
//!   children — outlives `exec`.
//!
//! [`Sandbox::isolation`](edward_core::Sandbox::isolation) says which mode a
//! sandbox is in, and the engine records a `sandbox_not_isolated` event when
//! commands run unconfined.
//!
//! # Without bubblewrap: not a security boundary
//!
//! **Without the jail, `LocalSandbox` does not isolate anything.** Commands
//! run as the same user as the host process, with that user's file system,
//! network and resources. **Running a script the model wrote (`npm run`,
//! `node app.js`, a `postinstall` hook) is then code execution on the host.**
//! The engine's command policy refuses such launchers unless the sandbox
//! isolates or the operator opts in, but its argument checks are defence in
//! depth, not containment. What the unconfined sandbox does guarantee is
//! hygiene:
//!
//! - file paths given to [`Sandbox::write_files`](edward_core::Sandbox::write_files),
//!   [`read_file`](edward_core::Sandbox::read_file) and `exec`'s `cwd` stay inside
//!   the workspace, including through symlinks (a symlink that resolves outside
//!   is refused, a symlink target is replaced, never written through);
//! - commands run with argv only (no shell), a cleared environment plus an
//!   allowlist, stdin closed, in a fresh process group that is killed as a whole
//!   on timeout, cancellation, or when the command exits, so no process outlives
//!   its `exec` and no stray background job keeps running (a process that
//!   calls `setsid` leaves the group: only the jail catches it);
//! - captured output is capped; the bytes beyond the cap are counted, not kept.
//!
//! A command can still read or write anything the host user can (`cat /etc/passwd`,
//! `rm -rf ~`). Run untrusted model output in a [`DockerSandbox`] (feature
//! `docker`) or inside a container/VM of your own.
//!
//! # Semantics
//!
//! - **Workspace directory.** The directory name is derived from the
//!   [`SandboxKey`](edward_core::SandboxKey): a sanitised prefix (ASCII letters,
//!   digits, `-`, `_`; at most 48 characters) plus a stable 64-bit FNV-1a hash of
//!   the whole key, so any key (`../../x`, `/etc`, the empty string) stays one
//!   level under the root, distinct keys do not collide by sanitising, and the
//!   name is the same across processes (reattach after a restart works).
//! - **Writes.** Each file is written whole to a temporary file in its target
//!   directory, then renamed over the target, so readers see the old or the new
//!   content, never a mix. A batch is a sequence of such writes in order: it is
//!   **not atomic as a whole** (a failure midway leaves the earlier files
//!   written); the engine only relies on per-file atomicity and re-writes whole
//!   batches on retry. `fsync` is off by default: a workspace is a scratch copy
//!   that the engine can rebuild from the run's recorded writes, the rename
//!   already gives atomic visibility to concurrent readers, and an `fsync` per
//!   file (plus one per directory) costs milliseconds each on many file systems,
//!   which would stall a turn that writes hundreds of files. Turn it on with
//!   [`LocalSandboxConfig::sync_writes`] when the workspace itself must survive
//!   a power loss.
//! - **Listing.** Regular files only (symlinks, sockets and the like are
//!   skipped, so a listing never leaves the workspace), sorted by path bytes, at
//!   most [`LocalSandboxConfig::list_cap`] entries (default 10,000). The walk
//!   visits directories in exactly that order, so a capped listing is the
//!   deterministic prefix of the full one; hitting the cap is logged.
//!   In-flight temporary files (`.edward-tmp-*`) are not listed.
//! - **Exec.** See [`LocalSandbox`] for the process model.
//!
//! # Example
//!
//! ```
//! use edward_core::{ExecRequest, FileWrite, SandboxKey, SandboxPath, SandboxProvider, SandboxSpec};
//! use edward_sandbox::LocalSandboxProvider;
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let root = tempfile::tempdir()?;
//! let provider = LocalSandboxProvider::new(root.path());
//! let sandbox = provider
//!     .provision(&SandboxKey("run-1".into()), &SandboxSpec::default())
//!     .await?;
//! sandbox
//!     .write_files(vec![FileWrite {
//!         path: SandboxPath::new("src/hello.txt")?,
//!         content: "hi".into(),
//!     }])
//!     .await?;
//! let out = sandbox
//!     .exec(
//!         ExecRequest {
//!             program: "cat".into(),
//!             args: vec!["src/hello.txt".into()],
//!             cwd: None,
//!             env: vec![],
//!             timeout: Duration::from_secs(10),
//!             output_cap: 64 * 1024,
//!         },
//!         CancellationToken::new(),
//!     )
//!     .await?;
//! assert_eq!(out.exit_code, Some(0));
//! assert_eq!(out.stdout, "hi");
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod config;
#[cfg(feature = "docker")]
pub mod docker;
mod exec;
mod fs;
mod jail;
mod local;

pub use config::{Confinement, LocalSandboxConfig, NetworkAccess};
#[cfg(feature = "docker")]
pub use docker::{DockerSandbox, DockerSandboxConfig, DockerSandboxProvider};
pub use local::{LocalSandbox, LocalSandboxProvider};
