//! Whole-workflow benchmarks: the solve-issue loop for N steps through the real runtime
//! (durable on disk, and in memory on tmpfs), the same loop natively in Rust with the same
//! agent, extraction and persistence (the floor), and one worker holding N concurrent
//! threads that wait on a slow agent. Prints one JSON object per measurement; `make bench`
//! turns them into BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uncaged_workflow::agent_spec::AgentSpec;

use serde_json::{Value, json};
use uncaged_test_artifacts as artifacts;
use uncaged_workflow::agents::extract::Extractor;
use uncaged_workflow::agents::{AgentContext, AgentSet, RoleRef, ScriptedAgent, Secrets};
use uncaged_workflow::clock::now_ms;
use uncaged_workflow::durable::AppendFile;
use uncaged_workflow::duration::Seconds;
use uncaged_workflow::home::Home;
use uncaged_workflow::ids::BundleHash;
use uncaged_workflow::limits::Limits;
use uncaged_workflow::run::catalog::Catalog;
use uncaged_workflow::run::lifecycle::{self, Checked, OpenThread, StartRequest};
use uncaged_workflow::run::runner::{RunContext, RunOutcome, ThreadEvent, Until, run_thread};
use uncaged_workflow::run_request::RunRequest;
use uncaged_workflow::sandbox::control::ThreadControl;
use uncaged_workflow::sandbox::engine::Runtime;
use uncaged_workflow::store::Storage;
use uncaged_workflow::store::config::{AgentConfig, AgentKind, Config};
use uncaged_workflow::store::files::journal::FileCalls;
use uncaged_workflow::store::journal::{CallKind, CallResponse, Journal, digest};
use uncaged_workflow::store::records::StepRecord;

/// Answers like the LangGraph script's: the reviewer never approves, so a thread runs until
/// its max rounds.
const ANSWERS: &str = r#"
planner: "Plan: fix it\n{\"steps\": [\"Reproduce the bug\", \"Fix the parser\", \"Run the tests\"]}"
developer: "Done: fixed it\n{\"summary\": \"Fixed the off-by-one in the parser\"}"
reviewer: "Not yet\n{\"approved\": false, \"comments\": [\"Handle the empty-input case\"]}"
"#;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `UNCAGED_BENCH_THREADS=N` measures one worker holding N threads instead; each N runs
    // in a process of its own, so one N's pools and mappings do not count against the next.
    let only_threads: Option<usize> =
        std::env::var("UNCAGED_BENCH_THREADS").ok().and_then(|n| n.parse().ok());
    uncaged_workflow::run::worker::raise_open_files_limit();
    // `UNCAGED_BENCH_PG=URL` measures the durable step on a PostgreSQL store instead; with
    // `UNCAGED_BENCH_ENQUEUE=N` it only queues N 10-step threads there, for the workers that
    // `make bench` then starts.
    let postgres = std::env::var("UNCAGED_BENCH_PG").ok();
    let enqueue: Option<usize> =
        std::env::var("UNCAGED_BENCH_ENQUEUE").ok().and_then(|n| n.parse().ok());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        if let Some(url) = postgres {
            let dir = disk_dir();
            let home = Home::new(dir.path().join("home"));
            let store = Storage::connect(&home, Some(&url)).unwrap();
            if let Some(n) = enqueue {
                queue_threads(&store, n).await;
                return;
            }
            // Side by side in one run: the same loop with the store on disk.
            for steps in [10, 100] {
                emit(json!({"bench": "ours", "mode": "postgres", "steps": steps,
                    "per_step_us": ours_in(&store, &dir, Path::new(artifacts::SOLVE_ISSUE), steps, 7).await}));
                emit(json!({"bench": "ours", "mode": "durable", "steps": steps,
                    "per_step_us": ours(&disk_dir(), Path::new(artifacts::SOLVE_ISSUE), steps, 7).await}));
            }
            return;
        }
        if let Some(n) = only_threads {
            emit(concurrency(n).await);
            return;
        }
        if std::env::var_os("UNCAGED_BENCH_EVICTED").is_some() {
            emit(evicted_steps().await);
            return;
        }
        // `UNCAGED_BENCH_PROFILE=MODE:N` (memory or durable) runs only our loop of N steps, many
        // times over: a workload to hold still under `perf record`.
        if let Some((mode, steps)) = std::env::var("UNCAGED_BENCH_PROFILE").ok().and_then(|v| {
            let (mode, steps) = v.split_once(':')?;
            Some((mode.to_string(), steps.parse::<usize>().ok()?))
        }) {
            let dir = if mode == "memory" { memory_dir() } else { disk_dir() };
            emit(json!({"bench": "ours", "mode": mode, "steps": steps,
                "per_step_us": ours(&dir, Path::new(artifacts::SOLVE_ISSUE), steps, 40).await}));
            emit(json!({"bench": "native", "mode": mode, "steps": steps,
                "per_step_us": native(&dir, steps, 40).await}));
            return;
        }
        emit(json!({"bench": "parallel", "agent_ms": 100,
            "group_ms": parallel_round(if quick { 2 } else { 7 }).await}));
        emit(json!({"bench": "add_yaml", "ms": add_yaml(if quick { 2 } else { 7 }).await}));
        let sizes: &[usize] = if quick { &[10] } else { &[10, 100, 1000] };
        for &steps in sizes {
            let repeat = if steps >= 1000 { 3 } else { 7 };
            for (mode, dir) in [("durable", disk_dir()), ("memory", memory_dir())] {
                emit(json!({"bench": "ours", "mode": mode, "steps": steps,
                    "per_step_us": ours(&dir, Path::new(artifacts::SOLVE_ISSUE), steps, repeat).await}));
                emit(json!({"bench": "ours_yaml", "mode": mode, "steps": steps,
                    "per_step_us": ours(&dir, &example("solve-issue.yaml"), steps, repeat).await}));
                emit(json!({"bench": "native", "mode": mode, "steps": steps,
                    "per_step_us": native(&dir, steps, repeat).await}));
            }
        }
    });
}

