//! Sending a wait's message through a `notify:` channel: a JSON POST signed as Standard
//! Webhooks sign, a Slack incoming webhook, a mail over SMTP. A channel's secrets are read from
//! the environment when it sends and go nowhere else: not into the message, not into an error
//! (a Slack webhook's URL is its credential, so a failed POST is told without its URL).

use std::time::Duration;

use base64::Engine as _;
use hmac::Mac as _;
use lettre::message::MultiPart;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::message::Message;
use crate::store::notify_config::Channel;

/// How long a send may take before it counts as failed (and is tried again later).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The recipients of `channel`: one message each (an e-mail channel's addresses; one, unnamed,
/// for the others).
pub fn recipients(channel: &Channel) -> Vec<Option<String>> {
    match channel {
        Channel::Email { to, .. } => to.iter().cloned().map(Some).collect(),
        Channel::Webhook { .. } | Channel::Slack { .. } => vec![None],
    }
}

/// Sends `message` through channel `name` (`channel`), to `recipient` if it has one; `id` is
/// the delivery's id, the same on every attempt (a webhook's `webhook-id`, a mail's
/// `Message-ID`), so that a receiver can tell an attempt made again. Why it failed, if it did,
/// in one line.
pub async fn send(
    name: &str,
    channel: &Channel,
    recipient: Option<&str>,
    message: &Message,
    id: &str,
) -> std::result::Result<(), String> {
    match channel {
        Channel::Webhook { url, secret_env } => {
            let secret = secret(name, "secret_env", secret_env)?;
            let key = crate::http::standard_webhooks_key(secret.as_bytes()).ok_or_else(|| {
                format!("notify.channels.{name}: ${secret_env} is not a valid whsec_ secret")
            })?;
            let body = serde_json::to_vec(&message.webhook()).expect("a message serializes");
            let timestamp = crate::clock::now_ms() / 1000;
            let mac = crate::http::standard_webhooks_mac(&key, id, timestamp, &body);
            let signature =
                base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
            let request = client()?
                .post(url)
                .header("content-type", "application/json")
                .header("webhook-id", id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", format!("v1,{signature}"))
                .body(body);
            answered(request.send().await).await
        }
        Channel::Slack { url_env } => {
            let url = secret(name, "url_env", url_env)?;
            let request = client()?.post(url).json(&message.slack());
            answered(request.send().await).await
        }
        Channel::Email { smtp, from, username, password_env, .. } => {
            let to = recipient.ok_or("an e-mail needs an address")?;
            let mail = lettre::Message::builder()
                .from(from.parse().map_err(|e| format!("from `{from}`: {e}"))?)
                .to(to.parse().map_err(|e| format!("to `{to}`: {e}"))?)
                .subject(message.subject())
                .message_id(Some(format!("<{id}@uncaged-workflow>")))
                .multipart(MultiPart::alternative_plain_html(message.text(), message.html()))
                .map_err(|e| format!("the mail does not build: {e}"))?;
            let mut transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(smtp)
                .map_err(|e| format!("notify.channels.{name}.smtp: {e}"))?
                .timeout(Some(SEND_TIMEOUT));
            if let Some(user) = username {
                let password = match password_env {
                    Some(var) => secret(name, "password_env", var)?,
                    None => String::new(),
                };
                transport = transport.credentials(
                    lettre::transport::smtp::authentication::Credentials::new(
                        user.clone(),
                        password,
                    ),
                );
            }
            transport.build().send(mail).await.map(drop).map_err(|e| format!("SMTP: {e}"))
        }
    }
}

/// The value of environment variable `var`, which `notify.channels.NAME.KEY` names.
fn secret(name: &str, key: &str, var: &str) -> std::result::Result<String, String> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("notify.channels.{name}.{key}: ${var} is not set"))
}

fn client() -> std::result::Result<reqwest::Client, String> {
    crate::http::shared_client(SEND_TIMEOUT).map_err(|e| format!("no HTTP client: {e}"))
}

/// A POST's outcome: a 2xx is sent; anything else is why not, without the URL.
async fn answered(
    response: std::result::Result<reqwest::Response, reqwest::Error>,
) -> std::result::Result<(), String> {
    let response = response.map_err(|e| e.without_url().to_string())?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    let body: String = body.chars().take(200).collect();
    Err(format!("HTTP {}: {}", status.as_u16(), crate::terminal::line(body.trim())))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mail_message_id_is_valid() {
        let id = "01J9ZQ0000000000000000000A-3f2a";
        let mail = lettre::Message::builder()
            .from("a@x.org".parse().unwrap())
            .to("b@x.org".parse().unwrap())
            .subject("s")
            .message_id(Some(format!("<{id}@uncaged-workflow>")))
            .body(String::from("b"))
            .unwrap();
        let text = String::from_utf8(mail.formatted()).unwrap();
        assert!(text.contains(&format!("Message-ID: <{id}@uncaged-workflow>")), "{text}");
    }
}
