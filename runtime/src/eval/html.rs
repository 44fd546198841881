//! An eval's report as HTML a person reads: the totals, a row per thread, and for each thread
//! whose steps differ its first difference side by side (the recorded step and the eval's,
//! with their agents, tokens and cost) and a line diff of the two answers. One rendering for
//! both the self-contained page `eval --html` writes and the web view's eval page. Every text
//! in it (answers, prompts, reasons: the agents' and the bundle's) is escaped.

use std::fmt::Write as _;

use similar::{ChangeTag, TextDiff};

use super::compare::{Cost, Report, Shown, ThreadResult};

/// The report's style, in the page and in the web view's stylesheet.
pub const CSS: &str = include_str!("report.css");

/// `report` as one self-contained HTML page (its style in it, no script, nothing fetched).
pub fn page(report: &Report) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>eval {} of {}</title><style>body {{ margin: 16px 20px; background: #f7f7f5; }}\n{CSS}</style>\
         </head><body>\n{}</body></html>\n",
        report.id,
        escape(&report.workflow),
        body(report)
    )
}

/// The report's markup, in an element of class `eval-report`.
pub fn body(report: &Report) -> String {
    let mut out = String::new();
    let t = &report.totals;
    let _ = write!(
        out,
        "<div class=\"eval-report\" data-eval=\"{}\"><h1>Eval <span class=\"mono\">{}</span> of {}</h1>\
         <p>On {}{}. {}</p>",
        report.id,
        report.id,
        escape(&report.workflow),
        escape(&report.against),
        match report.live_roles.is_empty() {
            true => String::new(),
            false => format!(", asking {} live", escape(&report.live_roles.join(", "))),
        },
        match report.finished {
            Some(_) => "Finished.",
            None => "Not finished: <span class=\"mono\">eval resume</span> goes on.",
        }
    );
    out.push_str("<div class=\"cards\">");
    for (label, value, class) in [
        ("threads", t.threads.to_string(), ""),
        ("improved", t.improved.to_string(), "improved"),
        ("regressed", t.regressed.to_string(), "regressed"),
        ("unchanged", t.unchanged.to_string(), "unchanged"),
        ("passed", format!("{} (were {})", t.passed, t.baseline_passed), ""),
        (
            "asked live",
            format!("{} calls, {} tokens{}", t.live.calls, t.live.tokens, dollars(t.live.cost_usd)),
            "",
        ),
        ("from the journal", t.live.answered_by_journal.to_string(), ""),
    ] {
        let _ = write!(
            out,
            "<div class=\"card {class}\" data-total=\"{label}\"><b>{}</b>{label}</div>",
            escape(&value)
        );
    }
    if t.pending > 0 {
        let _ = write!(
            out,
            "<div class=\"card\" data-total=\"pending\"><b>{}</b>not ended</div>",
            t.pending
        );
    }
    out.push_str(
        "</div><h2>Threads</h2><table><thead><tr><th>Recorded</th><th>Eval</th><th>Change</th>\
        <th>Before</th><th>After</th><th>Steps</th><th>Tokens</th><th>Cost</th><th>Time</th>\
        <th>Differs at</th><th>Prompt</th></tr></thead><tbody>",
    );
    for thread in &report.threads {
        row(&mut out, thread);
    }
    out.push_str("</tbody></table>");
    let differing: Vec<&ThreadResult> =
        report.threads.iter().filter(|t| t.difference.is_some()).collect();
    if !differing.is_empty() {
        out.push_str("<h2>Where they differ</h2>");
        for thread in differing {
            pair(&mut out, thread);
        }
    }
    out.push_str("</div>");
    out
}

fn row(out: &mut String, t: &ThreadResult) {
    let verdict = |passed: bool| if passed { "passed" } else { "failed" };
    let eval_cost = t.eval_cost.clone().unwrap_or_default();
    let _ = write!(
        out,
        "<tr data-recorded=\"{}\"><td class=\"mono\">{}</td><td class=\"mono\">{}</td>\
         <td><span class=\"change {change}\">{change}</span></td><td>{}</td><td>{}</td>\
         <td>{}→{}</td><td>{}→{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"text\">{}</td></tr>",
        t.recorded,
        t.recorded,
        t.thread.map_or_else(|| "-".into(), |id| id.to_string()),
        verdict(t.baseline.passed),
        t.eval.as_ref().map_or("-", |v| verdict(v.passed)),
        t.recorded_cost.steps,
        eval_cost.steps,
        t.recorded_cost.tokens,
        eval_cost.tokens,
        arrow(t.recorded_cost.cost_usd, eval_cost.cost_usd, |c| format!("${c:.4}")),
        arrow(
            t.recorded_cost.duration_ms.map(|ms| ms as f64),
            eval_cost.duration_ms.map(|ms| ms as f64),
            |ms| format!("{:.1} s", ms / 1000.0)
        ),
        t.difference
            .as_ref()
            .map_or_else(|| "-".into(), |d| format!("step {} ({})", d.step, escape(&d.role))),
        escape(&t.prompt),
        change = t.change.as_str(),
    );
}

