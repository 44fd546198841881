//! Reach: waits sent through `notify:` channels and decided through signed one-time links,
//! against parts no one here wrote — a real SMTP server (PyPI's aiosmtpd) that receives the
//! mail, the Standard Webhooks library that verifies each webhook, and a headless Chromium that
//! follows a link from the mail (`tests/reach/receivers.py` runs the first two).

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::mock_model::{MockModel, Turn, turn_of};
use crate::tools::{DONE, ledger_lines, ledger_server, python, repo, workbench};
use crate::{Env, Serve, status, wait_until};

/// The webhook channel's signing secret (Standard Webhooks' `whsec_` form).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The mail server and the HTTP receivers, stopped when dropped.
pub struct Receivers {
    child: Child,
    smtp: u16,
    pub http: u16,
    out: PathBuf,
}

impl Receivers {
    /// Starts them; the first `fail_webhooks` webhook deliveries are answered 503.
    pub fn start(env: &Env, fail_webhooks: u32) -> Result<Receivers> {
        let out = env.dir.path().join("received.jsonl");
        let mut child = Command::new(python()?)
            .arg(repo().join("tests/reach/receivers.py"))
            .arg(&out)
            .arg(SECRET)
            .args(["--fail-webhooks", &fail_webhooks.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the receivers (`make test` installs aiosmtpd and standardwebhooks)")?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let port = |name: &str| -> Result<u16> {
            let value = line.split_whitespace().find_map(|w| w.strip_prefix(name));
            value.context("a port")?.parse().with_context(|| format!("ports in {line:?}"))
        };
        Ok(Receivers { smtp: port("smtp=")?, http: port("http=")?, child, out })
    }

    /// What they received of `kind` (`mail`, `webhook`, `webhook-refused`, `slack`).
    pub fn received(&self, kind: &str) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let all: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        Ok(all.into_iter().filter(|r| r["kind"] == kind).collect())
    }

    /// Everything they received, as one text.
    fn everything(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The environment `serve` sends with: the webhook's secret, Slack's URL.
    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("NOTIFY_SECRET", SECRET.to_string()),
            ("SLACK_URL", format!("http://127.0.0.1:{}/slack", self.http)),
        ]
    }
}

impl Drop for Receivers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `notify:` for `receivers`: the channels named in `to` (`mail`, `slack`, `hook`), every wait.
fn notify_yaml(receivers: &Receivers, to: &[&str]) -> String {
    format!(
        "notify:\n  poll: 100ms\n  channels:\n    mail:\n      kind: email\n      smtp: \
         smtp://127.0.0.1:{}\n      from: flows@example.com\n      to: [ada@example.com]\n    \
         slack:\n      kind: slack\n      url_env: SLACK_URL\n    hook:\n      kind: webhook\n      \
         url: http://127.0.0.1:{}/webhook\n      secret_env: NOTIFY_SECRET\n  rules:\n    - to: [{}]\n",
        receivers.smtp,
        receivers.http,
        to.join(", ")
    )
}

/// Adds `yaml` to the home's config.yaml.
fn add_config(env: &Env, yaml: &str) -> Result<()> {
    let path = env.home().join("config.yaml");
    let before = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, format!("{before}{yaml}"))?;
    Ok(())
}

/// `serve` with `vars` as its environment (and its workers').
fn serve(env: &Env, vars: &[(&str, String)]) -> Result<Serve> {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Serve::start(env, &[], &vars)
}

/// The link for `action` in a webhook's payload.
fn link(webhook: &Value, action: &str) -> Result<String> {
    Ok(webhook["payload"]["links"][action].as_str().context("a link")?.to_string())
}

/// A thread of `solve-issue` whose reviewer is a person, detached, once it waits.
fn waiting_review(env: &Env, prompt: &str) -> Result<String> {
    let out =
        env.ok(&["run", "solve-issue", "-p", prompt, "--agent-for", "reviewer=human", "--detach"])?;
    let thread = out.trim().to_string();
    wait_until("the thread waits for its reviewer", || Ok(status(env, &thread)? == "waiting"))?;
    Ok(thread)
}

/// The webhook of thread `thread`, once it came.
fn webhook_of(receivers: &Receivers, thread: &str) -> Result<Value> {
    let mut found = None;
    wait_until("the thread's webhook arrives", || {
        found =
            receivers.received("webhook")?.into_iter().find(|w| w["payload"]["thread"] == thread);
        Ok(found.is_some())
    })?;
    found.context("a webhook")
}

