//! Every row of the exit-code table (`uncaged_workflow::error::exit::TABLE`, which `--help`
//! and the documentation print) triggered by a command a user could type: one test per row.

use anyhow::{Context, Result, ensure};

use crate::{Env, artifacts, pg, wait_until};

/// The rows this module triggers, one test each below.
const TESTED: &[&str] =
    &["0", "1-63", "64", "65", "66", "69", "70", "74", "75", "77", "78", "79", "80", "130"];

#[test]
fn every_row_of_the_table_has_its_test_and_help_lists_it() -> Result<()> {
    let table: Vec<&str> = uncaged_workflow::error::exit::TABLE.iter().map(|(c, _)| *c).collect();
    assert_eq!(table, TESTED, "a row of the table without its test here, or the reverse");
    let help = Env::new()?.ok(&["--help"])?;
    for code in TESTED {
        ensure!(help.contains(&format!("\n  {code:<5} ")), "--help does not list {code}:\n{help}");
    }
    Ok(())
}

#[test]
fn exit_0_a_workflow_that_succeeds() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.ok(&["run", "solve-issue", "-p", "p"])?;
    Ok(())
}

#[test]
fn exit_1_to_63_the_workflows_own_return_code() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    // A reviewer who never approves runs the thread into max rounds: the SDK returns 2.
    let never = env.write("never.yaml", "reviewer:\n  - {approved: false, comments: [again]}\n")?;
    let agent = format!("scripted:{}", never.display());
    let run = env.run(&["run", "solve-issue", "-p", "p", "--agent", &agent])?;
    assert_eq!(run.code, 2, "{}", run.stderr);
    Ok(())
}

#[test]
fn exit_64_a_bad_value_on_the_command_line() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.fails(&["thread", "not-an-id"], 64)?;
    let err = env.fails(&["run", "solve-issue", "-p", "p", "--agent", "no-such-binding"], 64)?;
    assert!(err.contains("agent binding `no-such-binding`"), "{err}");
    let err = env.fails(&["run", "solve-issue", "-p", "p", "--agent-for", "ghost=scripted"], 64)?;
    assert!(err.contains("no role `ghost`"), "{err}");
    let thread = env.ok(&["run", "solve-issue", "-p", "p", "--detach"])?.trim().to_string();
    wait_until("it completes", || Ok(crate::status(&env, &thread)? == "completed"))?;
    let err = env.fails(&["fork", &thread, "--at", "99"], 64)?;
    assert!(err.contains("there is no step 99"), "{err}");
    let err = env.fails(&["fork", &thread, "--from-role", "ghost"], 64)?;
    assert!(err.contains("no step of role `ghost`"), "{err}");
    Ok(())
}

#[test]
fn exit_65_bad_data_in_a_file() -> Result<()> {
    let env = Env::new()?;
    let text = env.write("not.wasm", "hello")?;
    env.fails(&["add", "x", text.to_str().context("path")?], 65)?;
    env.add_solve_issue()?;
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), "agent: nobody\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "p"], 65)?;
    assert!(err.contains("agent binding `nobody` in config.yaml"), "{err}");
    // A binding whose answers file is missing is a bad binding in config.yaml too (at 4abdda5
    // it exited 66, as a file named on the command line does).
    std::fs::write(
        env.home().join("config.yaml"),
        "agent: offline\nagents:\n  offline: {kind: scripted, answers: missing.yaml}\n",
    )?;
    let err = env.fails(&["run", "solve-issue", "-p", "p"], 65)?;
    assert!(err.contains("agent binding `offline` in config.yaml"), "{err}");
    assert!(err.contains("missing.yaml") && err.contains("does not exist"), "{err}");
    std::fs::write(env.home().join("config.yaml"), "agent: scripted:missing.yaml\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "p"], 65)?;
    assert!(err.contains("in config.yaml") && err.contains("does not exist"), "{err}");
    Ok(())
}

#[test]
fn exit_66_something_named_does_not_exist() -> Result<()> {
    let env = Env::new()?;
    env.fails(&["run", "nothing", "-p", "p"], 66)?;
    let err = env.fails(&["add", "flow", "missing.yaml"], 66)?;
    assert!(err.contains("workflow file") && err.contains("does not exist"), "{err}");
    env.add_solve_issue()?;
    let err =
        env.fails(&["run", "solve-issue", "-p", "p", "--agent", "scripted:missing.yaml"], 66)?;
    assert!(err.contains("scripted answers file") && err.contains("does not exist"), "{err}");
    Ok(())
}

#[test]
fn exit_69_the_database_cannot_be_reached() -> Result<()> {
    let env = Env::new()?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    env.fails(&["--store", &format!("postgres://u@127.0.0.1:{closed}/db"), "list"], 69)?;
    Ok(())
}

