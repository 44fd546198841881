//! Integration tests: the real `uncaged-workflow` binary, each test in a fresh temporary home.
//!
//! The tests that go through the CLI only are written once, inside [`on_both_stores!`], and
//! run on both stores: a home directory, and a fresh database on a real PostgreSQL server the
//! tests start themselves (`../support/postgres.rs`). The others read the home directory's
//! files, or a local worker's process, and run on a home directory (or, in `shared_store`,
//! on a database by design). `UNCAGED_TEST_STORE=postgres` puts those on a database too.

/// Declares each test twice, as `<name>::files` and `<name>::postgres`: the same body, with
/// [`Env::new`] giving it a home directory or a fresh database.
macro_rules! on_both_stores {
    () => {};
    ($(#[$attr:meta])* fn $name:ident() -> $ret:ty $body:block $($rest:tt)*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(#[$attr])*
            fn files() -> $ret {
                $crate::use_store($crate::TestStore::Files);
                $body
            }
            $(#[$attr])*
            fn postgres() -> $ret {
                $crate::use_store($crate::TestStore::Postgres);
                $body
            }
        }
        on_both_stores!($($rest)*);
    };
    ($(#[$attr:meta])* async fn $name:ident() -> $ret:ty $body:block $($rest:tt)*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(#[$attr])*
            async fn files() -> $ret {
                $crate::use_store($crate::TestStore::Files);
                $body
            }
            $(#[$attr])*
            async fn postgres() -> $ret {
                $crate::use_store($crate::TestStore::Postgres);
                $body
            }
        }
        on_both_stores!($($rest)*);
    };
}

mod a2a;
mod agents;
mod api;
mod bad_input;
mod children;
mod command_line;
mod crash;
mod declarative;
mod durability;
mod evals;
mod exit_codes;
mod fan_out;
mod hooks;
mod hostile;
mod human;
mod inputs;
mod instances;
mod languages;
mod lifecycle;
mod limits;
mod llm;
mod mcp;
mod mock_model;
mod notify;
mod oauth;
mod parallel;
mod plan;
mod registry;
mod run;
mod sandbox;
mod schedule;
mod serve;
mod shared_store;
mod telemetry;
mod tools;
mod versions;
pub mod web;

#[path = "../support/postgres.rs"]
pub mod postgres;
#[path = "../support/scratch.rs"]
pub mod scratch;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

pub use uncaged_test_artifacts as artifacts;

/// A temporary home and a way to run the binary in it.
pub struct Env {
    pub dir: tempfile::TempDir,
    /// The database store, when the tests run on PostgreSQL.
    pub store: Option<String>,
}

/// The PostgreSQL server of this test process, started at first use and stopped when the
/// process exits.
pub fn pg() -> Result<&'static postgres::PgServer> {
    static SERVER: std::sync::OnceLock<std::result::Result<postgres::PgServer, String>> =
        std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            let server = postgres::PgServer::start(&[
                // Test data need not survive a power cut; the server is killed with its tests.
                "fsync=off",
                "synchronous_commit=off",
                "full_page_writes=off",
                "max_connections=400",
            ])
            .map_err(|e| format!("{e:#}"))?;
            // Every test's database starts as a copy of one the binary migrated.
            server
                .prepare_template(|url| {
                    let home = scratch::tempdir()?;
                    let out = Command::new(env!("CARGO_BIN_EXE_uncaged-workflow"))
                        .arg("threads")
                        .env("UNCAGED_WORKFLOW_HOME", home.path())
                        .env("UNCAGED_WORKFLOW_STORE", url)
                        .output()?;
                    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                    Ok(())
                })
                .map_err(|e| format!("migrating the template database: {e:#}"))?;
            Ok(server)
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("starting PostgreSQL: {e}"))
}

/// The PgBouncer (transaction pooling) in front of [`pg`], started at first use.
pub fn bouncer() -> Result<&'static postgres::PgBouncer> {
    postgres::PgBouncer::shared(pg)
}

