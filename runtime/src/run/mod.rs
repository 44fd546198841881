//! Running workflows: the catalog of registered workflows, a thread's life on the store
//! (create, open, fork), the runner that advances a thread step by step in the sandbox, the
//! worker that takes threads through the store's work queue, and the dispatch that hands a
//! thread to a worker and follows it — one path for every store.

pub mod actions;
pub mod answer;
pub mod baselines;
pub mod catalog;
pub mod children;
pub mod control;
pub mod diff;
pub mod dispatch;
pub mod events;
pub mod ipc;
pub mod lifecycle;
pub mod query;
pub mod replay;
pub mod retry;
pub mod runner;
pub mod upgrade;
pub mod waits;
pub mod watch;
pub mod worker;