fn emit(value: Value) {
    println!("{value}");
}

/// A directory on the disk the home usually lives on (fsync is real).
fn disk_dir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A directory in memory (tmpfs: fsync costs nothing), standing in for "durability off".
fn memory_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| disk_dir())
}

fn answers_config(dir: &Path, delay: Option<Duration>) -> Config {
    let path = dir.join("answers.yaml");
    std::fs::write(&path, ANSWERS).unwrap();
    let mut config = Config::default();
    config.agents.insert(
        "bench".into(),
        AgentConfig {
            kind: AgentKind::Scripted { answers: Some(path), delay: delay.map(Seconds) },
            timeout: None,
            retries: None,
            retry_delay: None,
        },
    );
    config
}

/// A file of `bundles/`.
fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bundles").join(name)
}

/// `add` of a YAML workflow never added before (validate, assemble, compile), on a warm cache:
/// another YAML workflow was added to the home first. Milliseconds per add.
async fn add_yaml(repeat: usize) -> Vec<f64> {
    let dir = disk_dir();
    let home = Home::new(dir.path().join("home"));
    let store = Storage::open(&home);
    let runtime = Runtime::new(&home).unwrap();
    let catalog = Catalog::new(&store);
    let text = std::fs::read_to_string(example("triage.yaml")).unwrap();
    let mut results = Vec::new();
    for i in 0..repeat + 1 {
        // A new description: new bytes, new hash, nothing in the AOT cache for it.
        let file = dir.path().join(format!("flow-{i}.yaml"));
        std::fs::write(
            &file,
            text.replacen("description: >-", &format!("description: >-\n  Variant {i}."), 1),
        )
        .unwrap();
        let started = Instant::now();
        catalog.add(&runtime, &format!("flow-{i}"), &file, &Limits::default()).await.unwrap();
        results.push(started.elapsed().as_secs_f64() * 1e3);
    }
    results.remove(0); // the first fills the function cache
    results
}

/// The runtime: a thread of solve-issue (`bundle`: the Rust one, or its YAML) run to `steps`
/// steps; per-step microseconds of each repetition (instantiation and thread creation
/// included).
async fn ours(dir: &tempfile::TempDir, bundle: &Path, steps: usize, repeat: usize) -> Vec<f64> {
    let home = Home::new(dir.path().join("home"));
    ours_in(&Storage::open(&home), dir, bundle, steps, repeat).await
}