/// A fresh database of the test server, for a new [`Env`]: reached directly, or through
/// [`bouncer`] for a test that asked with [`through_pgbouncer`] (and for every test with
/// `UNCAGED_TEST_PG_VIA=pgbouncer`: `make test-pgbouncer`).
fn new_database() -> Result<String> {
    let url = pg()?.new_database()?;
    let via_bouncer = THROUGH_PGBOUNCER.with(|chosen| chosen.get())
        || std::env::var("UNCAGED_TEST_PG_VIA").is_ok_and(|via| via == "pgbouncer");
    if via_bouncer { bouncer()?.url(&url) } else { Ok(url) }
}

/// Puts the databases of the test on this thread behind [`bouncer`].
pub fn through_pgbouncer() {
    THROUGH_PGBOUNCER.with(|chosen| chosen.set(true));
}

/// The store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStore {
    Files,
    Postgres,
}

thread_local! {
    /// The store [`on_both_stores!`] chose for the test on this thread.
    static TEST_STORE: std::cell::Cell<Option<TestStore>> = const { std::cell::Cell::new(None) };
    /// Whether the test on this thread reaches its database through PgBouncer.
    static THROUGH_PGBOUNCER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Puts the test on this thread on `store` (each test runs on a thread of its own, and its
/// environments are made on it).
pub fn use_store(store: TestStore) {
    TEST_STORE.with(|chosen| chosen.set(Some(store)));
}

/// Whether this test uses a PostgreSQL store.
pub fn on_postgres() -> bool {
    match TEST_STORE.with(|chosen| chosen.get()) {
        Some(store) => store == TestStore::Postgres,
        None => std::env::var("UNCAGED_TEST_STORE").is_ok_and(|store| store == "postgres"),
    }
}

/// What a finished command left.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// A test's processes end with it: workers waiting out their five idle seconds would take the
/// CPU the tests after it need (and, once its directory is gone, fail to read its clock).
/// Every process started on this home — workers, `serve`, agents — carries it in its
/// environment.
impl Drop for Env {
    fn drop(&mut self) {
        let mark = format!("UNCAGED_WORKFLOW_HOME={}", self.home().display());
        kill_9(&processes_where("environ", |variables| {
            variables.split(|&b| b == 0).any(|variable| variable == mark.as_bytes())
        }));
    }
}

/// The pids of the processes whose `/proc/<pid>/<file>` (`cmdline`, `environ`: NUL-separated)
/// `matches`; a process that is gone, or not ours to read, is left out.
pub fn processes_where(file: &str, matches: impl Fn(&[u8]) -> bool) -> Vec<String> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if std::fs::read(entry.path().join(file)).is_ok_and(|bytes| matches(&bytes)) {
            pids.push(pid);
        }
    }
    pids
}

/// `kill -9` of `pids` (any already gone is no error).
pub fn kill_9(pids: &[String]) {
    if !pids.is_empty() {
        let _ = Command::new("kill").arg("-9").args(pids).stderr(Stdio::null()).status();
    }
}

impl Env {
    pub fn new() -> Result<Self> {
        let store = if on_postgres() { Some(new_database()?) } else { None };
        Env::with_store(store)
    }

    /// A fresh home on a fresh database of the test server, whatever the run's store.
    pub fn on_postgres() -> Result<Self> {
        Env::with_store(Some(new_database()?))
    }

    /// A fresh home on `store`, sharing the compiled code of every test's home.
    fn with_store(store: Option<String>) -> Result<Self> {
        let env = Env { dir: scratch::tempdir()?, store };
        env.share_compiled_code()?;
        Ok(env)
    }

