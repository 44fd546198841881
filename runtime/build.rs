//! Links the binary so that its start costs little: the dynamic loader's relocations are most
//! of what a bare start of a large PIE costs.
//!
//! A debug `uncaged-workflow` carries ~285,000 relative relocations: as a PIE, every process
//! the tests start (hundreds a run) has the dynamic loader write them, touching ~1,000 pages
//! copy-on-write before `main`. Linked at a fixed address they are resolved by the linker
//! instead.
//!
//! Release builds stay PIE, for address-space randomisation, with their ~133,000 relative
//! relocations packed (`DT_RELR`, glibc 2.36+): the table shrinks from ~3 MiB, which the loader
//! faulted in page by page at every start (half of `uncaged-workflow --version`'s 5 ms, and a
//! `run` starts two processes), to a few KiB. Where the C library is older, or unknown (a cross
//! build), the table stays as it was: a binary asking for `DT_RELR` would not start there.

use std::process::Command;

fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let linux = var("CARGO_CFG_TARGET_OS") == "linux";
    if linux && var("PROFILE") == "debug" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    } else if linux && var("CARGO_CFG_TARGET_ENV") == "gnu" && var("HOST") == var("TARGET") {
        if glibc_at_least(2, 36) {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// Whether this machine's C library (the one the binary is built against and for) is glibc
/// `major.minor` or later, as `getconf GNU_LIBC_VERSION` says ("glibc 2.36").
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else { return false };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (have_major, have_minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (have_major, have_minor) >= (major, minor)
}
