//! MCP servers that ask for OAuth 2.1: a server written with the official Python SDK's auth
//! support (its authorization-server routes: metadata, dynamic client registration, the
//! authorization code with PKCE, refresh), which `tools login` signs in to once in a browser
//! (the test plays the browser), whose tokens every worker then sends and refreshes from the
//! store, and whose revoked grant leaves a thread resting until a person signs in again.

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::mock_model::{MockModel, Turn, tool_results, turn_of};
use crate::tools::{DONE, KillOnDrop, python, test_server, workbench};
use crate::{Env, status};

/// The OAuth server, its port and the file of what it did.
fn oauth_server(dir: &Path) -> Result<(KillOnDrop, String)> {
    let mut server = std::process::Command::new(python()?)
        .arg(test_server("oauth_server.py")?)
        .env("EVENTS", dir.join("events"))
        .env("REFUSE_REFRESH", dir.join("refuse-refresh"))
        .stdout(Stdio::piped())
        .spawn()?;
    let stop = KillOnDrop(server.id());
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().context("stdout")?).read_line(&mut line)?;
    let port = line.trim().strip_prefix("port ").context("the server's port")?.to_string();
    Ok((stop, port))
}

/// What the server did, in order.
fn events(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("events")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect()
}

/// `tools login tracker`, with the test as the browser: it opens the address the command
/// prints, and follows the authorization server's redirect back to the command's listener.
fn login(env: &Env) -> Result<()> {
    let mut child = env
        .command()
        .args(["tools", "login", "tracker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = std::io::BufReader::new(child.stderr.take().context("stderr")?);
    let mut address = None;
    let mut said = Vec::new();
    let mut lines = stderr.lines();
    for line in lines.by_ref() {
        let line = line?;
        if let Some(found) = line.trim().strip_prefix("http://") {
            address = Some(format!("http://{found}"));
            break;
        }
        said.push(line);
    }
    let address = address.with_context(|| format!("no sign-in address printed: {said:?}"))?;
    // The rest of what it says is read too, as a terminal would.
    let rest = std::thread::spawn(move || lines.count());
    let (code, page) =
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
            let page =
                uncaged_workflow::http::client_builder().build()?.get(&address).send().await?;
            Ok::<_, anyhow::Error>((page.status().as_u16(), page.text().await?))
        })?;
    ensure!(code == 200 && page.contains("Signed in"), "{code}: {page}");
    let out = child.wait_with_output()?;
    let _ = rest.join();
    ensure!(out.status.success(), "{out:?}");
    ensure!(String::from_utf8_lossy(&out.stdout).contains("signed in to `tracker`"), "{out:?}");
    Ok(())
}

/// Moves the time the kept access token was received back to the epoch: the next call finds
/// it run out, as it would be a day later, without the test waiting for a day.
fn age_token(env: &Env) -> Result<()> {
    if env.store.is_some() {
        env.sql(
            "UPDATE tool_credentials SET credentials = \
             jsonb_set(credentials::jsonb, '{token_received_at}', '0')::text",
        )?;
        return Ok(());
    }
    for file in std::fs::read_dir(env.home().join("credentials"))?.flatten() {
        let mut kept: Value = serde_json::from_str(&std::fs::read_to_string(file.path())?)?;
        kept["token_received_at"] = json!(0);
        std::fs::write(file.path(), kept.to_string())?;
    }
    Ok(())
}

/// The credentials kept for the one server, as the OAuth client wrote them.
fn kept_credentials(env: &Env) -> Result<Value> {
    let text = match env.store.is_some() {
        true => env.sql("SELECT credentials FROM tool_credentials")?,
        false => {
            let file = std::fs::read_dir(env.home().join("credentials"))?.flatten().next();
            std::fs::read_to_string(file.context("a credentials file")?.path())?
        }
    };
    Ok(serde_json::from_str(text.trim())?)
}

/// The thread `run` started, and why it rests if it does.
fn started(env: &Env, args: &[&str]) -> Result<(String, Value)> {
    let run = env.run(args)?;
    let thread = crate::thread_id_of(&run.stdout).with_context(|| format!("{run:?}"))?;
    Ok((thread.clone(), env.json(&["thread", &thread])?))
}