    /// Points the home's cache of compiled code (`cache/`: each bundle's native code by its
    /// hash and the engine's, and `functions/`, compiled functions by the hash of their code;
    /// all written by rename, safe to share) at one shared by all the tests and kept between
    /// runs: a bundle, and the interpreter of YAML workflows, is compiled once, not once per
    /// test. [`Env::own_cache`] undoes it for a test that looks into the cache or damages it.
    fn share_compiled_code(&self) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compiled-code");
        std::fs::create_dir_all(shared.join("functions"))?;
        // Private, as the product makes a home.
        std::fs::DirBuilder::new().mode(0o700).create(self.home())?;
        std::os::unix::fs::symlink(shared, self.home().join("cache"))?;
        Ok(())
    }

    /// What the product wrote in the home: every file and folder in it, but the shared cache
    /// of compiled code this test put there.
    pub fn written(&self) -> Result<Vec<PathBuf>> {
        let home = self.home();
        let mut found = Vec::new();
        let mut dirs = vec![home.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path == home.join("cache") && path.is_symlink() {
                    continue;
                }
                if path.is_dir() {
                    dirs.push(path.clone());
                }
                found.push(path.strip_prefix(&home)?.to_path_buf());
            }
        }
        Ok(found)
    }

    /// Gives this home a cache of compiled code of its own (empty).
    pub fn own_cache(&self) -> Result<()> {
        let cache = self.home().join("cache");
        std::fs::remove_file(&cache)?;
        std::fs::create_dir(&cache)?;
        Ok(())
    }

    /// Runs SQL on this test's database (tables are in schema `uncaged_workflow`).
    pub fn sql(&self, statements: &str) -> Result<String> {
        let url = self.store.as_deref().context("this test's store is not a database")?;
        let db = url.rsplit('/').next().context("database name")?;
        pg()?.sql(db, &format!("SET search_path TO uncaged_workflow; {statements}"))
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// Waits until no worker of this home or store is live: a worker stays a moment after its
    /// last thread for the next one, and a test whose next `run` must start a worker of its
    /// own (with its environment, or to load the bundle afresh) waits it out.
    pub fn wait_for_workers_to_exit(&self) -> Result<()> {
        if self.store.is_some() {
            return wait_until("the workers exit", || {
                Ok(self.sql("SELECT count(*) FROM workers")?.trim() == "0")
            });
        }
        let run = self.home().join("run");
        wait_until("the workers exit", || {
            Ok(!std::fs::read_dir(&run).is_ok_and(|entries| {
                entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "sock"))
            }))
        })
    }

    /// The binary, on this test's home and store, in its directory.
    pub fn command(&self) -> Command {
        self.command_of(env!("CARGO_BIN_EXE_uncaged-workflow"))
    }

    /// Gives this test's processes a clock of their own, reading `ms` (since the epoch) until
    /// moved with [`Env::advance`]: what they decide on the time of day (due cron instants,
    /// due polls) follows it, and the test waits for no real time to pass.
    pub fn set_clock(&self, ms: u64) -> Result<()> {
        let path = self.clock_file();
        let next = self.dir.path().join("clock.next");
        std::fs::write(&next, ms.to_string())?;
        // In place at once: a process reading the clock never sees it half written.
        std::fs::rename(next, path)?;
        Ok(())
    }

    /// Moves this test's clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) -> Result<()> {
        self.set_clock(self.clock_ms()? + by.as_millis() as u64)
    }

    /// The time on this test's clock.
    pub fn clock_ms(&self) -> Result<u64> {
        let text = std::fs::read_to_string(self.clock_file()).context("the test's clock is set")?;
        Ok(text.trim().parse()?)
    }

    fn clock_file(&self) -> PathBuf {
        self.dir.path().join("clock")
    }

    /// The file this test's clock is kept in, for a server of the test's that reads the time
    /// as the product does.
    pub fn clock_file_path(&self) -> PathBuf {
        self.clock_file()
    }

    /// `program` (a shell that starts the binary, say) with the binary's environment.
    pub fn command_of(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        match self.clock_file().exists() {
            true => command.env("UNCAGED_WORKFLOW_CLOCK", self.clock_file()),
            false => command.env_remove("UNCAGED_WORKFLOW_CLOCK"),
        };
        match &self.store {
            Some(url) => command.env("UNCAGED_WORKFLOW_STORE", url),
            None => command.env_remove("UNCAGED_WORKFLOW_STORE"),
        };
        command
            .env("UNCAGED_WORKFLOW_HOME", self.home())
            .env_remove("RUST_LOG")
            // A collector of the machine's must not get this test's traces, nor decide them.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .current_dir(self.dir.path());
        command
    }

    /// Runs the binary with `args`, whatever its exit code.
    pub fn run(&self, args: &[&str]) -> Result<Run> {
        self.run_with(args, &[])
    }

    /// Runs the binary with `args` and extra environment variables (which a worker it starts
    /// inherits), whatever its exit code.
    pub fn run_with(&self, args: &[&str], vars: &[(&str, &str)]) -> Result<Run> {
        let output: Output = self
            .command()
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .context("failed to start uncaged-workflow")?;
        Ok(Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout)?,
            stderr: String::from_utf8(output.stderr)?,
        })
    }

    /// Runs and requires exit code 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let run = self.run(args)?;
        ensure!(
            run.code == 0,
            "`{}` exited {}:\nstdout: {}\nstderr: {}",
            args.join(" "),
            run.code,
            run.stdout,
            run.stderr
        );
        Ok(run.stdout)
    }

    /// Runs and requires exit code `code`; returns stderr. Our own errors must be one line;
    /// clap's usage errors keep clap's format (the error, then a hint).
    pub fn fails(&self, args: &[&str], code: i32) -> Result<String> {
        let run = self.run(args)?;
        ensure!(
            run.code == code,
            "`{}` exited {} (wanted {code}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            run.code,
            run.stdout,
            run.stderr
        );
        if run.stderr.starts_with("uncaged-workflow: ") {
            ensure!(
                run.stderr.trim().lines().count() == 1,
                "error is not one line: {}",
                run.stderr
            );
        } else {
            ensure!(run.stderr.starts_with("error: "), "not a usage error: {}", run.stderr);
        }
        Ok(run.stderr)
    }

    /// Runs with `--json` appended and parses stdout.
    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.ok(&args)?;
        serde_json::from_str(&out).with_context(|| format!("not JSON: {out}"))
    }

    /// Writes a file in the test directory and returns its path.
    pub fn write(&self, name: &str, content: impl AsRef<[u8]>) -> Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content)?;
        Ok(path)
    }

    /// Writes an executable script in the test directory and returns its path.
    pub fn write_script(&self, name: &str, content: impl AsRef<[u8]>) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(name, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    /// Adds `solve-issue` and returns its hash.
    pub fn add_solve_issue(&self) -> Result<String> {
        let added = self.json(&["add", "solve-issue", artifacts::SOLVE_ISSUE])?;
        Ok(added["hash"].as_str().context("hash")?.to_string())
    }

    /// The records of a thread (the lines of its data file, or its rows), parsed.
    pub fn thread_lines(&self, hash: &str, thread: &str) -> Result<Vec<Value>> {
        if self.store.is_some() {
            return self.rows(&format!(
                "SELECT line FROM thread_records WHERE thread = '{thread}' ORDER BY seq"
            ));
        }
        let path = self.home().join("logs").join(hash).join(format!("{thread}.data.jsonl"));
        read_jsonl(&path)
    }

    /// The call journal of a thread, parsed.
    pub fn calls(&self, hash: &str, thread: &str) -> Result<Vec<Value>> {
        if self.store.is_some() {
            return self.rows(&format!(
                "SELECT line FROM thread_calls WHERE thread = '{thread}' ORDER BY seq"
            ));
        }
        read_jsonl(&self.home().join(format!("logs/{hash}/{thread}.calls.jsonl")))
    }

    /// The debug log of a thread, parsed.
    pub fn info_lines(&self, hash: &str, thread: &str) -> Result<Vec<Value>> {
        if self.store.is_some() {
            return self.rows(&format!(
                "SELECT line FROM thread_log WHERE thread = '{thread}' ORDER BY seq"
            ));
        }
        read_jsonl(&self.home().join(format!("logs/{hash}/{thread}.info.jsonl")))
    }

    /// The debug log of a thread as text, a JSON line each.
    pub fn info_text(&self, hash: &str, thread: &str) -> Result<String> {
        if self.store.is_some() {
            return Ok(self.info_lines(hash, thread)?.iter().map(|l| format!("{l}\n")).collect());
        }
        let path = self.home().join(format!("logs/{hash}/{thread}.info.jsonl"));
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
    }

    /// JSON lines selected from this test's database.
    pub fn rows(&self, query: &str) -> Result<Vec<Value>> {
        let out = self.sql(query)?;
        out.lines()
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_str(line).with_context(|| format!("not JSON: {line}")))
            .collect()
    }

    /// Waits until `answers` agent calls of step `step` (0-based) of `thread` are journaled,
    /// then `kill -9`s the worker and waits until the thread reads `interrupted`.
    pub fn kill_once_journaled(
        &self,
        hash: &str,
        thread: &str,
        step: u64,
        answers: usize,
    ) -> Result<()> {
        wait_until("the answers are journaled", || {
            let journaled = self.calls(hash, thread).unwrap_or_default();
            Ok(journaled.iter().filter(|c| c["kind"] == "agent" && c["step"] == step).count()
                == answers)
        })?;
        self.kill_the_worker()?;
        wait_until("the thread is interrupted", || Ok(status(self, thread)? == "interrupted"))
    }

    /// A command agent that answers `{}` once the file it waits on is gone; the file (created
    /// here: remove it to let the agent answer) and the agent spec.
    pub fn gate_agent(&self) -> Result<(PathBuf, String)> {
        let gate = self.dir.path().join("gate");
        std::fs::write(&gate, "")?;
        let script = self.write_script(
            "gate.sh",
            format!(
                "#!/bin/sh\nwhile [ -f {} ]; do sleep 0.02; done\necho '{{}}'\n",
                gate.display()
            ),
        )?;
        Ok((gate, format!("command:{}", script.display())))
    }

    /// `kill -9` of the one worker running in this home.
    pub fn kill_the_worker(&self) -> Result<()> {
        let worker = self.json(&["ps"])?[0]["pid"].as_u64().context("worker pid")?;
        ensure!(alive(worker), "the worker {worker} is not running");
        Command::new("kill").args(["-9", &worker.to_string()]).status()?;
        Ok(())
    }
}

