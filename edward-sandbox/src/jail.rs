//! Confinement of local commands with bubblewrap (`bwrap`).
//!
//! Each command runs in a fresh set of namespaces (`--unshare-all`: user,
//! mount, pid, network, ipc, uts, cgroup): the workspace is the only
//! writable directory, system directories are mounted read-only, `/tmp` is a
//! private tmpfs, `/etc` holds only what programs need to start, and there is
//! no network except for package managers when the configuration allows it.
//! The command is not pid 1 of its namespace; when it exits (or bubblewrap is
//! killed, `--die-with-parent`) the namespace's init exits and the kernel
//! kills every process left in it, detached (`setsid`) children included.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::{Confinement, LocalSandboxConfig, NetworkAccess};

/// Whether and how this host can jail commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JailSupport {
    /// `bwrap` at this path works.
    Bwrap(PathBuf),
    /// Commands run unconfined, for this reason.
    Unavailable(String),
}

/// System directories bound read-only (or re-created as the same symlink).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
];

/// The parts of `/etc` programs need (name resolution, TLS roots, users,
/// dynamic linker, Debian alternatives); nothing else of the host's `/etc`.
const ETC_ENTRIES: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/group",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/resolv.conf",
    "/etc/ssl",
];

/// Programs that may use the network under [`NetworkAccess::PackageManagers`].
const PACKAGE_MANAGERS: &[&str] = &["npm", "pnpm", "yarn", "bun", "npx"];

/// Find a working `bwrap` (looked up once per provider).
pub(crate) fn detect(config: &LocalSandboxConfig) -> JailSupport {
    if config.confinement == Confinement::Off {
        return JailSupport::Unavailable("confinement is turned off in the configuration".into());
    }
    let candidates: Vec<PathBuf> = match &config.bwrap_path {
        Some(p) => vec![p.clone()],
        None => ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    };
    let Some(bwrap) = candidates.into_iter().find(|p| is_executable(p)) else {
        return JailSupport::Unavailable(
            "bubblewrap (`bwrap`) is not installed; commands run unconfined".into(),
        );
    };
    // Probe: namespaces may be forbidden (a container without user namespaces).
    let probe = std::process::Command::new(&bwrap)
        .args(["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"])
        .arg("--")
        .arg(resolve_program("true", &system_path(), Path::new("/")).unwrap_or("true".into()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match probe {
        Ok(out) if out.status.success() => JailSupport::Bwrap(bwrap),
        Ok(out) => JailSupport::Unavailable(format!(
            "bubblewrap cannot create namespaces here ({}): commands run unconfined",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(err) => JailSupport::Unavailable(format!(
            "bubblewrap could not be started ({err}): commands run unconfined"
        )),
    }
}

fn system_path() -> OsString {
    OsString::from("/usr/local/bin:/usr/bin:/bin")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `program` as an absolute path: looked up on `path` (the command's `PATH`)
/// when it is a bare name, relative to `cwd` when it contains a slash.
/// Spawning an absolute path lets std use `posix_spawn`, and the jail needs
/// the path anyway.
pub(crate) fn resolve_program(program: &str, path: &OsString, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        let p = cwd.join(program);
        return is_executable(&p).then_some(p);
    }
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// The bwrap argv (after the `bwrap` program itself) running `program args`
/// with `cwd` inside `workspace`.
pub(crate) fn bwrap_args(
    config: &LocalSandboxConfig,
    workspace: &Path,
    cwd: &Path,
    program_name: &str,
    program: &Path,
    args: &[String],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(64 + args.len());
    let mut push = |s: &str| a.push(OsString::from(s));
    push("--unshare-all");
    let net = match config.network {
        NetworkAccess::None => false,
        NetworkAccess::PackageManagers => PACKAGE_MANAGERS.contains(&program_name),
        NetworkAccess::All => true,
    };
    if net {
        push("--share-net");
    }
    push("--die-with-parent");
    push("--new-session");
    for dir in SYSTEM_DIRS {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(dir) {
                    a.push("--symlink".into());
                    a.push(target.into_os_string());
                    a.push((*dir).into());
                }
            }
            Ok(m) if m.is_dir() => {
                a.push("--ro-bind".into());
                a.push((*dir).into());
                a.push((*dir).into());
            }
            _ => {}
        }
    }
    for entry in ETC_ENTRIES {
        a.push("--ro-bind-try".into());
        a.push((*entry).into());
        a.push((*entry).into());
    }
    for s in ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"] {
        a.push(s.into());
    }
    a.push("--bind".into());
    a.push(workspace.as_os_str().to_owned());
    a.push(workspace.as_os_str().to_owned());
    // A `HOME` the operator configured outside the workspace is shared by
    // every sandbox: the operator's choice, bound read-write.
    if let Some(home) = config.home.as_deref().filter(|h| h.is_dir()) {
        a.push("--bind".into());
        a.push(home.as_os_str().to_owned());
        a.push(home.as_os_str().to_owned());
    }
    a.push("--chdir".into());
    a.push(cwd.as_os_str().to_owned());
    a.push("--".into());
    a.push(program.as_os_str().to_owned());
    a.extend(args.iter().map(OsString::from));
    a
}
