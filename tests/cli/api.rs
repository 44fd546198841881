//! The HTTP API (`/api/v1`) as another system calls it: `serve` on loopback with an ephemeral
//! port, tokens made with `token create`, real HTTP. Each test runs on both stores.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, Serve, wait_until};

/// The thread a `serve` armed to crash at `point` leaves when `send` starts one through it:
/// the server dies before it answers, and the thread has never run — queued on a database,
/// interrupted on a home directory (nobody hands it over until someone does).
fn left_by_a_dying_server<T: std::fmt::Debug, F: std::future::Future<Output = Result<T>>>(
    env: &Env,
    token: &str,
    point: &str,
    send: impl FnOnce(Api) -> F,
) -> Result<String> {
    let crash = [("UNCAGED_WORKFLOW_CRASH_AT", point)];
    let mut dying = Serve::start(env, &["--no-schedules"], &crash)?;
    let api = Api::new(&dying, token)?;
    let answer = runtime()?.block_on(send(api));
    ensure!(answer.is_err(), "the server answered: {answer:?}");
    ensure!(!dying.child.wait()?.success());
    let left = env.json(&["threads"])?;
    let id = left[0]["threadId"].as_str().context("the thread it left")?.to_string();
    let left_as = if env.store.is_some() { "queued" } else { "interrupted" };
    assert_eq!((left[0]["status"].clone(), left[0]["steps"].clone()), (json!(left_as), json!(0)));
    Ok(id)
}

/// A client of one server, with a token.
struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    fn new(serve: &Serve, token: &str) -> Result<Self> {
        Ok(Api {
            base: format!("http://{}/api/v1", serve.addr),
            token: token.to_string(),
            http: uncaged_workflow::http::client_builder()
                .timeout(Duration::from_secs(60))
                .build()?,
        })
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.base)).bearer_auth(&self.token)
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base)).bearer_auth(&self.token)
    }

    /// Sends `request`; its status and JSON body (null if none).
    async fn send(request: reqwest::RequestBuilder) -> Result<(u16, Value)> {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text)? };
        Ok((status, body))
    }

    /// Starts a thread of `workflow`; its id.
    async fn start(&self, workflow: &str, prompt: &str) -> Result<String> {
        let (status, body) =
            Api::send(self.post("/threads").json(&json!({"workflow": workflow, "prompt": prompt})))
                .await?;
        ensure!(status == 201, "{status} {body}");
        Ok(body["id"].as_str().context("an id")?.to_string())
    }

    /// The events of thread `id` from `after` (as `Last-Event-ID`) until the stream ends.
    async fn events(&self, id: &str, after: Option<usize>) -> Result<Vec<(String, String, Value)>> {
        let mut request = self.get(&format!("/threads/{id}/events"));
        if let Some(after) = after {
            request = request.header("last-event-id", after.to_string());
        }
        let mut response = request.send().await?;
        ensure!(response.status() == 200, "{}", response.status());
        let kind = response.headers()["content-type"].to_str()?.to_string();
        ensure!(kind.starts_with("text/event-stream"), "{kind}");
        let mut text = String::new();
        while let Some(chunk) = response.chunk().await? {
            text.push_str(std::str::from_utf8(&chunk)?);
        }
        let mut events = Vec::new();
        for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}:")))
                    .map(|v| v.trim().to_string())
            };
            let (Some(name), Some(data)) = (field("event"), field("data")) else { continue };
            events.push((name, field("id").unwrap_or_default(), serde_json::from_str(&data)?));
        }
        Ok(events)
    }
}

