//! The web view, in a real headless Chromium over WebDriver.
