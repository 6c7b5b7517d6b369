//! Where the repository's files are, for tests of any crate of the workspace.

use std::path::{Path, PathBuf};

/// The repository root (the workspace's folder): fixtures, the default model, the README and
/// the shipped configuration are found from here, whichever crate's test asks.
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}
