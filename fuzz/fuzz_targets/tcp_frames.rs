//! Fuzz target `tcp_frames`: arbitrary bytes into `gdsync::fuzz::tcp_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::tcp_frames(data));