fn http() -> Result<reqwest::Client> {
    Ok(uncaged_workflow::http::client_builder().timeout(Duration::from_secs(60)).build()?)
}

/// GET of `url`: the status and the page.
async fn get(url: &str) -> Result<(u16, String)> {
    let response = http()?.get(url).send().await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// POST of the form `form` to `url`: the status and the page.
async fn post(url: &str, form: &[(&str, &str)]) -> Result<(u16, String)> {
    let body: Vec<String> =
        form.iter().map(|(k, v)| format!("{}={}", encoded(k), encoded(v))).collect();
    let response = http()?
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.join("&"))
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

on_both_stores! {

/// The issue's "done when", first half: a durable agent's tool call that needs approval is
/// sent once to each channel — the mail reaches the SMTP server, the webhook verifies with the
/// Standard Webhooks library, Slack gets buttons — no secret in any; a headless Chromium
/// follows the mail's approve link, sees what it approves (nothing decided yet), and confirms;
/// the call is made once, and the journal says who approved it, through which channel.
#[tokio::test(flavor = "multi_thread")]
async fn a_mailed_link_approves_a_tool_call_once() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__append", json!({"entry": "a"})).saying("I will write a."),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("        approve: [append]\n")?)?;
    let receivers = Receivers::start(&env, 0)?;
    add_config(&env, &notify_yaml(&receivers, &["mail", "slack", "hook"]))?;
    let ledger = env.dir.path().join("ledger");
    let mut vars = receivers.vars();
    vars.push(("LEDGER_FILE", ledger.display().to_string()));
    vars.push(("UNCAGED_WORKFLOW_LEASE_MS", "1500".into()));
    let plain: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = env.run_with(&["run", "dev", "-p", "Write a", "--detach"], &plain)?;
    ensure!(run.code == 0, "{run:?}");
    let thread = run.stdout.trim().to_string();
    wait_until("the call waits for approval", || Ok(status(&env, &thread)? == "waiting"))?;
    let server = serve(&env, &vars)?;

    wait_until("mail, Slack and the webhook arrive", || {
        Ok(["mail", "slack", "webhook"].iter().all(|k| receivers.received(k).is_ok_and(|r| !r.is_empty())))
    })?;
    let webhook = webhook_of(&receivers, &thread)?;
    ensure!(webhook["verified"] == true, "{webhook}");
    ensure!(webhook["payload"]["wait"]["kind"] == "approve", "{webhook}");
    ensure!(webhook["payload"]["wait"]["tool"]["tool"] == "ledger.append", "{webhook}");
    let mail = &receivers.received("mail")?[0];
    ensure!(mail["to"] == json!(["ada@example.com"]), "{mail}");
    ensure!(mail["subject"] == "[uncaged-workflow] dev waits for an approval", "{mail}");
    let text = mail["text"].as_str().context("a plain part")?;
    ensure!(text.contains("ledger.append") && text.contains("I will write a."), "{text}");
    let approve = text
        .lines()
        .find_map(|l| l.strip_prefix("Approve: "))
        .context("an approve link in the mail")?
        .trim()
        .to_string();
    ensure!(approve.starts_with(&format!("http://{}/links/{thread}/", server.addr)), "{approve}");
    ensure!(mail["html"].as_str().is_some_and(|h| h.contains(&approve)), "{mail}");
    let slack = &receivers.received("slack")?[0]["payload"];
    let buttons = slack["blocks"].as_array().context("blocks")?.iter()
        .filter_map(|b| b["elements"].as_array()).flatten()
        .filter_map(|e| e["action_id"].as_str()).collect::<Vec<_>>();
    ensure!(buttons == ["approve", "deny", "thread"], "{slack}");
    ensure!(!receivers.everything().contains(SECRET), "a secret went into a message");
    // Each link is bound to the address it was mailed to; the webhook's and Slack's are not
    // the mail's.
    ensure!(link(&webhook, "approve")? != approve);

    let driver = crate::web::Driver::start()?;
    let browser = driver.browser().await?;
    browser.goto(&approve).await?;
    crate::web::wait_for(&browser, "the confirm page", "return document.title.includes('Approve tool call')").await?;
    let page = crate::web::eval(&browser, "return document.body.innerText").await?;
    ensure!(page.as_str().is_some_and(|p| p.contains("ledger.append") && p.contains("\"entry\":\"a\"")), "{page}");
    ensure!(status(&env, &thread)? == "waiting" && ledger_lines(&ledger).is_empty(), "a GET decided");
    crate::web::interact(&browser, "confirm", None).await?;
    crate::web::wait_for(&browser, "the decision", "return document.body.innerText.includes('Done: approved')").await?;
    // The thread's page in the web view says who decided, and what was sent.
    browser.goto(&format!("http://{}/#/thread/{thread}", server.addr)).await?;
    crate::web::wait_for(
        &browser,
        "the thread's decision and deliveries",
        "const d = document.getElementById('decisions'), n = document.getElementById('notifications'); \
         return !!d && d.innerText.includes('approve by ada@example.com through link:mail') \
           && !!n && n.innerText.includes('through mail to ada@example.com: sent');",
    )
    .await?;
    browser.close().await?;
    wait_until("the thread completes", || Ok(status(&env, &thread)? == "completed"))?;
    ensure!(ledger_lines(&ledger) == ["a"], "{:?}", ledger_lines(&ledger));

    let shown = env.json(&["thread", &thread])?;
    let decisions = shown["decisions"].as_array().context("decisions")?;
    ensure!(decisions.len() == 1, "{shown}");
    ensure!(decisions[0]["decision"] == "approve", "{decisions:?}");
    ensure!(decisions[0]["by"] == json!({"who": "ada@example.com", "via": "link:mail"}), "{decisions:?}");
    let notices = shown["notifications"].as_array().context("notifications")?;
    ensure!(notices.len() == 3, "one per channel: {notices:?}");
    ensure!(notices.iter().all(|n| n["state"] == "sent" && n["attempts"] == 1), "{notices:?}");
    ensure!(env.ok(&["thread", &thread])?.contains("decided (approve) by ada@example.com through link:mail"));
    // The wait's other links decide nothing now, and say why.
    let (code, page) = get(&link(&webhook, "deny")?).await?;
    ensure!(code == 409 && page.contains("decides nothing"), "#1: {code} {page}");
    // Sent once: the notifier went on passing while the thread ran to its end.
    ensure!(receivers.received("mail")?.len() == 1 && receivers.received("webhook")?.len() == 1);
    ensure!(receivers.received("slack")?.len() == 1);
    server.stop()?;
    Ok(())
}

/// The issue's security tests: a GET alone decides nothing; a tampered link, one used with
/// another thread's id, an answer the role refuses (the link is not spent), a reused link, a
/// link for a wait answered through another channel, and an expired link each decide nothing
/// and say why.
#[tokio::test(flavor = "multi_thread")]
async fn a_link_decides_once_and_only_for_its_wait() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.set_clock(now_ms())?;
    let receivers = Receivers::start(&env, 0)?;
    add_config(&env, &notify_yaml(&receivers, &["hook"]))?;
    let server = serve(&env, &receivers.vars())?;
    let (a, b) = (waiting_review(&env, "first")?, waiting_review(&env, "second")?);
    let (hook_a, hook_b) = (webhook_of(&receivers, &a)?, webhook_of(&receivers, &b)?);
    let answer = link(&hook_a, "answer")?;
    ensure!(hook_a["payload"]["wait"]["role"] == "reviewer", "{hook_a}");

    // GET shows the form, as often as it is opened, and decides nothing.
    for _ in 0..2 {
        let (code, page) = get(&answer).await?;
        ensure!(code == 200 && page.contains("<textarea"), "#2: {code} {page}");
    }
    ensure!(status(&env, &a)? == "waiting");
    // Tampered with: one character of the token changed.
    let mut tampered = answer.clone();
    let last = tampered.pop().context("a token")?;
    tampered.push(if last == '0' { '1' } else { '0' });
    let (code, page) = post(&tampered, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 404 && page.contains("not known"), "#3: {code} {page}");
    // Another thread's id in front of this thread's token.
    let foreign = answer.replace(&a, &b);
    let (code, _) = post(&foreign, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 404, "{code}");
    // An answer the reviewer's schema refuses: said, and the link still decides.
    let (code, page) = post(&answer, &[("text", "looks fine")]).await?;
    ensure!(code == 422 && page.contains("approved"), "#4: {code} {page}");
    ensure!(get(&answer).await?.0 == 200, "a refused answer spent the link");
    ensure!(status(&env, &a)? == "waiting");
    // The answer.
    let (code, page) = post(&answer, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 200 && page.contains("Done: answered"), "#5: {code} {page}");
    wait_until("thread a completes", || Ok(status(&env, &a)? == "completed"))?;
    // Used again: refused, by POST and by GET.
    let (code, page) = post(&answer, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 410 && page.contains("was used at"), "#6: {code} {page}");
    ensure!(get(&answer).await?.0 == 410);
    let decisions = env.json(&["thread", &a])?["decisions"].clone();
    ensure!(decisions.as_array().map(Vec::len) == Some(1), "{decisions}");
    ensure!(decisions[0]["by"]["via"] == "link:hook", "{decisions}");

    // Answered through another channel first: b's link says so.
    env.ok(&["answer", &b, "Ship it. {\"approved\": true}"])?;
    let (code, page) = post(&link(&hook_b, "answer")?, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 409 && page.contains("decides nothing"), "#7: {code} {page}");
    let decisions = env.json(&["thread", &b])?["decisions"].clone();
    ensure!(decisions.as_array().map(Vec::len) == Some(1) && decisions[0]["by"]["via"] == "cli", "{decisions}");

    // Its thread deleted: the link says so.
    env.ok(&["thread", "rm", &b])?;
    let (code, page) = get(&link(&hook_b, "answer")?).await?;
    ensure!(code == 409 && page.contains("its thread was deleted"), "{code} {page}");

    // Expired: 72 hours and a minute later, a link decides nothing.
    let c = waiting_review(&env, "third")?;
    let hook_c = webhook_of(&receivers, &c)?;
    env.advance(Duration::from_secs(72 * 3600 + 60))?;
    let (code, page) = post(&link(&hook_c, "answer")?, &[("text", "Ship it. {\"approved\": true}")]).await?;
    ensure!(code == 410 && page.contains("expired"), "#8: {code} {page}");
    ensure!(status(&env, &c)? == "waiting");
    server.stop()?;
    Ok(())
}

