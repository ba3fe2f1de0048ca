//! Attribute parsing and entity decoding: no panic; `end` is a char boundary
//! just past a `>`; parsing the prefix up to `end` gives the same result.
#![no_main]

use edward_parser::attr::{decode_entities, parse_attributes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let attrs = parse_attributes(&input);
    if let Some(end) = attrs.end() {
        assert!(input.is_char_boundary(end));
        assert_eq!(input.as_bytes().get(end - 1), Some(&b'>'));
        assert_eq!(parse_attributes(&input[..end]), attrs);
    }
    for (name, value) in attrs.iter() {
        assert!(!name.is_empty());
        assert_eq!(attrs.get(name).is_some(), true);
        let _ = value;
    }
    let decoded = decode_entities(&input);
    assert!(decoded.len() <= input.len() + 3 * input.matches('&').count());
    // no entity survives a decode of something without `&`
    if !input.contains('&') {
        assert_eq!(decoded, input);
    }
});
