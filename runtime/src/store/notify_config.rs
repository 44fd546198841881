//! `notify:` in config.yaml: the channels waits are sent to (a signed webhook, Slack, e-mail
//! over SMTP) and the rules that choose which waits go where. Secrets — a webhook's signing
//! secret, a Slack webhook's URL, an SMTP password — are never in the file: it names the
//! environment variables that hold them, read when a message is sent.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::duration::Seconds;
use crate::store::pauses::WaitKind;

/// `notify:`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// How long a link decides [default: 72h].
    #[serde(default)]
    pub link_ttl: Option<Seconds>,
    /// How often `serve` looks for new waits [default: 2s].
    #[serde(default)]
    pub poll: Option<Seconds>,
    /// Attempts at a message before it is given up [default: 8].
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Whether A2A push notifications may go to loopback and private addresses [default:
    /// false: an A2A client could otherwise have this server POST into its own network].
    #[serde(default)]
    pub a2a_push_private: bool,
    /// The channels, by name.
    #[serde(default)]
    pub channels: BTreeMap<String, Channel>,
    /// Which waits go to which channels; a wait goes to every channel of every rule it fits.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// A channel.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Channel {
    /// A JSON POST signed as Standard Webhooks sign (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`) with the `whsec_` secret in `secret_env`.
    Webhook { url: String, secret_env: String },
    /// A Slack incoming webhook, whose URL (its credential) is in `url_env`.
    Slack { url_env: String },
    /// Mail over SMTP: `smtp` is `smtp://HOST:PORT` (STARTTLS when the server offers it; `?tls=required`
    /// insists), `smtps://HOST:PORT` (TLS from the start); one message per address in `to`,
    /// its links bound to that address.
    Email {
        smtp: String,
        from: String,
        to: Vec<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password_env: Option<String>,
    },
}

impl Channel {
    pub fn kind(&self) -> &'static str {
        match self {
            Channel::Webhook { .. } => "webhook",
            Channel::Slack { .. } => "slack",
            Channel::Email { .. } => "email",
        }
    }
}

/// A rule: waits of these kinds, of threads of these workflows, go to these channels.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub to: Vec<String>,
    /// The workflows whose waits it takes [default: every one].
    #[serde(default)]
    pub workflows: Vec<String>,
    /// The kinds of wait it takes [default: every one].
    #[serde(default)]
    pub waits: Vec<WaitKind>,
}

/// The longest a link may live: a week (a link is a credential in someone's mailbox).
const MAX_TTL_SECS: u64 = 7 * 24 * 3600;

impl NotifyConfig {
    /// Whether anything is to be sent.
    pub fn is_on(&self) -> bool {
        !self.rules.is_empty()
    }

    pub fn link_ttl_ms(&self) -> u64 {
        self.link_ttl.map_or(72 * 3600 * 1000, |t| t.0.as_millis() as u64)
    }

    pub fn poll(&self) -> std::time::Duration {
        self.poll.map_or(std::time::Duration::from_secs(2), |p| p.0)
    }

    pub fn attempts(&self) -> u32 {
        self.attempts.unwrap_or(8)
    }