/// A budget's wait: its link's form raises the budget (a limit lowered is refused, spending
/// nothing), and the thread goes on from where it paused.
#[tokio::test(flavor = "multi_thread")]
async fn a_link_raises_a_spent_budget_and_the_thread_goes_on() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let receivers = Receivers::start(&env, 0)?;
    add_config(&env, &notify_yaml(&receivers, &["hook"]))?;
    let out = env.ok(&["run", "solve-issue", "-p", "x", "--max-agent-calls", "1", "--detach"])?;
    let thread = out.trim().to_string();
    wait_until("the budget pauses the thread", || Ok(status(&env, &thread)? == "paused"))?;
    let server = serve(&env, &receivers.vars())?;
    let hook = webhook_of(&receivers, &thread)?;
    ensure!(hook["payload"]["wait"]["kind"] == "budget", "{hook}");
    let raise = link(&hook, "raise")?;
    let (code, page) = get(&raise).await?;
    ensure!(code == 200 && page.contains("name=\"max_agent_calls\" inputmode=\"decimal\" value=\"2\""), "{code} {page}");
    let (code, page) = post(&raise, &[("max_agent_calls", "0")]).await?;
    ensure!(code == 422 && page.contains("below the one in force"), "{code} {page}");
    let (code, page) = post(&raise, &[("max_agent_calls", "10")]).await?;
    ensure!(code == 200 && page.contains("Done: budget raised"), "{code} {page}");
    wait_until("the thread completes", || Ok(status(&env, &thread)? == "completed"))?;
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["start"]["parameters"]["options"]["budget"]["maxAgentCalls"] == 1, "{shown}");
    server.stop()?;
    Ok(())
}

