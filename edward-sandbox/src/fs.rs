//! Blocking file-system operations of a local sandbox, confined to its
//! workspace. Called from `spawn_blocking`.
//!
//! Confinement: a [`SandboxPath`] is already normalised (relative, no `..`), so
//! the only way out of the workspace is a symlink. Every directory component is
//! examined with `lstat`; a symlink is resolved with `canonicalize` and accepted
//! only if it lands inside the (canonical) workspace, and the walk continues
//! from the resolved directory, so the final operation happens on a path that
//! contains no symlinks. This is a check-then-act sequence: a process racing
//! against it inside the sandbox can still win, which is one reason the local
//! sandbox is not a security boundary.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use edward_core::{FileEntry, FileWrite, SandboxError, SandboxPath};

/// Prefix of in-flight temporary files; they are never listed.
pub(crate) const TMP_PREFIX: &str = ".edward-tmp-";

/// Distinguishes temp files of concurrent writes in one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A backend error from an I/O error, with context.
pub(crate) fn io_error(context: impl std::fmt::Display, err: &io::Error) -> SandboxError {
    let retryable = matches!(
        err.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    );
    SandboxError::Backend {
        message: format!("{context}: {err}"),
        retryable,
    }
}

fn invalid(path: &str, reason: impl Into<String>) -> SandboxError {
    SandboxError::InvalidPath {
        path: path.chars().take(256).collect(),
        reason: reason.into(),
    }
}

/// Whether the workspace directory still exists (else the sandbox is gone).
pub(crate) fn check_workspace(workspace: &Path, key: &str) -> Result<(), SandboxError> {
    match fs::symlink_metadata(workspace) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(SandboxError::Gone { key: key.into() }),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            Err(SandboxError::Gone { key: key.into() })
        }
        Err(err) => Err(io_error(format!("stat {}", workspace.display()), &err)),
    }
}

/// Resolve the directory named by `components` (relative to `workspace`) to a
/// symlink-free absolute path inside the workspace. With `create`, missing
/// directories are created; without, a missing one is `NotFound`.
pub(crate) fn resolve_dir(
    workspace: &Path,
    components: &[&str],
    shown: &str,
    create: bool,
) -> Result<PathBuf, SandboxError> {
    let mut dir = workspace.to_path_buf();
    for component in components {
        let next = dir.join(component);
        // Two attempts: a concurrent `mkdir` of the same directory is fine.
        let mut created = false;
        loop {
            match fs::symlink_metadata(&next) {
                Ok(meta) if meta.is_dir() => {
                    dir = next;
                    break;
                }
                Ok(meta) if meta.file_type().is_symlink() => {
                    dir = resolve_symlink(workspace, &next, shown)?;
                    if !dir.is_dir() {
                        return Err(invalid(shown, format!("`{component}` is not a directory")));
                    }
                    break;
                }
                Ok(_) => {
                    return Err(invalid(shown, format!("`{component}` is not a directory")));
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    if !create {
                        return Err(SandboxError::NotFound { path: shown.into() });
                    }
                    if created {
                        return Err(io_error(format!("create directory for {shown}"), &err));
                    }
                    match fs::create_dir(&next) {
                        Ok(()) => {}
                        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(err) => {
                            return Err(io_error(format!("create directory for {shown}"), &err));
                        }
                    }
                    created = true;
                }
                Err(err) => return Err(io_error(format!("stat {shown}"), &err)),
            }
        }
    }
    Ok(dir)
}

/// Resolve the symlink at `link`; refuse it if it leaves the workspace or dangles.
fn resolve_symlink(workspace: &Path, link: &Path, shown: &str) -> Result<PathBuf, SandboxError> {
    match fs::canonicalize(link) {
        Ok(target) if target.starts_with(workspace) => Ok(target),
        Ok(_) => Err(invalid(shown, "symlink resolves outside the workspace")),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            Err(invalid(shown, "dangling symlink"))
        }
        Err(err) => Err(io_error(format!("resolve symlink in {shown}"), &err)),
    }
}

/// Split a validated path into its parent components and file name.
fn split(path: &SandboxPath) -> (Vec<&str>, &str) {
    let mut parts: Vec<&str> = path.as_str().split('/').collect();
    // A SandboxPath names at least one segment.
    let name = parts.pop().unwrap_or_default();
    (parts, name)
}

/// Write each file whole (temp file + rename), in order.
pub(crate) fn write_files(
    workspace: &Path,
    key: &str,
    files: &[FileWrite],
    sync: bool,
) -> Result<(), SandboxError> {
    check_workspace(workspace, key)?;
    for file in files {
        write_one(workspace, file, sync)?;
    }
    Ok(())
}

