//! An eval's report as JUnit XML, for CI: one test case per recorded thread, failing when
//! the eval's thread regressed (its recorded thread passed its judges, it does not), skipped
//! while it has not ended. The text is the agents' and the bundle's: escaped, and stripped of
//! what XML 1.0 cannot hold.

use std::io;

use quick_xml::Writer;
use quick_xml::events::BytesText;

use super::compare::{Change, Report, ThreadResult};

/// `report` as a JUnit XML document.
pub fn junit(report: &Report) -> io::Result<Vec<u8>> {
    let mut writer = Writer::new_with_indent(Vec::new(), b' ', 2);
    writer.write_event(quick_xml::events::Event::Decl(quick_xml::events::BytesDecl::new(
        "1.0",
        Some("UTF-8"),
        None,
    )))?;
    let totals = &report.totals;
    let (tests, failures, skipped) =
        (totals.threads.to_string(), totals.regressed.to_string(), totals.pending.to_string());
    let seconds = |ms: Option<u64>| format!("{:.3}", ms.unwrap_or(0) as f64 / 1000.0);
    let time = seconds(totals.eval.duration_ms);
    let suite = format!("eval {} of {}", report.id, report.workflow);
    let suite = xml_text(&suite);
    writer
        .create_element("testsuites")
        .with_attribute(("name", suite.as_str()))
        .with_attribute(("tests", tests.as_str()))
        .with_attribute(("failures", failures.as_str()))
        .with_attribute(("time", time.as_str()))
        .write_inner_content(|w| {
            w.create_element("testsuite")
                .with_attribute(("name", suite.as_str()))
                .with_attribute(("tests", tests.as_str()))
                .with_attribute(("failures", failures.as_str()))
                .with_attribute(("errors", "0"))
                .with_attribute(("skipped", skipped.as_str()))
                .with_attribute(("time", time.as_str()))
                .write_inner_content(|w| {
                    for thread in &report.threads {
                        case(w, report, thread)?;
                    }
                    Ok(())
                })?;
            Ok(())
        })?;
    let mut bytes = writer.into_inner();
    bytes.push(b'\n');
    Ok(bytes)
}

/// The test case of one recorded thread.
fn case(w: &mut Writer<Vec<u8>>, report: &Report, thread: &ThreadResult) -> io::Result<()> {
    let name = xml_text(&format!("{} {}", thread.recorded, crate::terminal::line(&thread.prompt)));
    let class = xml_text(&format!("eval.{}", report.workflow));
    let time = format!(
        "{:.3}",
        thread.eval_cost.as_ref().and_then(|c| c.duration_ms).unwrap_or(0) as f64 / 1000.0
    );
    let out = xml_text(&summary(thread));
    w.create_element("testcase")
        .with_attribute(("name", name.as_str()))
        .with_attribute(("classname", class.as_str()))
        .with_attribute(("time", time.as_str()))
        .write_inner_content(|w| {
            match thread.change {
                Change::Regressed => {
                    let message = xml_text(&regression(thread));
                    let reasons = thread.eval.as_ref().map(|v| v.reasons.join("\n"));
                    let detail = xml_text(&reasons.unwrap_or_default());
                    w.create_element("failure")
                        .with_attribute(("message", message.as_str()))
                        .with_attribute(("type", "regressed"))
                        .write_text_content(BytesText::new(&detail))?;
                }
                Change::Pending => {
                    w.create_element("skipped")
                        .with_attribute(("message", "the eval's thread has not ended"))
                        .write_empty()?;
                }
                Change::Improved | Change::Unchanged => {}
            }
            w.create_element("system-out").write_text_content(BytesText::new(&out))?;
            Ok(())
        })?;
    Ok(())
}

/// A regression in a line: where the threads first differ, and why the eval's fails.
pub fn regression(thread: &ThreadResult) -> String {
    let why = thread.eval.as_ref().and_then(|v| v.reasons.first()).cloned().unwrap_or_default();
    match &thread.difference {
        Some(d) => format!("regressed at step {} ({}): {why}", d.step, d.role),
        None => format!("regressed: {why}"),
    }
}

/// What a pair did, in a few lines.
fn summary(thread: &ThreadResult) -> String {
    let verdict = |passed: bool| if passed { "passed" } else { "failed" };
    let mut text = format!(
        "recorded thread {}: {} ({} steps, {} tokens)\n",
        thread.recorded,
        verdict(thread.baseline.passed),
        thread.recorded_cost.steps,
        thread.recorded_cost.tokens
    );
    if let (Some(id), Some(v), Some(cost)) = (thread.thread, &thread.eval, &thread.eval_cost) {
        text.push_str(&format!(
            "eval thread {id}: {} ({} steps, {} tokens; {} calls asked live, {} answered by the journal)\n",
            verdict(v.passed),
            cost.steps,
            cost.tokens,
            thread.live.calls,
            thread.live.answered_by_journal
        ));
    }
    if let Some(d) = &thread.difference {
        text.push_str(&format!(
            "first difference: step {} ({}), {}\n",
            d.step,
            d.role,
            d.fields.join(", ")
        ));
    }
    text
}

/// `text` with every character XML 1.0 cannot hold (most control characters, lone
/// surrogates' stand-ins, U+FFFE/U+FFFF) replaced by U+FFFD.
fn xml_text(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => c,
            '\u{0}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => '\u{fffd}',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::xml_text;

    #[test]
    fn text_xml_cannot_hold_is_replaced() {
        assert_eq!(xml_text("a\u{0}b\u{1b}[31m\tc\n"), "a\u{fffd}b\u{fffd}[31m\tc\n");
    }
}
