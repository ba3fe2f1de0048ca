//! The body of `<edward_install>` (PROTOCOL.md §5).

/// At most this many packages are installed from one block; the rest are
/// reported in an `invalid_dependency` error.
pub const MAX_DEPENDENCIES: usize = 50;
/// Longest accepted package name (scope included), in bytes, as npm requires.
pub const MAX_NAME_LEN: usize = 214;
/// Longest accepted version range after `@`, in bytes.
pub const MAX_RANGE_LEN: usize = 256;

/// What an install body asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallBody {
    /// Valid package specs, de-duplicated by package name (first wins), at most
    /// [`MAX_DEPENDENCIES`].
    pub dependencies: Vec<String>,
    /// The last `framework:` value, trimmed and lower-cased (`None` when absent or empty).
    pub framework: Option<String>,
    /// Items that are not valid npm specs, as written (after trimming and bullet removal).
    pub invalid: Vec<String>,
    /// Valid, distinct packages beyond the first [`MAX_DEPENDENCIES`].
    pub over_limit: Vec<String>,
}

/// Parse an install body.
///
/// Line oriented (`\n` or `\r\n`); each line is trimmed; blank lines are
/// ignored; a leading `- ` or `* ` bullet is removed. `framework: X` sets the
/// framework (key case-insensitive; the last one wins). `packages: a, b` adds
/// comma-separated packages; `packages:` alone is a list header (the lines
/// after it are packages, as any other line is). Any other non-empty line is
/// one package spec, checked by [`is_valid_spec`].
///
/// ```
/// use edward_parser::install::parse_install_body;
/// let body = parse_install_body("framework: React\n- react@18\npackages: zod, Bad Name\nreact\n");
/// assert_eq!(body.framework.as_deref(), Some("react"));
/// assert_eq!(body.dependencies, ["react@18", "zod"]);
/// assert_eq!(body.invalid, ["Bad Name"]);
/// ```
pub fn parse_install_body(body: &str) -> InstallBody {
    let mut out = InstallBody::default();
    let mut seen_names: Vec<String> = Vec::new();
    let mut add = |item: &str, out: &mut InstallBody| {
        let item = item.trim();
        if item.is_empty() {
            return;
        }
        if !is_valid_spec(item) {
            out.invalid.push(item.to_string());
            return;
        }
        let name = spec_name(item);
        if seen_names.iter().any(|n| n == name) {
            return;
        }
        seen_names.push(name.to_string());
        if out.dependencies.len() < MAX_DEPENDENCIES {
            out.dependencies.push(item.to_string());
        } else {
            out.over_limit.push(item.to_string());
        }
    };
    for line in body.split('\n') {
        let mut line = line.trim();
        if let Some(rest) = line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")) {
            line = rest.trim();
        }
        if line.is_empty() {
            continue;
        }
        if let Some(value) = key_value(line, "framework") {
            let value = value.trim().to_lowercase();
            out.framework = if value.is_empty() { None } else { Some(value) };
        } else if let Some(value) = key_value(line, "packages") {
            for item in value.split(',') {
                add(item, &mut out);
            }
        } else {
            add(line, &mut out);
        }
    }
    out
}

/// `key: value` with the key matched case-insensitively (spaces allowed before the colon).
fn key_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let head = line.get(..key.len())?;
    if !head.eq_ignore_ascii_case(key) {
        return None;
    }
    let rest = line.get(key.len()..)?.trim_start();
    rest.strip_prefix(':')
}

/// The package name of a (valid) spec: `@scope/name@1` → `@scope/name`.
fn spec_name(spec: &str) -> &str {
    let search_from = usize::from(spec.starts_with('@'));
    match spec
        .get(search_from..)
        .and_then(|s| s.find('@'))
        .map(|i| i + search_from)
    {
        Some(at) => spec.get(..at).unwrap_or(spec),
        None => spec,
    }
}

/// Whether `spec` is an npm package spec the parser accepts: a name
/// (`name` or `@scope/name`) optionally followed by `@` and a version range.
///
/// Names follow npm's rules for new packages: at most 214 bytes, lower case,
/// only `a-z 0-9 - . _` in the scope and the name, the name not starting with
/// `.` or `_`, not `node_modules` or `favicon.ico`; additionally nothing may
/// start with `-` (it would read as a command-line option). A range is
/// 1–256 bytes of ASCII letters, digits, spaces and `. ^ ~ < > = | * + - _`,
/// not starting or ending with a space (`18`, `^20.1`, `latest`, `>=1 <2`).
///
/// ```
/// use edward_parser::install::is_valid_spec;
/// assert!(is_valid_spec("@types/node@^20.1"));
/// assert!(!is_valid_spec("React"));
/// assert!(!is_valid_spec("rm -rf /"));
/// ```
pub fn is_valid_spec(spec: &str) -> bool {
    let name = spec_name(spec);
    let range = spec.get(name.len()..).unwrap_or("");
    if !is_valid_name(name) {
        return false;
    }
    match range.strip_prefix('@') {
        None => range.is_empty(),
        Some(r) => is_valid_range(r),
    }
}