fn write_one(workspace: &Path, file: &FileWrite, sync: bool) -> Result<(), SandboxError> {
    let shown = file.path.as_str();
    let (parents, name) = split(&file.path);
    let dir = resolve_dir(workspace, &parents, shown, true)?;
    let target = dir.join(name);

    // Keep the permissions of a file being replaced (an executable script stays
    // executable). A symlink at the target is replaced by the rename, never
    // written through.
    let mode = match fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_dir() => return Err(invalid(shown, "is a directory")),
        Ok(meta) if meta.is_file() => Some(meta.permissions()),
        Ok(_) => None,
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => return Err(io_error(format!("stat {shown}"), &err)),
    };

    let tmp = dir.join(format!(
        "{TMP_PREFIX}{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| -> io::Result<()> {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        out.write_all(&file.content)?;
        if let Some(perms) = mode {
            out.set_permissions(perms)?;
        }
        if sync {
            out.sync_all()?;
        }
        drop(out);
        fs::rename(&tmp, &target)?;
        if sync {
            File::open(&dir)?.sync_all()?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        // Best effort: the temp file may not exist if `open` failed.
        let _ = fs::remove_file(&tmp);
        return Err(io_error(format!("write {shown}"), &err));
    }
    Ok(())
}

/// Read one regular file; symlinks are followed only inside the workspace.
pub(crate) fn read_file(
    workspace: &Path,
    key: &str,
    path: &SandboxPath,
) -> Result<Vec<u8>, SandboxError> {
    check_workspace(workspace, key)?;
    let shown = path.as_str();
    let (parents, name) = split(path);
    let dir = resolve_dir(workspace, &parents, shown, false)?;
    let mut target = dir.join(name);
    match fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            target = resolve_symlink(workspace, &target, shown)?;
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(SandboxError::NotFound { path: shown.into() });
        }
        Err(err) => return Err(io_error(format!("stat {shown}"), &err)),
    }
    // `target` is symlink-free now; O_NOFOLLOW closes the race of it being
    // swapped for a symlink since.
    let mut input = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&target)
    {
        Ok(input) => input,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(SandboxError::NotFound { path: shown.into() });
        }
        Err(err) => return Err(io_error(format!("open {shown}"), &err)),
    };
    let meta = input
        .metadata()
        .map_err(|err| io_error(format!("stat {shown}"), &err))?;
    if !meta.is_file() {
        return Err(invalid(shown, "not a regular file"));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    input
        .read_to_end(&mut bytes)
        .map_err(|err| io_error(format!("read {shown}"), &err))?;
    Ok(bytes)
}

enum Kind {
    File(u64),
    Dir,
}

struct Entry {
    name: String,
    kind: Kind,
}

impl Entry {
    /// Sorting directories as `name/` makes a depth-first walk visit paths in
    /// exactly their byte order (`a-b` < `a/c` because `-` < `/`).
    fn sort_key(&self) -> std::borrow::Cow<'_, str> {
        match self.kind {
            Kind::File(_) => std::borrow::Cow::Borrowed(&self.name),
            Kind::Dir => std::borrow::Cow::Owned(format!("{}/", self.name)),
        }
    }
}

/// The regular files and directories of `dir`, sorted by walk order.
fn read_sorted(dir: &Path) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            tracing::warn!(dir = %dir.display(), "skipping a file name that is not UTF-8");
            continue;
        };
        // `DirEntry::file_type` does not follow symlinks.
        let file_type = entry.file_type()?;
        let kind = if file_type.is_dir() {
            Kind::Dir
        } else if file_type.is_file() {
            if name.starts_with(TMP_PREFIX) {
                continue;
            }
            match entry.metadata() {
                Ok(meta) => Kind::File(meta.len()),
                // Removed since read_dir: not there any more.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
        } else {
            continue;
        };
        entries.push(Entry { name, kind });
    }
    entries.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    Ok(entries)
}

/// All regular files, sorted by path, at most `cap`. Returns whether the cap cut
/// the listing short.
pub(crate) fn list_files(
    workspace: &Path,
    key: &str,
    cap: usize,
) -> Result<(Vec<FileEntry>, bool), SandboxError> {
    let top = match read_sorted(workspace) {
        Ok(top) => top,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(SandboxError::Gone { key: key.into() });
        }
        Err(err) => return Err(io_error("list workspace", &err)),
    };
    let mut files = Vec::new();
    let mut stack: Vec<(String, std::vec::IntoIter<Entry>)> =
        vec![(String::new(), top.into_iter())];
    while let Some((prefix, iter)) = stack.last_mut() {
        let Some(entry) = iter.next() else {
            stack.pop();
            continue;
        };
        let rel = if prefix.is_empty() {
            entry.name
        } else {
            format!("{prefix}/{}", entry.name)
        };
        match entry.kind {
            Kind::File(size) => {
                if files.len() >= cap {
                    return Ok((files, true));
                }
                files.push(FileEntry { path: rel, size });
            }
            Kind::Dir => match read_sorted(&workspace.join(&rel)) {
                Ok(children) => stack.push((rel, children.into_iter())),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    // An unreadable directory (made so by a command) should not
                    // hide every other file; say so instead.
                    tracing::warn!(dir = %rel, error = %err, "skipping unreadable directory");
                }
            },
        }
    }
    Ok((files, false))
}

/// Remove a workspace directory; missing is fine. A symlink in its place is
/// removed itself, never followed.
pub(crate) fn remove_workspace(path: &Path) -> Result<(), SandboxError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => match fs::remove_dir_all(path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(io_error(format!("remove {}", path.display()), &err)),
        },
        Ok(_) => fs::remove_file(path)
            .map_err(|err| io_error(format!("remove {}", path.display()), &err)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_error(format!("stat {}", path.display()), &err)),
    }
}
