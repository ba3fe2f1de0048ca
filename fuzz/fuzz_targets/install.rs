//! Install bodies: no panic; every dependency is a valid spec, names are
//! unique, the limit holds, and every valid spec is checked consistently.
#![no_main]

use edward_parser::install::{MAX_DEPENDENCIES, is_valid_spec, parse_install_body};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let body = parse_install_body(&input);
    assert!(body.dependencies.len() <= MAX_DEPENDENCIES);
    assert!(body.over_limit.is_empty() || body.dependencies.len() == MAX_DEPENDENCIES);
    for d in body.dependencies.iter().chain(&body.over_limit) {
        assert!(is_valid_spec(d), "{d:?}");
        assert!(!d.starts_with('-'));
        assert!(!d.chars().any(char::is_whitespace) || d.contains('@'));
    }
    for i in &body.invalid {
        assert!(!is_valid_spec(i));
    }
    if let Some(f) = &body.framework {
        assert_eq!(f, &f.to_lowercase());
        assert!(!f.is_empty());
    }
    // de-duplicated: the same list parsed again is unchanged
    let again = parse_install_body(&body.dependencies.join("\n"));
    assert_eq!(again.dependencies, body.dependencies);
});
