//! Sandbox limits: what one thread's bundle may use, and how many threads a worker holds.
//! Defaults are safe; `limits:` in config.yaml and `--limit KEY=VALUE` override them.
//!
//! | key | default | what |
//! |---|---|---|
//! | `cpu-per-step` | 30s | guest computation per generator call (time in agents excluded) |
//! | `memory` | 512MiB | linear memory of the thread's instance |
//! | `table-elements` | 100000 | elements of the instance's tables |
//! | `string` | 16MiB | any one string crossing the boundary (prompts, content, meta, log lines) |
//! | `output` | 1MiB | guest stdout, stderr and log lines kept in the debug log, per thread |
//! | `max-rounds` | 1000 | hard cap on a thread's steps, whatever the bundle or `--max-rounds` say |
//! | `max-threads` | 1000 | threads one worker runs at once |
//! | `live-instances` | 1000 | bundle instances one worker keeps live at once (a waiting thread gives its up) |
//! | `evict-after` | 2s | how long a worker's thread waits on its agents before it gives up its instance |
//! | `bundle-size` | 128MiB | a bundle file `add` accepts |
//! | `descriptor` | 1MiB | a bundle's descriptor (its description, roles, prompts and schemas) |
//! | `roles` | 64 | roles a bundle may declare |
//!
//! Every limit but `output` must be more than zero: a zero would only make every thread fail.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// The limits in force for a thread (and its worker).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub cpu_per_step: Duration,
    pub memory_bytes: usize,
    pub table_elements: usize,
    pub string_bytes: usize,
    pub output_bytes: usize,
    pub max_rounds: u32,
    pub max_threads: usize,
    /// Instances a worker keeps live at once: its pool's size. A thread that waits on its
    /// agents past `evict_after` gives its instance up and is rebuilt from its journal.
    pub live_instances: usize,
    pub evict_after: Duration,
    pub bundle_bytes: usize,
    pub descriptor_bytes: usize,
    pub roles: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_per_step: Duration::from_secs(30),
            memory_bytes: 512 << 20,
            table_elements: 100_000,
            string_bytes: 16 << 20,
            output_bytes: 1 << 20,
            max_rounds: 1000,
            max_threads: 1000,
            live_instances: 1000,
            evict_after: Duration::from_secs(2),
            bundle_bytes: 128 << 20,
            descriptor_bytes: 1 << 20,
            roles: 64,
        }
    }
}

/// The keys, for messages.
pub const KEYS: &str = "cpu-per-step, memory, table-elements, string, output, max-rounds, \
                        max-threads, live-instances, evict-after, bundle-size, descriptor, roles";

impl Limits {
    /// Applies one `key=value` (or a config entry). Durations like `500ms`, `2s`, `1m`; sizes
    /// like `64MiB`, `1GB`, `4096`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let positive = |n: usize| match n {
            0 => Err(format!("`{value}`: must be more than zero")),
            n => Ok(n),
        };
        let size =
            || parse_size(value).ok_or_else(|| format!("`{value}` is not a size (e.g. 64MiB)"));
        let count =
            || value.parse::<usize>().map_err(|_| format!("`{value}` is not a whole number"));
        let duration = || {
            let duration = humantime::parse_duration(value)
                .map_err(|e| format!("`{value}` is not a duration (e.g. 30s): {e}"))?;
            match duration.is_zero() {
                true => Err(format!("`{value}`: must be more than zero")),
                false => Ok(duration),
            }
        };
        match key {
            "cpu-per-step" => self.cpu_per_step = duration()?,
            "evict-after" => self.evict_after = duration()?,
            "live-instances" => self.live_instances = positive(count()?)?,
            "memory" => self.memory_bytes = positive(size()?)?,
            "table-elements" => self.table_elements = positive(count()?)?,
            "string" => self.string_bytes = positive(size()?)?,
            "output" => self.output_bytes = size()?,
            "max-rounds" => {
                self.max_rounds = u32::try_from(positive(count()?)?)
                    .map_err(|_| format!("`{value}` is too large"))?;
            }
            "max-threads" => self.max_threads = positive(count()?)?,
            "bundle-size" => self.bundle_bytes = positive(size()?)?,
            "descriptor" => self.descriptor_bytes = positive(size()?)?,
            "roles" => self.roles = positive(count()?)?,
            _ => return Err(format!("unknown limit `{key}` (limits: {KEYS})")),
        }
        Ok(())
    }

    /// Defaults, then `config.yaml`'s `limits:`, then `overrides` in order.
    pub fn resolve(
        config: &BTreeMap<String, serde_yaml::Value>,
        overrides: &LimitOverrides,
    ) -> Result<Self> {
        let mut limits = Limits::default();
        for (key, value) in config {
            let text = match value {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Number(n) => n.to_string(),
                other => {
                    return Err(Error::InvalidLimit {
                        key: key.clone(),
                        reason: format!("expected a number or a size, got {}", yaml_kind(other)),
                    });
                }
            };
            limits
                .set(key, &text)
                .map_err(|reason| Error::InvalidLimit { key: key.clone(), reason })?;
        }
        for (key, value) in &overrides.0 {
            limits
                .set(key, value)
                .map_err(|reason| Error::InvalidLimit { key: key.clone(), reason })?;
        }
        Ok(limits)
    }
}

