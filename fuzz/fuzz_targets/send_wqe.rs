//! Fuzz target `send_wqe`: arbitrary bytes into `gdsync::fuzz::send_wqe`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::send_wqe(data));
