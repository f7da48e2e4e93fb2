//! Any text as a layout spec (what the Python package sends once its pools are registered):
//! parsing returns a spec or a typed error, never panics; an accepted spec passes its own
//! checks, reads back from its JSON unchanged and keeps its fingerprint.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_store::layout::page::LayoutSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = LayoutSpec::from_json(text) else {
        return;
    };
    assert!(spec.check().is_ok());
    let back = LayoutSpec::from_json(&spec.to_json()).expect("an accepted spec reads back");
    assert_eq!(back, spec);
    assert_eq!(back.fingerprint(), spec.fingerprint());
    assert!(!spec.fingerprint().is_none());
});
