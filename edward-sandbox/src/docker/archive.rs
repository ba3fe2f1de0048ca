//! Tar archives to and from a container: the staging archive of a write
//! batch (built without copying file contents), and reading a downloaded
//! archive (one file, or a listing) with caps.

use std::collections::HashMap;
use std::io::Read;

use bytes::Bytes;
use edward_core::{FileEntry, SandboxError};

use crate::docker::error::fatal;

/// The directory Edward keeps inside every workspace (staging area and the
/// last-use marker). Hidden from listings; writes to it are refused.
pub(crate) const PRIVATE_DIR: &str = ".edward";

/// Mode of every uploaded file: regular, `rw-r--r--`, whatever was asked.
const FILE_MODE: u32 = 0o644;

/// Uid and gid from a `uid:gid` user spec (1000:1000 when not numeric).
pub(crate) fn owner_ids(user: &str) -> (u64, u64) {
    let mut parts = user.splitn(2, ':');
    let uid = parts.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let gid = parts.next().and_then(|s| s.parse().ok()).unwrap_or(uid);
    (uid, gid)
}

fn header(
    path: &str,
    kind: tar::EntryType,
    mode: u32,
    size: u64,
    owner: (u64, u64),
    mtime: u64,
) -> Result<[u8; 512], SandboxError> {
    let mut header = tar::Header::new_ustar();
    header
        .set_path(path)
        .map_err(|err| fatal(format!("tar header for {path}: {err}")))?;
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(owner.0);
    header.set_gid(owner.1);
    header.set_mtime(mtime);
    header.set_cksum();
    let mut block = [0u8; 512];
    block.copy_from_slice(header.as_bytes());
    Ok(block)
}

/// The chunks of a tar archive (to be extracted at the workspace root) that
/// holds `.edward/` and `.edward/<stage>/` directories and the contents as
/// regular files named `0`, `1`, … inside the stage directory, all owned by
/// `owner`. File contents are shared, not copied. Entry names are built here
/// from an index, never from a requested path, so no name in the archive
/// can point anywhere else (no tar-slip by construction); the final paths
/// travel separately, as arguments of the rename step.
pub(crate) fn staging_archive(
    stage: &str,
    contents: &[Bytes],
    owner: (u64, u64),
) -> Result<Vec<Bytes>, SandboxError> {
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut chunks = Vec::with_capacity(contents.len() * 3 + 3);
    let dir = |path: &str| header(path, tar::EntryType::Directory, 0o755, 0, owner, mtime);
    chunks.push(Bytes::copy_from_slice(&dir(&format!("{PRIVATE_DIR}/"))?));
    chunks.push(Bytes::copy_from_slice(&dir(&format!(
        "{PRIVATE_DIR}/{stage}/"
    ))?));
    for (index, content) in contents.iter().enumerate() {
        let name = format!("{PRIVATE_DIR}/{stage}/{index}");
        let size = content.len() as u64;
        chunks.push(Bytes::copy_from_slice(&header(
            &name,
            tar::EntryType::Regular,
            FILE_MODE,
            size,
            owner,
            mtime,
        )?));
        if !content.is_empty() {
            chunks.push(content.clone());
        }
        let padding = (512 - content.len() % 512) % 512;
        if padding > 0 {
            chunks.push(Bytes::from(vec![0u8; padding]));
        }
    }
    // End of archive: two zero blocks.
    chunks.push(Bytes::from(vec![0u8; 1024]));
    Ok(chunks)
}

fn read_error(what: &str, err: &std::io::Error) -> SandboxError {
    // A broken download stream (daemon gone) is worth retrying; a malformed
    // archive is not, but both surface as I/O errors from the tar reader.
    SandboxError::Backend {
        message: format!("docker: reading the archive of {what}: {err}"),
        retryable: true,
    }
}

/// The content of the single regular file in the archive `reader` (the
/// answer to downloading one path). Refuses anything else (a directory, a
/// symlink, a device) with `InvalidPath`, and files over `cap` bytes.
pub(crate) fn read_single_file(
    reader: impl Read,
    shown: &str,
    cap: u64,
) -> Result<Vec<u8>, SandboxError> {
    let mut archive = tar::Archive::new(reader);
    let mut entries = archive.entries().map_err(|err| read_error(shown, &err))?;
    let Some(entry) = entries.next() else {
        return Err(SandboxError::NotFound { path: shown.into() });
    };
    let mut entry = entry.map_err(|err| read_error(shown, &err))?;
    match entry.header().entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => {}
        tar::EntryType::Directory => {
            return Err(SandboxError::InvalidPath {
                path: shown.into(),
                reason: "is a directory".into(),
            });
        }
        other => {
            return Err(SandboxError::InvalidPath {
                path: shown.into(),
                reason: format!("not a regular file ({other:?})"),
            });
        }
    }
    let size = entry.size();
    if size > cap {
        return Err(fatal(format!(
            "{shown} is {size} bytes, more than the read cap of {cap}"
        )));
    }
    let mut content = Vec::with_capacity(size as usize);
    entry
        .by_ref()
        .take(cap + 1)
        .read_to_end(&mut content)
        .map_err(|err| read_error(shown, &err))?;
    Ok(content)
}