/// Queues `n` threads of solve-issue that end after 10 steps, with the bench's instant
/// agent: its answers are written to `UNCAGED_BENCH_ANSWERS` (a file that outlives this
/// process, for the workers to read).
async fn queue_threads(store: &Storage, n: usize) {
    let runtime = Runtime::for_worker(store.home(), &Limits::default()).unwrap();
    let catalog = Catalog::new(store);
    catalog
        .add(&runtime, "solve-issue", Path::new(artifacts::SOLVE_ISSUE), &Limits::default())
        .await
        .unwrap();
    let answers =
        PathBuf::from(std::env::var("UNCAGED_BENCH_ANSWERS").expect("UNCAGED_BENCH_ANSWERS"));
    std::fs::write(&answers, ANSWERS).unwrap();
    let request = RunRequest {
        agent: Some(AgentSpec::Scripted { answers: Some(answers.clone()) }),
        ..Default::default()
    };
    for i in 0..n {
        let start = StartRequest {
            name: "solve-issue".into(),
            prompt: format!("thread {i}"),
            trigger_data: None,
            request: RunRequest { max_rounds: Some(10), ..Default::default() },
            origin: Default::default(),
        };
        let checked = lifecycle::check_start(store, &start).unwrap();
        let record = lifecycle::create(store, start, checked).unwrap();
        store.queue().enqueue(record.id(), record.start.hash, &request).unwrap();
    }
}

async fn ours_in(
    store: &Storage,
    dir: &tempfile::TempDir,
    bundle: &Path,
    steps: usize,
    repeat: usize,
) -> Vec<f64> {
    let home = store.home().clone();
    let store = store.clone();
    let runtime = Runtime::for_worker(&home, &Limits::default()).unwrap();
    let catalog = Catalog::new(&store);
    catalog.add(&runtime, "solve-issue", bundle, &Limits::default()).await.unwrap();
    let hash = catalog.entry("solve-issue").unwrap().hash;
    let bundle = catalog.load(&runtime, "solve-issue", hash).unwrap();
    let config = answers_config(dir.path(), None);
    let request =
        RunRequest { agent: Some(AgentSpec::Named("bench".into())), ..Default::default() };
    let agents =
        AgentSet::resolve(&config, &request, &Secrets::default(), &bundle.descriptor, None)
            .unwrap();
    let mut results = Vec::new();
    for _ in 0..repeat + 1 {
        let started = Instant::now();
        let (mut writer, record) = new_thread(&store, hash, steps as u32);
        let ctx = RunContext {
            runtime: &runtime,
            store: &store,
            agents: agents.clone(),
            limits: Limits::default(),
            control: Arc::new(ThreadControl::default()),
            children: None,
        };
        let outcome =
            run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |_| {}).await.unwrap();
        let RunOutcome::Ended(end) = outcome else { panic!("the thread did not end") };
        assert_eq!(end.end.return_code, 2, "{}", end.end.summary);
        results.push(started.elapsed().as_secs_f64() * 1e6 / steps as f64);
    }
    results.remove(0); // warm-up
    results
}

