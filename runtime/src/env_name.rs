//! The name of an environment variable that holds a secret (a webhook's `secret_env`, the
//! variables a tool server is given): what a file or a command line may say instead of the
//! secret itself.

/// Whether `name` is the name of an environment variable as a file may give one: `A-Z`,
/// `0-9`, `_`, not starting with a digit, 128 characters at most.
pub fn is_name(name: &str) -> bool {
    name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// A webhook's `secret_env`: the name of an environment variable (`A-Z`, `0-9`, `_`, not
/// starting with a digit), never the secret itself.
pub fn check(name: &str) -> std::result::Result<(), String> {
    if is_name(name) {
        Ok(())
    } else {
        Err(format!(
            "`secret_env` names the environment variable that holds the secret (A-Z, 0-9, _), \
             not `{}`: the secret itself is never written in a workflow",
            crate::terminal::line(&name.chars().take(40).collect::<String>())
        ))
    }
}
