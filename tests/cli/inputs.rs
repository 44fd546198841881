//! A workflow's declared input: the JSON Schema of the data its threads start with (a YAML
//! workflow's `inputs:`, an SDK's input schema), which every way of starting a thread checks
//! before anything is created and which callers are shown.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::hooks::{deliver, github_signature};
use crate::{Env, Serve, status, wait_until};

/// What the workflow below takes: an issue number, and labels.
fn input_schema() -> Value {
    json!({
        "type": "object",
        "required": ["issue"],
        "properties": {
            "issue": {"type": "integer", "minimum": 1},
            "labels": {"type": "array", "items": {"type": "string"}}
        },
        "additionalProperties": false
    })
}

/// A YAML workflow taking [`input_schema`], delivered by a webhook that maps a tracker's body
/// onto it.
const TRIAGE: &str = "description: Triage an issue
inputs:
  type: object
  required: [issue]
  properties:
    issue: {type: integer, minimum: 1}
    labels: {type: array, items: {type: string}}
  additionalProperties: false
trigger:
  type: webhook
  secret_env: HOOK_SECRET
  map:
    issue: /issue/number
    labels: /issue/labels
roles:
  triager:
    description: Triages the issue
steps:
  - id: triager
    role: triager
    inputs:
      issue: $trigger_data
";

