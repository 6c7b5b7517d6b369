//! The command line (clap): `ferry serve`, `ferry plan`, `ferry generate`, `ferry config`. The
//! setting flags are generated from [`SETTINGS`] (one flag per setting) and become
//! [`Overrides`] for configuration resolution; nothing here does I/O.

use std::marker::PhantomData;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

use ferry_config::settings::{Scope, Setting, SETTINGS};
use ferry_config::Overrides;

/// ferry: serve large language models on small GPUs (OpenAI-compatible API).
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured models over HTTP.
    Serve(ServeArgs),
    /// Show how the models' weights would be placed on the device, without loading them.
    Plan(PlanArgs),
    /// Generate text for one prompt and print it to stdout (logs go to stderr).
    Generate(GenerateArgs),
    /// Print the effective configuration and where each value came from (default, file, env,
    /// flag).
    Config(ConfigArgs),
}

/// Which settings a subcommand takes as flags.
pub trait FlagSet: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// Whether `setting` is a flag of this subcommand.
    fn takes(setting: &Setting) -> bool;
}

/// Every setting (`serve`, `config`).
#[derive(Debug, Clone, Default)]
pub struct AllSettings;
impl FlagSet for AllSettings {
    fn takes(_: &Setting) -> bool {
        true
    }
}

/// Device and model settings, not the HTTP server's (`plan`, `generate`).
#[derive(Debug, Clone, Default)]
pub struct ModelSettings;
impl FlagSet for ModelSettings {
    fn takes(setting: &Setting) -> bool {
        setting.scope() != Scope::Server
    }
}

/// The setting flags given on the command line, one per entry of [`SETTINGS`] that `S` takes.
/// Each overrides the config file and the matching `FERRY_*` variable.
#[derive(Debug, Clone, Default)]
pub struct SettingFlags<S> {
    /// The flags given, as overrides.
    pub overrides: Overrides,
    set: PhantomData<S>,
}

impl<S: FlagSet> SettingFlags<S> {
    fn settings() -> impl Iterator<Item = &'static Setting> {
        SETTINGS.iter().filter(|s| S::takes(s))
    }

    /// The value given for the setting named `name`, if any.
    pub fn value(&self, name: &str) -> Option<&str> {
        ferry_config::settings::find(name).and_then(|s| self.overrides.get(s))
    }
}

fn flag_of(setting: &'static Setting) -> Arg {
    let default = match (setting.default_note, setting.default) {
        ("", Some(text)) => text.to_string(),
        ("", None) => "none".to_string(),
        (note, _) => note.to_string(),
    };
    let mut arg = Arg::new(setting.name)
        .long(setting.name)
        .value_name(setting.value_name)
        .action(ArgAction::Set)
        .value_parser(clap::value_parser!(String))
        .help(format!(
            "{} [env: {}] [config: {}] [default: {default}]",
            setting.help,
            setting.env(),
            setting.doc_key()
        ))
        .help_heading(match setting.scope() {
            Scope::Server => "Server settings",
            Scope::Device => "Device settings",
            Scope::Model => "Model settings (with several [[models]], a flag applies to each)",
        });
    if let Some(short) = setting.short {
        arg = arg.short(short);
    }
    // A switch given alone (`--recalibrate`) is switched on.
    if setting.value_name == "BOOL" {
        arg = arg.num_args(0..=1).default_missing_value("true");
    }
    arg
}

impl<S: FlagSet> Args for SettingFlags<S> {
    fn augment_args(command: clap::Command) -> clap::Command {
        Self::settings().fold(command, |command, setting| command.arg(flag_of(setting)))
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl<S: FlagSet> FromArgMatches for SettingFlags<S> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self {
            overrides: Overrides::default(),
            set: PhantomData,
        };
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for setting in Self::settings() {
            if let Some(value) = matches.get_one::<String>(setting.name) {
                self.overrides.insert(setting, value.clone());
            }
        }
        Ok(())
    }
}

/// `--config FILE`, shared by every subcommand.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigFile {
    /// TOML config file (see config/default.toml). Relative model sources in it are relative to
    /// its folder.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `ferry serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The config file.
    #[command(flatten)]
    pub file: ConfigFile,
    /// Setting flags.
    #[command(flatten)]
    pub settings: SettingFlags<AllSettings>,
}

/// `ferry plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The config file.
    #[command(flatten)]
    pub file: ConfigFile,
    /// Setting flags.
    #[command(flatten)]
    pub settings: SettingFlags<ModelSettings>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `ferry config`.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// The config file.
    #[command(flatten)]
    pub file: ConfigFile,
    /// Setting flags.
    #[command(flatten)]
    pub settings: SettingFlags<AllSettings>,
    /// Print one JSON document instead of TOML-ish text.
    #[arg(long)]
    pub json: bool,
}

/// `ferry generate`.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// The config file.
    #[command(flatten)]
    pub file: ConfigFile,
    /// Setting flags.
    #[command(flatten)]
    pub settings: SettingFlags<ModelSettings>,
    /// The prompt text.
    #[arg(long, value_name = "TEXT")]
    pub prompt: String,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub max_tokens: usize,
    /// RNG seed for reproducible sampling.
    #[arg(long, value_name = "SEED")]
    pub seed: Option<u64>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
