//! The configuration layer's error type: every message names the file, key, flag or variable at
//! fault.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// A configuration that cannot be used, with enough context to fix it.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML, or its structure is not ferry's.
    #[error("invalid config file{}: {message}", in_file(path.as_deref()))]
    Parse {
        /// The file, when known.
        path: Option<PathBuf>,
        /// What is wrong, in the file's own terms.
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("invalid value for {key}: {message}")]
    Invalid {
        /// The key, flag or environment variable, e.g. "`--port`" or "`models[0].dtype`".
        key: String,
        /// Why it is wrong.
        message: String,
    },
}

fn in_file(path: Option<&Path>) -> String {
    path.map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

impl ConfigError {
    /// Shorthand for [`ConfigError::Invalid`]; `key` is quoted.
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: format!("`{}`", key.into()),
            message: message.into(),
        }
    }

    /// The same error, naming `path` as the file it is about.
    pub fn in_file(self, file: &Path) -> Self {
        match self {
            Self::Parse {
                path: None,
                message,
            } => Self::Parse {
                path: Some(file.to_path_buf()),
                message,
            },
            other => other,
        }
    }
}
