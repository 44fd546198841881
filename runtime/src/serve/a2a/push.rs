//! A2A push notifications: a client's push configs for its tasks, kept in the store
//! ([`crate::store::push_configs`]), and sent by the `serve` notifier
//! ([`crate::reach::notifier`]) once per change of the task's rest — the same delivery
//! machinery as `notify:` channels: claimed once, retried with backoff, shown on the thread.

use a2a::{
    A2AError, DeleteTaskPushNotificationConfigRequest, GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    TaskPushNotificationConfig,
};

use super::{a2a_error, tasks, thread_of};
use crate::store::Storage;
use crate::store::push_configs::{PushConfig, check_id};

/// Keeps `config` for its task (made by `owner`), its id made if it has none.
pub fn create(
    store: &Storage,
    owner: &str,
    mut config: TaskPushNotificationConfig,
) -> Result<TaskPushNotificationConfig, A2AError> {
    let thread = thread_of(&config.task_id)?;
    let record = store.threads().read(thread).map_err(a2a_error)?;
    tasks::offered(store, &record)?;
    check(&config)?;
    let id = config.id.clone().unwrap_or_else(|| crate::ids::random_hex(8));
    check_id(&id).map_err(A2AError::invalid_params)?;
    config.id = Some(id.clone());
    let kept = PushConfig {
        thread,
        id,
        config: serde_json::to_value(&config).expect("a push config serializes"),
        owner: owner.to_string(),
        created: crate::clock::now_ms(),
    };
    store.push_configs().put(&kept).map_err(a2a_error)?;
    Ok(config)
}

/// What a push config must hold before it is kept: an http(s) URL, and a token and
/// credentials that cannot add a header. (Where the URL may point is checked when a push is
/// sent, by the SDK's sender: see `notify.a2a_push_private`.)
fn check(config: &TaskPushNotificationConfig) -> Result<(), A2AError> {
    let url = reqwest::Url::parse(&config.url)
        .map_err(|e| A2AError::invalid_params(format!("push url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(A2AError::invalid_params("push url: expected an http(s):// address"));
    }
    let credentials = config.authentication.as_ref().and_then(|a| a.credentials.as_deref());
    if [config.token.as_deref(), credentials]
        .into_iter()
        .flatten()
        .any(|v| v.contains(['\r', '\n']))
    {
        return Err(A2AError::invalid_params("a push token may not hold a line break"));
    }
    Ok(())
}

/// The configs of a task, as the client gave them.
fn of_task(store: &Storage, task: &str) -> Result<Vec<TaskPushNotificationConfig>, A2AError> {
    let thread = thread_of(task)?;
    let record = store.threads().read(thread).map_err(a2a_error)?;
    tasks::offered(store, &record)?;
    let kept = store.push_configs().of_thread(thread).map_err(a2a_error)?;
    Ok(kept.into_iter().filter_map(|k| serde_json::from_value(k.config).ok()).collect())
}

pub fn get(
    store: &Storage,
    req: &GetTaskPushNotificationConfigRequest,
) -> Result<TaskPushNotificationConfig, A2AError> {
    of_task(store, &req.task_id)?
        .into_iter()
        .find(|c| c.id.as_deref() == Some(req.id.as_str()))
        .ok_or_else(|| A2AError::invalid_params(format!("no push config `{}`", req.id)))
}

pub fn list(
    store: &Storage,
    req: &ListTaskPushNotificationConfigsRequest,
) -> Result<ListTaskPushNotificationConfigsResponse, A2AError> {
    Ok(ListTaskPushNotificationConfigsResponse {
        configs: of_task(store, &req.task_id)?,
        next_page_token: None,
    })
}

pub fn delete(
    store: &Storage,
    req: &DeleteTaskPushNotificationConfigRequest,
) -> Result<(), A2AError> {
    let thread = thread_of(&req.task_id)?;
    match store.push_configs().delete(thread, &req.id) {
        Ok(true) => Ok(()),
        Ok(false) => Err(A2AError::invalid_params(format!("no push config `{}`", req.id))),
        Err(e) => Err(a2a_error(e)),
    }
}
