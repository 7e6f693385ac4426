//! Fuzz target `recv_wqe`: arbitrary bytes into `gdsync::fuzz::recv_wqe`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::recv_wqe(data));