/// The floor: the same loop natively — moderator, scripted agent, extraction against the
/// role's schema, the call journal and a durable step append — with no WebAssembly.
async fn native(dir: &tempfile::TempDir, steps: usize, repeat: usize) -> Vec<f64> {
    let home = Home::new(dir.path().join("native"));
    std::fs::create_dir_all(home.root()).unwrap();
    // The schemas the bundle declares, read from its descriptor.
    let describe = Home::new(dir.path().join("describe"));
    let runtime = Runtime::new(&describe).unwrap();
    let added = Catalog::new(&Storage::open(&describe))
        .add(&runtime, "s", Path::new(artifacts::SOLVE_ISSUE), &Limits::default())
        .await
        .unwrap();
    let descriptor = added.descriptor;
    let answers = dir.path().join("native-answers.yaml");
    std::fs::write(&answers, ANSWERS).unwrap();
    let agent = ScriptedAgent::new(Some(&answers), &descriptor).unwrap();
    let mut results = Vec::new();
    for run in 0..repeat + 1 {
        let started = Instant::now();
        let mut data =
            AppendFile::open(&home.root().join(format!("{run}.data.jsonl")), true).unwrap();
        data.append(br#"{"start": true}"#).unwrap();
        let calls = FileCalls::open(&home.root().join(format!("{run}.calls.jsonl"))).unwrap();
        let mut journal = Journal::new(Box::new(calls)).unwrap();
        let extractor = Extractor;
        // Shared with each agent context, as the host shares its record of the thread.
        let mut recorded: Arc<Vec<StepRecord>> = Arc::new(Vec::new());
        while recorded.len() < steps {
            let role = match recorded.last().map(|s| s.role.as_str()) {
                None => "planner",
                Some("planner") | Some("reviewer") => "developer",
                Some(_) => "reviewer",
            };
            let spec = descriptor.role(role).unwrap();
            journal.begin_step(recorded.len());
            let context = AgentContext {
                thread_id: "bench".into(),
                prompt: "Fix the crash".into(),
                steps: recorded.clone(),
                role: RoleRef { name: role.into(), system_prompt: spec.system_prompt.clone() },
                input: None,
            };
            let answer = agent.answer(&context).unwrap();
            let response =
                CallResponse::Ok { value: answer.content.clone(), meta: None, usage: None };
            journal
                .record(0, CallKind::Agent, role, digest(&(role, &context.input)), response, false)
                .unwrap();
            let schema = spec.schema.to_string();
            let meta = extractor.extract(&schema, &answer.content, None).unwrap();
            let response = CallResponse::Ok { value: meta.to_string(), meta: None, usage: None };
            journal
                .record(
                    1,
                    CallKind::Extract,
                    "",
                    digest(&(&schema, &answer.content)),
                    response,
                    false,
                )
                .unwrap();
            let step = StepRecord {
                role: role.into(),
                content: answer.content,
                meta,
                timestamp: now_ms(),
                group: None,
                agent: Some("native".into()),
                duration_ms: None,
                usage: None,
            };
            data.append(&serde_json::to_vec(&step).unwrap()).unwrap();
            drop(context);
            Arc::make_mut(&mut recorded).push(step);
        }
        data.append(br#"{"end": true}"#).unwrap();
        results.push(started.elapsed().as_secs_f64() * 1e6 / steps as f64);
    }
    results.remove(0);
    results
}

/// review-panel's first round through the real runtime, every agent taking 100 ms: the
/// developer, then the three reviewers at once. Milliseconds of the reviewers' step (asked,
/// answered, extracted, persisted) in each repetition.
async fn parallel_round(repeat: usize) -> Vec<f64> {
    let dir = memory_dir();
    let home = Home::new(dir.path().join("home"));
    let store = Storage::open(&home);
    let runtime = Runtime::for_worker(&home, &Limits::default()).unwrap();
    let catalog = Catalog::new(&store);
    let path = Path::new(artifacts::REVIEW_PANEL);
    let added = catalog.add(&runtime, "review-panel", path, &Limits::default()).await.unwrap();
    let bundle = catalog.load(&runtime, "review-panel", added.hash).unwrap();
    // solve-issue's developer answer fits review-panel's developer; the reviewers, which the
    // answers do not name, answer from their schemas' examples.
    let config = answers_config(dir.path(), Some(Duration::from_millis(100)));
    let request =
        RunRequest { agent: Some(AgentSpec::Named("bench".into())), ..Default::default() };
    let agents =
        AgentSet::resolve(&config, &request, &Secrets::default(), &bundle.descriptor, None)
            .unwrap();
    let mut results = Vec::new();
    for _ in 0..repeat + 1 {
        let (mut writer, record) =
            open_thread(&store, "review-panel", added.hash, "Validate the upload size", 4);
        let ctx = RunContext {
            runtime: &runtime,
            store: &store,
            agents: agents.clone(),
            limits: Limits::default(),
            control: Arc::new(ThreadControl::default()),
            children: None,
        };
        let mut group = None;
        run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |event| {
            // The group's wall time is its slowest step's own (each records its call's).
            let ThreadEvent::Step { step, .. } = event;
            if let (Some(g), Some(ms)) = (step.group, step.duration_ms)
                && g.first == 2
            {
                let slowest: f64 = group.unwrap_or(0.0);
                group = Some(slowest.max(ms as f64));
            }
        })
        .await
        .unwrap();
        results.push(group.expect("the reviewers' group ran"));
    }
    results.remove(0); // warm-up
    results
}

/// One worker's runtime holding `n` threads, each waiting on an agent that takes minutes:
/// how fast they start, and the memory they hold.
async fn concurrency(n: usize) -> Value {
    let dir = memory_dir();
    let home = Home::new(dir.path().join("home"));
    // Threads beyond the live instances wait for one; each gives its instance up once its call
    // has been out for `evict_after`.
    let evict_after = Duration::from_millis(200);
    let limits =
        Limits { max_threads: n, live_instances: n.min(1000), evict_after, ..Limits::default() };
    // The pooling allocator reserves every slot's fiber stack up front: count those mappings
    // apart from the ones each live instance adds.
    let maps_at_start = memory_maps();
    let runtime = match Runtime::for_worker(&home, &limits) {
        Ok(runtime) => runtime,
        Err(e) => return json!({"bench": "concurrency", "threads": n, "error": e.to_string()}),
    };
    let store = Storage::open(&home);
    let (hash, bundle, agents) =
        slow_solve_issue(&runtime, &store, dir.path(), Duration::from_secs(600)).await;
    let rss_before = rss_kib();
    let maps_before = memory_maps();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    let mut controls = Vec::with_capacity(n);
    for _ in 0..n {
        let (mut writer, record) = new_thread(&store, hash, 10);
        let control = Arc::new(ThreadControl::default());
        controls.push(control.clone());
        let (runtime, store, bundle, agents, limits) =
            (runtime.clone(), store.clone(), bundle.clone(), agents.clone(), limits.clone());
        tasks.push(tokio::spawn(async move {
            let ctx = RunContext {
                runtime: &runtime,
                store: &store,
                agents,
                limits,
                control,
                children: None,
            };
            run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |_| {}).await
        }));
    }
    // Every thread is in its first agent call once its role shows.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut failed = None;
    while controls.iter().any(|c| c.current_role().is_none()) {
        if let Some(i) = tasks.iter().position(|t| t.is_finished()) {
            let ended = tasks.swap_remove(i).await;
            failed = Some(match ended {
                Ok(Ok(RunOutcome::Ended(end))) => {
                    format!("a thread ended early: {}", end.end.summary)
                }
                Ok(Ok(outcome)) => format!("a thread stopped early: {outcome:?}"),
                Ok(Err(e)) => format!("a thread failed: {e}"),
                Err(e) => format!("a thread panicked: {e}"),
            });
            break;
        }
        if Instant::now() > deadline {
            failed = Some("threads did not all start within 600 s".into());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The last threads in give their instances up too.
    tokio::time::sleep(evict_after * 3).await;
    let rss_after = rss_kib();
    let maps_after = memory_maps();
    let peak = peak_rss_kib();
    for task in &tasks {
        task.abort();
    }
    json!({
        "bench": "concurrency", "threads": n, "error": failed,
        "allocator": runtime.allocator().to_string(),
        "start_seconds": elapsed, "threads_per_second": n as f64 / elapsed,
        "rss_kib": rss_after, "peak_rss_kib": peak,
        "rss_per_thread_kib": (rss_after.saturating_sub(rss_before)) as f64 / n as f64,
        "memory_maps": maps_after,
        "memory_maps_pool_per_thread": (maps_before.saturating_sub(maps_at_start)) as f64 / n as f64,
        "memory_maps_per_thread": (maps_after.saturating_sub(maps_before)) as f64 / n as f64,
    })
}

/// solve-issue added to `store` and loaded in `runtime`, with the bench's agent answering
/// every call after `delay`.
async fn slow_solve_issue(
    runtime: &Runtime,
    store: &Storage,
    dir: &Path,
    delay: Duration,
) -> (BundleHash, Arc<uncaged_workflow::sandbox::engine::LoadedBundle>, AgentSet) {
    let catalog = Catalog::new(store);
    catalog
        .add(runtime, "solve-issue", Path::new(artifacts::SOLVE_ISSUE), &Limits::default())
        .await
        .unwrap();
    let hash = catalog.entry("solve-issue").unwrap().hash;
    let bundle = Arc::new(catalog.load(runtime, "solve-issue", hash).unwrap());
    let config = answers_config(dir, Some(delay));
    let request =
        RunRequest { agent: Some(AgentSpec::Named("bench".into())), ..Default::default() };
    let agents =
        AgentSet::resolve(&config, &request, &Secrets::default(), &bundle.descriptor, None)
            .unwrap();
    (hash, bundle, agents)
}

/// The answer to an evicted thread → its next step: threads whose every agent call takes
/// `DELAY` give their instances up after 20 ms, so each step after the 20th is a rebuild of
/// the instance from 20+ recorded steps, then the step. A step's time beyond `DELAY`, with and
/// without eviction, in milliseconds.
async fn evicted_steps() -> Value {
    const DELAY: Duration = Duration::from_millis(100);
    const THREADS: usize = 8;
    const STEPS: usize = 45;
    let dir = disk_dir();
    let home = Home::new(dir.path().join("home"));
    let store = Storage::open(&home);
    let mut result = json!({"bench": "evicted_step", "delay_ms": DELAY.as_millis() as u64});
    for (name, evict_after) in
        [("kept", Duration::from_secs(600)), ("evicted", Duration::from_millis(20))]
    {
        let limits = Limits { evict_after, ..Limits::default() };
        let runtime = Runtime::for_worker(&home, &limits).unwrap();
        let (hash, bundle, agents) = slow_solve_issue(&runtime, &store, dir.path(), DELAY).await;
        let mut tasks = Vec::new();
        for _ in 0..THREADS {
            let (runtime, store, bundle, agents, limits) =
                (runtime.clone(), store.clone(), bundle.clone(), agents.clone(), limits.clone());
            tasks.push(tokio::spawn(async move {
                let (mut writer, record) = new_thread(&store, hash, STEPS as u32);
                let ctx = RunContext {
                    runtime: &runtime,
                    store: &store,
                    agents,
                    limits,
                    control: Arc::new(ThreadControl::default()),
                    children: None,
                };
                let mut last = Instant::now();
                let mut over = Vec::new();
                run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |event| {
                    let ThreadEvent::Step { index, .. } = event;
                    let now = Instant::now();
                    if index > 20 {
                        over.push((now - last).saturating_sub(DELAY).as_secs_f64() * 1e3);
                    }
                    last = now;
                })
                .await
                .unwrap();
                over
            }));
        }
        let mut over = Vec::new();
        for task in tasks {
            over.extend(task.await.unwrap());
        }
        over.sort_by(f64::total_cmp);
        let at = |q: f64| over[((over.len() - 1) as f64 * q).round() as usize];
        result[name] = json!({"samples": over.len(), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)});
    }
    result
}

/// A new thread of solve-issue on the bench prompt, taking at most `max_rounds` steps.
fn new_thread(store: &Storage, hash: BundleHash, max_rounds: u32) -> OpenThread {
    open_thread(store, "solve-issue", hash, "Fix the crash", max_rounds)
}

/// A new thread of workflow `name` (bundle `hash`) on `prompt`, opened to run here.
fn open_thread(
    store: &Storage,
    name: &str,
    hash: BundleHash,
    prompt: &str,
    max_rounds: u32,
) -> OpenThread {
    let request = RunRequest { max_rounds: Some(max_rounds), ..Default::default() };
    let start = StartRequest {
        name: name.into(),
        prompt: prompt.into(),
        trigger_data: None,
        request: request.clone(),
        origin: Default::default(),
    };
    let created = lifecycle::create(store, start, Checked { hash, request }).unwrap();
    store.threads().open(created.id()).unwrap()
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Mappings of this process: the kernel caps them at `vm.max_map_count`.
fn memory_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps").map(|m| m.lines().count()).unwrap_or(0)
}

fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

fn peak_rss_kib() -> u64 {
    status_kib("VmHWM:")
}
