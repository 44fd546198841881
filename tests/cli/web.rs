//! The web view, in a real headless Chromium driven over WebDriver (the distribution's
//! `chromium` and `chromium-driver`, which `make test` installs): live steps, kill from the
//! page, hostile text rendered as text; and the server's guards, over plain HTTP.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

use super::{Env, Serve, status, wait_until};

/// A ChromeDriver on an ephemeral loopback port, killed when dropped.
pub struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    pub fn start() -> Result<Driver> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start chromedriver (`make test` installs chromium-driver)")?;
        let driver = Driver { child, port };
        wait_until("chromedriver listens", || {
            Ok(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
        })?;
        Ok(driver)
    }

    pub async fn browser(&self) -> Result<Client> {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({"args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1100", "--lang=en-US",
            ]}),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .context("open a Chromium session")?;
        Ok(client)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CSRF token the page carries for its actions.
pub fn csrf_of(html: &str) -> Result<String> {
    let after = html.split("name=\"csrf\" content=\"").nth(1).context("no CSRF token")?;
    Ok(after.split('"').next().unwrap_or_default().to_string())
}

/// Types `text` into the element with id `id`, or clicks it (`text` None). The page redraws
/// when its thread changes, and an element found just before a redraw is gone by the time it
/// is used: then it is found again.
pub async fn interact(browser: &Client, id: &str, text: Option<&str>) -> Result<()> {
    let mut last = None;
    for _ in 0..50 {
        let done = async {
            let element = browser.wait().for_element(fantoccini::Locator::Id(id)).await?;
            match text {
                Some(text) => {
                    // What a redraw carried over from a try cut short is typed again whole.
                    element.clear().await?;
                    element.send_keys(text).await
                }
                None => element.click().await,
            }
        };
        match done.await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow::anyhow!("#{id}: {:?}", last))
}

/// Evaluates `script` (a function body) in the page.
pub async fn eval(browser: &Client, script: &str) -> Result<Value> {
    Ok(browser.execute(script, vec![]).await?)
}

