//! Manifest decoding, static-pod defaults and validation on arbitrary bytes (YAML or JSON, Pod or PodList).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeagent_fuzz::manifest(data));