fn is_valid_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return false;
    }
    let (scope, bare) = match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, bare)) => (Some(scope), bare),
            None => return false,
        },
        None => (None, name),
    };
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('-')
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
            })
    };
    if let Some(scope) = scope {
        if !part_ok(scope) {
            return false;
        }
    }
    part_ok(bare)
        && !bare.starts_with(['.', '_'])
        && !(scope.is_none() && matches!(bare, "node_modules" | "favicon.ico"))
}

fn is_valid_range(range: &str) -> bool {
    !range.is_empty()
        && range.len() <= MAX_RANGE_LEN
        && !range.starts_with(' ')
        && !range.ends_with(' ')
        && range.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b' ' | b'.'
                        | b'^'
                        | b'~'
                        | b'<'
                        | b'>'
                        | b'='
                        | b'|'
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'_'
                )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        for ok in [
            "react",
            "react@18",
            "react-dom@^18.2.0",
            "@types/node",
            "@types/node@^20.1",
            "lodash.debounce",
            "zod@latest",
            "next@14.x",
            "a@>=1 <2",
            "vue@3.0.0-beta.1",
            "x@1 || 2",
        ] {
            assert!(is_valid_spec(ok), "{ok}");
        }
        for bad in [
            "",
            "React",
            "@types",
            "@/x",
            "@Types/node",
            ".hidden",
            "_private",
            "-rf",
            "node_modules",
            "favicon.ico",
            "a b",
            "react@",
            "react@ 18",
            "react@18;rm",
            "react@$(x)",
            "x~y",
            "a/b",
            "ünicode",
            "react@18@19",
            "@scope/name/extra",
        ] {
            assert!(!is_valid_spec(bad), "{bad:?}");
        }
        assert!(is_valid_spec(&"a".repeat(214)));
        assert!(!is_valid_spec(&"a".repeat(215)));
        assert!(!is_valid_spec(&format!("a@{}", "1".repeat(257))));
    }

    #[test]
    fn body_lines_bullets_keys() {
        let b = parse_install_body(
            "\n  framework: Vite  \r\n* react\r\n- @types/node@^20\npackages:\n  zod\n\nPackages: a, b ,, c@1\n",
        );
        assert_eq!(b.framework.as_deref(), Some("vite"));
        assert_eq!(
            b.dependencies,
            ["react", "@types/node@^20", "zod", "a", "b", "c@1"]
        );
        assert!(b.invalid.is_empty());
        assert!(b.over_limit.is_empty());
    }

    #[test]
    fn framework_last_wins_and_empty_clears() {
        assert_eq!(
            parse_install_body("framework: a\nFRAMEWORK : B")
                .framework
                .as_deref(),
            Some("b")
        );
        assert_eq!(
            parse_install_body("framework: a\nframework:").framework,
            None
        );
    }

    #[test]
    fn duplicates_by_name_first_wins() {
        let b = parse_install_body("react@18\nreact\nreact@19\n@a/b\n@a/b@2");
        assert_eq!(b.dependencies, ["react@18", "@a/b"]);
    }

    #[test]
    fn invalid_items_are_reported_as_written() {
        let b = parse_install_body("- Bad One\nok\nnpm install x\n");
        assert_eq!(b.dependencies, ["ok"]);
        assert_eq!(b.invalid, ["Bad One", "npm install x"]);
    }

    #[test]
    fn more_than_fifty() {
        let body: String = (0..55).map(|i| format!("p{i}\n")).collect();
        let b = parse_install_body(&body);
        assert_eq!(b.dependencies.len(), 50);
        assert_eq!(b.dependencies.last().map(String::as_str), Some("p49"));
        assert_eq!(b.over_limit, ["p50", "p51", "p52", "p53", "p54"]);
        // duplicates do not count towards the limit
        let body: String = (0..50).map(|i| format!("p{i}\np{i}@1\n")).collect();
        let b = parse_install_body(&body);
        assert_eq!(b.dependencies.len(), 50);
        assert!(b.over_limit.is_empty());
    }

    #[test]
    fn bullet_needs_a_space() {
        let b = parse_install_body("-react\n*react");
        assert_eq!(b.invalid, ["-react", "*react"]);
    }
}