/// A `serve` process on an ephemeral loopback port, stopped (SIGTERM) when dropped.
pub struct Serve {
    pub child: std::process::Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Serve {
    /// Starts `serve --listen 127.0.0.1:0` with `args` and waits for the address it prints.
    pub fn start(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Result<Serve> {
        Serve::start_on(env, "127.0.0.1:0", args, vars)
    }

    /// Starts `serve --listen LISTEN` with `args` and waits for the address it prints.
    pub fn start_on(
        env: &Env,
        listen: &str,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Result<Serve> {
        use std::io::BufRead;
        let mut child = env
            .command()
            .args(["serve", "--listen", listen])
            .args(args)
            .envs(vars.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(env.dir.path().join("serve.err"))?)
            .spawn()
            .context("start serve")?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .with_context(|| format!("no address in {line:?}"))?
            .to_string();
        Ok(Serve { child, addr })
    }

    /// Stops it as an operator would (SIGTERM) and waits for it to exit (60 s at most: a
    /// bound for a hung test).
    pub fn stop(mut self) -> Result<()> {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status()?;
        let mut exited = None;
        wait_until("serve exits on SIGTERM", || {
            exited = self.child.try_wait()?;
            Ok(exited.is_some())
        })?;
        ensure!(exited.is_some_and(|s| s.success()), "serve exited with {exited:?}");
        Ok(())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A shell loop that waits until `path` exists, or exits 1 once the directory holding it is
/// gone: an agent still waiting when its test returned (and its directory went) would
/// otherwise wait for ever, and keep its worker alive after the tests.
pub fn sh_wait_for(path: &Path) -> String {
    let dir = path.parent().expect("a file in a directory");
    format!(
        "while [ ! -e {} ]; do [ -d {} ] || exit 1; sleep 0.02; done",
        path.display(),
        dir.display()
    )
}

/// Polls `check` until it holds (60 s at most: a bound for a hung test, not a timing claim).
pub fn wait_until(what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check()? {
        ensure!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Is process `pid` alive? A zombie (exited, not yet reaped) is not.
pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

/// A thread's status, as `thread --json` says it.
pub fn status(env: &Env, thread: &str) -> Result<String> {
    Ok(env.json(&["thread", thread])?["status"].as_str().context("status")?.to_string())
}

pub fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines().map(|l| serde_json::from_str(l).with_context(|| format!("bad line {l}"))).collect()
}

/// The thread id printed by a human-readable `run` (`thread <ULID>: ...`).
pub fn thread_id_of(run_stdout: &str) -> Result<String> {
    let first = run_stdout.lines().next().context("no output")?;
    let id =
        first.strip_prefix("thread ").and_then(|r| r.split(':').next()).context("no thread id")?;
    Ok(id.to_string())
}

/// Roles of a thread's steps, in order.
pub fn roles(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.get("role").is_some())
        .map(|l| l["role"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A file system mounted for a test (a small tmpfs, or a folder bound read-only), unmounted
/// when dropped. Mounting needs root, as CI runs: elsewhere the constructors say so and give
/// `None`, and the test that asked ends there.
pub struct Mount {
    at: PathBuf,
}

impl Mount {
    /// A tmpfs of `size` (`1m`, say) at `at`, which must be an empty directory.
    pub fn tmpfs(at: &Path, size: &str) -> Result<Option<Mount>> {
        std::fs::create_dir_all(at)?;
        Mount::run(at, &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
    }

    /// `dir` itself, bound over itself read-only: what is there stays, nothing can be written.
    pub fn read_only(dir: &Path) -> Result<Option<Mount>> {
        let Some(mount) = Mount::run(dir, &["--bind", &dir.display().to_string()])? else {
            return Ok(None);
        };
        let remounted = Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(dir)
            .status()
            .context("run mount")?;
        ensure!(remounted.success(), "could not remount {} read-only", dir.display());
        Ok(Some(mount))
    }

    /// Writes a file until the file system is full; returns it (removing it makes room).
    pub fn fill(&self) -> Result<PathBuf> {
        use std::io::Write;
        let path = self.at.join("filler");
        let mut file = std::fs::File::create(&path)?;
        let chunk = vec![0u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.sync_all();
        Ok(path)
    }

    fn run(at: &Path, args: &[&str]) -> Result<Option<Mount>> {
        if !is_root() {
            eprintln!("skipped: mounting a file system for this test needs root (CI runs as root)");
            return Ok(None);
        }
        let status = Command::new("mount").args(args).arg(at).status().context("run mount")?;
        ensure!(status.success(), "mount {args:?} {} failed", at.display());
        Ok(Some(Mount { at: at.to_path_buf() }))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.to_string()))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
}

/// A small xorshift generator: the points a crash test picks at random, reproducible from its
/// seed (`UNCAGED_TEST_SEED`; a failing point names it).
pub struct Random(u64);

impl Random {
    /// Seeded from `UNCAGED_TEST_SEED`, or else the time; with the seed, to report.
    pub fn seeded() -> (u64, Random) {
        let seed: u64 = std::env::var("UNCAGED_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                now.map_or(1, |d| d.as_nanos() as u64) ^ std::process::id() as u64
            });
        (seed, Random(seed.max(1)))
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