#[test]
fn exit_70_the_host_ended_the_thread() -> Result<()> {
    let env = Env::new()?;
    env.json(&["add", "adversary", artifacts::ADVERSARY])?;
    let err = env.run(&["run", "adversary", "-p", "panic"])?;
    assert_eq!(err.code, 70, "{}", err.stdout);
    assert!(err.stdout.contains("failed (70)"), "{}", err.stdout);
    Ok(())
}

#[test]
fn exit_74_the_home_cannot_be_written() -> Result<()> {
    let env = Env::new()?;
    let err = env.fails(&["--home", "/dev/null/home", "add", "x", artifacts::SOLVE_ISSUE], 74)?;
    assert!(err.contains("/dev/null/home"), "{err}");
    Ok(())
}

#[test]
fn exit_75_the_thread_is_not_in_a_state_for_it() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let thread = env.ok(&["run", "solve-issue", "-p", "p", "--detach"])?.trim().to_string();
    wait_until("it completes", || Ok(crate::status(&env, &thread)? == "completed"))?;
    env.fails(&["resume", &thread], 75)?;
    Ok(())
}

#[test]
fn exit_77_the_database_refuses_the_credentials() -> Result<()> {
    let env = Env::on_postgres()?;
    let url = env.store.clone().context("store")?;
    env.fails(&["--store", &url.replacen("uncaged@", "nobody@", 1), "list"], 77)?;
    Ok(())
}

#[test]
fn exit_78_the_database_belongs_to_another_application() -> Result<()> {
    let env = Env::on_postgres()?;
    let other = pg()?.new_empty_database()?;
    pg()?.sql(other.rsplit('/').next().context("name")?, "CREATE TABLE invoices (id integer)")?;
    env.fails(&["--store", &other, "list"], 78)?;
    Ok(())
}

#[test]
fn exit_130_interrupted() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let gate = env.dir.path().join("gate");
    let agent = env.write_script(
        "slow.sh",
        format!("#!/bin/sh\n{}\necho '{{}}'\n", crate::sh_wait_for(&gate)),
    )?;
    let child = env
        .command()
        .args(["run", "solve-issue", "-p", "p", "--agent", &format!("command:{}", agent.display())])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    wait_until("the agent works", || {
        Ok(env.json(&["ps"])?.as_array().is_some_and(|p| p.len() == 1))
    })?;
    std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
    let out = child.wait_with_output()?;
    std::fs::write(&gate, "")?;
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    // The worker finishes the step and pauses the thread: waited for, so that the agent sees
    // the gate before the test's directory (and the gate with it) is deleted. Otherwise it
    // waits for a gate that is gone, and its worker with it, after the test.
    wait_until("the worker lets the thread go", || {
        Ok(env.json(&["ps"])?.as_array().is_some_and(|p| p.is_empty()))
    })?;
    Ok(())
}

/// Workflow `flow`, one step, added, and a thread of it run; its text.
fn one_step_recorded(env: &Env) -> Result<&'static str> {
    let flow =
        "description: One step\nsteps:\n  - id: a\n    description: A.\n    inputs: {x: 1}\n";
    let file = env.write("flow.yaml", flow)?;
    env.ok(&["add", "flow", file.to_str().context("path")?])?;
    env.ok(&["run", "flow", "-p", "p"])?;
    Ok(flow)
}

#[test]
fn exit_80_an_eval_finds_a_regression() -> Result<()> {
    let env = Env::new()?;
    one_step_recorded(&env)?;
    // The step rebound to an agent that fails: the thread that completed now fails.
    let failing = env.write_script("fail.sh", "#!/bin/sh\ncat >/dev/null\nexit 1\n")?;
    let agent = format!("a=command:{}", failing.display());
    let run = env.run(&["eval", "--workflow", "flow", "--agent-for", &agent])?;
    assert_eq!(run.code, 80, "{run:?}");
    ensure!(run.stdout.contains("1 regressed"), "{}", run.stdout);
    Ok(())
}

#[test]
fn exit_79_a_recorded_thread_diverges_from_a_new_version() -> Result<()> {
    let env = Env::new()?;
    let flow = one_step_recorded(&env)?;
    let changed = env.write("changed.yaml", flow.replace("{x: 1}", "{x: 2}"))?;
    let run = env.run(&["replay", changed.to_str().context("path")?, "--workflow", "flow"])?;
    assert_eq!(run.code, 79, "{run:?}");
    ensure!(run.stdout.contains("diverges at step 1"), "{}", run.stdout);
    Ok(())
}
