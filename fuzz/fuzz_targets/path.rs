//! Path normalisation: no panic; accepted paths are clean, relative and
//! idempotent.
#![no_main]

use edward_parser::normalize_path;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    if let Ok(p) = normalize_path(&input) {
        assert!(!p.is_empty());
        assert!(!p.starts_with('/'));
        assert!(!p.contains('\\'));
        assert!(!p.contains("//"));
        assert!(p.len() <= 4096);
        assert!(!p.chars().any(char::is_control));
        for seg in p.split('/') {
            assert!(!seg.is_empty() && seg != "." && seg != "..");
            assert!(seg.len() <= 255);
        }
        assert_eq!(normalize_path(&p).as_deref(), Ok(p.as_str()));
    }
});