/// Waits until `script` returns true in the page (60 s at most, a bound for a hung test).
pub async fn wait_for(browser: &Client, what: &str, script: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if eval(browser, script).await? == json!(true) {
            return Ok(());
        }
        ensure!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A command agent that answers one call each time the file `go` appears (and removes it).
fn gated_agent(env: &Env) -> Result<String> {
    let gate = env.dir.path().join("go");
    let script = env.write_script(
        "gated.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
{wait}
rm -f {gate}
case "$input" in
  *'"name":"reviewer"'*) echo '{{"content": "LGTM", "meta": {{"approved": true}}}}' ;;
  *) echo 'Done. {{"steps": ["a"], "summary": "did a"}}' ;;
esac
"#,
            wait = crate::sh_wait_for(&gate),
            gate = gate.display()
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// Text meant to run if a page ever treated it as markup.
const HOSTILE: &str = r#"<script>window.__pwned = 'script'</script><img src=x onerror="window.__pwned = 'img'"> <a href="javascript:window.__pwned = 'link'">click me</a> <svg onload="window.__pwned = 'svg'"></svg>"#;

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[tokio::test]
async fn actions_need_the_page_token_and_this_origin_and_a_token_guards_every_request() -> Result<()>
{
    let env = Env::new()?;
    env.add_solve_issue()?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let http = uncaged_workflow::http::client_builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let base = format!("http://{}", serve.addr);
    let page = http.get(format!("{base}/")).send().await?;
    let csp = page.headers()["content-security-policy"].to_str()?.to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let html = page.text().await?;
    let csrf = csrf_of(&html)?;
    let id = "01KQXKW18CT8G75T53R8F4G7YG";
    let kill = format!("{base}/api/v1/threads/{id}/kill");
    // No token, a wrong one, another origin, another site: refused before anything runs.
    assert_eq!(http.post(&kill).send().await?.status(), 401);
    assert_eq!(
        http.post(&kill).header("x-uncaged-csrf", "0".repeat(32)).send().await?.status(),
        401
    );
    let foreign = http
        .post(&kill)
        .header("x-uncaged-csrf", &csrf)
        .header("origin", "http://evil.example")
        .send()
        .await?;
    assert_eq!(foreign.status(), 401);
    let cross = http
        .post(&kill)
        .header("x-uncaged-csrf", &csrf)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await?;
    assert_eq!(cross.status(), 401);
    // With it, the action reaches the library, which says the thread does not exist.
    let allowed = http.post(&kill).header("x-uncaged-csrf", &csrf).send().await?;
    assert_eq!(allowed.status(), 404);
    let body: Value = allowed.json().await?;
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(
        body["error"]["message"],
        format!("no thread `{id}` (see `uncaged-workflow threads`)")
    );
    // A page of another site that rebinds its name to 127.0.0.1 is not answered.
    let rebound =
        http.get(format!("{base}/api/v1/threads")).header("host", "evil.example").send().await?;
    assert_eq!(rebound.status(), 421);
    drop(serve);

    // With a token, every request needs it; visiting /?token= sets a cookie and drops it from
    // the address.
    let token = "abcdefghijklmnop0123";
    let serve = Serve::start(&env, &["--no-schedules", "--token", token], &[])?;
    let base = format!("http://{}", serve.addr);
    assert_eq!(http.get(format!("{base}/api/v1/threads")).send().await?.status(), 401);
    let bearer = http.get(format!("{base}/api/v1/threads")).bearer_auth(token).send().await?;
    assert_eq!(bearer.status(), 200);
    let visit = http.get(format!("{base}/?token={token}")).send().await?;
    assert_eq!(visit.status(), 303);
    assert_eq!(visit.headers()["location"], "/");
    let cookie = visit.headers()["set-cookie"].to_str()?.to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let with_cookie = http
        .get(format!("{base}/"))
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await?;
    assert_eq!(with_cookie.status(), 200);
    let e = env.fails(&["serve", "--listen", "127.0.0.1:0", "--token", "short"], 64)?;
    assert!(e.contains("the token must be at least 16 characters"), "{e}");
    drop(serve);

    // config.yaml names the variable holding the token (the token is not in the file).
    std::fs::write(env.home().join("config.yaml"), "serve:\n  token_env: WEB_TOKEN\n")?;
    let e = env.fails(&["serve", "--listen", "127.0.0.1:0"], 64)?;
    assert!(e.contains("serve.token_env names `WEB_TOKEN`, which is not set"), "{e}");
    let serve = Serve::start(&env, &["--no-schedules"], &[("WEB_TOKEN", token)])?;
    let base = format!("http://{}", serve.addr);
    assert_eq!(http.get(format!("{base}/api/v1/threads")).send().await?.status(), 401);
    let bearer = http.get(format!("{base}/api/v1/threads")).bearer_auth(token).send().await?;
    assert_eq!(bearer.status(), 200);
    Ok(())
}

#[tokio::test]
async fn the_actions_answer_fork_pause_and_resume_threads() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let base = format!("http://{}", serve.addr);
    let http = uncaged_workflow::http::client_builder().build()?;
    let html = http.get(format!("{base}/")).send().await?.text().await?;
    let csrf = csrf_of(&html)?;
    let post = |id: String, action: &'static str, body: Value| {
        let request = http
            .post(format!("{base}/api/v1/threads/{id}/{action}"))
            .header("x-uncaged-csrf", &csrf)
            .json(&body);
        async move {
            let response = request.send().await?;
            let status = response.status().as_u16();
            Ok::<_, anyhow::Error>((status, response.json::<Value>().await?))
        }
    };

    // A thread waiting for a person: answered from the page, it continues with the answer.
    let waiting =
        env.ok(&["run", "solve-issue", "-p", "y", "--agent-for", "reviewer=human", "--detach"])?;
    let waiting = waiting.trim().to_string();
    wait_until("the thread waits", || Ok(status(&env, &waiting)? == "waiting"))?;
    let (code, body) =
        post(waiting.clone(), "answer", json!({"text": "LGTM {\"approved\": true}"})).await?;
    assert_eq!((code, &body["thread"]), (200, &json!(waiting)), "{body}");
    wait_until("the answered thread goes on", || Ok(status(&env, &waiting)? != "waiting"))?;
    let record = env.json(&["thread", &waiting])?;
    let answered = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["content"] == "LGTM {\"approved\": true}");
    assert!(answered, "{record}");
    // Answering a thread that no longer waits is the library's one-line refusal.
    wait_until("it ends", || Ok(status(&env, &waiting)? != "running"))?;
    let (code, body) = post(waiting.clone(), "answer", json!({"text": "again"})).await?;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("it is not waiting for a human answer"),
        "{body}"
    );

    // Fork after step 1: a new thread with that step, run on.
    let (code, body) = post(waiting.clone(), "fork", json!({"at": 1})).await?;
    assert_eq!(code, 200, "{body}");
    let fork = body["thread"].as_str().context("the fork's id")?.to_string();
    let forked = env.json(&["thread", &fork])?;
    assert_eq!(forked["start"]["forkedFrom"], json!({"threadId": waiting, "step": 1}));

    // Pause a running thread, then resume it, from the page.
    let gated = gated_agent(&env)?;
    let id = env
        .ok(&["run", "solve-issue", "-p", "z", "--agent", &gated, "--detach"])?
        .trim()
        .to_string();
    wait_until("it runs", || Ok(status(&env, &id)? == "running"))?;
    let (code, body) = post(id.clone(), "pause", json!({})).await?;
    assert_eq!(code, 200, "{body}");
    std::fs::write(env.dir.path().join("go"), "")?;
    wait_until("it pauses after its step", || Ok(status(&env, &id)? == "paused"))?;
    assert_eq!(env.json(&["thread", &id])?["steps"].as_array().unwrap().len(), 1);
    let (code, body) = post(id.clone(), "resume", json!({})).await?;
    assert_eq!(code, 200, "{body}");
    wait_until("it runs again", || Ok(status(&env, &id)? == "running"))?;
    let (code, _) = post(id.clone(), "kill", json!({})).await?;
    assert_eq!(code, 200);
    wait_until("it is killed", || Ok(status(&env, &id)? == "killed"))?;
    let (code, body) = post(id.clone(), "explode", json!({})).await?;
    assert_eq!(code, 404, "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_shows_threads_live_kills_from_the_page_and_renders_hostile_text_as_text()
-> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    // A workflow whose descriptor is hostile, run by an agent whose answers are.
    let flow = env.write(
        "hostile.yaml",
        format!(
            "description: {desc}\nroles:\n  writer:\n    description: {desc}\nsteps:\n  - id: writer\n    role: writer\n    description: {desc}\n",
            desc = serde_json::to_string(HOSTILE)?
        ),
    )?;
    env.ok(&["add", "hostile", flow.to_str().unwrap()])?;
    let long_line = "x".repeat(100_000);
    // And a right-to-left override, which would reverse what follows it on screen.
    let answer = json!({"content": format!("{HOSTILE}\u{202e}desrever\n{long_line}"), "meta": {"html": HOSTILE, "link": "javascript:alert(1)"}});
    let agent = env.write_script(
        "hostile.sh",
        format!("#!/bin/sh\ncat > /dev/null\ncat <<'EOF'\n{answer}\nEOF\n"),
    )?;
    let out = env.ok(&[
        "run",
        "hostile",
        "-p",
        HOSTILE,
        "--agent",
        &format!("command:{}", agent.display()),
    ])?;
    let hostile = crate::thread_id_of(&out)?;

    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let base = format!("http://{}", serve.addr);
    let driver = Driver::start()?;
    let browser = driver.browser().await?;
    let result = async {
        // A thread running live: its steps appear as they land, without a reload.
        let gated = gated_agent(&env)?;
        let id = env.ok(&["run", "solve-issue", "-p", "Fix the crash", "--agent", &gated, "--detach"])?;
        let id = id.trim().to_string();
        browser.goto(&format!("{base}/#/thread/{id}")).await?;
        wait_for(&browser, "the thread page", &format!("return document.querySelector('#view h1')?.textContent.includes('{id}') === true")).await?;
        let steps = "return document.querySelectorAll('#view details.step').length";
        assert_eq!(eval(&browser, steps).await?, json!(0));
        wait_for(&browser, "the planner at work", "return document.getElementById('working')?.textContent.includes('planner is working') === true").await?;
        for n in 1..=2 {
            std::fs::write(env.dir.path().join("go"), "")?;
            wait_for(&browser, &format!("step {n} on the page"), &format!("{steps} === {n}")).await?;
        }
        wait_for(&browser, "the running node", "return document.querySelector('svg.graph g.node.running') !== null").await?;
        // The screenshot kept for the README: a thread at work.
        let png = browser.screenshot().await?;
        let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        std::fs::create_dir_all(&target)?;
        std::fs::write(target.join("web-view-thread.png"), png)?;

        // Kill from the page; the CLI sees it killed.
        interact(&browser, "kill", None).await?;
        wait_until("the thread is killed", || Ok(status(&env, &id)? == "killed"))?;
        wait_for(&browser, "the page shows the end", "return document.getElementById('end')?.textContent.includes('killed') === true").await?;

        // Hostile text is text: nothing ran, no element came from it, all of it is shown.
        browser.goto(&format!("{base}/#/thread/{hostile}")).await?;
        wait_for(&browser, "the hostile thread's steps", "return document.querySelectorAll('#view details.step').length === 1").await?;
        eval(&browser, "document.querySelectorAll('details').forEach(d => d.open = true); return true").await?;
        browser.goto(&format!("{base}/#/workflows")).await?;
        wait_for(&browser, "the workflows", "return document.querySelectorAll('#view .panel:not(.start)').length === 2").await?;
        for page in [format!("#/thread/{hostile}"), "#/workflows".into(), "#/".into()] {
            browser.goto(&format!("{base}/{page}")).await?;
            let shown = format!("return document.getElementById('view').dataset.route === '{page}'");
            wait_for(&browser, &page, &shown).await?;
            let checks = eval(
                &browser,
                r#"document.querySelectorAll('details').forEach(d => d.open = true);
                const view = document.getElementById('view');
                return {
                  pwned: window.__pwned ?? null,
                  markup: view.querySelectorAll('script, img, iframe, object, embed, [onerror], [onload]').length,
                  links: [...view.querySelectorAll('a')].map(a => a.getAttribute('href')).filter(h => !h.startsWith('#/')),
                  shown: view.textContent.includes("<script>window.__pwned = 'script'</script>"),
                  wide: document.documentElement.scrollWidth > window.innerWidth + 1,
                };"#,
            )
            .await?;
            assert_eq!(
                checks,
                json!({"pwned": null, "markup": 0, "links": [], "shown": true, "wide": false}),
                "{page}"
            );
        }
        // Characters that reorder or hide text are shown escaped, as the CLI shows them.
        browser.goto(&format!("{base}/#/thread/{hostile}")).await?;
        wait_for(&browser, "the hostile thread again", "return document.querySelectorAll('#view details.step').length === 1").await?;
        let bidi = eval(&browser, r#"document.querySelectorAll('details').forEach(d => d.open = true);
            const text = document.getElementById('view').textContent;
            return [text.includes(String.fromCodePoint(0x202e)), text.includes('\\u{202e}desrever')];"#).await?;
        assert_eq!(bidi, json!([false, true]));
        browser.goto(&format!("{base}/#/")).await?;
        wait_for(&browser, "the list", "return document.querySelectorAll('#threads tbody tr').length === 2").await?;
        // The list: both threads, newest first.
        let ids = eval(&browser, "return [...document.querySelectorAll('#threads tbody tr')].map(r => r.dataset.thread)").await?;
        assert_eq!(ids, json!([id, hostile]));

        // A person answers a waiting thread on its page, while other threads change.
        let waiting = env.ok(&["run", "solve-issue", "-p", "w", "--agent-for", "reviewer=human", "--detach"])?;
        let waiting = waiting.trim().to_string();
        wait_until("the thread waits", || Ok(status(&env, &waiting)? == "waiting"))?;
        browser.goto(&format!("{base}/#/thread/{waiting}")).await?;
        interact(&browser, "answer-text", Some("LGTM {\"approved\": true}")).await?;
        env.ok(&["run", "solve-issue", "-p", "meanwhile"])?;
        let typed = "return document.getElementById('answer-text').value";
        assert_eq!(eval(&browser, typed).await?, json!("LGTM {\"approved\": true}"));
        interact(&browser, "answer", None).await?;
        wait_until("the answered thread ends", || Ok(status(&env, &waiting)? == "completed"))?;
        let record = env.json(&["thread", &waiting])?;
        let answered = record["steps"].as_array().unwrap().iter().any(|s| s["content"] == "LGTM {\"approved\": true}");
        assert!(answered, "{record}");

        // A thread started from the page, through the API: the page opens it, and it runs.
        browser.goto(&format!("{base}/#/workflows")).await?;
        interact(&browser, "start-prompt", Some("Started from the page")).await?;
        let chosen = browser.wait().for_element(fantoccini::Locator::Id("start-workflow")).await?;
        chosen.select_by_value("solve-issue").await?;
        // The workflow's declared input is a field per property; data it refuses is named, and
        // starts nothing.
        interact(&browser, "start-data-issue", Some("0")).await?;
        interact(&browser, "start", None).await?;
        let named = "return document.getElementById('notice').textContent.includes('(at `/issue`)')";
        wait_for(&browser, "the refusal names the field", named).await?;
        interact(&browser, "start-data-issue", Some("7")).await?;
        interact(&browser, "start-data-title", Some("<b>crash</b>")).await?;
        interact(&browser, "start", None).await?;
        wait_for(&browser, "the started thread's page", "return location.hash.startsWith('#/thread/')").await?;
        let started = eval(&browser, "return location.hash.slice('#/thread/'.length)").await?;
        let started = started.as_str().context("an id")?.to_string();
        wait_until("the started thread ends", || Ok(status(&env, &started)? == "completed"))?;
        let record = env.json(&["thread", &started])?;
        assert_eq!(record["start"]["parameters"]["prompt"], "Started from the page");
        assert_eq!(record["start"]["triggerData"], json!({"issue": 7, "title": "<b>crash</b>"}));
        // Who started it is shown: on its page, and in the list.
        wait_for(&browser, "who started it", "return document.getElementById('started-by')?.textContent === 'Started by api page'").await?;
        browser.goto(&format!("{base}/#/")).await?;
        let row = format!("return document.querySelector('#threads tbody tr[data-thread=\"{started}\"]')?.textContent.includes('api page') === true");
        wait_for(&browser, "the list names who started it", &row).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    // Stopped while the page is still open on its live view: it exits, not waits for it.
    let stopped = serve.stop();
    browser.close().await?;
    result.and(stopped)
}
}
