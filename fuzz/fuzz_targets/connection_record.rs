//! Fuzz target `connection_record`: arbitrary bytes into `mp::fuzz::connection_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mp::fuzz::connection_record(data));