/// A home with solve-issue, a token that may act, and `serve` on it.
fn serving(env: &Env) -> Result<(Serve, String)> {
    env.add_solve_issue()?;
    let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
    let serve = Serve::start(env, &["--no-schedules"], &[])?;
    Ok((serve, token))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

on_both_stores! {
    #[test]
    fn a_thread_started_over_the_api_is_followed_to_its_end() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        let api = Api::new(&serve, &token)?;
        runtime()?.block_on(async {
            let data = json!({"issue": 7, "title": "<b>it breaks</b>"});
            let (status, body) = Api::send(api.post("/threads").json(
                &json!({"workflow": "solve-issue", "prompt": "fix it", "data": data}),
            ))
            .await?;
            assert_eq!(status, 201, "{body}");
            let id = body["id"].as_str().context("id")?.to_string();
            // Followed to its end: every step once, in order, then `ended`.
            let events = api.events(&id, None).await?;
            let record = env.json(&["thread", &id])?;
            let steps = record["steps"].as_array().context("steps")?.len();
            ensure!(steps > 0, "{record}");
            let told: Vec<u64> = events
                .iter()
                .filter(|(name, _, _)| name == "step")
                .map(|(_, _, e)| e["index"].as_u64().unwrap_or(0))
                .collect();
            assert_eq!(told, (1..=steps as u64).collect::<Vec<_>>(), "{events:?}");
            let (name, last_id, last) = events.last().context("events")?;
            assert_eq!(name, "ended");
            assert_eq!(last["status"], "completed", "{last}");
            assert_eq!(last_id, &steps.to_string());
            assert_eq!(record["start"]["triggerData"], data);
            // Twenty clients at once, the thread read once for all of them: each hears it whole.
            let many = (0..20).map(|_| api.events(&id, None));
            for heard in futures::future::join_all(many).await {
                let heard = heard?;
                assert_eq!(heard.len(), events.len(), "{heard:?}");
                assert_eq!(heard.last().map(|e| e.0.as_str()), Some("ended"));
            }
            // Resumed after step 2: the steps after it, then the end.
            let resumed = api.events(&id, Some(2)).await?;
            assert_eq!(resumed[0].2["index"], 3, "{resumed:?}");
            assert_eq!(resumed.len(), steps - 2 + 1, "{resumed:?}");

            // One thread, whole; by the hash of the workflow's current version too.
            let (status, one) = Api::send(api.get(&format!("/threads/{id}"))).await?;
            assert_eq!((status, one["status"].clone()), (200, json!("completed")));
            let hash = one["start"]["hash"].as_str().context("hash")?.to_string();
            let by_hash = api.start(&hash, "by hash").await?;
            // Pages, newest first, that meet without a gap or an overlap.
            let third = api.start("solve-issue", "third").await?;
            let (_, page) = Api::send(api.get("/threads?limit=2")).await?;
            let first: Vec<&str> =
                page["threads"].as_array().context("threads")?.iter().map(|t| t["threadId"].as_str().unwrap()).collect();
            assert_eq!(first, [third.as_str(), by_hash.as_str()]);
            let cursor = page["nextCursor"].as_str().context("a next page")?;
            let (_, rest) = Api::send(api.get(&format!("/threads?limit=2&cursor={cursor}"))).await?;
            assert_eq!(rest["threads"][0]["threadId"], id.as_str());
            ensure!(rest.get("nextCursor").is_none(), "{rest}");
            let (_, of_workflow) =
                Api::send(api.get("/threads?workflow=solve-issue&status=completed&since=1h")).await?;
            ensure!(of_workflow["threads"].as_array().is_some_and(|t| !t.is_empty()), "{of_workflow}");
            let (status, bad) = Api::send(api.get("/threads?status=asleep")).await?;
            assert_eq!((status, bad["error"]["code"].clone()), (400, json!("invalid")));
            let (status, missing) = Api::send(api.get("/threads/01KQXKW18CT8G75T53R8F4G7YG")).await?;
            assert_eq!((status, missing["error"]["code"].clone()), (404, json!("not_found")));
            Ok(())
        })
    }

    #[test]
    fn a_retried_start_with_its_idempotency_key_starts_one_thread() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        let api = Api::new(&serve, &token)?;
        runtime()?.block_on(async {
            let asked = json!({"workflow": "solve-issue", "prompt": "once"});
            let send = |key: &'static str, body: Value| {
                Api::send(api.post("/threads").header("idempotency-key", key).json(&body))
            };
            let (first, started) = send("k-1", asked.clone()).await?;
            let (again, replayed) = send("k-1", asked.clone()).await?;
            assert_eq!((first, again), (201, 200));
            assert_eq!(started["id"], replayed["id"]);
            // Twelve at once with a new key: one thread, the same id for all.
            let racing = (0..12).map(|_| send("k-2", asked.clone()));
            let answers = futures::future::join_all(racing).await;
            let mut ids = BTreeSet::new();
            let mut created = 0;
            for answer in answers {
                let (status, body) = answer?;
                ensure!(status == 201 || status == 200, "{status} {body}");
                created += usize::from(status == 201);
                ids.insert(body["id"].as_str().context("id")?.to_string());
            }
            assert_eq!((created, ids.len()), (1, 1), "{ids:?}");
            // The key with another request is refused; a bad request holds no key.
            let other = json!({"workflow": "solve-issue", "prompt": "something else"});
            let (status, refused) = send("k-1", other).await?;
            assert_eq!((status, refused["error"]["code"].clone()), (422, json!("idempotency_key_reused")));
            let (status, _) = send("k-3", json!({"workflow": "nope", "prompt": "x"})).await?;
            assert_eq!(status, 404);
            let (status, _) = send("k-3", asked.clone()).await?;
            assert_eq!(status, 201);
            Ok::<_, anyhow::Error>(())
        })?;
        let threads = env.json(&["threads"])?;
        assert_eq!(threads.as_array().context("a list")?.len(), 3, "{threads}");
        Ok(())
    }

    #[test]
    fn a_keyed_start_whose_server_died_before_handing_it_over_runs_when_retried() -> Result<()> {
        let env = Env::new()?;
        // How long the dead request had is counted on the test's clock: moved, not waited for.
        env.set_clock(1_893_456_000_500)?;
        env.add_solve_issue()?;
        let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
        let asked = json!({"workflow": "solve-issue", "prompt": "once"});
        let send = |api: &Api| {
            Api::send(api.post("/threads").header("idempotency-key", "k").json(&asked))
        };
        // The server dies after creating the keyed thread, before handing it to a worker (on
        // a database it was created queued, but no worker was made sure of).
        let send_once = |api: Api| async move { send(&api).await };
        let id = left_by_a_dying_server(&env, &token, "start-created:1", send_once)?;
        // The client retries with the key: the same thread, handed over now, runs to its end.
        env.advance(Duration::from_secs(2))?;
        let serve = Serve::start(&env, &["--no-schedules"], &[])?;
        let api = Api::new(&serve, &token)?;
        let (status, replayed) = runtime()?.block_on(send(&api))?;
        assert_eq!((status, replayed["id"].clone()), (200, json!(id)), "{replayed}");
        wait_until("the thread ends", || Ok(crate::status(&env, &id)? == "completed"))?;
        assert_eq!(env.json(&["threads"])?.as_array().context("a list")?.len(), 1);
        Ok(())
    }

    /// A start is answered once its thread is queued, and handed to a worker after: a server
    /// that dies between the two leaves a start nobody hands over, which the next `serve`
    /// does by itself (on a home directory, the orphaned queue entry, with its own secrets;
    /// on a database, a worker made sure of), with no retry from the client.
    #[test]
    fn a_start_whose_server_died_before_handing_it_over_runs_with_the_next_server() -> Result<()> {
        let env = Env::new()?;
        env.add_solve_issue()?;
        let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
        let start = |api: Api| async move { api.start("solve-issue", "orphaned").await };
        let id = left_by_a_dying_server(&env, &token, "start-queued:1", start)?;
        let _serve = Serve::start(&env, &["--no-schedules"], &[])?;
        wait_until("the orphaned start runs to its end", || {
            Ok(crate::status(&env, &id)? == "completed")
        })?;
        assert_eq!(env.json(&["threads"])?.as_array().context("a list")?.len(), 1);
        Ok(())
    }

    /// A server killed (-9) in the middle of a burst of keyed starts loses no start it
    /// answered and starts none twice: each key sent again gets the thread its first request
    /// was answered with (or, its answer lost, the one that request made), one thread a key,
    /// and every thread runs to its end.
    #[test]
    fn a_server_killed_in_a_burst_of_starts_loses_and_repeats_none() -> Result<()> {
        let env = Env::new()?;
        env.set_clock(1_893_456_000_500)?;
        let (serve, token) = serving(&env)?;
        let keys: Vec<String> = (0..40).map(|i| format!("burst-{i}")).collect();
        let asked = |key: &str| json!({"workflow": "solve-issue", "prompt": format!("start {key}")});
        let send = |api: &Api, key: &str| {
            Api::send(api.post("/threads").header("idempotency-key", key).json(&asked(key)))
        };
        // Where the kill lands in the burst is left to chance: wherever it lands, nothing may
        // be lost or doubled.
        let pid = serve.child.id().to_string();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(80));
            crate::kill_9(&[pid]);
        });
        let api = Api::new(&serve, &token)?;
        let first: Vec<Option<String>> = runtime()?.block_on(async {
            let sends = keys.iter().enumerate().map(|(i, key)| {
                let (api, send) = (&api, &send);
                async move {
                    tokio::time::sleep(Duration::from_millis(i as u64 * 4)).await;
                    match send(api, key).await {
                        Ok((201, body)) => body["id"].as_str().map(String::from),
                        _ => None,
                    }
                }
            });
            futures::future::join_all(sends).await
        });
        killer.join().expect("the killer thread");
        drop(serve);
        env.advance(Duration::from_secs(2))?;
        let serve = Serve::start(&env, &["--no-schedules"], &[])?;
        let api = Api::new(&serve, &token)?;
        let again: Vec<String> = runtime()?.block_on(async {
            let mut ids = vec![];
            for key in &keys {
                let (status, body) = send(&api, key).await?;
                ensure!(status == 200 || status == 201, "{key}: {status} {body}");
                ids.push(body["id"].as_str().context("an id")?.to_string());
            }
            Ok::<_, anyhow::Error>(ids)
        })?;
        for ((key, first), again) in keys.iter().zip(&first).zip(&again) {
            if let Some(first) = first {
                assert_eq!(first, again, "{key}: answered with one thread, then another");
            }
        }
        let mut distinct = again.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), keys.len(), "{again:?}");
        wait_until("every thread ends", || {
            let threads = env.json(&["threads"])?;
            let threads = threads.as_array().context("a list")?;
            ensure!(threads.len() == keys.len(), "{} threads for {} keys", threads.len(), keys.len());
            Ok(threads.iter().all(|t| t["status"] == "completed"))
        })?;
        Ok(())
    }

    /// A server killed (-9) in the middle of a burst of starts without keys loses none it
    /// answered: each start answered 201 was durable when it was answered, and runs to its end
    /// once a `serve` is back (handed over by it on a home directory if the dead one had not
    /// yet; on a database, by a worker it makes sure of), with no request sent again.
    #[test]
    fn a_server_killed_in_a_burst_of_unkeyed_starts_loses_none_it_answered() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        // The kill lands a moment after the first answer (a first start on a database also
        // starts its worker), while the burst's other starts are in flight.
        let first_answer = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pid = serve.child.id().to_string();
        let heard = first_answer.clone();
        let killer = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !heard.load(std::sync::atomic::Ordering::SeqCst)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(15));
            crate::kill_9(&[pid]);
        });
        let api = Api::new(&serve, &token)?;
        let answered: Vec<String> = runtime()?.block_on(async {
            let sends = (0..40).map(|i| {
                let (api, first_answer) = (&api, &first_answer);
                async move {
                    tokio::time::sleep(Duration::from_millis(i * 4)).await;
                    let id = api.start("solve-issue", &format!("start {i}")).await.ok();
                    if id.is_some() {
                        first_answer.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    id
                }
            });
            futures::future::join_all(sends).await.into_iter().flatten().collect()
        });
        killer.join().expect("the killer thread");
        drop(serve);
        ensure!(!answered.is_empty(), "no start was answered before the kill");
        ensure!(answered.len() < 40, "the kill came after the burst");
        let _serve = Serve::start(&env, &["--no-schedules"], &[])?;
        wait_until("every start answered runs to its end", || {
            for id in &answered {
                if crate::status(&env, id)? != "completed" {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        Ok(())
    }

    #[test]
    fn tokens_none_wrong_read_only_and_revoked() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        ensure!(token.starts_with("uwt_") && token.len() > 40, "{token}");
        let viewer = env.ok(&["token", "create", "--name", "viewer", "--read-only"])?.trim().to_string();
        let list = env.json(&["token", "list"])?;
        assert_eq!(list[0]["name"], "ci");
        assert_eq!((list[1]["name"].clone(), list[1]["readOnly"].clone()), (json!("viewer"), json!(true)));
        let listed = env.ok(&["token", "list"])?;
        ensure!(listed.contains("viewer") && !listed.contains(&token) && !listed.contains(&viewer), "{listed}");
        // Only hashes are kept.
        let kept = match &env.store {
            Some(_) => env.sql("SELECT name, hash FROM api_tokens")?,
            None => std::fs::read_to_string(env.home().join("api/tokens.json"))?,
        };
        ensure!(kept.contains("viewer") && !kept.contains(&token[4..]), "{kept}");
        let e = env.fails(&["token", "create", "--name", "ci"], 64)?;
        ensure!(e.contains("a token named `ci` exists"), "{e}");
        env.fails(&["token", "revoke", "nobody"], 66)?;

        let api = Api::new(&serve, &token)?;
        let anonymous = uncaged_workflow::http::client_builder().build()?;
        runtime()?.block_on(async {
            let health = anonymous.get(format!("{}/health", api.base)).send().await?;
            assert_eq!(health.status(), 200);
            for request in [
                anonymous.get(format!("{}/threads", api.base)),
                anonymous.get(format!("{}/threads", api.base)).bearer_auth("uwt_wrong"),
                anonymous.get(format!("{}/threads", api.base)).header("authorization", "Basic eDp5"),
            ] {
                let (status, body) = Api::send(request).await?;
                assert_eq!((status, body["error"]["code"].clone()), (401, json!("unauthorized")));
            }
            let read_only = Api::new(&serve, &viewer)?;
            assert_eq!(Api::send(read_only.get("/threads")).await?.0, 200);
            let start = json!({"workflow": "solve-issue", "prompt": "x"});
            let (status, body) = Api::send(read_only.post("/threads").json(&start)).await?;
            assert_eq!((status, body["error"]["code"].clone()), (403, json!("read_only")));
            assert_eq!(Api::send(api.get("/threads")).await?.0, 200);
            Ok::<_, anyhow::Error>(())
        })?;
        assert_eq!(env.json(&["threads"])?, json!([]), "a refused request started nothing");
        env.ok(&["token", "revoke", "ci"])?;
        runtime()?.block_on(async {
            let (status, _) = Api::send(api.get("/threads")).await?;
            assert_eq!(status, 401, "a revoked token");
            Ok::<_, anyhow::Error>(())
        })?;
        // The tokens appear in no log.
        drop(serve);
        let log = std::fs::read_to_string(env.dir.path().join("serve.err"))?;
        ensure!(!log.contains(&token) && !log.contains(&viewer), "{log}");
        Ok(())
    }

    #[test]
    fn oversized_and_malformed_bodies_are_refused_and_change_nothing() -> Result<()> {
        let env = Env::new()?;
        std::fs::create_dir_all(env.home())?;
        std::fs::write(env.home().join("config.yaml"), "serve:\n  max_body_bytes: 1000\n")?;
        let (serve, token) = serving(&env)?;
        let api = Api::new(&serve, &token)?;
        runtime()?.block_on(async {
            let huge = json!({"workflow": "solve-issue", "prompt": "x".repeat(2000)});
            for (request, want, code) in [
                (api.post("/threads").json(&huge), 413, "too_large"),
                (api.post("/threads").header("content-type", "application/json").body("{not json"), 400, "malformed_json"),
                (api.post("/threads").header("content-type", "text/plain").body("{}"), 415, "unsupported_media_type"),
                (api.post("/threads").json(&json!({"workflow": "solve-issue", "prompt": 5})), 422, "invalid_body"),
                (api.post("/threads").json(&json!({"workflow": "solve-issue", "prompt": "x", "extra": 1})), 422, "invalid_body"),
                (api.post("/threads").json(&json!({"workflow": "solve-issue", "prompt": "x"})).header("idempotency-key", ""), 400, "invalid"),
                (api.post("/threads/01KQXKW18CT8G75T53R8F4G7YG/dance"), 404, "not_found"),
                (api.get("/no/such/route"), 404, "not_found"),
            ] {
                let response = request.send().await?;
                let status = response.status().as_u16();
                let kind = response.headers()["content-type"].to_str()?.to_string();
                let body: Value = response.json().await?;
                assert_eq!((status, body["error"]["code"].clone()), (want, json!(code)), "{body}");
                ensure!(kind.starts_with("application/json"), "{kind}");
            }
            Ok::<_, anyhow::Error>(())
        })?;
        assert_eq!(env.json(&["threads"])?, json!([]));
        Ok(())
    }

    #[test]
    fn a_budget_given_over_the_api_pauses_the_thread_and_a_raise_resumes_it() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        let api = Api::new(&serve, &token)?;
        runtime()?.block_on(async {
            let asked = json!({"workflow": "solve-issue", "prompt": "x", "budget": {"maxAgentCalls": 1}});
            let (status, body) = Api::send(api.post("/threads").json(&asked)).await?;
            assert_eq!(status, 201, "{body}");
            let id = body["id"].as_str().context("id")?.to_string();
            wait_until("it pauses", || Ok(crate::status(&env, &id)? == "paused"))?;
            let (_, thread) = Api::send(api.get(&format!("/threads/{id}"))).await?;
            assert_eq!(thread["paused"]["by"], "budget", "{thread}");
            assert_eq!(thread["steps"].as_array().map(Vec::len), Some(1));
            let raise = json!({"raiseBudget": {"maxAgentCalls": 10}});
            let (status, _) = Api::send(api.post(&format!("/threads/{id}/resume")).json(&raise)).await?;
            assert_eq!(status, 200);
            wait_until("it completes", || Ok(crate::status(&env, &id)? == "completed"))?;
            Ok(())
        })
    }

    #[test]
    fn the_openapi_document_describes_every_route_and_each_answers_as_documented() -> Result<()> {
        let env = Env::new()?;
        let (serve, token) = serving(&env)?;
        let api = Api::new(&serve, &token)?;
        runtime()?.block_on(async {
            let (status, doc) = Api::send(api.get("/openapi.json")).await?;
            assert_eq!(status, 200);
            ensure!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", doc["openapi"]);
            let thread = api.start("solve-issue", "documented").await?;
            wait_until("the thread ends", || Ok(crate::status(&env, &thread)? == "completed"))?;
            let paths = doc["paths"].as_object().context("paths")?;
            let mut checked = 0;
            for (path, operations) in paths {
                for (method, operation) in operations.as_object().context("operations")? {
                    let concrete = path
                        .trim_start_matches("/api/v1")
                        .replace("{id}", &thread)
                        .replace("{action}", "pause");
                    let request = match method.as_str() {
                        "get" => api.get(&concrete),
                        "post" if concrete == "/threads" => api
                            .post(&concrete)
                            .json(&json!({"workflow": "solve-issue", "prompt": "from the document"})),
                        "post" => api.post(&concrete),
                        other => anyhow::bail!("an undocumented method {other}"),
                    };
                    let response = request.send().await?;
                    let status = response.status().as_u16().to_string();
                    let documented = &operation["responses"][&status];
                    ensure!(documented.is_object(), "{method} {path} answered {status}, not documented");
                    let content = &documented["content"];
                    if let Some(schema) = content["application/json"]["schema"].as_object() {
                        let body: Value = response.json().await?;
                        let mut root = Value::Object(schema.clone());
                        root["components"] = doc["components"].clone();
                        let validator = jsonschema::validator_for(&root)?;
                        let errors: Vec<String> = validator.iter_errors(&body).map(|e| e.to_string()).collect();
                        ensure!(errors.is_empty(), "{method} {path} {status}: {errors:?} in {body}");
                    } else if content.get("text/event-stream").is_some() {
                        let kind = response.headers()["content-type"].to_str()?.to_string();
                        ensure!(kind.starts_with("text/event-stream"), "{kind}");
                    }
                    checked += 1;
                }
            }
            ensure!(checked >= 9, "{checked} routes checked");
            Ok(())
        })
    }

    /// Every error is `{"error": {"code", "message"}}`, as docs/api.md says: a query or a path
    /// that does not parse, a method a route does not take, a route of the old unversioned API
    /// (at 4abdda5: plain text, or an empty body). A malformed id's 400 is documented. The
    /// scheme of `Authorization` is read in any case. Each request is logged in one line at
    /// `-v`, with the token's name and never the token.
    #[test]
    fn every_error_is_the_json_error_and_every_request_is_logged() -> Result<()> {
        let env = Env::new()?;
        env.add_solve_issue()?;
        let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
        let serve = Serve::start(&env, &["--no-schedules", "-v"], &[])?;
        let api = Api::new(&serve, &token)?;
        let root = format!("http://{}", serve.addr);
        runtime()?.block_on(async {
            let thread = api.start("solve-issue", "errors").await?;
            let http = &api.http;
            let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
                (api.get("/threads?limit=-1"), 400, "invalid_query"),
                (api.get("/threads?limit=abc"), 400, "invalid_query"),
                (api.get("/threads?limit=1000000000000000000000000000000"), 400, "invalid_query"),
                (api.get(&format!("/threads/{thread}/events?after=-1")), 400, "invalid_query"),
                (api.get("/threads/%FF%FE"), 400, "invalid"),
                (api.get("/threads/0"), 400, "invalid"),
                (http.delete(format!("{}/threads", api.base)).bearer_auth(&token), 405, "method_not_allowed"),
                (http.put(format!("{}/threads", api.base)).bearer_auth(&token), 405, "method_not_allowed"),
                (api.get(&format!("/threads/{thread}/kill")), 405, "method_not_allowed"),
                (http.get(format!("{root}/api/threads")).bearer_auth(&token), 404, "not_found"),
                (http.get(format!("{root}/api/workflows")).bearer_auth(&token), 404, "not_found"),
                (http.get(format!("{root}/api/schedules")).bearer_auth(&token), 404, "not_found"),
            ];
            for (request, status, code) in cases {
                let response = request.send().await?;
                let url = response.url().to_string();
                let got = response.status().as_u16();
                let kind = response.headers().get("content-type").map(|k| k.to_str().unwrap_or("").to_string());
                let text = response.text().await?;
                let body: Value = serde_json::from_str(&text).with_context(|| format!("{url}: {got} {kind:?} {text:?}"))?;
                ensure!(got == status && body["error"]["code"] == code, "{url}: {got} {body}");
                ensure!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{url}: {body}");
            }
            // RFC 7235: the scheme's name in any case.
            for scheme in ["bearer", "BEARER", "Bearer"] {
                let request = http.get(format!("{}/threads", api.base)).header("authorization", format!("{scheme} {token}"));
                ensure!(Api::send(request).await?.0 == 200, "`{scheme}` refused");
            }
            // The 400 of a malformed id is in the document.
            let (_, doc) = Api::send(api.get("/openapi.json")).await?;
            for path in ["/api/v1/threads/{id}", "/api/v1/threads/{id}/events", "/api/v1/threads/{id}/{action}"] {
                let method = if path.ends_with("{action}") { "post" } else { "get" };
                ensure!(doc["paths"][path][method]["responses"]["400"].is_object(), "{path}: no 400");
            }
            Ok::<_, anyhow::Error>(())
        })?;
        drop(serve);
        let log = std::fs::read_to_string(env.dir.path().join("serve.err"))?;
        ensure!(log.contains("GET /api/v1/threads/{id} 400"), "no request line: {log}");
        ensure!(log.lines().any(|l| l.contains("POST /api/v1/threads 201") && l.contains("token:ci")), "{log}");
        ensure!(!log.contains(&token), "a token in the log: {log}");
        Ok(())
    }
}