/// `a→b`, each formatted, `-` where there is none.
fn arrow(a: Option<f64>, b: Option<f64>, format: impl Fn(f64) -> String) -> String {
    if a.is_none() && b.is_none() {
        return "-".into();
    }
    let shown = |v: Option<f64>| v.map_or_else(|| "-".into(), &format);
    format!("{}→{}", shown(a), shown(b))
}

/// One thread's first difference, side by side, and the diff of the two answers.
fn pair(out: &mut String, t: &ThreadResult) {
    let Some(d) = &t.difference else { return };
    let _ = write!(
        out,
        "<section class=\"pair\" data-pair=\"{}\"><div><span class=\"change {change}\">{change}</span> \
         recorded <span class=\"mono\">{}</span> → eval <span class=\"mono\">{}</span>: first differs \
         at step {} ({}; its {})</div>",
        t.recorded,
        t.recorded,
        t.thread.map_or_else(|| "-".into(), |id| id.to_string()),
        d.step,
        escape(&d.role),
        escape(&d.fields.join(", ")),
        change = t.change.as_str(),
    );
    if let Some(eval) = &t.eval
        && !eval.reasons.is_empty()
    {
        out.push_str("<ul class=\"reasons\">");
        for reason in &eval.reasons {
            let _ = write!(out, "<li class=\"text\">{}</li>", escape(reason));
        }
        out.push_str("</ul>");
    }
    out.push_str("<div class=\"sides\">");
    side(out, "Recorded", d.recorded.as_ref(), &t.recorded_cost);
    side(out, "Eval", d.eval.as_ref(), t.eval_cost.as_ref().unwrap_or(&Cost::default()));
    out.push_str("</div>");
    if let (Some(before), Some(after)) = (&d.recorded, &d.eval) {
        out.push_str("<div>The answer, line by line:</div><pre class=\"diff\">");
        for change in TextDiff::from_lines(&before.content, &after.content).iter_all_changes() {
            let (class, sign) = match change.tag() {
                ChangeTag::Delete => ("del", '-'),
                ChangeTag::Insert => ("ins", '+'),
                ChangeTag::Equal => ("same", ' '),
            };
            let line = change.value().trim_end_matches('\n');
            let _ = writeln!(out, "<span class=\"{class}\">{sign} {}</span>", escape(line));
        }
        out.push_str("</pre>");
    }
    out.push_str("</section>");
}

fn side(out: &mut String, title: &str, step: Option<&Shown>, whole: &Cost) {
    let _ =
        write!(out, "<div class=\"side\" data-side=\"{}\"><b>{title}</b>", title.to_lowercase());
    match step {
        Some(step) => {
            let _ = write!(
                out,
                "<div class=\"muted\">{} · {} · {} tokens{} · the thread: {} steps, {} tokens{}</div>\
                 <pre class=\"answer\">{}</pre><pre class=\"meta\">{}</pre>",
                escape(&step.role),
                escape(step.agent.as_deref().unwrap_or("-")),
                step.tokens,
                dollars(step.cost_usd),
                whole.steps,
                whole.tokens,
                dollars(whole.cost_usd),
                escape(&step.content),
                escape(&serde_json::to_string_pretty(&step.meta).unwrap_or_default()),
            );
        }
        None => out.push_str("<div class=\"muted\">no such step</div>"),
    }
    out.push_str("</div>");
}

fn dollars(cost: Option<f64>) -> String {
    cost.map(|c| format!(", ${c:.4}")).unwrap_or_default()
}

fn escape(text: &str) -> String {
    crate::terminal::html(text)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_in_text_is_text() {
        assert_eq!(
            escape("<script>a&b</script>\"'"),
            "&lt;script&gt;a&amp;b&lt;/script&gt;&quot;&#39;"
        );
        // A right-to-left override would reverse what follows it on the page.
        assert!(!escape("a\u{202e}b").contains('\u{202e}'));
        assert_eq!(escape("line\n\tnext"), "line\n\tnext");
    }
}
