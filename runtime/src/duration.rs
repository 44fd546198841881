//! Durations as the files a person writes give them: seconds (`90`, `0.5`), or a number with a
//! unit (`500ms`, `2m`, `1h 30m`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration written as seconds (`90`, `0.5`) or with a unit (`500ms`, `2m`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::Number(n) => n
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Seconds(Duration::from_secs_f64(s)))
                .ok_or_else(|| {
                    serde::de::Error::custom(format!("`{n}` is not a number of seconds"))
                }),
            serde_yaml::Value::String(s) => humantime::parse_duration(&s)
                .map(Seconds)
                .map_err(|e| serde::de::Error::custom(format!("`{s}` is not a duration: {e}"))),
            other => Err(serde::de::Error::custom(format!(
                "expected seconds or a duration, got {}",
                crate::limits::yaml_kind(&other)
            ))),
        }
    }
}
