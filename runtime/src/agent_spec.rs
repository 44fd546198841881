//! An agent as a person names it — on the command line (`--agent`, `--agent-for`), in a
//! schedule, in `config.yaml` — parsed once into what it is. Threads, schedules and the queue
//! store its text form (`scripted:answers.yaml`, `command:./review.sh --strict`), which parses
//! back to the same spec. What it binds to is decided by `agents::binding`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// An agent spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSpec {
    /// `scripted`: the built-in offline agent, answering from each role's schema examples;
    /// `scripted:FILE`: answering per role from a YAML file.
    Scripted { answers: Option<PathBuf> },
    /// `command:PROGRAM [ARGS]`: an external program, its words split as a shell would (but
    /// never run by one).
    Command { program: String, args: Vec<String> },
    /// `human`: a person, at the terminal following the thread or later with `answer`.
    Human,
    /// A binding of that name under `agents:` in config.yaml.
    Named(String),
}

impl AgentSpec {
    /// The same spec with a relative `scripted:FILE` or `command:./PROGRAM` made absolute
    /// against `cwd`, so it means the same in a worker started elsewhere.
    pub fn absolutize(self, cwd: &Path) -> AgentSpec {
        match self {
            AgentSpec::Scripted { answers: Some(path) } => {
                AgentSpec::Scripted { answers: Some(cwd.join(path)) }
            }
            AgentSpec::Command { program, args } if program.contains('/') => {
                AgentSpec::Command { program: cwd.join(program).display().to_string(), args }
            }
            other => other,
        }
    }
}

impl FromStr for AgentSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("an agent spec is empty".into());
        }
        Ok(if text == "scripted" {
            AgentSpec::Scripted { answers: None }
        } else if let Some(path) = text.strip_prefix("scripted:") {
            if path.is_empty() {
                return Err("no answers file after `scripted:`".into());
            }
            AgentSpec::Scripted { answers: Some(PathBuf::from(path)) }
        } else if text == "human" {
            AgentSpec::Human
        } else if let Some(command_line) = text.strip_prefix("command:") {
            let mut words = shlex::split(command_line)
                .ok_or("cannot split the command line (unbalanced quotes?)")?;
            if words.first().is_none_or(String::is_empty) {
                return Err("no program after `command:`".into());
            }
            let program = words.remove(0);
            AgentSpec::Command { program, args: words }
        } else {
            AgentSpec::Named(text.to_string())
        })
    }
}

impl fmt::Display for AgentSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentSpec::Scripted { answers: None } => f.write_str("scripted"),
            AgentSpec::Scripted { answers: Some(path) } => {
                write!(f, "scripted:{}", path.display())
            }
            AgentSpec::Human => f.write_str("human"),
            AgentSpec::Command { program, args } => {
                let words =
                    std::iter::once(program.as_str()).chain(args.iter().map(String::as_str));
                // Words holding a NUL cannot be quoted; none can be parsed from text either.
                write!(f, "command:{}", shlex::try_join(words).unwrap_or_default())
            }
            AgentSpec::Named(name) => f.write_str(name),
        }
    }
}

impl serde::Serialize for AgentSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for AgentSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_read_back_from_their_text() {
        for text in [
            "scripted",
            "scripted:answers.yaml",
            "human",
            "command:./review.sh --strict 'two words'",
            "command:/usr/bin/env",
            "reviewer-llm",
        ] {
            let spec: AgentSpec = text.parse().unwrap();
            assert_eq!(spec.to_string().parse::<AgentSpec>().unwrap(), spec, "{text}");
        }
        assert_eq!(
            "command:./r.sh 'a b'".parse::<AgentSpec>().unwrap(),
            AgentSpec::Command { program: "./r.sh".into(), args: vec!["a b".into()] }
        );
        for bad in ["", "command:", "command:'unbalanced", "scripted:"] {
            assert!(bad.parse::<AgentSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_files_and_programs_are_made_absolute() {
        let cwd = Path::new("/work");
        let spec = |text: &str| text.parse::<AgentSpec>().unwrap().absolutize(cwd).to_string();
        assert_eq!(spec("scripted:a.yaml"), "scripted:/work/a.yaml");
        assert_eq!(spec("command:./r.sh x"), "command:/work/./r.sh x");
        assert_eq!(spec("command:echo x"), "command:echo x");
        assert_eq!(spec("scripted:/abs.yaml"), "scripted:/abs.yaml");
        assert_eq!(spec("command:/bin/echo"), "command:/bin/echo");
    }
}
