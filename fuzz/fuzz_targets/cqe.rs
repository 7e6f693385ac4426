//! Fuzz target `cqe`: arbitrary bytes into `gdsync::fuzz::cqe`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::cqe(data));
