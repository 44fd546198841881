//! Paths of the example bundles and guest fixtures, built for `wasm32-wasip2` by this
//! crate's build script so that `cargo test` alone is enough.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));
