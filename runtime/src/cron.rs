//! Cron triggers: which instant of a cron expression, in a time zone, is due now, and when the
//! next one comes.
//!
//! Expressions have five fields (minute to day of week) or six (a leading seconds field), as
//! croner parses them; a time zone is an IANA name and defaults to UTC. Only the latest due
//! instant fires: a machine that was off through several instants fires once when it is back.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, TimeZone};
use chrono_tz::Tz;
use croner::Cron;

/// A parsed cron trigger.
#[derive(Debug, Clone)]
pub struct CronTrigger {
    cron: Cron,
    zone: Tz,
}

impl CronTrigger {
    /// Parses `expression` in `timezone` (UTC if `None`); the error says what is wrong.
    pub fn parse(expression: &str, timezone: Option<&str>) -> Result<Self, String> {
        let cron = Cron::from_str(expression)
            .map_err(|_| format!("cron expression `{expression}`: {}", explain(expression)))?;
        let zone = match timezone {
            None => Tz::UTC,
            Some(name) => name.parse::<Tz>().map_err(|_| {
                format!("unknown time zone `{name}` (an IANA name such as `Europe/Paris` or `UTC`)")
            })?,
        };
        let trigger = CronTrigger { cron, zone };
        // An expression that never matches (`0 0 30 2 *`) would never fire: refuse it now.
        if trigger.next_after(crate::clock::now_ms()).is_none() {
            return Err(format!("cron expression `{expression}` never matches a date"));
        }
        Ok(trigger)
    }

    fn at(&self, ms: u64) -> DateTime<Tz> {
        let utc = DateTime::from_timestamp_millis(ms as i64).unwrap_or_default();
        self.zone.from_utc_datetime(&utc.naive_utc())
    }

    /// The latest instant at or before `now` and after `after`, if there is one: what a pass
    /// at `now` fires, when `after` is the last instant fired (or when the schedule began).
    pub fn due(&self, after: u64, now: u64) -> Option<u64> {
        let latest = self.cron.find_previous_occurrence(&self.at(now), true).ok()?;
        let instant = latest.timestamp_millis() as u64;
        (instant > after).then_some(instant)
    }

    /// The first instant after `t`.
    pub fn next_after(&self, t: u64) -> Option<u64> {
        let next = self.cron.find_next_occurrence(&self.at(t), false).ok()?;
        Some(next.timestamp_millis() as u64)
    }

    /// `instant` as RFC 3339 in the trigger's zone, to the second.
    pub fn format(&self, instant: u64) -> String {
        self.at(instant).to_rfc3339_opts(SecondsFormat::Secs, true)
    }
}

/// The fields of a cron expression: name, and the range of its numbers.
const FIELDS: [(&str, u32, u32); 6] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

/// What is wrong with an expression the cron library refused, in our words: which field, and
/// why. (The library's own messages name neither the field nor the range.)
fn explain(expression: &str) -> String {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let names = match fields.len() {
        5 => &FIELDS[1..],
        6 => &FIELDS[..],
        0 => {
            return "it is empty; it needs 5 fields (minute hour day-of-month month \
                     day-of-week), or 6 with a leading second"
                .into();
        }
        n => {
            return format!(
                "it has {n} field(s); it needs 5 (minute hour day-of-month month day-of-week), \
                 or 6 with a leading second"
            );
        }
    };
    // The field that fails alone, the others left open, is the one to name.
    for (i, field) in fields.iter().enumerate() {
        let probe: Vec<&str> =
            (0..fields.len()).map(|j| if j == i { field } else { "*" }).collect();
        if Cron::from_str(&probe.join(" ")).is_err() {
            let (name, low, high) = names[i];
            return explain_field(name, low, high, field);
        }
    }
    "its fields do not go together (a day of the month and a day of the week both set with \
     `L` or `#`?)"
        .into()
}

/// Whether `token` is a name the field `name` takes (`MON`, `jan`).
fn is_name_of(name: &str, token: &str) -> bool {
    const MONTHS: &[&str] =
        &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
    const DAYS: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let names = match name {
        "month" => MONTHS,
        "day-of-week" => DAYS,
        _ => return false,
    };
    names.iter().any(|n| n.eq_ignore_ascii_case(token))
}

