//! Running workflows: the catalog of registered workflows, a thread's life on the store
//! (create, open, fork), the runner that advances a thread step by step in the sandbox, and
//! the worker process that runs a bundle's threads, reached over its local socket; and on a
//! shared store, the queue and the pool worker that claims threads of any bundle.

pub mod catalog;
pub mod control;
pub mod events;
pub mod handover;
pub mod ipc;
pub mod lifecycle;
pub mod pool;
pub mod queued;
pub mod runner;
pub mod worker;
