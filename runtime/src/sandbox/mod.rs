//! Everything wasmtime: the engine and its AOT cache, the host-side bindgen of each version of
//! the WIT contract, a bundle instance of either version, its generator as the host drives it
//! (each step held to the contract, a trap read as what caused it), a thread's store (WASI
//! that grants nothing, limits, CPU accounting), the host side of the WIT imports, and the
//! live state a running thread shares with its controllers.
//!
//! What a guest may do is decided here and nowhere else: it may call the imports in
//! [`host`](self) (`agents`, `extract`, `log`, `now`) and the bare minimum of WASI p2.

mod agent_calls;
pub mod baseline;
pub mod bindings;
pub(crate) mod call_digests;
pub mod calls_out;
pub mod children;
pub mod control;
pub mod engine;
mod function_cache;
pub mod generator;
mod host;
pub mod instance;
mod output;
mod recorded_answers;
pub mod shared_budget;
pub mod state;
mod turns;
