//! Configuration: raw TOML types (no I/O) and their resolution against env and flags.