    /// The channels `kind` waits of a thread of `workflow` go to, each once, by name.
    pub fn channels_for(&self, workflow: &str, kind: WaitKind) -> Vec<(&str, &Channel)> {
        let mut names: Vec<&str> = self
            .rules
            .iter()
            .filter(|r| r.workflows.is_empty() || r.workflows.iter().any(|w| w == workflow))
            .filter(|r| r.waits.is_empty() || r.waits.contains(&kind))
            .flat_map(|r| r.to.iter().map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        names.into_iter().filter_map(|n| Some((n, self.channels.get(n)?))).collect()
    }

    /// What is wrong with it, named by its key (`notify.rules[0].to`), if anything.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(ttl) = self.link_ttl
            && (ttl.0.is_zero() || ttl.0.as_secs() > MAX_TTL_SECS)
        {
            return Err("notify.link_ttl: expected more than 0 and at most 7 days".into());
        }
        if self.attempts == Some(0) {
            return Err("notify.attempts: expected at least 1".into());
        }
        for (name, channel) in &self.channels {
            check_channel(name, channel)?;
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.to.is_empty() {
                return Err(format!("notify.rules[{i}].to: name at least one channel"));
            }
            for to in &rule.to {
                if !self.channels.contains_key(to) {
                    let names: Vec<&str> = self.channels.keys().map(String::as_str).collect();
                    return Err(format!(
                        "notify.rules[{i}].to: no channel `{to}` in notify.channels (there: {})",
                        if names.is_empty() { "none".into() } else { names.join(", ") }
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_channel(name: &str, channel: &Channel) -> std::result::Result<(), String> {
    let at = format!("notify.channels.{name}");
    let env =
        |key: &str, var: &str| crate::env_name::check(var).map_err(|e| format!("{at}.{key}: {e}"));
    match channel {
        Channel::Webhook { url, secret_env } => {
            let parsed = reqwest::Url::parse(url).map_err(|e| format!("{at}.url `{url}`: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("{at}.url `{url}`: expected an http(s):// address"));
            }
            env("secret_env", secret_env)
        }
        Channel::Slack { url_env } => env("url_env", url_env),
        Channel::Email { smtp, from, to, password_env, .. } => {
            let parsed =
                reqwest::Url::parse(smtp).map_err(|e| format!("{at}.smtp `{smtp}`: {e}"))?;
            if !matches!(parsed.scheme(), "smtp" | "smtps") || parsed.host_str().is_none() {
                return Err(format!(
                    "{at}.smtp `{smtp}`: expected smtp://HOST:PORT or smtps://HOST:PORT"
                ));
            }
            if !parsed.username().is_empty() || parsed.password().is_some() {
                return Err(format!(
                    "{at}.smtp: no credentials in the address; give `username` and \
                     `password_env` (the variable that holds the password)"
                ));
            }
            for address in std::iter::once(from).chain(to) {
                address
                    .parse::<lettre::Address>()
                    .map_err(|e| format!("{at}: `{address}` is not an e-mail address: {e}"))?;
            }
            if to.is_empty() {
                return Err(format!("{at}.to: give at least one address"));
            }
            match password_env {
                Some(var) => env("password_env", var),
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> std::result::Result<NotifyConfig, String> {
        let config: NotifyConfig = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        config.check().map(|()| config)
    }

    #[test]
    fn rules_choose_channels_by_workflow_and_kind() {
        let config = parse(
            "channels:\n  mail: {kind: email, smtp: 'smtp://127.0.0.1:25', from: a@x.org, \
             to: [b@x.org]}\n  hook: {kind: webhook, url: 'https://h.example/x', secret_env: S}\n\
             rules:\n  - {to: [mail], waits: [approve]}\n  - {to: [hook, mail], workflows: [deploy]}\n",
        )
        .unwrap();
        let names =
            |w, k| -> Vec<&str> { config.channels_for(w, k).into_iter().map(|(n, _)| n).collect() };
        assert_eq!(names("deploy", WaitKind::Approve), ["hook", "mail"]);
        assert_eq!(names("other", WaitKind::Approve), ["mail"]);
        assert!(names("other", WaitKind::Answer).is_empty());
    }

    #[test]
    fn mistakes_are_named_by_their_key() {
        let err = parse("rules: [{to: [nope]}]").unwrap_err();
        assert!(err.contains("notify.rules[0].to: no channel `nope`"), "{err}");
        let err = parse(
            "channels: {m: {kind: email, smtp: 'smtp://u:p@h:25', from: a@x.org, to: [b@x.org]}}",
        )
        .unwrap_err();
        assert!(err.contains("no credentials in the address"), "{err}");
        let err =
            parse("channels: {s: {kind: slack, url: 'https://hooks.slack.com/x'}}").unwrap_err();
        assert!(err.contains("unknown field `url`"), "{err}");
        let err = parse("rules: [{to: [x], waits: [approval]}]").unwrap_err();
        assert!(err.contains("approve"), "{err}");
    }
}
