//! `eval`: recorded threads run again on a changed prompt, judged and compared, against a
//! mock model whose answers depend on the prompt it is given; the JUnit file read by a JUnit
//! parser no one here wrote (PyPI's junitparser).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::Env;
use crate::llm::{MockLlm, completion, config};
use crate::versions::FLOW;

/// The checks the eval judges by: the reviewer approved.
const CHECKS: &str = "checks:\n  - name: approved\n    expr: $steps.review.meta.approved = true\n";

/// A model that approves unless its system prompt asks it to review strictly, and reports
/// 100 tokens in and 20 out for each answer.
fn model() -> Result<MockLlm> {
    MockLlm::start(Box::new(|_, body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default().to_string();
        let user = body["messages"][1]["content"].as_str().unwrap_or_default().to_string();
        // A judge prefers the answer that approves.
        let judged = user
            .split_once("# Answer 2")
            .map(|(first, _)| if first.contains(r#""approved": true"#) { 1 } else { 2 });
        let verdict;
        let answer = if system.contains("You compare two answers") {
            verdict = format!(
                r#"Clearly. {{"better": {}, "reason": "it approves"}}"#,
                judged.unwrap_or(0)
            );
            verdict.as_str()
        } else if system.contains("strictly") {
            // Markup a page must show as text.
            r#"{"approved": false, "note": "<img src=x onerror=\"window.pwned=1\">"}"#
        } else if system.contains("Review") {
            r#"{"approved": true}"#
        } else {
            r#"{"done": true}"#
        };
        let mut reply = completion(answer);
        reply["usage"] = json!({"prompt_tokens": 100, "completion_tokens": 20});
        (200, reply, Duration::ZERO)
    }))
}

/// A model as [`model`] is, that holds its answer to the reviewer's `hold`th question (1-based)
/// for a minute.
fn model_holding(hold: usize) -> Result<MockLlm> {
    let asked = std::sync::atomic::AtomicUsize::new(0);
    MockLlm::start(Box::new(move |_, body: &Value| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default().to_string();
        let (answer, delay) = if system.contains("Review") {
            let n = asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let delay = if n == hold { Duration::from_secs(60) } else { Duration::ZERO };
            let approved = !system.contains("strictly");
            (format!(r#"{{"approved": {approved}}}"#), delay)
        } else {
            (r#"{"done": true}"#.to_string(), Duration::ZERO)
        };
        let mut reply = completion(&answer);
        reply["usage"] = json!({"prompt_tokens": 100, "completion_tokens": 20});
        (200, reply, delay)
    }))
}

/// How many of `llm`'s questions were a reviewer's.
fn reviews(llm: &MockLlm) -> usize {
    llm.seen()
        .iter()
        .filter(|s| {
            s.body["messages"][0]["content"].as_str().unwrap_or_default().contains("Review")
        })
        .count()
}

/// A home with workflow `flow` bound to `llm`, priced, and two threads of it recorded.
fn recorded(env: &Env, llm: &MockLlm) -> Result<Vec<String>> {
    config(
        env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: mock-model\n\
             prices:\n  mock-model: {{input: 2.0, output: 10.0}}\n",
            llm.base_url
        ),
    )?;
    let file = env.write("flow.yaml", FLOW)?;
    env.ok(&["add", "flow", file.to_str().context("path")?])?;
    for prompt in ["one", "two"] {
        env.ok(&["run", "flow", "-p", prompt])?;
    }
    let threads = env.json(&["threads", "flow"])?;
    let ids: Vec<String> = threads
        .as_array()
        .context("threads")?
        .iter()
        .map(|t| t["threadId"].as_str().unwrap_or_default().to_string())
        .collect();
    ensure!(ids.len() == 2 && llm.seen().len() == 6, "{threads} {}", llm.seen().len());
    Ok(ids)
}

/// Every recorded thread as `thread --json` shows it: what an eval must not change.
fn snapshot(env: &Env, ids: &[String]) -> Result<Vec<Value>> {
    ids.iter().map(|id| env.json(&["thread", id])).collect()
}

on_both_stores! {
    /// An unchanged prompt: every thread unchanged, no model asked. A stricter reviewer's
    /// prompt: the reviewer is asked again (and only it), rejects, and each thread is a
    /// regression at step 3, with its tokens and cost; exit 80, a JUnit file a JUnit parser
    /// reads, threads kept beside the recorded ones, which stay as they were.
    #[test]
    fn a_stricter_reviewer_prompt_is_a_regression_at_its_step_and_an_unchanged_one_asks_nothing() -> Result<()> {
        let env = Env::new()?;
        let llm = model()?;
        let ids = recorded(&env, &llm)?;
        let before = snapshot(&env, &ids)?;
        let checks = env.write("checks.yaml", CHECKS)?;
        let checks = checks.to_str().context("path")?;

        let same = env.write("same.yaml", FLOW)?;
        let run = env.run(&["eval", same.to_str().context("path")?, "--workflow", "flow", "--checks", checks, "--json"])?;
        ensure!(run.code == 0, "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        let totals = &report["totals"];
        ensure!(totals["threads"] == 2 && totals["unchanged"] == 2 && totals["regressed"] == 0, "{report}");
        ensure!(totals["passed"] == 2 && totals["baselinePassed"] == 2 && totals["differing"] == 0, "{report}");
        ensure!(totals["live"]["calls"] == 0 && totals["live"]["answeredByJournal"] == 6, "{report}");
        ensure!(llm.seen().len() == 6, "a model was asked: {}", llm.seen().len());

        let strict = env.write("strict.yaml", FLOW.replace("Review it.", "Review it strictly."))?;
        let junit = env.dir.path().join("eval.xml");
        let run = env.run(&[
            "eval", strict.to_str().context("path")?, "--workflow", "flow", "--checks", checks,
            "--json", "--junit", junit.to_str().context("path")?,
        ])?;
        ensure!(run.code == 80, "{run:?}");
        ensure!(llm.seen().len() == 8, "only the two reviewers are asked: {}", llm.seen().len());
        let report: Value = serde_json::from_str(&run.stdout)?;
        let totals = &report["totals"];
        ensure!(totals["regressed"] == 2 && totals["passed"] == 0, "{report}");
        ensure!(totals["live"]["calls"] == 2 && totals["live"]["tokens"] == 240, "{report}");
        ensure!(totals["live"]["answeredByJournal"] == 4, "{report}");
        for thread in report["threads"].as_array().context("threads")? {
            ensure!(thread["change"] == "regressed", "{thread}");
            let difference = &thread["difference"];
            ensure!(difference["step"] == 3 && difference["role"] == "review", "{thread}");
            ensure!(difference["eval"]["tokens"] == 120, "{thread}");
            // 100 tokens in at $2/M and 20 out at $10/M.
            let cost = difference["eval"]["costUsd"].as_f64().context("cost")?;
            ensure!((cost - 0.0004).abs() < 1e-9, "{thread}");
            let reasons = thread["eval"]["reasons"].to_string();
            ensure!(reasons.contains("check `approved` is false"), "{thread}");
        }
        // The table says the same to a person.
        let id = report["id"].as_str().context("id")?;
        let shown = env.run(&["eval", "show", id])?;
        ensure!(shown.code == 80, "{shown:?}");
        ensure!(shown.stdout.contains("regressed at step 3 (review): check `approved` is false"), "{}", shown.stdout);
        ensure!(shown.stdout.contains("2 regressed"), "{}", shown.stdout);

        // A JUnit parser no one here wrote reads one failing case per thread.
        let python = crate::tools::python()?;
        let read = std::process::Command::new(python)
            .arg("-c")
            .arg("import sys\nfrom junitparser import JUnitXml, Failure\nxml = JUnitXml.fromfile(sys.argv[1])\nfor suite in xml:\n    for case in suite:\n        failed = [r for r in case.result if isinstance(r, Failure)]\n        print(case.name.split()[0], 'failed' if failed else 'passed', failed[0].message if failed else '')\n")
            .arg(&junit)
            .output()?;
        let out = String::from_utf8_lossy(&read.stdout);
        ensure!(read.status.success(), "{out} {}", String::from_utf8_lossy(&read.stderr));
        for id in &ids {
            ensure!(out.contains(&format!("{id} failed regressed at step 3 (review)")), "{out}");
        }

        // The eval's threads are kept beside the recorded ones, opened and diffed as threads.
        let listed = env.json(&["threads", "flow"])?;
        ensure!(listed.as_array().map(Vec::len) == Some(2), "{listed}");
        let ours = env.json(&["threads", "--eval", id])?;
        ensure!(ours.as_array().map(Vec::len) == Some(2), "{ours}");
        let pair = &report["threads"][0];
        let (recorded, eval) = (pair["recorded"].as_str().context("id")?, pair["thread"].as_str().context("id")?);
        let diff = env.ok(&["thread", "diff", recorded, eval])?;
        ensure!(diff.contains("[3]"), "{diff}");
        ensure!(snapshot(&env, &ids)? == before, "a recorded thread changed");
        let evals = env.json(&["eval", "list"])?;
        ensure!(evals.as_array().map(Vec::len) == Some(2), "{evals}");
        Ok(())
    }

    /// `kill -9` of an eval while a thread's reviewer is being asked: `eval resume` finishes
    /// it; the thread that had ended is not run again, and no call that was answered is asked
    /// again (only the one cut short is).
    #[test]
    fn an_eval_killed_midway_is_finished_by_resume_without_asking_an_answered_call_again() -> Result<()> {
        let env = Env::new()?;
        // The recorded threads' two reviews, then the eval's first; its second is held.
        let llm = model_holding(4)?;
        let ids = recorded(&env, &llm)?;
        let strict = env.write("strict.yaml", FLOW.replace("Review it.", "Review it strictly."))?;
        let checks = env.write("checks.yaml", CHECKS)?;
        let checks = checks.to_str().context("path")?;
        // A database's lease of the killed eval runs out soon.
        let lease = ("UNCAGED_WORKFLOW_LEASE_MS", "1500");
        let mut eval = env
            .command()
            .env(lease.0, lease.1)
            .args(["eval", strict.to_str().context("path")?, "--workflow", "flow", "--concurrency", "1"])
            .args(["--checks", checks])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        crate::wait_until("the second thread's reviewer asked", || Ok(reviews(&llm) == 4))?;
        eval.kill()?;
        eval.wait()?;
        let evals = env.json(&["eval", "list"])?;
        let id = evals[0]["id"].as_str().context("id")?.to_string();
        let run = env.run_with(&["eval", "resume", &id, "--json"], &[lease])?;
        ensure!(run.code == 80, "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        ensure!(report["totals"]["regressed"] == 2 && report["finished"].is_u64(), "{report}");
        // Two recorded reviews, the eval's first, the one cut short and the one asked again.
        ensure!(reviews(&llm) == 5, "{} reviews asked", reviews(&llm));
        // Nothing but the reviews was asked again: 4 recorded other calls.
        ensure!(llm.seen().len() == ids.len() * 2 + 5, "{} calls", llm.seen().len());
        Ok(())
    }

    /// A developer asked live whose tool call is the recorded one takes the recorded result
    /// (the ledger is not written again); one with new arguments is a divergence under
    /// `--tools journal` (the ledger untouched, the thread a regression saying where), is made
    /// under `--tools live`, and refused to the model under `--tools deny`.
    #[test]
    fn a_tool_call_with_new_arguments_diverges_under_journal_and_is_made_under_live() -> Result<()> {
        use crate::mock_model::{MockModel, Turn, messages, turn_of};
        use crate::tools::{DEV_YAML, DONE, ledger_lines, ledger_server, workbench};
        let model = MockModel::start(|body| {
            let system = messages(body)[0]["content"].as_str().unwrap_or_default().to_string();
            let entry = if system.contains("carefully") { "two" } else { "one" };
            match turn_of(body) {
                1 => Turn::call("ledger__append", json!({"entry": entry})),
                _ => Turn::answer(DONE),
            }
        })?;
        let env = workbench(&model, "", &ledger_server("")?)?;
        let ledger = env.dir.path().join("ledger");
        let vars = [("LEDGER_FILE", ledger.to_str().context("path")?), ("UNCAGED_WORKFLOW_LEASE_MS", "1500")];
        let run = env.run_with(&["run", "dev", "-p", "Keep a ledger"], &vars)?;
        ensure!(run.code == 0 && ledger_lines(&ledger) == ["one"], "{run:?}");
        let eval = |file: &str, extra: &[&str]| -> Result<(i32, Value)> {
            let mut args = vec!["eval", file, "--workflow", "dev", "--json"];
            args.extend_from_slice(extra);
            let run = env.run_with(&args, &vars)?;
            Ok((run.code, serde_json::from_str(&run.stdout).with_context(|| format!("{run:?}"))?))
        };

        let same = env.write("same.yaml", DEV_YAML)?;
        let same = same.to_str().context("path")?;
        let (code, report) = eval(same, &["--live", "developer"])?;
        ensure!(code == 0 && report["totals"]["unchanged"] == 1, "{report}");
        ensure!(report["totals"]["live"]["calls"] == 1, "the developer is asked live: {report}");
        ensure!(ledger_lines(&ledger) == ["one"], "the recorded call was made again: {:?}", ledger_lines(&ledger));

        let careful = DEV_YAML.replace("You are the developer.", "You are the developer. Work carefully.");
        let careful = env.write("careful.yaml", careful)?;
        let careful = careful.to_str().context("path")?;
        let (code, report) = eval(careful, &[])?;
        ensure!(code == 80 && report["totals"]["regressed"] == 1, "{report}");
        let reasons = report["threads"][0]["eval"]["reasons"].to_string();
        ensure!(reasons.contains("diverged from recorded thread") && reasons.contains("ledger__append"), "{report}");
        ensure!(ledger_lines(&ledger) == ["one"], "{:?}", ledger_lines(&ledger));

        let (code, report) = eval(careful, &["--tools", "deny"])?;
        ensure!(code == 0 && report["totals"]["unchanged"] == 1, "{report}");
        ensure!(ledger_lines(&ledger) == ["one"], "{:?}", ledger_lines(&ledger));
        let denied = model.seen().iter().any(|body| {
            messages(body).iter().any(|m| m["role"] == "tool" && m["content"].as_str().unwrap_or_default().contains("--tools deny"))
        });
        ensure!(denied, "the model was not told the call was refused");

        let (code, report) = eval(careful, &["--tools", "live"])?;
        ensure!(code == 0 && report["totals"]["unchanged"] == 1, "{report}");
        ensure!(ledger_lines(&ledger) == ["one", "two"], "{:?}", ledger_lines(&ledger));
        Ok(())
    }

    /// The HTML page `eval --html` writes and the web view's eval page, in a headless
    /// Chromium: both show the comparison (the totals, the first difference side by side, the
    /// diff), the model's markup as text. The API starts an eval and reads its report, and
    /// refuses a binding to a command.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_html_report_and_the_web_views_eval_page_show_the_comparison() -> Result<()> {
        use crate::web::{Driver, eval as script, wait_for};
        let env = Env::new()?;
        let llm = model()?;
        recorded(&env, &llm)?;
        let checks = env.write("checks.yaml", CHECKS)?;
        let strict = env.write("strict.yaml", FLOW.replace("Review it.", "Review it strictly."))?;
        let page = env.dir.path().join("report.html");
        let run = env.run(&[
            "eval", strict.to_str().context("path")?, "--workflow", "flow",
            "--checks", checks.to_str().context("path")?, "--html", page.to_str().context("path")?, "--json",
        ])?;
        ensure!(run.code == 80, "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        let id = report["id"].as_str().context("id")?.to_string();

        let token = "evals-test-token-0123456789";
        let serve = crate::Serve::start(&env, &["--no-schedules", "--token", token], &[])?;
        let base = format!("http://{}", serve.addr);
        let driver = Driver::start()?;
        let browser = driver.browser().await?;
        let shows_the_comparison = |what: &'static str| {
            let browser = browser.clone();
            async move {
                wait_for(&browser, what, "return document.querySelector('.eval-report section.pair') !== null").await?;
                let shown = script(&browser, "const r = document.querySelector('.eval-report'); return {
                    regressed: r.querySelector('[data-total=regressed] b').textContent,
                    pairs: r.querySelectorAll('section.pair').length,
                    removed: r.querySelectorAll('.diff .del').length,
                    added: r.querySelectorAll('.diff .ins').length,
                    answer: r.querySelector('.side[data-side=eval] pre.answer').textContent,
                    images: r.querySelectorAll('img').length,
                    pwned: window.pwned === undefined ? null : window.pwned };").await?;
                ensure!(shown["regressed"] == "2" && shown["pairs"] == 2, "{what}: {shown}");
                ensure!(shown["removed"].as_u64() >= Some(1) && shown["added"].as_u64() >= Some(1), "{what}: {shown}");
                let answer = shown["answer"].as_str().unwrap_or_default();
                ensure!(answer.contains("<img src=x") && answer.contains("\"approved\": false"), "{what}: {shown}");
                ensure!(shown["images"] == 0 && shown["pwned"].is_null(), "{what}: markup ran: {shown}");
                anyhow::Ok(())
            }
        };
        let result = async {
            browser.goto(&format!("file://{}", page.display())).await?;
            shows_the_comparison("the HTML report").await?;
            // The web view lists the eval, and its page shows the same.
            browser.goto(&format!("{base}/?token={token}#/evals")).await?;
            wait_for(&browser, "the evals list", &format!("return document.querySelector('tr[data-eval=\"{id}\"]') !== null")).await?;
            browser.goto(&format!("{base}/#/eval/{id}")).await?;
            shows_the_comparison("the web view's eval page").await?;
            anyhow::Ok(())
        }
        .await;
        browser.close().await?;
        result?;

        // The API: an eval of the current version asking the reviewer again, and its report.
        let http = uncaged_workflow::http::client_builder().timeout(Duration::from_secs(60)).build()?;
        let api = format!("{base}/api/v1");
        let started = http.post(format!("{api}/evals")).bearer_auth(token)
            .json(&json!({"workflow": "flow", "live": ["review"], "checks": [{"name": "approved", "expr": "$steps.review.meta.approved = true"}]}))
            .send().await?;
        ensure!(started.status().as_u16() == 202, "{:?}", started.text().await?);
        let started: Value = started.json().await?;
        ensure!(started["threads"] == 2, "{started}");
        let id = started["id"].as_str().context("id")?.to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let report = loop {
            let report: Value = http.get(format!("{api}/evals/{id}")).bearer_auth(token).send().await?.json().await?;
            if report["finished"].is_u64() {
                break report;
            }
            ensure!(std::time::Instant::now() < deadline, "the eval did not finish: {report}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ensure!(report["totals"]["unchanged"] == 2 && report["totals"]["live"]["calls"] == 2, "{report}");
        let listed: Value = http.get(format!("{api}/evals")).bearer_auth(token).send().await?.json().await?;
        ensure!(listed.as_array().map(Vec::len) == Some(2), "{listed}");
        let refused = http.post(format!("{api}/evals")).bearer_auth(token)
            .json(&json!({"workflow": "flow", "agentFor": {"review": "command:/bin/sh -c id"}}))
            .send().await?;
        ensure!(refused.status().as_u16() == 400, "{:?}", refused.text().await?);
        Ok(())
    }

    /// A budget of one live call: the eval asks one reviewer, starts no further thread, says
    /// why it stopped and exits 75; `eval resume` with a larger budget finishes it.
    #[test]
    fn an_eval_stops_asking_when_its_budget_is_spent_and_a_larger_one_finishes_it() -> Result<()> {
        let env = Env::new()?;
        let llm = model()?;
        recorded(&env, &llm)?;
        let same = env.write("same.yaml", FLOW)?;
        let run = env.run(&[
            "eval", same.to_str().context("path")?, "--workflow", "flow", "--live", "review",
            "--max-agent-calls", "1", "--concurrency", "1", "--json",
        ])?;
        ensure!(run.code == 75, "{run:?}");
        ensure!(run.stderr.contains("stopped asking: the eval's budget: 1 agent calls made and 1 more asked, of a budget of 1"), "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        ensure!(report["totals"]["unchanged"] == 1 && report["totals"]["pending"] == 1, "{report}");
        ensure!(llm.seen().len() == 7, "{} calls", llm.seen().len());
        let id = report["id"].as_str().context("id")?;
        let run = env.run(&["eval", "resume", id, "--max-agent-calls", "2", "--json"])?;
        ensure!(run.code == 0, "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        ensure!(report["totals"]["unchanged"] == 2 && report["finished"].is_u64(), "{report}");
        ensure!(llm.seen().len() == 8, "{} calls", llm.seen().len());
        Ok(())
    }

    /// An LLM judge named by the eval file compares each thread's recorded and new reviews,
    /// whichever it is shown first, and its tokens are counted apart from the eval's.
    #[test]
    fn an_llm_judge_prefers_the_better_answer_whichever_comes_first() -> Result<()> {
        let env = Env::new()?;
        let llm = model()?;
        recorded(&env, &llm)?;
        let file = env.write("judged.yaml", format!("{CHECKS}judge:\n  agent: local\n  role: review\n"))?;
        let strict = env.write("strict.yaml", FLOW.replace("Review it.", "Review it strictly."))?;
        let run = env.run(&[
            "eval", strict.to_str().context("path")?, "--workflow", "flow",
            "--checks", file.to_str().context("path")?, "--json",
        ])?;
        ensure!(run.code == 80, "{run:?}");
        let report: Value = serde_json::from_str(&run.stdout)?;
        for thread in report["threads"].as_array().context("threads")? {
            ensure!(thread["judge"]["preferred"] == "baseline", "{thread}");
            ensure!(thread["judge"]["reason"] == "it approves", "{thread}");
        }
        let judged = &report["totals"]["judge"];
        ensure!(judged["baseline"] == 2 && judged["tokens"] == 240, "{report}");
        ensure!(report["totals"]["live"]["calls"] == 2, "the judge's calls are not the eval's: {report}");
        // Asked once per thread: showing the report again asks nothing.
        let asked = llm.seen().len();
        let shown = env.run(&["eval", "show", report["id"].as_str().context("id")?, "--json"])?;
        ensure!(shown.code == 80, "{shown:?}");
        ensure!(llm.seen().len() == asked && asked == 6 + 2 + 2, "{asked}");
        Ok(())
    }

    /// A saved set is the same threads whatever runs after; an eval of it runs those.
    #[test]
    fn an_eval_of_a_saved_set_runs_the_threads_saved() -> Result<()> {
        let env = Env::new()?;
        let llm = model()?;
        let ids = recorded(&env, &llm)?;
        let saved = env.ok(&["eval", "set", "save", "first", "--workflow", "flow", "--threads", &ids[0]])?;
        ensure!(saved.contains("saved eval set first of flow: 1 thread(s)"), "{saved}");
        env.ok(&["run", "flow", "-p", "three"])?;
        let same = env.write("same.yaml", FLOW)?;
        let report = env.json(&["eval", same.to_str().context("path")?, "--workflow", "flow", "--set", "first"])?;
        let threads = report["threads"].as_array().context("threads")?;
        ensure!(threads.len() == 1 && threads[0]["recorded"] == ids[0].as_str(), "{report}");
        let sets = env.json(&["eval", "set", "list"])?;
        ensure!(sets[0]["name"] == "first" && sets[0]["threads"].as_array().map(Vec::len) == Some(1), "{sets}");
        ensure!(env.run(&["eval", "set", "save", "../x", "--workflow", "flow", "--last", "1"])?.code == 64);
        let run = env.run(&["eval", same.to_str().context("path")?, "--workflow", "flow", "--set", "nope"])?;
        ensure!(run.code == 64 && run.stderr.contains("no eval set `nope`"), "{run:?}");
        Ok(())
    }
}