/// Two `serve`s on one store send one message per wait (each delivery claimed once); a
/// delivery refused by its receiver is tried again after its backoff, and the thread shows
/// the failure and the attempts.
#[test]
fn two_serves_send_one_message_per_wait_and_retry_a_failed_one() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.set_clock(now_ms())?;
    let receivers = Receivers::start(&env, 1)?;
    add_config(&env, &notify_yaml(&receivers, &["mail", "hook"]))?;
    let threads: Vec<String> =
        (0..3).map(|i| waiting_review(&env, &format!("review {i}"))).collect::<Result<_>>()?;
    let (one, two) = (serve(&env, &receivers.vars())?, serve(&env, &receivers.vars())?);
    wait_until("a mail per wait", || Ok(receivers.received("mail")?.len() >= 3))?;
    wait_until("the refused webhook", || Ok(receivers.received("webhook-refused")?.len() == 1))?;
    wait_until("two webhooks", || Ok(receivers.received("webhook")?.len() >= 2))?;
    // The refused one waits out its backoff (5 s) on the test's clock.
    let refused = threads
        .iter()
        .find(|t| receivers.received("webhook").is_ok_and(|w| !w.iter().any(|w| w["payload"]["thread"] == **t)))
        .context("the thread whose webhook was refused")?
        .clone();
    let mut notices = Value::Null;
    wait_until("the failure is on the thread", || {
        notices = env.json(&["thread", &refused])?["notifications"].clone();
        Ok(notices.as_array().is_some_and(|n| n.iter().any(|n| n["state"] == "retrying")))
    })?;
    let failed = notices.as_array().into_iter().flatten().find(|n| n["channel"] == "hook").cloned();
    ensure!(failed.as_ref().is_some_and(|n| n["lastError"] == "HTTP 503: not now"), "{notices}");
    ensure!(env.ok(&["thread", &refused])?.contains("retrying, 1 attempt(s): HTTP 503: not now"));
    env.advance(Duration::from_secs(6))?;
    wait_until("the webhook is sent again", || Ok(receivers.received("webhook")?.len() == 3))?;
    for thread in &threads {
        wait_until("every delivery settles", || {
            let shown = env.json(&["thread", thread])?["notifications"].clone();
            Ok(shown.as_array().is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["state"] == "sent")))
        })?;
        let shown = env.json(&["thread", thread])?["notifications"].clone();
        let attempts: Vec<u64> = shown.as_array().into_iter().flatten().filter_map(|n| n["attempts"].as_u64()).collect();
        let want = if *thread == refused { vec![1, 2] } else { vec![1, 1] };
        let mut got = attempts.clone();
        got.sort();
        ensure!(got == want, "thread {thread}: attempts {attempts:?} (claimed by both serves?)");
    }
    ensure!(receivers.received("mail")?.len() == 3, "{}", receivers.everything());
    let verified = receivers.received("webhook")?;
    ensure!(verified.iter().all(|w| w["verified"] == true), "{verified:?}");
    // The retry carries the first attempt's id: a receiver tells a repeat by it.
    one.stop()?;
    two.stop()?;
    Ok(())
}

