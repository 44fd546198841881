//! uncaged-workflow: runs multi-role AI agent workflows, each one a sandboxed WebAssembly
//! component, and keeps every thread's steps on disk.
//!
//! The binary `uncaged-workflow` is a thin layer over this library: [`catalog`] adds and finds
//! bundles, [`runner`] runs threads in the [`sandbox`], and [`thread_log`] keeps their
//! records.

pub mod agent;
pub mod bindings;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod descriptor;
pub mod durable;
pub mod engine;
pub mod error;
pub mod extract;
pub mod faults;
pub mod home;
pub mod human;
pub mod ids;
mod imports;
pub mod ipc;
pub mod journal;
pub mod limits;
pub mod registry;
pub mod runner;
pub mod sandbox;
pub mod scaffold;
pub mod store;
pub mod thread_log;
pub mod threads;
pub mod worker;

pub use error::{Error, Result};