/// What kind of YAML value `value` is, for messages.
pub fn yaml_kind(value: &serde_yaml::Value) -> &'static str {
    match value {
        serde_yaml::Value::Null => "nothing (null)",
        serde_yaml::Value::Bool(_) => "a boolean",
        serde_yaml::Value::Number(_) => "a number",
        serde_yaml::Value::String(_) => "a string",
        serde_yaml::Value::Sequence(_) => "a list",
        serde_yaml::Value::Mapping(_) => "a mapping",
        serde_yaml::Value::Tagged(_) => "a tagged value",
    }
}

fn parse_size(text: &str) -> Option<usize> {
    text.trim().parse::<bytesize::ByteSize>().ok().and_then(|b| usize::try_from(b.as_u64()).ok())
}

/// The limits one thread sets for itself (`--limit KEY=VALUE`, a schedule's, an HTTP
/// request's), over the configured ones: each checked when it is set. Threads and schedules
/// record them as a map of the text given.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct LimitOverrides(BTreeMap<String, String>);

impl LimitOverrides {
    /// Sets limit `key` to `value`, a later one winning; refused if `key` is not a limit or
    /// `value` not a value of it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        Limits::default().set(key, value)?;
        self.0.insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// Overrides from `KEY=VALUE` pairs, later ones winning.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, String> {
        let mut overrides = LimitOverrides::default();
        for (key, value) in pairs {
            overrides.set(key, value)?;
        }
        Ok(overrides)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The overrides, by key, as given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Parses `KEY=VALUE` from `--limit`, checking it against a default set of limits.
pub fn parse_limit_flag(text: &str) -> Result<(String, String), String> {
    let (key, value) =
        text.split_once('=').ok_or_else(|| format!("expected KEY=VALUE, got `{text}`"))?;
    Limits::default().set(key, value)?;
    Ok((key.to_string(), value.to_string()))
}

/// A size for messages: `16 MiB`.
pub struct Size(pub usize);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bytesize::ByteSize(self.0 as u64).display().iec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_from_flags_and_config() {
        let config: BTreeMap<String, serde_yaml::Value> =
            serde_yaml::from_str("memory: 64MiB\ncpu-per-step: 2s\nmax-threads: 10\n").unwrap();
        let overrides = LimitOverrides::from_pairs([("cpu-per-step", "500ms")]).unwrap();
        let limits = Limits::resolve(&config, &overrides).unwrap();
        assert_eq!(limits.memory_bytes, 64 << 20);
        assert_eq!(limits.cpu_per_step, Duration::from_millis(500));
        assert_eq!(limits.max_threads, 10);
        assert_eq!(limits.string_bytes, Limits::default().string_bytes);
        assert!(parse_limit_flag("memory=lots").unwrap_err().contains("not a size"));
        assert!(parse_limit_flag("speed=1").unwrap_err().contains("unknown limit `speed`"));
        assert!(parse_limit_flag("memory").is_err());
        assert_eq!(Size(16 << 20).to_string(), "16.0 MiB");
    }

    #[test]
    fn instance_limits_parse() {
        let mut limits = Limits::default();
        limits.set("live-instances", "50").unwrap();
        limits.set("evict-after", "250ms").unwrap();
        assert_eq!((limits.live_instances, limits.evict_after), (50, Duration::from_millis(250)));
        assert!(limits.set("evict-after", "0s").unwrap_err().contains("more than zero"));
        assert!(limits.set("live-instances", "0").unwrap_err().contains("more than zero"));
        assert!(limits.set("evict-after", "soon").unwrap_err().contains("not a duration"));
    }
}
