//! Where ferry keeps what it caches for the next start (calibrations, expert routes, panel
//! layouts): the user's cache folder, one definition for every cache.

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/ferry`, else `$HOME/.cache/ferry`, the environment read through `var`
/// (empty values count as unset); `None` without either variable.
pub fn user_cache_folder(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    let non_empty = |k: &str| var(k).filter(|p| !p.as_os_str().is_empty());
    let base =
        non_empty("XDG_CACHE_HOME").or_else(|| non_empty("HOME").map(|h| h.join(".cache")))?;
    Some(base.join("ferry"))
}
