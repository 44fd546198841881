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
            .map_err(|e| format!("cron expression `{expression}` does not parse: {e}"))?;
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
        let e = CronTrigger::parse("61 * * * *", None).unwrap_err();
        assert!(e.starts_with("cron expression `61 * * * *` does not parse"), "{e}");
        let e = CronTrigger::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(e.contains("unknown time zone `Mars/Olympus`"), "{e}");
        let e = CronTrigger::parse("0 0 30 2 *", None).unwrap_err();
        assert!(e.contains("never matches"), "{e}");
    }
}
