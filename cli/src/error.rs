use std::path::PathBuf;

/// What can go wrong before a binary starts its work.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Flags or variables clap refused (printed by clap itself).
    #[error("{0}")]
    Usage(clap::Error),
    #[error("config file {}: {source} (give an existing TOML file to --config or PARAKEET_CONFIG)", path.display())]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: not TOML: {source}", path.display())]
    ConfigParse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config file {}: `{key}` is not a setting of this program (keys are the long flags with `_` for `-`; see --help or docs/settings/)", path.display())]
    UnknownKey { path: PathBuf, key: String },
    #[error("config file {}: `{key}` is a TOML {found}; give a string, number, boolean or an array of them", path.display())]
    ConfigValue {
        path: PathBuf,
        key: String,
        found: &'static str,
    },
}
