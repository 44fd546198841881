//! The store kept in a home directory: one backend per store trait, each in a file named as
//! its PostgreSQL counterpart is under `postgres/` — threads (`threads.rs`: JSONL data files
//! under a run lock), their listing index (`listing.rs`), call journals (`journal.rs`) and
//! debug logs (`debug_log.rs`), the work queue (`queue.rs`), the registry and bundles
//! (`registry.rs`), schedules (`schedules.rs`), API tokens (`tokens.rs`) and request keys
//! (`request_keys.rs`).
//!
//! Nothing above `store/` names these: the layers above reach a store through [`Storage`]
//! and the traits. The module is public for the benchmarks, whose native loop appends its
//! journal as a home does, and for the property tests of the parsers of a home's files.
//!
//! [`Storage`]: super::Storage

pub mod capacity;
pub mod credentials;
pub mod debug_log;
pub mod docs;
pub mod evals;
pub mod journal;
pub mod links;
pub mod listing;
pub mod notices;
pub mod push_configs;
pub mod queue;
pub mod queue_entry;
pub mod registry;
pub mod request_keys;
pub mod schedules;
pub mod threads;
pub mod tokens;
