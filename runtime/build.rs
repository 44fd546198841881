//! Links the debug build of the binary as a position-dependent executable.
//!
//! A debug `uncaged-workflow` carries ~285,000 relative relocations: as a PIE, every process
//! the tests start (hundreds a run) has the dynamic loader write them, touching ~1,000 pages
//! copy-on-write before `main`. Linked at a fixed address they are resolved by the linker
//! instead. Release builds stay PIE, for address-space randomisation.

fn main() {
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if linux && std::env::var("PROFILE").as_deref() == Ok("debug") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