on_both_stores! {
    #[test]
    fn a_server_that_asks_for_oauth_is_signed_in_to_once_and_its_tokens_refreshed() -> Result<()> {
        let scratch = crate::scratch::tempdir()?;
        let (_server, port) = oauth_server(scratch.path())?;
        let model = MockModel::start(|body| match turn_of(body) {
            1 => Turn::call("tracker__open_issues", json!({})),
            _ => Turn::answer(DONE),
        })?;
        let tools = format!("      tracker:\n        url: http://127.0.0.1:{port}/mcp\n        oauth: {{}}\n");
        let env = workbench(&model, "", &tools)?;

        // Nobody has signed in: the thread rests, saying what a person is to do.
        let run = env.run(&["run", "dev", "-p", "Triage"])?;
        ensure!(run.code == 75 && run.stdout.contains("needs a person to sign in"), "{run:?}");
        let (thread, shown) = started(&env, &["run", "dev", "-p", "Triage"])?;
        ensure!(shown["status"] == "paused" && shown["paused"]["by"] == "signin", "{shown}");
        let reason = shown["paused"]["reason"].as_str().context("a reason")?;
        ensure!(reason.contains("run `uncaged-workflow tools login tracker`, then resume the thread"), "{reason}");

        // Signed in once, in the browser: registered dynamically, the code exchanged with
        // PKCE, the tokens kept in the store (on a home, a file only its owner reads).
        login(&env)?;
        assert_eq!(events(scratch.path()), ["registered", "authorized", "token"]);
        if env.store.is_some() {
            assert_eq!(env.sql("SELECT count(*) FROM tool_credentials")?.trim(), "1");
        } else {
            use std::os::unix::fs::PermissionsExt;
            let files: Vec<_> = std::fs::read_dir(env.home().join("credentials"))?.flatten().collect();
            ensure!(files.len() == 1, "{files:?}");
            assert_eq!(files[0].metadata()?.permissions().mode() & 0o777, 0o600);
        }
        let resumed = env.run(&["resume", &thread])?;
        ensure!(resumed.code == 0, "{resumed:?}");
        assert_eq!(status(&env, &thread)?, "completed");
        let results = tool_results(&model.seen().last().cloned().unwrap_or_default());
        ensure!(results[0].1.starts_with("2 open issues"), "{results:?}");

        // A token that ran out is refreshed, and the new one kept, with no person asked.
        age_token(&env)?;
        let (refreshed, shown) = started(&env, &["run", "dev", "-p", "Again"])?;
        ensure!(shown["status"] == "completed", "{refreshed}: {shown}");
        ensure!(events(scratch.path()).contains(&"refreshed".to_string()), "{:?}", events(scratch.path()));

        // A grant the server revoked cannot be refreshed: the thread rests until a person
        // signs in again, and then goes on.
        std::fs::write(scratch.path().join("refuse-refresh"), "")?;
        age_token(&env)?;
        let (refused, shown) = started(&env, &["run", "dev", "-p", "Revoked"])?;
        ensure!(shown["status"] == "paused" && shown["paused"]["by"] == "signin", "{shown}");
        let reason = shown["paused"]["reason"].as_str().context("a reason")?;
        ensure!(reason.contains("its sign-in ran out and was not renewed"), "{reason}");
        ensure!(events(scratch.path()).contains(&"refresh-refused".to_string()));
        std::fs::remove_file(scratch.path().join("refuse-refresh"))?;
        login(&env)?;
        let resumed = env.run(&["resume", &refused])?;
        ensure!(resumed.code == 0, "{resumed:?}");
        assert_eq!(status(&env, &refused)?, "completed");
        // The tokens reach no record of the thread: not its debug log, not its journal.
        let kept = kept_credentials(&env)?;
        let token = kept["token_response"]["access_token"].as_str().context("a token")?;
        let refresh = kept["token_response"]["refresh_token"].as_str().context("a refresh token")?;
        let hash = env.json(&["thread", &refused])?["start"]["hash"].as_str().context("hash")?.to_string();
        let recorded = format!("{}{:?}", env.info_text(&hash, &refused)?, env.calls(&hash, &refused)?);
        ensure!(recorded.contains("tracker__open_issues"), "the journal holds the loop");
        ensure!(!recorded.contains(token) && !recorded.contains(refresh), "a token was recorded");

        // Signed out: the next thread rests again.
        env.ok(&["tools", "logout", "tracker"])?;
        let (_, shown) = started(&env, &["run", "dev", "-p", "Out"])?;
        ensure!(shown["paused"]["by"] == "signin", "{shown}");
        Ok(())
    }
}

#[test]
fn login_names_what_it_cannot_sign_in_to() -> Result<()> {
    let model = MockModel::start(|_| Turn::answer(DONE))?;
    let env = workbench(&model, "", "      plain:\n        url: http://127.0.0.1:9/mcp\n")?;
    let e = env.fails(&["tools", "login", "nope"], 64)?;
    ensure!(e.contains("no binding in config.yaml has a tool server `nope`"), "{e}");
    let e = env.fails(&["tools", "login", "plain"], 64)?;
    ensure!(e.contains("tool server `plain` does not sign in with OAuth"), "{e}");
    let both = "      both:\n        url: http://127.0.0.1:9/mcp\n        oauth: {}\n        \
                headers:\n          Authorization: \"Bearer x\"\n";
    let env = workbench(&model, "", both)?;
    let run = env.run(&["tools", "login", "both"])?;
    ensure!(
        run.code != 0
            && run.stderr.contains("has `oauth` and an `Authorization` header: choose one"),
        "{run:?}"
    );
    Ok(())
}
