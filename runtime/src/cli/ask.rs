//! A person's answer for a `human` agent, asked at the terminal that follows the thread: the
//! question on stderr, the answer read with a line editor at a terminal, else from standard
//! input, up to a line holding only `.`.

use std::io::IsTerminal;

use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::run::dispatch::Question;
use crate::store::pauses::{ToolWait, ToolWaitReason};
use crate::terminal;

/// Puts a `human` agent's question to the person running the command, on stderr, and reads
/// the answer: with a line editor at a terminal, else from standard input. `None` declines.
pub async fn ask_person(
    question: Question,
    stdin: &mut Option<Lines<BufReader<Stdin>>>,
) -> Option<String> {
    let Question { role, system_prompt, context, expected, error, tool } = question;
    if let Some(tool) = tool {
        return decide(&role, &tool, error.as_deref(), stdin).await;
    }
    match &error {
        // Asked again: the thread so far was shown already.
        Some(error) => eprintln!(
            "── that answer does not fit role `{}`: {} ──",
            terminal::line(&role),
            terminal::line(error)
        ),
        None => {
            eprintln!("── a human answer is needed for role `{}` ──", terminal::line(&role));
            eprintln!("{}", terminal::block(system_prompt.trim()));
            eprintln!();
            eprintln!("{}", terminal::block(context.trim()));
        }
    }
    if let Some(expected) = &expected {
        eprintln!("── answer with JSON like {} ──", terminal::line(expected));
    }
    if std::io::stdin().is_terminal() {
        eprintln!(
            "── type your answer (pasting is fine); a line holding only `.` ends it, Ctrl-C \
             declines ──"
        );
        tokio::task::spawn_blocking(edit_answer).await.unwrap_or(None)
    } else {
        eprintln!("── end your answer with a line holding only `.`, or with end of input ──");
        let lines = stdin.get_or_insert_with(|| BufReader::new(tokio::io::stdin()).lines());
        read_answer(lines).await
    }
}

/// Puts a durable agent's tool call to the person running the command and reads their
/// decision, one line: `yes` or `no WHY` for a call to approve, `redo` or `skip TEXT` for a
/// call a crash cut. `None` declines (the thread waits for `answer`).
async fn decide(
    role: &str,
    tool: &ToolWait,
    error: Option<&str>,
    stdin: &mut Option<Lines<BufReader<Stdin>>>,
) -> Option<String> {
    let name = terminal::line(&tool.tool);
    match error {
        Some(error) => eprintln!("── {} ──", terminal::line(error)),
        None => {
            match tool.why {
                ToolWaitReason::Approve => eprintln!(
                    "── the agent of role `{}` asks to call tool `{name}` ──",
                    terminal::line(role)
                ),
                ToolWaitReason::Cut => eprintln!(
                    "── the agent of role `{}` was cut in the middle of a call to tool `{name}`, \
                     which may not be safe to repeat ──",
                    terminal::line(role)
                ),
            }
            if let Some(reasoning) = &tool.reasoning {
                eprintln!("{}", terminal::block(reasoning.trim()));
            }
            eprintln!("arguments: {}", terminal::line(&tool.arguments));
        }
    }
    eprintln!(
        "── {} ──",
        match tool.why {
            ToolWaitReason::Approve => "`yes` to let it, `no WHY` not to (the model is told why)",
            ToolWaitReason::Cut =>
                "`redo` to make it again, `skip TEXT` to give the model TEXT instead",
        }
    );
    if std::io::stdin().is_terminal() {
        tokio::task::spawn_blocking(|| {
            let mut editor = rustyline::DefaultEditor::new().ok()?;
            editor.readline("> ").ok().filter(|line| !line.trim().is_empty())
        })
        .await
        .unwrap_or(None)
    } else {
        let lines = stdin.get_or_insert_with(|| BufReader::new(tokio::io::stdin()).lines());
        lines.next_line().await.ok().flatten().filter(|line| !line.trim().is_empty())
    }
}

/// Reads an answer from a person at a terminal with a line editor, up to a line holding only
/// `.`; Ctrl-C (or Ctrl-D on nothing typed) declines, and the thread waits for `answer`.
///
/// The whole answer is one edit: the editor reads every line as it arrives, so a paste, or
/// lines typed ahead of the prompt, arrive whole (an editor started per line would drop what
/// the previous one had read ahead).
fn edit_answer() -> Option<String> {
    let mut editor =
        rustyline::Editor::<AnswerEnd, rustyline::history::DefaultHistory>::new().ok()?;
    editor.set_helper(Some(AnswerEnd));
    let text = editor.readline("> ").ok()?;
    let text = match text.trim_end().rsplit_once('\n') {
        Some((answer, last)) if last.trim() == "." => answer.to_string(),
        _ if text.trim() == "." => String::new(),
        _ => text,
    };
    (!text.trim().is_empty()).then_some(text)
}

/// The editor's rule for an answer: Enter starts a new line, until a line holding only `.`.
struct AnswerEnd;

impl rustyline::validate::Validator for AnswerEnd {
    fn validate(
        &self,
        ctx: &mut rustyline::validate::ValidationContext,
    ) -> rustyline::Result<rustyline::validate::ValidationResult> {
        let ended = ctx.input().lines().last().is_some_and(|line| line.trim() == ".");
        Ok(if ended {
            rustyline::validate::ValidationResult::Valid(None)
        } else {
            rustyline::validate::ValidationResult::Incomplete
        })
    }
}

impl rustyline::completion::Completer for AnswerEnd {
    type Candidate = String;
}
impl rustyline::hint::Hinter for AnswerEnd {
    type Hint = String;
}
impl rustyline::highlight::Highlighter for AnswerEnd {}
impl rustyline::Helper for AnswerEnd {}

/// Reads an answer from stdin: lines up to one holding only `.`, or to the end of input.
/// Nothing at all (end of input at once) is no answer.
async fn read_answer(lines: &mut Lines<BufReader<Stdin>>) -> Option<String> {
    let mut text = Vec::new();
    let mut read_any = false;
    while let Ok(Some(line)) = lines.next_line().await {
        read_any = true;
        if line.trim() == "." {
            break;
        }
        text.push(line);
    }
    let text = text.join("\n");
    (read_any && !text.trim().is_empty()).then_some(text)
}
