//! Sandbox path validation (PROTOCOL.md §4). Kept identical to the parser's
//! rules so a path the parser accepted is accepted here and vice versa.

/// Normalise `raw` into a relative path or say why it is rejected.
pub(crate) fn normalize(raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err("empty path".into());
    }
    if raw.len() > 4096 {
        return Err("path longer than 4096 bytes".into());
    }
    if raw.chars().any(|c| c.is_control()) {
        return Err("control character in path".into());
    }
    let unified = raw.replace('\\', "/");
    if unified.starts_with('/') {
        return Err("absolute path".into());
    }
    if let Some(colon) = unified.find(':') {
        if !unified[..colon].contains('/') {
            return Err("drive or scheme prefix".into());
        }
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in unified.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err("`..` escapes the root".into());
                }
            }
            s if s.len() > 255 => return Err("segment longer than 255 bytes".into()),
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return Err("path names no file".into());
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn accepts_and_normalises() {
        assert_eq!(normalize("./src//a/../App.tsx").unwrap(), "src/App.tsx");
        assert_eq!(normalize("a\\b.ts").unwrap(), "a/b.ts");
    }

    #[test]
    fn rejects_escapes_and_prefixes() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "C:x",
            "c:\\x",
            "file:x",
            "a\0b",
            ".",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?} accepted");
        }
    }
}
