//! Fuzz target `bootstrap_stream`: arbitrary bytes into `mp::fuzz::bootstrap_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mp::fuzz::bootstrap_stream(data));
