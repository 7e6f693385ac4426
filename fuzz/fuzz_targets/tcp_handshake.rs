//! Fuzz target `tcp_handshake`: arbitrary bytes into `gdsync::fuzz::tcp_handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gdsync::fuzz::tcp_handshake(data));
