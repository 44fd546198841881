//! The name of an environment variable that holds a secret (a webhook's `secret_env`): what
//! a file or a command line may say instead of the secret itself.

/// A webhook's `secret_env`: the name of an environment variable (`A-Z`, `0-9`, `_`, not
/// starting with a digit), never the secret itself.
pub fn check(name: &str) -> std::result::Result<(), String> {
    let ok = name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`secret_env` names the environment variable that holds the secret (A-Z, 0-9, _), \
             not `{}`: the secret itself is never written in a workflow",
            crate::terminal::line(&name.chars().take(40).collect::<String>())
        ))
    }
}
