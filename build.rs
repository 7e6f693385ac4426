//! Build-time generation only. The default build needs nothing but cargo; later steps (the
//! CUDA device header, regenerated FFI) hang off features here.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
