//! What every bench takes on its command line: the model and its compute dtype (clap, flattened
//! into each bench's options).

use clap::Args;
use ferry::config::settings::DEFAULT_MODEL_SOURCE;
use ferry::config::values::{Codec, Dtype};
use ferry::config::DtypeChoice;

/// `--model PATH --dtype DTYPE`, and the `--bench` flag `cargo bench` passes.
#[derive(Args)]
pub struct ModelArgs {
    /// The GGUF file or HF directory to run.
    #[arg(long = "model", value_name = "PATH", default_value = DEFAULT_MODEL_SOURCE)]
    pub source: String,
    /// Compute dtype, as the `dtype` setting takes it (auto, f32, f16, bf16).
    #[arg(long, default_value = "auto", value_parser = Dtype::parse)]
    pub dtype: DtypeChoice,
    /// Passed by `cargo bench`.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}