/// kill -9 of `serve` between a link's use and its decision's journal entry loses nothing and
/// decides once: the restarted server applies the decision it kept, and the link says it was
/// used.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_cut_by_a_crash_is_applied_once_after_it() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let receivers = Receivers::start(&env, 0)?;
    add_config(&env, &notify_yaml(&receivers, &["hook"]))?;
    let thread = waiting_review(&env, "crash")?;
    let mut crashing = receivers.vars();
    crashing.push(("UNCAGED_WORKFLOW_CRASH_AT", "link-used:1".into()));
    let server = serve(&env, &crashing)?;
    let answer = link(&webhook_of(&receivers, &thread)?, "answer")?;
    let cut = post(&answer, &[("text", "Ship it. {\"approved\": true}")]).await;
    ensure!(cut.is_err(), "the server answered: {cut:?}");
    let crashed_at = server.addr.clone();
    drop(server);
    ensure!(status(&env, &thread)? == "waiting", "decided before the crash");
    ensure!(env.json(&["thread", &thread])?["decisions"] == json!([]));

    let server = serve(&env, &receivers.vars())?;
    // The link, at the restarted server's address (a `notify.base_url` would keep it).
    let answer = answer.replace(&crashed_at, &server.addr);
    wait_until("the kept decision is applied", || Ok(status(&env, &thread)? == "completed"))?;
    let shown = env.json(&["thread", &thread])?;
    let decisions = shown["decisions"].as_array().context("decisions")?;
    ensure!(decisions.len() == 1 && decisions[0]["by"]["via"] == "link:hook", "{decisions:?}");
    let reviews = shown["steps"].as_array().into_iter().flatten().filter(|s| s["role"] == "reviewer").count();
    ensure!(reviews == 1, "{shown}");
    let (code, page) = get(&answer).await?;
    ensure!(code == 410 && page.contains("was used at"), "#9: {code} {page}");
    server.stop()?;
    Ok(())
}

}

/// `text` as a form encodes it.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The machine's time now, in ms.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
