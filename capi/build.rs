//! Gives the shared library the name it is installed under (`libgdasync.so.0`), so programs
//! linked against the installed library find it by that name.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdasync.so.0");
}
