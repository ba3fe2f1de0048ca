//! File path normalisation (PROTOCOL.md §4).

use std::fmt;

/// Longest accepted path, in bytes (both as written and normalised).
pub const MAX_PATH_LEN: usize = 4096;
/// Longest accepted path segment, in bytes.
pub const MAX_SEGMENT_LEN: usize = 255;

/// Why a file path was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathError {
    /// Nothing is left after normalisation (`""`, `"."`, `"a/.."`), or the
    /// `path` attribute is missing.
    Empty,
    /// The path starts with `/` or `\`.
    Absolute,
    /// The path starts with a drive or URL scheme (`C:`, `c:\`, `file:`).
    Prefix {
        /// The prefix, up to and including the `:`.
        prefix: String,
    },
    /// A `..` segment climbs above the root.
    EscapesRoot,
    /// The path contains a control character or NUL.
    ControlCharacter {
        /// The offending character.
        ch: char,
    },
    /// A segment is longer than [`MAX_SEGMENT_LEN`] bytes.
    SegmentTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The path is longer than [`MAX_PATH_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::Empty => f.write_str("the path is empty"),
            PathError::Absolute => f.write_str("the path is absolute"),
            PathError::Prefix { prefix } => {
                write!(
                    f,
                    "the path starts with a drive or scheme prefix ({prefix:?})"
                )
            }
            PathError::EscapesRoot => f.write_str("the path escapes the root with `..`"),
            PathError::ControlCharacter { ch } => {
                write!(f, "the path contains a control character ({ch:?})")
            }
            PathError::SegmentTooLong { len } => write!(
                f,
                "a path segment is {len} bytes long (at most {MAX_SEGMENT_LEN})"
            ),
            PathError::TooLong { len } => {
                write!(f, "the path is {len} bytes long (at most {MAX_PATH_LEN})")
            }
        }
    }
}

impl std::error::Error for PathError {}

/// Normalise a file path from a `<file path="…">` tag, or say why it is rejected.
///
/// `\` becomes `/`; empty and `.` segments are removed (so repeated slashes
/// and a leading `./` disappear); `a/../b` collapses to `b`. Rejected: empty
/// results, absolute paths, a leading drive or URL scheme (`C:`, `c:\`,
/// `file:`: a first segment that starts with a letter, continues with letters,
/// digits, `+`, `-` or `.`, and then has `:`), a `..` above the root, control
/// characters (including NUL), a segment over 255 bytes, or a path over 4096
/// bytes. Nothing else is changed: no trimming, no case folding.
///
/// ```
/// use edward_parser::path::{normalize_path, PathError};
/// assert_eq!(normalize_path(r".\src\\lib/../App.tsx").unwrap(), "src/App.tsx");
/// assert_eq!(normalize_path("../etc/passwd"), Err(PathError::EscapesRoot));
/// assert_eq!(normalize_path("/etc/passwd"), Err(PathError::Absolute));
/// ```
pub fn normalize_path(path: &str) -> Result<String, PathError> {
    if path.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong { len: path.len() });
    }
    if let Some(ch) = path.chars().find(|c| c.is_control()) {
        return Err(PathError::ControlCharacter { ch });
    }
    if path.starts_with(['/', '\\']) {
        return Err(PathError::Absolute);
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::EscapesRoot);
                }
            }
            s if s.len() > MAX_SEGMENT_LEN => {
                return Err(PathError::SegmentTooLong { len: s.len() });
            }
            s => segments.push(s),
        }
    }
    let Some(first) = segments.first() else {
        return Err(PathError::Empty);
    };
    // Checked on the normalised path, so `./C:/x` and `a/../file:x` are
    // caught too (found by the `path` fuzz target).
    if let Some(prefix) = scheme_prefix(first) {
        return Err(PathError::Prefix {
            prefix: prefix.to_string(),
        });
    }
    let normalized = segments.join("/");
    if normalized.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong {
            len: normalized.len(),
        });
    }
    Ok(normalized)
}

/// `C:` / `file:` / `http:` at the start of a (first) segment.
fn scheme_prefix(first: &str) -> Option<&str> {
    let colon = first.find(':')?;
    let scheme = first.get(..colon)?;
    let mut bytes = scheme.bytes();
    let starts_with_letter = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if starts_with_letter && rest_ok {
        first.get(..=colon)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises() {
        let ok = |p: &str| normalize_path(p).unwrap();
        assert_eq!(ok("src/App.tsx"), "src/App.tsx");
        assert_eq!(ok("./src/App.tsx"), "src/App.tsx");
        assert_eq!(ok("src//a///b.ts"), "src/a/b.ts");
        assert_eq!(ok("src\\components\\B.tsx"), "src/components/B.tsx");
        assert_eq!(ok("a/./b/../c"), "a/c");
        assert_eq!(ok("a/b/../../c"), "c");
        assert_eq!(ok("dir/"), "dir");
        assert_eq!(ok(" spaced .ts"), " spaced .ts");
        assert_eq!(ok("ünï/cødé.rs"), "ünï/cødé.rs");
        assert_eq!(ok("src/a:b.ts"), "src/a:b.ts");
        assert_eq!(ok("1:2/x"), "1:2/x");
        assert_eq!(ok("..a/b.."), "..a/b..");
    }

    #[test]
    fn rejects() {
        let err = |p: &str| normalize_path(p).unwrap_err();
        assert_eq!(err(""), PathError::Empty);
        assert_eq!(err("."), PathError::Empty);
        assert_eq!(err("./"), PathError::Empty);
        assert_eq!(err("a/.."), PathError::Empty);
        assert_eq!(err("/etc/passwd"), PathError::Absolute);
        assert_eq!(err("\\server\\x"), PathError::Absolute);
        assert_eq!(
            err("C:"),
            PathError::Prefix {
                prefix: "C:".into()
            }
        );
        assert_eq!(
            err("c:\\windows"),
            PathError::Prefix {
                prefix: "c:".into()
            }
        );
        assert_eq!(
            err("file:///etc/passwd"),
            PathError::Prefix {
                prefix: "file:".into()
            }
        );
        // the prefix check applies to the normalised path (fuzz finding)
        assert_eq!(
            err("./s:\\\\a/..src\\a"),
            PathError::Prefix {
                prefix: "s:".into()
            }
        );
        assert_eq!(
            err("./C:/Windows/x"),
            PathError::Prefix {
                prefix: "C:".into()
            }
        );
        assert_eq!(
            err("a/../file:x"),
            PathError::Prefix {
                prefix: "file:".into()
            }
        );
        assert_eq!(err(".."), PathError::EscapesRoot);
        assert_eq!(err("a/../../b"), PathError::EscapesRoot);
        assert_eq!(err("a\0b"), PathError::ControlCharacter { ch: '\0' });
        assert_eq!(err("a\nb"), PathError::ControlCharacter { ch: '\n' });
        assert_eq!(err("a\u{7f}"), PathError::ControlCharacter { ch: '\u{7f}' });
        assert_eq!(
            err(&"x".repeat(256)),
            PathError::SegmentTooLong { len: 256 }
        );
        assert!(normalize_path(&"x".repeat(255)).is_ok());
        let long = vec!["abcdefg"; 600].join("/");
        assert_eq!(err(&long), PathError::TooLong { len: long.len() });
    }

    #[test]
    fn messages_name_the_problem() {
        assert!(
            PathError::TooLong { len: 5000 }
                .to_string()
                .contains("5000")
        );
        assert!(
            PathError::Prefix {
                prefix: "C:".into()
            }
            .to_string()
            .contains("C:")
        );
    }
}