on_both_stores! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_way_of_starting_a_thread_checks_its_data_against_the_workflows_input() -> Result<()> {
        let env = Env::new()?;
        let flow = env.write("triage.yaml", TRIAGE)?;
        env.ok(&["add", "triage", flow.to_str().unwrap()])?;
        // Shown as declared.
        assert_eq!(env.json(&["show", "triage"])?["inputSchema"], input_schema());
        let shown = env.ok(&["show", "triage"])?;
        ensure!(shown.contains("input (--data, checked against this JSON Schema):"), "{shown}");

        // The command line: data the schema refuses exits 65 naming where, and leaves no thread.
        let e = env.fails(&["run", "triage", "-p", "x", "--data", r#"{"issue": 0}"#], 65)?;
        ensure!(e.contains("workflow `triage` does not take this data") && e.contains("(at `/issue`)"), "{e}");
        let e = env.fails(&["run", "triage", "-p", "x", "--data", r#"{"issue": 3, "labels": [7]}"#], 65)?;
        ensure!(e.contains("(at `/labels/0`)"), "{e}");
        // No data at all is an empty object: the required issue is missing.
        let e = env.fails(&["run", "triage", "-p", "x"], 65)?;
        ensure!(e.contains("\"issue\" is a required property") && e.contains("(at the top level)"), "{e}");
        assert_eq!(env.json(&["threads"])?, json!([]));
        let out = env.ok(&["run", "triage", "-p", "x", "--data", r#"{"issue": 3}"#])?;
        let id = crate::thread_id_of(&out)?;
        assert_eq!(env.json(&["thread", &id])?["start"]["triggerData"], json!({"issue": 3}));

        let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
        let serve = Serve::start(&env, &["--no-schedules"], &[("HOOK_SECRET", "s3cret")])?;
        let base = format!("http://{}", serve.addr);
        let http = uncaged_workflow::http::client_builder().timeout(Duration::from_secs(60)).build()?;
        let start = |data: Value| {
            http.post(format!("{base}/api/v1/threads"))
                .bearer_auth(&token)
                .json(&json!({"workflow": "triage", "prompt": "from the API", "data": data}))
                .send()
        };

        // The API: 422 with the path of the bad field, and nothing started.
        let refused = start(json!({"issue": "seven"})).await?;
        assert_eq!(refused.status().as_u16(), 422);
        let body: Value = refused.json().await?;
        assert_eq!(body["error"]["code"], "invalid_input", "{body}");
        assert_eq!(body["error"]["path"], "/issue", "{body}");
        ensure!(body["error"]["message"].as_str().is_some_and(|m| m.contains("\"seven\" is not of type \"integer\"")), "{body}");
        let extra = start(json!({"issue": 1, "priority": "high"})).await?;
        assert_eq!(extra.status().as_u16(), 422);
        let started = start(json!({"issue": 5, "labels": ["bug"]})).await?;
        assert_eq!(started.status().as_u16(), 201);
        // The workflows' listing (the web view's start form) carries the schema.
        let listed: Value = http.get(format!("{base}/api/v1/workflows")).bearer_auth(&token).send().await?.json().await?;
        assert_eq!(listed[0]["inputSchema"], input_schema(), "{listed}");

        // A webhook: its map picks the data out of the tracker's body, which is then checked.
        let signed = |id: &str, body: &str| {
            vec![("x-github-delivery", id.to_string()), ("x-hub-signature-256", github_signature("s3cret", body))]
        };
        let bad = r#"{"action": "opened", "issue": {"number": 0, "labels": []}}"#;
        let (code, answer) = deliver(&base, "triage", bad, &signed("d1", bad)).await?;
        assert_eq!((code, answer["error"]["code"].clone(), answer["error"]["path"].clone()), (422, json!("invalid_input"), json!("/issue")), "{answer}");
        let good = r#"{"action": "opened", "issue": {"number": 12, "labels": ["crash"], "title": "t"}}"#;
        let (code, answer) = deliver(&base, "triage", good, &signed("d2", good)).await?;
        assert_eq!(code, 201, "{answer}");
        let hooked = answer["id"].as_str().context("id")?.to_string();
        wait_until("the delivered thread ends", || Ok(status(&env, &hooked)? == "completed"))?;
        let record = env.json(&["thread", &hooked])?;
        assert_eq!(record["start"]["triggerData"], json!({"issue": 12, "labels": ["crash"]}));
        // Started: the command line's, the API's and the webhook's; none of the refused.
        assert_eq!(env.json(&["threads"])?.as_array().map(Vec::len), Some(3));
        serve.stop()
    }
}

#[test]
fn a_workflows_input_is_checked_when_it_is_added() -> Result<()> {
    let env = Env::new()?;
    let broken = TRIAGE.replace("type: object\n  required", "type: 7\n  required");
    let flow = env.write("broken.yaml", broken)?;
    let e = env.fails(&["add", "broken", flow.to_str().unwrap()], 65)?;
    ensure!(e.contains("`inputs`: not a valid JSON Schema"), "{e}");
    let unmapped = TRIAGE.replace("issue: /issue/number", "issue: issue.number");
    let flow = env.write("unmapped.yaml", unmapped)?;
    let e = env.fails(&["add", "unmapped", flow.to_str().unwrap()], 65)?;
    ensure!(e.contains("not a JSON Pointer into the body"), "{e}");
    // A cron schedule's threads start with no data: one whose workflow requires some could
    // never fire, and is refused; a webhook's data comes with each delivery.
    let flow = env.write("plain.yaml", TRIAGE.split("trigger:").next().unwrap().to_string() + "roles:\n  triager:\n    description: T\nsteps:\n  - id: triager\n    role: triager\n")?;
    env.ok(&["add", "plain", flow.to_str().unwrap()])?;
    let e = env.fails(&["schedule", "add", "plain", "--cron", "0 * * * *"], 65)?;
    ensure!(e.contains("\"issue\" is a required property"), "{e}");
    env.ok(&[
        "schedule",
        "add",
        "plain",
        "--webhook",
        "--secret-env",
        "S",
        "--map",
        "issue=/number",
    ])?;
    let listed = env.json(&["schedule", "list"])?;
    assert_eq!(listed[0]["trigger"]["map"], json!({"issue": "/number"}), "{listed}");
    // A poll's item is its thread's data: an item the workflow refuses is a failed firing,
    // said by the tick, and starts nothing.
    let poll = env.write_script("items.sh", "#!/bin/sh\necho '[{\"issue\": 0}]'\n")?;
    let poll = poll.to_str().unwrap();
    env.ok(&[
        "schedule",
        "add",
        "plain",
        "--poll",
        poll,
        "--every",
        "1s",
        "--diff",
        "new-items",
        "--include-existing",
        "--name",
        "p",
    ])?;
    let run = env.run(&["schedule", "tick", "--json"])?;
    let pass: Value = serde_json::from_str(&run.stdout)?;
    let failed = pass["errors"].as_array().context("errors")?;
    ensure!(
        failed.iter().any(|e| e["schedule"] == "p"
            && e["error"].as_str().is_some_and(
                |m| m.contains("does not take this data") && m.contains("(at `/issue`)")
            )),
        "{pass}"
    );
    assert_eq!(env.json(&["threads"])?, json!([]));
    Ok(())
}
