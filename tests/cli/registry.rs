//! add, list, show, history, rollback, remove.

use anyhow::Result;

use crate::{Env, artifacts};

/// XXH64 (seed 0) in Crockford Base32, computed here independently of the runtime's code.
fn expected_hash(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let value = twox_hash::XxHash64::oneshot(0, bytes) as u128;
    (0..13).rev().map(|i| ALPHABET[((value >> (5 * i)) & 31) as usize] as char).collect()
}

#[test]
fn add_prints_the_xxh64_id_and_stores_the_bundle() -> Result<()> {
    let env = Env::new()?;
    env.own_cache()?;
    let out = env.ok(&["add", "solve-issue", artifacts::SOLVE_ISSUE])?;
    let bytes = std::fs::read(artifacts::SOLVE_ISSUE)?;
    let hash = expected_hash(&bytes);
    assert_eq!(hash.len(), 13);
    assert_eq!(
        out.trim(),
        format!("added solve-issue {hash} (new; roles: planner, developer, reviewer)")
    );

    // Stored byte for byte, with its descriptor and precompiled code beside it.
    let home = env.home();
    assert_eq!(std::fs::read(home.join(format!("bundles/{hash}.wasm")))?, bytes);
    let descriptor = std::fs::read_to_string(home.join(format!("bundles/{hash}.yaml")))?;
    assert!(descriptor.contains("name: reviewer"), "{descriptor}");
    // Beside the bundle's precompiled code, the function cache (`cache/functions/`).
    let cached: Vec<_> = std::fs::read_dir(home.join("cache"))?
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "functions")
        .collect();
    assert!(
        cached.len() == 1
            && cached[0].starts_with(&format!("{hash}-"))
            && cached[0].ends_with(".cwasm"),
        "{cached:?}"
    );

    // Adding the same bytes again changes nothing.
    let again = env.ok(&["add", "solve-issue", artifacts::SOLVE_ISSUE])?;
    assert!(again.contains("(unchanged;"), "{again}");
    assert_eq!(env.json(&["history", "solve-issue"])?.as_array().unwrap().len(), 1);
    Ok(())
}

#[test]
fn remove_unregisters_but_keeps_files() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let run = env.ok(&["run", "solve-issue", "-p", "x"])?;
    let thread = crate::thread_id_of(&run)?;
    let out = env.ok(&["remove", "solve-issue"])?;
    assert!(out.contains(&format!("removed solve-issue (was {hash}")), "{out}");
    assert_eq!(env.json(&["list"])?, serde_json::json!([]));
    assert!(env.home().join(format!("bundles/{hash}.wasm")).exists());
    // Its threads are still there to read.
    assert_eq!(env.json(&["thread", &thread])?["status"], "completed");
    let err = env.fails(&["remove", "solve-issue"], 66)?;
    assert!(err.contains("no workflow named `solve-issue`"), "{err}");
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 66)?;
    assert!(err.contains("no workflow named `solve-issue`"), "{err}");
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn history_and_rollback_move_between_versions() -> Result<()> {
    let env = Env::new()?;
    let first = env.add_solve_issue()?;
    let out = env.ok(&["add", "solve-issue", artifacts::DEVELOP])?;
    let second = env.json(&["show", "solve-issue"])?["hash"].as_str().unwrap().to_string();
    assert!(out.contains(&format!("updated from {first}")), "{out}");

    let hashes = |env: &Env| -> Result<Vec<(String, bool)>> {
        Ok(env
            .json(&["history", "solve-issue"])?
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["hash"].as_str().unwrap().to_string(), v["current"].as_bool().unwrap()))
            .collect())
    };
    assert_eq!(hashes(&env)?, [(second.clone(), true), (first.clone(), false)]);

    let out = env.ok(&["rollback", "solve-issue"])?;
    assert_eq!(out.trim(), format!("rolled solve-issue back from {second} to {first}"));
    assert_eq!(hashes(&env)?, [(first.clone(), true), (second.clone(), false)]);
    // The rolled-back version runs: solve-issue's roles again.
    let run = env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert!(run.contains("planner"), "{run}");

    // Rolling back again returns; rolling back to an explicit hash works too.
    env.ok(&["rollback", "solve-issue"])?;
    assert_eq!(hashes(&env)?[0], (second.clone(), true));
    env.ok(&["rollback", "solve-issue", &first])?;
    assert_eq!(hashes(&env)?[0], (first.clone(), true));

    let err = env.fails(&["rollback", "solve-issue", "0000000000000"], 66)?;
    assert!(err.contains("has no version `0000000000000`"), "{err}");
    let err = env.fails(&["rollback", "solve-issue", "nothash"], 64)?;
    assert!(err.contains("invalid bundle hash `nothash`"), "{err}");
    env.ok(&["add", "develop", artifacts::DEVELOP])?;
    let err = env.fails(&["rollback", "develop"], 64)?;
    assert!(err.contains("workflow `develop` has no earlier version to roll back to"), "{err}");
    Ok(())
}

#[test]
fn list_and_show_describe_registered_workflows() -> Result<()> {
    let env = Env::new()?;
    assert!(env.ok(&["list"])?.contains("no workflows registered"));
    let hash = env.add_solve_issue()?;
    env.ok(&["add", "develop", artifacts::DEVELOP])?;

    let list = env.json(&["list"])?;
    let names: Vec<_> =
        list.as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["develop", "solve-issue"]);
    let table = env.ok(&["list"])?;
    assert!(table.lines().next().unwrap().starts_with("NAME"), "{table}");
    assert!(table.contains(&hash), "{table}");

    let show = env.json(&["show", "solve-issue"])?;
    assert_eq!(show["hash"], hash.as_str());
    assert_eq!(show["maxRounds"], 10);
    let roles: Vec<_> =
        show["roles"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(roles, ["planner", "developer", "reviewer"]);
    assert_eq!(show["roles"][2]["schema"]["required"], serde_json::json!(["approved"]));
    let human = env.ok(&["show", "solve-issue"])?;
    assert!(human.contains("role reviewer: Reviews the change"), "{human}");
    assert!(human.contains("\"approved\""), "{human}");
    Ok(())
}
}