/// Every regular file in the archive of the workspace directory (entry
/// names start with `root/`), relative to it, sorted by path bytes, at most
/// `cap` of them (the first `cap` in that order). Symlinks, directories and
/// devices are skipped, and so is Edward's private directory; hard links
/// count as the regular files they are. Returns whether the cap cut it.
pub(crate) fn list_archive(
    reader: impl Read,
    root: &str,
    cap: usize,
) -> Result<(Vec<FileEntry>, bool), SandboxError> {
    let prefix = format!("{root}/");
    let private = format!("{PRIVATE_DIR}/");
    let mut archive = tar::Archive::new(reader);
    let mut sizes: HashMap<String, u64> = HashMap::new();
    let mut files: Vec<FileEntry> = Vec::new();
    for entry in archive
        .entries()
        .map_err(|err| read_error("the workspace", &err))?
    {
        let entry = entry.map_err(|err| read_error("the workspace", &err))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(relative) = name.strip_prefix(&prefix) else {
            continue;
        };
        let relative = relative.trim_end_matches('/');
        if relative.is_empty() || relative == PRIVATE_DIR || relative.starts_with(&private) {
            continue;
        }
        let size = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => entry.size(),
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                match sizes.get(target.trim_start_matches('/')) {
                    Some(size) => *size,
                    None => continue,
                }
            }
            _ => continue,
        };
        sizes.insert(name.clone(), size);
        files.push(FileEntry {
            path: relative.to_owned(),
            size,
        });
    }
    files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    files.dedup_by(|a, b| a.path == b.path);
    let capped = files.len() > cap;
    files.truncate(cap);
    Ok((files, capped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn concat(chunks: &[Bytes]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }

    #[test]
    fn staging_archive_holds_indexed_regular_files_owned_by_the_user() {
        let contents = vec![
            Bytes::from_static(b"hello"),
            Bytes::new(),
            Bytes::from(vec![7u8; 1500]),
        ];
        let chunks = staging_archive("stage-x", &contents, (1000, 1001)).expect("archive");
        let bytes = concat(&chunks);
        assert_eq!(bytes.len() % 512, 0);
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let header = entry.header().clone();
            assert_eq!(header.uid().expect("uid"), 1000);
            assert_eq!(header.gid().expect("gid"), 1001);
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let mut body = Vec::new();
            entry.read_to_end(&mut body).expect("body");
            seen.push((
                name,
                header.entry_type(),
                header.mode().expect("mode"),
                body,
            ));
        }
        assert_eq!(seen.len(), 5);
        assert_eq!(seen[0].0, ".edward/");
        assert_eq!(seen[1].0, ".edward/stage-x/");
        assert_eq!(seen[2].0, ".edward/stage-x/0");
        assert_eq!(seen[2].1, tar::EntryType::Regular);
        assert_eq!(seen[2].2, 0o644);
        assert_eq!(seen[2].3, b"hello");
        assert_eq!(seen[3].3, b"");
        assert_eq!(seen[4].3, vec![7u8; 1500]);
    }

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, body, link) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            if let Some(link) = link {
                header.set_link_name(link).expect("link");
            }
            builder
                .append_data(&mut header, name, *body)
                .expect("append");
        }
        builder.into_inner().expect("finish")
    }

    #[test]
    fn listing_keeps_regular_files_sorted_and_hides_the_private_dir() {
        use tar::EntryType::*;
        let bytes = tar_of(&[
            ("workspace/", Directory, b"", None),
            ("workspace/z.txt", Regular, b"zz", None),
            ("workspace/a/", Directory, b"", None),
            ("workspace/a/c.txt", Regular, b"ccc", None),
            ("workspace/link", Symlink, b"", Some("/etc/passwd")),
            ("workspace/hard", Link, b"", Some("workspace/z.txt")),
            ("workspace/.edward/last-use", Regular, b"", None),
            ("workspace/a-b.txt", Regular, b"", None),
        ]);
        let (files, capped) = list_archive(&bytes[..], "workspace", 100).expect("list");
        assert!(!capped);
        let got: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        assert_eq!(
            got,
            vec![("a-b.txt", 0), ("a/c.txt", 3), ("hard", 2), ("z.txt", 2)]
        );
        let (files, capped) = list_archive(&bytes[..], "workspace", 2).expect("list");
        assert!(capped);
        assert_eq!(files.len(), 2);
        assert_eq!(files[1].path, "a/c.txt");
    }

    #[test]
    fn single_file_read_refuses_non_regular_entries_and_the_cap() {
        use tar::EntryType::*;
        let file = tar_of(&[("f.txt", Regular, b"content", None)]);
        assert_eq!(
            read_single_file(&file[..], "f.txt", 100).expect("read"),
            b"content"
        );
        assert!(matches!(
            read_single_file(&file[..], "f.txt", 3),
            Err(SandboxError::Backend {
                retryable: false,
                ..
            })
        ));
        let link = tar_of(&[("l", Symlink, b"", Some("/etc/passwd"))]);
        assert!(matches!(
            read_single_file(&link[..], "l", 100),
            Err(SandboxError::InvalidPath { .. })
        ));
        let dir = tar_of(&[("d/", Directory, b"", None)]);
        assert!(matches!(
            read_single_file(&dir[..], "d", 100),
            Err(SandboxError::InvalidPath { .. })
        ));
    }
}
