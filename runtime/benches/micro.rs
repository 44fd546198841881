//! In-process micro-benchmarks (criterion): loading a bundle from the AOT cache vs compiling
//! it, instantiating a thread (on demand vs pooled), one generator step with an instant
//! in-process agent (with the host's share of it measured separately), and one appended
//! line with and without fsync (the durability floor of this disk).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use uncaged_test_artifacts as artifacts;
use uncaged_workflow::agents::{AgentSet, Secrets};
use uncaged_workflow::durable::AppendFile;
use uncaged_workflow::home::Home;
use uncaged_workflow::ids::BundleHash;
use uncaged_workflow::limits::Limits;
use uncaged_workflow::run::catalog::Catalog;
use uncaged_workflow::run_request::RunRequest;
use uncaged_workflow::sandbox::control::ThreadControl;
use uncaged_workflow::sandbox::engine::{LoadedBundle, Runtime};
use uncaged_workflow::sandbox::instance::ThreadInput;
use uncaged_workflow::sandbox::state::{HostContext, ThreadState, ThreadView};
use uncaged_workflow::store::Storage;
use uncaged_workflow::store::config::Config;
use uncaged_workflow::store::debug_log::DebugLog;
use uncaged_workflow::store::journal::Journal;
use wasmtime::Store;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A home with solve-issue added, and its bundle loaded by `runtime`.
fn setup(dir: &Path, runtime: &Runtime) -> (Home, LoadedBundle) {
    let home = Home::new(dir);
    let catalog = Catalog::new(&Storage::open(&home));
    rt().block_on(catalog.add(
        runtime,
        "solve-issue",
        Path::new(artifacts::SOLVE_ISSUE),
        &Limits::default(),
    ))
    .unwrap();
    let hash = catalog.entry("solve-issue").unwrap().hash;
    let bundle = catalog.load(runtime, "solve-issue", hash).unwrap();
    (home, bundle)
}

fn store(runtime: &Runtime, bundle: &LoadedBundle) -> Store<ThreadState> {
    // Scripted answers from the schemas' examples: the reviewer rejects, then approves; with
    // the approving example removed it would loop — here each step is a fresh thread anyway.
    let agents = AgentSet::resolve(
        &Config::default(),
        &RunRequest::default(),
        &Secrets::default(),
        &bundle.descriptor,
        None,
    )
    .unwrap();
    let host = HostContext::new(
        "01KQXKW18CT8G75T53R8F4G7YG".parse().unwrap(),
        agents,
        DebugLog::tracing(),
        Journal::disabled(),
        Arc::new(ThreadControl::default()),
        ThreadView::default(),
    );
    let mut store = Store::new(runtime.engine(), ThreadState::new(host, &Limits::default()));
    store.set_epoch_deadline(u64::MAX / 2);
    store
}

fn load(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(&Home::new(dir.path())).unwrap();
    let (_home, _) = setup(dir.path(), &runtime);
    let bytes = std::fs::read(artifacts::SOLVE_ISSUE).unwrap();
    let hash = BundleHash::of(&bytes);
    let path = Path::new(artifacts::SOLVE_ISSUE);
    let cache = runtime.cache_file(hash);
    let mut group = c.benchmark_group("load");
    group
        .bench_function("from AOT cache", |b| b.iter(|| runtime.load(hash, &bytes, path).unwrap()));
    group.sample_size(10);
    group.bench_function("compile", |b| {
        b.iter(|| {
            let _ = std::fs::remove_file(&cache);
            runtime.load(hash, &bytes, path).unwrap()
        })
    });
    group.finish();
}

fn instantiate(c: &mut Criterion) {
    let mut group = c.benchmark_group("instantiate");
    for (name, pooled) in [("on demand", false), ("pooling", true)] {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let runtime = if pooled {
            Runtime::for_worker(&home, &Limits::default()).unwrap()
        } else {
            Runtime::new(&home).unwrap()
        };
        let (_home, bundle) = setup(dir.path(), &runtime);
        let rt = rt();
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let mut store = store(&runtime, &bundle);
                bundle.pre.instantiate(&mut store).await.unwrap()
            })
        });
    }
    group.finish();
}

fn step(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    let runtime = Runtime::for_worker(&home, &Limits::default()).unwrap();
    let (_home, bundle) = setup(dir.path(), &runtime);
    let rt = rt();
    let host_share = std::sync::Mutex::new(Vec::new());
    c.bench_function("generator step (instant agent)", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let runtime = &runtime;
            let bundle = &bundle;
            let host_share = &host_share;
            async move {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    // A thread of solve-issue takes 5 steps: time them, not the set-up.
                    let mut store = store(runtime, bundle);
                    let instance = bundle.pre.instantiate(&mut store).await.unwrap();
                    let input = ThreadInput {
                        thread_id: "01KQXKW18CT8G75T53R8F4G7YG".parse().unwrap(),
                        prompt: "Fix the crash",
                        steps: &[],
                        trigger_data: None,
                        max_rounds: 1000,
                    };
                    let generator = instance.start(&mut store, input).await.unwrap();
                    for _ in 0..5 {
                        if done == iters {
                            break;
                        }
                        store.data_mut().start_step();
                        let started = Instant::now();
                        generator.next(&mut store).await.unwrap();
                        let elapsed = started.elapsed();
                        total += elapsed;
                        let share =
                            store.data().step_host_time().as_secs_f64() / elapsed.as_secs_f64();
                        host_share.lock().unwrap().push(share);
                        done += 1;
                    }
                }
                total
            }
        })
    });
    let mut host_share = host_share.into_inner().unwrap();
    host_share.sort_by(f64::total_cmp);
    if let Some(median) = host_share.get(host_share.len() / 2) {
        // Criterion reports the whole step; this is the host's part of it.
        println!("generator step: host share (agent, extract, log) median {:.1}%", median * 100.0);
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/criterion/host-share.txt");
        let _ = std::fs::write(out, format!("{median}\n"));
    }
}

fn append(c: &mut Criterion) {
    let dir =
        tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")).unwrap();
    let line = br#"{"role":"developer","content":"Done: fixed it","meta":{"summary":"Fixed"},"timestamp":1795000000000}"#;
    let mut group = c.benchmark_group("append one step");
    for (name, durable) in [("fsync", true), ("no fsync", false)] {
        let mut file =
            AppendFile::open(&dir.path().join(format!("{durable}.jsonl")), durable).unwrap();
        group.bench_function(name, |b| b.iter(|| file.append(line).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, load, instantiate, step, append);
criterion_main!(benches);
