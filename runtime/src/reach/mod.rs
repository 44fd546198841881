//! Reaching people where they are: a thread that waits on a person is sent, once per wait, to
//! the `notify:` channels its rules choose (a signed webhook, Slack, e-mail), with signed
//! one-time links that decide it; and those links, used. `serve` runs the [`notifier`]; a
//! link's page is `serve`'s too, but what a link may decide, and whether it still may, is
//! here and in [`crate::run::waits`], never in a handler.

pub mod a2a_tasks;
pub mod channels;
pub mod links;
pub mod message;
pub mod notifier;
pub mod push;
