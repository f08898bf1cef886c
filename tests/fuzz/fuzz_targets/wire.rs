//! Every kubelet.v1 message decoder, and the pod and node JSON carried inside them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeagent_fuzz::wire(data));
