//! The web view's page, script and style, compiled into the binary: no network at run time,
//! no build step.

/// The page; `{{CSRF}}` is replaced by the process's CSRF token.
pub const INDEX_HTML: &str = include_str!("assets/index.html");
pub const APP_JS: &str = include_str!("assets/app.js");
pub const APP_CSS: &str = include_str!("assets/app.css");
