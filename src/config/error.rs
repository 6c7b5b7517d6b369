//! The configuration layer's error type: every message names the key or flag at fault.

use std::path::PathBuf;

use thiserror::Error;

/// A configuration that cannot be used, with enough context to fix it.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has unknown keys.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said.
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("invalid value for `{key}`: {message}")]
    Invalid {
        /// The key, flag or environment variable.
        key: String,
        /// Why it is wrong.
        message: String,
    },
}

impl ConfigError {
    /// Shorthand for [`ConfigError::Invalid`].
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}
