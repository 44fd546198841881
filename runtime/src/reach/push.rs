//! A2A push notifications, sent: a task's push config is told the task each time it comes to
//! rest (asks for input, ends), once per rest — a delivery claimed in the store like a
//! `notify:` channel's, by the official SDK's sender, which refuses loopback, private,
//! link-local and metadata addresses (also after DNS and redirects) unless
//! `notify.a2a_push_private` says otherwise.

use a2a::{StreamResponse, TaskPushNotificationConfig, TaskState};
use a2a_server::push::{HttpPushSender, HttpPushSenderConfig};

use super::a2a_tasks;
use crate::run::waits;
use crate::store::push_configs::PushConfig;
use crate::store::records::ThreadRecord;

/// What is pushed of thread `record` now, if it is at a rest a push tells: the key of that
/// rest (one push each), and the task.
pub fn due(record: &ThreadRecord) -> Option<(String, a2a::Task)> {
    let task = a2a_tasks::task(record);
    let key = match task.status.state {
        TaskState::InputRequired | TaskState::AuthRequired => {
            let wait = waits::of(record)?;
            format!("{}.{}", wait.key, &wait.digest[..16])
        }
        TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected => {
            "end".to_string()
        }
        _ => return None,
    };
    Some((key, task))
}

/// Pushes `task` to `config`; why not, in a line, if it failed.
pub async fn send(
    config: &PushConfig,
    task: a2a::Task,
    private: bool,
) -> std::result::Result<(), String> {
    let config: TaskPushNotificationConfig = serde_json::from_value(config.config.clone())
        .map_err(|e| format!("the push config does not read: {e}"))?;
    crate::http::install_tls();
    let sender = HttpPushSender::new(Some(HttpPushSenderConfig {
        timeout: std::time::Duration::from_secs(30),
        fail_on_error: true,
        validate_urls: !private,
    }));
    sender.send_push(&config, StreamResponse::Task(task)).await.map_err(|e| e.message)
}