/// Why one field of a cron expression is refused.
fn explain_field(name: &str, low: u32, high: u32, field: &str) -> String {
    let usage = format!(
        "numbers {low}-{high}, `*`, ranges `a-b`, lists `a,b` and steps `*/n`{}",
        match name {
            "month" => ", or JAN-DEC",
            "day-of-week" => ", or SUN-SAT",
            _ => "",
        }
    );
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (part, None),
        };
        if let Some(step) = step
            && step.parse::<u32>().map_or(true, |n| n == 0)
        {
            return format!(
                "the {name} field `{field}` has the step `{step}`: a step is a whole number from 1"
            );
        }
        for token in range.split('-').filter(|t| !matches!(*t, "*" | "?" | "")) {
            match token.parse::<u32>() {
                Ok(n) if n < low || n > high => {
                    return format!(
                        "the {name} field `{field}`: {n} is outside its range {low}-{high}"
                    );
                }
                Ok(_) => {}
                Err(_) if is_name_of(name, token) => {}
                Err(_) if token.chars().all(|c| c.is_ascii_alphabetic()) => {
                    return format!(
                        "the {name} field `{field}`: `{token}` is not a {name} ({usage})"
                    );
                }
                Err(_) => {}
            }
        }
    }
    format!("the {name} field `{field}` is not valid ({usage})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    #[test]
    fn only_the_latest_due_instant_fires() {
        let every_minute = CronTrigger::parse("* * * * *", None).unwrap();
        let t0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE; // on a minute
        assert_eq!(every_minute.due(t0, t0 + 30_000), None, "the instant fired already");
        assert_eq!(every_minute.due(t0, t0 + MINUTE), Some(t0 + MINUTE));
        // Off for an hour: one firing, the latest instant.
        assert_eq!(every_minute.due(t0, t0 + 60 * MINUTE + 5), Some(t0 + 60 * MINUTE));
        assert_eq!(every_minute.next_after(t0 + 1), Some(t0 + MINUTE));
    }

    #[test]
    fn seconds_and_zones() {
        let every_second = CronTrigger::parse("* * * * * *", None).unwrap();
        assert_eq!(every_second.due(10_000, 11_500), Some(11_000));
        // 09:00 in Paris is 08:00 UTC in winter.
        let paris = CronTrigger::parse("0 9 * * *", Some("Europe/Paris")).unwrap();
        let jan_1_2030_utc = 1_893_456_000_000;
        let fired = paris.due(jan_1_2030_utc, jan_1_2030_utc + 9 * 60 * MINUTE).unwrap();
        assert_eq!(fired, jan_1_2030_utc + 8 * 60 * MINUTE);
        assert_eq!(paris.format(fired), "2030-01-01T09:00:00+01:00");
    }

    #[test]
    fn mistakes_are_named() {
        // Which field, and why, in our words.
        for (expression, said) in [
            ("61 * * * *", "the minute field `61`: 61 is outside its range 0-59"),
            ("0 24 * * *", "the hour field `24`: 24 is outside its range 0-23"),
            ("0 0 32 * *", "the day-of-month field `32`: 32 is outside its range 1-31"),
            ("0 0 * FOO *", "the month field `FOO`: `FOO` is not a month"),
            ("0 0 * * MON-FOO", "the day-of-week field `MON-FOO`: `FOO` is not a day-of-week"),
            ("*/0 * * * *", "the minute field `*/0` has the step `0`"),
            ("* * *", "it has 3 field(s); it needs 5"),
            ("0 0 * * * 1-99", "the day-of-week field `1-99`: 99 is outside its range 0-7"),
        ] {
            let e = CronTrigger::parse(expression, None).unwrap_err();
            assert_eq!(
                e.split_once(": ").map(|(_, rest)| rest).unwrap_or(&e).get(..said.len()),
                Some(said),
                "{e}"
            );
        }
        assert!(CronTrigger::parse("0 9 * jan-mar mon-fri", None).is_ok(), "names are read");
        let e = CronTrigger::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(e.contains("unknown time zone `Mars/Olympus`"), "{e}");
        let e = CronTrigger::parse("0 0 30 2 *", None).unwrap_err();
        assert!(e.contains("never matches"), "{e}");
    }
}
