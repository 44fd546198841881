//! Webhook triggers: signed deliveries to `serve`'s `POST /hooks/<workflow>`, each starting one
//! thread with the body as `$trigger_data`, exactly once per delivery id.

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::{Env, Serve, status, wait_until};

/// The secret, as `serve`'s environment holds it.
const SECRET: &str = "It's a Secret to Everybody";
/// A Standard Webhooks secret: `whsec_` and base64.
const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub(crate) fn github_signature(secret: &str, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn standard_signature(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", engine.encode(mac.finalize().into_bytes()))
}

/// A YAML workflow whose trigger is a webhook with the secret in `$var`.
fn hooked_workflow(env: &Env, name: &str, var: &str) -> Result<()> {
    let flow = env.write(
        &format!("{name}.yaml"),
        format!(
            "description: Triage a pushed change\ntrigger:\n  type: webhook\n  secret_env: {var}\n\
             roles:\n  a:\n    description: A\nsteps:\n  - id: a\n    role: a\n"
        ),
    )?;
    env.ok(&["add", name, flow.to_str().unwrap()])?;
    Ok(())
}

/// Sends `body` to `/hooks/<workflow>` with `headers`; the status and JSON answer.
pub(crate) async fn deliver(
    base: &str,
    workflow: &str,
    body: &str,
    headers: &[(&str, String)],
) -> Result<(u16, Value)> {
    let mut request = uncaged_workflow::http::client_builder()
        .build()?
        .post(format!("{base}/hooks/{workflow}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

/// Seconds since the epoch, as `serve` (on the system clock) sees them.
fn unix_now() -> Result<u64> {
    Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs())
}

on_both_stores! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signed_delivery_starts_one_thread_and_a_bad_one_nothing() -> Result<()> {
        let env = Env::new()?;
        // The secret is named, never written: a value that is not a variable's name is refused
        // at its place in the file.
        let bad = env.write(
            "bad.yaml",
            "description: d\ntrigger:\n  type: webhook\n  secret_env: hunter2 is my secret\n\
             roles:\n  a:\n    description: A\nsteps:\n  - id: a\n    role: a\n",
        )?;
        let e = env.fails(&["add", "bad", bad.to_str().unwrap()], 65)?;
        ensure!(e.contains("bad.yaml:4:15: `secret_env` names the environment variable"), "{e}");
        hooked_workflow(&env, "triage", "HOOK_SECRET")?;
        let listed = env.json(&["schedule", "list"])?;
        assert_eq!(listed[0]["trigger"], json!({"type": "webhook", "secretEnv": "HOOK_SECRET"}));
        let serve = Serve::start(&env, &["--no-schedules"], &[("HOOK_SECRET", SECRET)])?;
        let base = format!("http://{}", serve.addr);
        let body = r#"{"action": "opened", "number": 7, "title": "<b>crash</b>"}"#;
        let github = |id: &str, signature: String| {
            vec![("x-github-delivery", id.to_string()), ("x-hub-signature-256", signature)]
        };

        // Not signed, wrongly signed, signed for another body: 401, nothing started.
        let (status_code, answer) = deliver(&base, "triage", body, &[("x-github-delivery", "d0".into())]).await?;
        assert_eq!((status_code, answer["error"]["code"].clone()), (401, json!("bad_signature")));
        let wrong = github("d0", github_signature("another secret", body));
        assert_eq!(deliver(&base, "triage", body, &wrong).await?.0, 401);
        let other = github("d0", github_signature(SECRET, "{}"));
        assert_eq!(deliver(&base, "triage", body, &other).await?.0, 401);
        assert_eq!(env.json(&["threads"])?, json!([]));

        // Signed: a thread with the body as its trigger data, answered at once.
        let good = github("d1", github_signature(SECRET, body));
        let (code, started) = deliver(&base, "triage", body, &good).await?;
        assert_eq!(code, 201, "{started}");
        let id = started["id"].as_str().context("id")?.to_string();
        let record = env.json(&["thread", &id])?;
        assert_eq!(record["start"]["triggerData"], serde_json::from_str::<Value>(body)?);
        assert_eq!(record["start"]["schedule"], json!({"name": "triage", "firing": "delivery:d1"}));
        // The same delivery again (a sender's retry): the same thread, none started.
        let (code, again) = deliver(&base, "triage", body, &good).await?;
        assert_eq!((code, &again["id"]), (200, &started["id"]));
        wait_until("the delivered thread ends", || Ok(status(&env, &id)? == "completed"))?;

        // No webhook for a workflow without one; a body that is not JSON.
        assert_eq!(deliver(&base, "nope", body, &good).await?.0, 404);
        let text = github("d2", github_signature(SECRET, "hello"));
        assert_eq!(deliver(&base, "triage", "hello", &text).await?.0, 400);
        // A delivery over the body limit (1 MiB): the API's JSON error, counted as refused
        // (at 4abdda5 a plain-text 413, counted nowhere).
        let huge = format!("{{\"blob\": \"{}\"}}", "x".repeat(1 << 20));
        let signed = github("d3", github_signature(SECRET, &huge));
        let (code, refused) = deliver(&base, "triage", &huge, &signed).await?;
        assert_eq!((code, refused["error"]["code"].clone()), (413, json!("too_large")), "{refused}");
        ensure!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("max_body_bytes")), "{refused}");
        assert_eq!(env.json(&["threads"])?.as_array().map(Vec::len), Some(1));
        // What serve saw, for Prometheus.
        let metrics = reqwest::get(format!("{base}/metrics")).await?.text().await?;
        for line in [
            "uncaged_workflow_webhook_deliveries_total{outcome=\"started\"} 1",
            "uncaged_workflow_webhook_deliveries_total{outcome=\"replayed\"} 1",
            "uncaged_workflow_webhook_deliveries_total{outcome=\"refused\"} 6",
            "uncaged_workflow_threads{status=\"completed\"} 1",
            "uncaged_workflow_queue_depth 0",
            "uncaged_workflow_steps 1",
            // The one step's agent call.
            "uncaged_workflow_agent_call_duration_seconds_bucket{le=\"+Inf\"} 1",
            "uncaged_workflow_agent_call_duration_seconds_count 1",
        ] {
            ensure!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
        }
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn standard_webhooks_are_verified_with_their_timestamp() -> Result<()> {
        let env = Env::new()?;
        env.add_solve_issue()?;
        env.ok(&["schedule", "add", "solve-issue", "--webhook", "--secret-env", "STD_SECRET", "-p", "from a hook"])?;
        let e = env.fails(&["schedule", "add", "solve-issue", "--webhook", "--secret-env", "lower-case", "--name", "x"], 64)?;
        ensure!(e.contains("`secret_env` names the environment variable"), "{e}");
        // Started without the secret: said once, and deliveries are refused, not guessed at.
        let blind = Serve::start(&env, &["--no-schedules"], &[])?;
        let (code, answer) = deliver(&format!("http://{}", blind.addr), "solve-issue", "{}", &[]).await?;
        assert_eq!((code, answer["error"]["code"].clone()), (503, json!("not_configured")));
        blind.stop()?;
        let said = std::fs::read_to_string(env.dir.path().join("serve.err"))?;
        ensure!(said.contains("STD_SECRET, the variable holding its secret, is not set"), "{said}");
        let serve = Serve::start(&env, &["--no-schedules"], &[("STD_SECRET", WHSEC)])?;
        let base = format!("http://{}", serve.addr);
        let body = r#"{"type": "invoice.paid"}"#;
        let signed = |id: &str, at: u64, signature: String| {
            vec![("webhook-id", id.to_string()), ("webhook-timestamp", at.to_string()), ("webhook-signature", signature)]
        };
        let now = unix_now()?;
        let good = signed("msg_1", now, format!("v1,bm90IGl0 {}", standard_signature(WHSEC, "msg_1", now, body)));
        let (code, started) = deliver(&base, "solve-issue", body, &good).await?;
        assert_eq!(code, 201, "{started}");
        assert_eq!(deliver(&base, "solve-issue", body, &good).await?, (200, started.clone()));
        // Ten minutes old, or signed for another id: refused.
        let old = now - 600;
        let stale = signed("msg_2", old, standard_signature(WHSEC, "msg_2", old, body));
        assert_eq!(deliver(&base, "solve-issue", body, &stale).await?.0, 401);
        let swapped = signed("msg_3", now, standard_signature(WHSEC, "msg_1", now, body));
        assert_eq!(deliver(&base, "solve-issue", body, &swapped).await?.0, 401);
        let id = started["id"].as_str().context("id")?.to_string();
        assert_eq!(env.json(&["thread", &id])?["start"]["parameters"]["prompt"], "from a hook");
        assert_eq!(env.json(&["threads"])?.as_array().map(Vec::len), Some(1));
        Ok(())
    }
}

/// Two `serve` processes on one database, the same deliveries sent to both at once: one
/// thread per delivery id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_to_two_servers_on_one_database_starts_one_thread() -> Result<()> {
    let env = Env::on_postgres()?;
    hooked_workflow(&env, "triage", "HOOK_SECRET")?;
    let first = Serve::start(&env, &["--no-schedules"], &[("HOOK_SECRET", SECRET)])?;
    let second = Serve::start(&env, &["--no-schedules"], &[("HOOK_SECRET", SECRET)])?;
    let bases = [format!("http://{}", first.addr), format!("http://{}", second.addr)];
    let body = r#"{"ref": "refs/heads/main"}"#;
    let mut sends = Vec::new();
    for delivery in ["a", "b", "c"] {
        for n in 0..8 {
            let base = bases[n % 2].clone();
            let headers = vec![
                ("x-github-delivery", delivery.to_string()),
                ("x-hub-signature-256", github_signature(SECRET, body)),
            ];
            sends.push(async move {
                let (code, answer) = deliver(&base, "triage", body, &headers).await?;
                ensure!(code == 201 || code == 200, "{code} {answer}");
                Ok::<_, anyhow::Error>((
                    delivery,
                    code,
                    answer["id"].as_str().unwrap_or("").to_string(),
                ))
            });
        }
    }
    let mut by_delivery: std::collections::BTreeMap<&str, BTreeSet<String>> = Default::default();
    let mut created = 0;
    for result in futures::future::join_all(sends).await {
        let (delivery, code, id) = result?;
        created += usize::from(code == 201);
        by_delivery.entry(delivery).or_default().insert(id);
    }
    ensure!(by_delivery.values().all(|ids| ids.len() == 1), "{by_delivery:?}");
    assert_eq!(created, 3, "one 201 per delivery");
    assert_eq!(env.json(&["threads"])?.as_array().map(Vec::len), Some(3));
    Ok(())
}
