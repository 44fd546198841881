//! What a wait's message says, in each channel's form: a mail's text and HTML, Slack's blocks,
//! a webhook's JSON. What a thread asks is untrusted (a model wrote the tool call, a bundle the
//! question): escaped for HTML and for Slack's markup, cut to a bound, and never in a subject
//! line beyond the workflow's name. No secret is ever in a message; the links' tokens are, as
//! the one place they go.

use serde_json::{Value, json};

use super::links::Minted;
use crate::run::waits::{Wait, WaitKind};
use crate::terminal::html;

/// A wait, told.
#[derive(Debug, Clone)]
pub struct Message {
    pub wait: Wait,
    /// The links that decide it, one per action.
    pub links: Vec<Minted>,
    /// The thread's page in the web view.
    pub thread_url: String,
    /// When its links stop deciding (ms since the epoch).
    pub expires: u64,
}

impl Message {
    /// One line, for a subject: the workflow and what it waits for.
    pub fn subject(&self) -> String {
        let what = match self.wait.kind {
            WaitKind::Answer => "an answer",
            WaitKind::Approve => "an approval",
            WaitKind::Cut => "a decision about a cut tool call",
            WaitKind::Budget => "a budget",
            WaitKind::SignIn => "a sign-in",
        };
        let workflow = crate::terminal::line(&self.wait.workflow);
        format!("[uncaged-workflow] {workflow} waits for {what}")
    }

    /// What waits, in a sentence (plain text: callers escape it for their markup).
    pub fn intro(&self) -> String {
        let w = &self.wait;
        let thread = format!("Thread {} of workflow `{}`", w.thread, w.workflow);
        let role = w.role.as_deref().unwrap_or("?");
        let tool = w.tool.as_ref().map_or("?", |t| t.tool.as_str());
        match w.kind {
            WaitKind::Answer => format!("{thread} waits for an answer for role `{role}`."),
            WaitKind::Approve => {
                format!("{thread} asks to call tool `{tool}`: approve or deny it.")
            }
            WaitKind::Cut => format!(
                "{thread}: a crash cut tool call `{tool}` in the middle, and the tool is not safe \
                 to call again. Make it again, or skip it with a text the model is given instead."
            ),
            WaitKind::Budget => {
                format!("{thread} is paused: its next agent call would go over its budget.")
            }
            WaitKind::SignIn => format!(
                "{thread} is paused: a tool server's sign-in ran out. Sign in again with \
                 `uncaged-workflow tools login SERVER` where it runs, then resume it."
            ),
        }
    }

    /// What is asked, as text: the question, and what the model said before a tool call.
    pub fn details(&self) -> String {
        let mut out = self.wait.question.clone();
        if let Some(reasoning) = self.wait.tool.as_ref().and_then(|t| t.reasoning.as_deref()) {
            out = format!("{out}\n\nThe model said before it: {reasoning}");
        }
        crate::terminal::block(&out).into_owned()
    }

    fn expiry(&self) -> String {
        format!(
            "Each link decides once, and until {}. Opening one shows what it decides and asks \
             to confirm; nothing is decided until you do.",
            crate::clock::rfc3339(self.expires)
        )
    }

    /// A mail's plain text.
    pub fn text(&self) -> String {
        let mut out = format!("{}\n\n{}\n\n", self.intro(), indent(&self.details()));
        for link in &self.links {
            out.push_str(&format!("{}: {}\n", link.action.label(), link.url));
        }
        if !self.links.is_empty() {
            out.push('\n');
            out.push_str(&self.expiry());
            out.push('\n');
        }
        out.push_str(&format!("\nThe thread: {}\n", self.thread_url));
        out
    }

    /// A mail's HTML.
    pub fn html(&self) -> String {
        let mut out = format!(
            "<!doctype html><html><body><p>{}</p><pre style=\"white-space:pre-wrap\">{}</pre><p>",
            html(&self.intro()),
            html(&self.details())
        );
        for link in &self.links {
            out.push_str(&format!(
                "<a href=\"{}\" style=\"margin-right:1em\">{}</a>",
                html(&link.url),
                link.action.label()
            ));
        }
        out.push_str("</p>");
        if !self.links.is_empty() {
            out.push_str(&format!("<p><small>{}</small></p>", html(&self.expiry())));
        }
        out.push_str(&format!(
            "<p><a href=\"{}\">The thread</a></p></body></html>",
            html(&self.thread_url)
        ));
        out
    }

    /// Slack's message: blocks with the question and a button per link.
    pub fn slack(&self) -> Value {
        let mut blocks = vec![
            json!({"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(&self.intro())}}),
            json!({"type": "section", "text": {"type": "mrkdwn",
                "text": format!("```{}```", slack_escape(&crate::terminal::cut(&self.details(), 2800)))}}),
        ];
        let mut buttons: Vec<Value> = self
            .links
            .iter()
            .map(|link| {
                json!({"type": "button", "text": {"type": "plain_text", "text": link.action.label()},
                    "url": link.url, "action_id": link.action.as_str()})
            })
            .collect();
        buttons
            .push(json!({"type": "button", "text": {"type": "plain_text", "text": "The thread"},
            "url": self.thread_url, "action_id": "thread"}));
        blocks.push(json!({"type": "actions", "elements": buttons}));
        if !self.links.is_empty() {
            blocks.push(json!({"type": "context", "elements": [
                {"type": "mrkdwn", "text": slack_escape(&self.expiry())}]}));
        }
        json!({"text": slack_escape(&self.intro()), "blocks": blocks})
    }

    /// A webhook's body: the wait, and its links by action.
    pub fn webhook(&self) -> Value {
        let links: serde_json::Map<String, Value> = self
            .links
            .iter()
            .map(|l| (l.action.as_str().to_string(), Value::String(l.url.clone())))
            .collect();
        json!({
            "type": "thread.waiting",
            "thread": self.wait.thread.to_string(),
            "workflow": self.wait.workflow,
            "wait": self.wait,
            "summary": self.intro(),
            "links": links,
            "linksExpire": crate::clock::rfc3339(self.expires),
            "threadUrl": self.thread_url,
        })
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

/// `text` for Slack's markup: its three control characters escaped, as Slack asks.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::waits::Action;

    fn message(question: &str) -> Message {
        Message {
            wait: Wait {
                thread: crate::ids::ThreadId::new(),
                workflow: "deploy".into(),
                kind: WaitKind::Answer,
                key: "1.0".into(),
                digest: "d".into(),
                role: Some("reviewer".into()),
                question: question.into(),
                tool: None,
                budget: None,
            },
            links: vec![Minted { action: Action::Answer, url: "http://h/links/T/tok".into() }],
            thread_url: "http://h/#/thread/T".into(),
            expires: 0,
        }
    }

    #[test]
    fn what_a_thread_asks_is_escaped_in_every_form() {
        let m = message("<img src=x onerror=alert(1)> <!channel> \u{1b}[31m");
        assert!(m.html().contains("&lt;img src=x onerror=alert(1)&gt;"), "{}", m.html());
        let slack = m.slack().to_string();
        assert!(slack.contains("&lt;!channel&gt;") && !slack.contains("<!channel>"), "{slack}");
        assert!(m.text().contains("\\u{1b}[31m"), "{}", m.text());
        assert!(m.text().contains("Answer: http://h/links/T/tok"));
    }
}
