//! Pod validation on any pod that JSON can express.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeagent_fuzz::validate(data));
