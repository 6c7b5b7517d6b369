//! The configuration's I/O edge: reads the config file and the process environment, warns about
//! unknown `FERRY_*` variables, and resolves them with the flags ([`super::resolve`] does the
//! rest, without I/O).

use std::path::Path;

use super::env::unknown_variables;
use super::raw::RawConfig;
use super::resolve::{Overrides, Resolved};
use super::ConfigError;

/// Defaults < `file` (if given) < `FERRY_*` environment < `flags`.
pub fn load(file: Option<&Path>, flags: &Overrides) -> Result<Resolved, ConfigError> {
    let raw = match file {
        Some(path) => read_file(path)?,
        None => RawConfig::default(),
    };
    for warning in unknown_variables(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
    {
        tracing::warn!("{warning}");
    }
    let env = Overrides::from_env(|key| std::env::var(key).ok());
    Resolved::new(&raw, &env, flags)
}

/// Reads and parses `path`; relative model sources in it resolve against its folder.
pub fn read_file(path: &Path) -> Result<RawConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut raw = RawConfig::from_toml(&text).map_err(|e| e.in_file(path))?;
    raw.path = Some(path.to_path_buf());
    Ok(raw)
}
