//! Sandbox path validation: exactly the parser's rules (PROTOCOL.md §4), so a
//! path the parser accepted is accepted here and vice versa — one rule, one place.

/// Normalise `raw` into a relative path or say why it is rejected.
pub(crate) fn normalize(raw: &str) -> Result<String, String> {
    edward_parser::normalize_path(raw).map_err(|e| e.to_string())
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
