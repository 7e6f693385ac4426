//! Fuzz target `endpoint`: arbitrary bytes into `gdsync::fuzz::endpoint`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::endpoint(data));
