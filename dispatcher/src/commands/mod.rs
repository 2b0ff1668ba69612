//! One module per subcommand.

pub(crate) mod transcribe;

pub(crate) mod backfill;
pub(crate) mod enqueue;
pub(crate) mod limit;
pub(crate) mod local;
pub(crate) mod progress;
pub(crate) mod reconcile;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod summary;
pub(crate) mod targets;

/// Exit status of a command that worked but left some jobs failed or inputs without a result
/// (`local` with failed jobs, `reconcile` with missing inputs): not 1, which is an error that
/// stopped the command.
pub(crate) const EXIT_PARTIAL: u8 = 3;

/// Parses `--format`/`--formats`, naming the formats in `--help` and in errors.
pub(crate) fn output_format(
) -> impl clap::builder::TypedValueParser<Value = model_core::render::OutputFormat> {
    use clap::builder::TypedValueParser;
    use model_core::render::OutputFormat;
    clap::builder::PossibleValuesParser::new(OutputFormat::ALL.map(OutputFormat::name))
        .try_map(|name| name.parse::<OutputFormat>())
}
