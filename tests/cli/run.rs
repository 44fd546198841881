//! run, threads, thread: a thread's life on disk.

use anyhow::Result;
use serde_json::json;

use crate::{Env, roles, thread_id_of};

#[test]
fn run_prints_steps_and_records_the_thread() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let out = env.ok(&["run", "solve-issue", "-p", "Fix the crash on empty input"])?;
    let thread = thread_id_of(&out)?;
    let printed: Vec<_> = out.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(printed.len(), 5, "{out}");
    for (line, role) in
        printed.iter().zip(["planner", "developer", "reviewer", "developer", "reviewer"])
    {
        assert!(line.contains(role) && line.contains("scripted"), "{line}");
    }
    assert!(
        out.trim_end().ends_with("completed (0): approved after 2 development round(s)"),
        "{out}"
    );

    // The data file: start record, one line per step, end record.
    let lines = env.thread_lines(&hash, &thread)?;
    assert_eq!(lines.len(), 7);
    let start = &lines[0];
    assert_eq!(start["name"], "solve-issue");
    assert_eq!(start["hash"], hash.as_str());
    assert_eq!(start["threadId"], thread.as_str());
    assert_eq!(start["parameters"]["prompt"], "Fix the crash on empty input");
    assert_eq!(start["parameters"]["options"]["maxRounds"], 10);
    // Recorded so that command agents of a resumed thread run where it was started.
    assert_eq!(start["parameters"]["options"]["cwd"], env.dir.path().to_str().unwrap());
    assert!(start["timestamp"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer", "developer", "reviewer"]);
    assert_eq!(
        lines[3]["meta"],
        json!({"approved": false, "comments": ["Handle the empty-input case"]})
    );
    assert_eq!(lines[5]["meta"]["approved"], true);
    assert!(lines[1]["content"].as_str().unwrap().contains("```json"));
    let end = &lines[6]["end"];
    assert_eq!(
        end,
        &json!({"returnCode": 0, "summary": "approved after 2 development round(s)",
                "status": "completed", "endedBy": "workflow"})
    );

    // The debug log names the thread and where the code came from.
    let info = env.info_lines(&hash, &thread)?;
    assert!(info.iter().all(|l| l["tag"].as_str().unwrap().len() == 8));
    assert!(
        info.iter().any(|l| { l["content"].as_str().unwrap().contains("asking agent `scripted`") })
    );

    // threads and thread show it.
    let threads = env.json(&["threads"])?;
    assert_eq!(threads[0]["threadId"], thread.as_str());
    assert_eq!(threads[0]["status"], "completed");
    assert_eq!(threads[0]["steps"], 5);
    assert!(env.ok(&["threads", "solve-issue"])?.contains(&thread));
    assert!(env.ok(&["threads", "develop"])?.contains("no threads"));
    let shown = env.json(&["thread", &thread])?;
    assert_eq!(shown["steps"].as_array().unwrap().len(), 5);
    // The end at one level: its fields and when it was written.
    assert_eq!(shown["end"]["status"], "completed");
    assert!(shown["end"]["timestamp"].is_u64(), "{shown}");
    let human = env.ok(&["thread", &thread])?;
    assert!(
        human.contains("prompt: Fix the crash on empty input") && human.contains("[5] reviewer"),
        "{human}"
    );
    Ok(())
}

#[test]
fn second_run_loads_precompiled_code() -> Result<()> {
    let env = Env::new()?;
    env.own_cache()?;
    env.add_solve_issue()?;
    let hash = env.json(&["show", "solve-issue"])?["hash"].as_str().unwrap().to_string();
    // What the thread's debug log says about where its code came from.
    let cache_line = |stdout: &str| -> Result<String> {
        let thread = thread_id_of(stdout)?;
        let info = env.info_lines(&hash, &thread)?;
        let line = info.iter().find(|l| l["content"].as_str().unwrap().contains("AOT cache"));
        Ok(line.map(|l| l["content"].as_str().unwrap().to_string()).unwrap_or_default())
    };
    // Each run starts a worker of its own, which loads the bundle: the one before has gone.
    for _ in 0..2 {
        env.wait_for_workers_to_exit()?;
        let out = env.ok(&["run", "solve-issue", "-p", "x"])?;
        assert!(out.lines().next().unwrap().ends_with("(precompiled)"), "{out}");
        assert_eq!(cache_line(&out)?, "bundle loaded from the AOT cache (no compilation)");
    }
    // A deleted cache is rebuilt, not an error.
    env.wait_for_workers_to_exit()?;
    std::fs::remove_dir_all(env.home().join("cache"))?;
    let out = env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert!(out.lines().next().unwrap().ends_with("(compiled now)"), "{out}");
    assert_eq!(cache_line(&out)?, "bundle compiled (AOT cache miss)");
    env.wait_for_workers_to_exit()?;
    let out = env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(cache_line(&out)?, "bundle loaded from the AOT cache (no compilation)");
    // The worker's own log (`-v` level) says so too.
    let log = std::fs::read_to_string(env.home().join(format!("run/{hash}.log")))?;
    assert!(log.contains("AOT cache hit") && log.contains("AOT cache miss"), "{log}");
    Ok(())
}

/// `--json` prints one event per line, each naming its `type` (docs/json.md): started,
/// working, step (the step with its agent and duration), ended.
#[test]
fn run_json_prints_one_typed_event_per_line() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let out = env.ok(&["run", "solve-issue", "-p", "x", "--json"])?;
    let all: Vec<serde_json::Value> =
        out.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert!(all.iter().all(|o| o["type"].is_string()), "an event without its type: {out}");
    assert_eq!(all[0]["type"], "started");
    let thread = all[0]["thread"].as_str().unwrap();
    if env.store.is_none() {
        assert!(all[0]["worker"].as_u64().is_some(), "{}", all[0]);
    }
    assert_eq!(all[0]["resumedAfter"], 0);
    assert!(all.iter().all(|o| o["thread"] == thread));
    // Progress events say which role went to work with which agent.
    let working: Vec<_> = all.iter().filter(|o| o["type"] == "working").collect();
    if env.store.is_none() {
        assert_eq!(working[0]["roles"], json!(["planner"]));
        assert_eq!(working[0]["agents"], json!(["scripted"]));
    }
    let steps: Vec<_> = all.iter().filter(|o| o["type"] == "step").collect();
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[0]["index"], 1);
    // The same shape as `step` prints.
    assert_eq!(steps[0]["step"]["role"], "planner");
    assert_eq!(steps[0]["step"]["agent"], "scripted");
    assert!(steps[0]["step"]["meta"]["steps"].is_array());
    assert!(steps[0]["step"]["timestamp"].is_u64());
    assert!(steps[0]["step"]["durationMs"].is_u64());
    let last = all.last().unwrap();
    assert_eq!((&last["type"], &last["status"]), (&json!("ended"), &json!("completed")));
    assert_eq!(last["returnCode"], 0);
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn max_rounds_ends_the_thread_with_code_2() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let run = env.run(&["run", "solve-issue", "-p", "x", "--max-rounds", "3"])?;
    assert_eq!(run.code, 2, "{run:?}");
    let thread = thread_id_of(&run.stdout)?;
    let lines = env.thread_lines(&hash, &thread)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer"]);
    let end = &lines.last().unwrap()["end"];
    assert_eq!(end["status"], "failed");
    assert_eq!(end["returnCode"], 2);
    assert!(end["summary"].as_str().unwrap().contains("max rounds (3)"), "{end}");
    assert_eq!(lines[0]["parameters"]["options"]["maxRounds"], 3);
    env.fails(&["run", "solve-issue", "-p", "x", "--max-rounds", "0"], 64)?;
    Ok(())
}

#[test]
fn thread_rm_deletes_a_thread() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let thread = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    assert_eq!(env.ok(&["thread", "rm", &thread])?.trim(), format!("deleted thread {thread}"));
    assert!(!env.home().join(format!("logs/{hash}/{thread}.data.jsonl")).exists());
    assert!(!env.home().join(format!("logs/{hash}/{thread}.info.jsonl")).exists());
    let err = env.fails(&["thread", &thread], 66)?;
    assert!(err.contains(&format!("no thread `{thread}`")), "{err}");
    env.fails(&["thread", "rm", &thread], 66)?;
    Ok(())
}
}
