//! The binaries' logs on stderr: text (coloured only for a person at a terminal; files, pipes
//! and journald get plain text) or one JSON object per line (`--log-format json`, for log
//! shippers). The level filter is `RUST_LOG` (default `info`).

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, message and fields.
    Json,
}

/// Installs the process's subscriber; call once, first thing after parsing the flags. Targets
/// in `muted` (libraries whose own lines repeat what the binary reports) are off unless
/// `RUST_LOG` names them.
pub fn init(format: LogFormat, default_filter: &str, muted: &[&str]) {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let mut directives = from_env
        .clone()
        .unwrap_or_else(|| default_filter.to_owned());
    for target in muted {
        if !from_env.as_deref().is_some_and(|v| v.contains(target)) {
            directives.push_str(&format!(",{target}=off"));
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
