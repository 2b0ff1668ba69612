//! The vocabulary check each binary's tests run: every setting of every (sub)command is
//! accepted as its flag, its `PARAKEET_` variable and its TOML key, with the same value, and
//! no name spells a unit another way than the rest (`_s`, `_ms`, `_mib`, ...).

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

use crate::vocabulary::{env_name, key_of};

/// Values tried, in order, for a setting with neither possible values nor a default.
const CANDIDATES: &[&str] = &["1", "0.5", "127.0.0.1:9100", "s3://bucket/prefix/", "x"];

/// Words for seconds other than our `s` (`wait_time_s`).
const OTHER_SECONDS: &[&str] = &["sec", "secs", "seconds"];

/// One line per setting that fails; `make` builds the binary's command (through
/// [`crate::command`]) and is called again after each variable is set, since clap reads the
/// environment when the command is built. Sets and removes `PARAKEET_` variables: run it in
/// one test, not beside tests that read them.
pub fn violations(make: impl Fn() -> Command) -> Vec<String> {
    let mut failures = Vec::new();
    let dir = match tempfile_dir() {
        Ok(dir) => dir,
        Err(e) => return vec![format!("temporary directory: {e}")],
    };
    let mut paths = vec![Vec::new()];
    collect_paths(&make(), &mut Vec::new(), &mut paths);
    for path in paths {
        let cmd = make();
        let Some(at) = descend(&cmd, &path) else {
            continue;
        };
        let settings: Vec<(String, clap::Id, bool, Vec<String>)> = at
            .get_arguments()
            .filter_map(|a| {
                let key = key_of(a)?;
                let flag = matches!(a.get_action(), ArgAction::SetTrue);
                let mut tries: Vec<String> = a
                    .get_possible_values()
                    .first()
                    .map(|v| v.get_name().to_owned())
                    .into_iter()
                    .collect();
                tries.extend(
                    a.get_default_values()
                        .first()
                        .map(|v| v.to_string_lossy().into_owned()),
                );
                tries.extend(CANDIDATES.iter().map(|s| s.to_string()));
                Some((key, a.get_id().clone(), flag, tries))
            })
            .collect();
        let name = std::iter::once(cmd.get_name().to_owned())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        for (key, id, flag, tries) in settings {
            if let Some(word) = key.split('_').find(|w| OTHER_SECONDS.contains(w)) {
                let long = key.replace('_', "-");
                failures.push(format!("{name} --{long}: spell seconds `s`, not `{word}`"));
            }
            if let Err(e) = check_setting(&make, &path, &key, &id, flag, &tries, &dir) {
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    failures
}

fn check_setting(
    make: &impl Fn() -> Command,
    path: &[String],
    key: &str,
    id: &clap::Id,
    flag: bool,
    tries: &[String],
    dir: &std::path::Path,
) -> Result<(), String> {
    let long = format!("--{}", key.replace('_', "-"));
    let value = if flag {
        "true".to_owned()
    } else {
        tries
            .iter()
            .find(|v| {
                parse(make, path, &[format!("{long}={v}")], None, id)
                    == Some((ValueSource::CommandLine, vec![v.to_string()]))
            })
            .cloned()
            .ok_or_else(|| format!("{long}: no value tried was accepted ({tries:?})"))?
    };
    let by_flag = if flag {
        parse(make, path, std::slice::from_ref(&long), None, id)
    } else {
        parse(make, path, &[format!("{long}={value}")], None, id)
    };
    let variable = env_name(key);
    let by_env = parse(make, path, &[], Some((&variable, &value)), id);
    let file = dir.join(format!("{key}.toml"));
    let toml_value = toml_scalar(&value);
    std::fs::write(&file, format!("{key} = {toml_value}\n")).map_err(|e| e.to_string())?;
    let by_file = parse(
        make,
        path,
        &["--config".into(), file.to_string_lossy().into_owned()],
        None,
        id,
    );
    let want = |source| Some((source, vec![value.clone()]));
    let mut wrong = Vec::new();
    if by_flag != want(ValueSource::CommandLine) {
        wrong.push(format!("flag {long} gave {by_flag:?}"));
    }
    if by_env != want(ValueSource::EnvVariable) {
        wrong.push(format!("variable {variable}={value} gave {by_env:?}"));
    }
    if by_file != want(ValueSource::DefaultValue) {
        wrong.push(format!("TOML `{key} = {toml_value}` gave {by_file:?}"));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// The value source and raw values of `id` after a lenient parse (missing required arguments
/// and the like are not this check's business).
fn parse(
    make: &impl Fn() -> Command,
    path: &[String],
    extra: &[String],
    env: Option<(&str, &str)>,
    id: &clap::Id,
) -> Option<(ValueSource, Vec<String>)> {
    if let Some((name, value)) = env {
        std::env::set_var(name, value);
    }
    let cmd = make().ignore_errors(true);
    let mut args: Vec<OsString> = vec![cmd.get_name().into()];
    args.extend(path.iter().map(OsString::from));
    args.extend(extra.iter().map(OsString::from));
    let matches = crate::matches_from(cmd, args);
    if let Some((name, _)) = env {
        std::env::remove_var(name);
    }
    let matches = matches.ok()?;
    let mut level: &ArgMatches = &matches;
    for name in path {
        level = level.subcommand_matches(name)?;
    }
    let source = level.value_source(id.as_str())?;
    let raw = level
        .get_raw(id.as_str())?
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    Some((source, raw))
}

/// The value as a TOML scalar, typed as a person would write it.
fn toml_scalar(value: &str) -> String {
    if value == "true" || value == "false" || value.parse::<i64>().is_ok() {
        return value.to_owned();
    }
    if value.parse::<f64>().is_ok() && value.contains('.') {
        return value.to_owned();
    }
    toml::Value::String(value.to_owned()).to_string()
}

fn collect_paths(cmd: &Command, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        prefix.push(sub.get_name().to_owned());
        out.push(prefix.clone());
        collect_paths(sub, prefix, out);
        prefix.pop();
    }
}

fn descend<'a>(cmd: &'a Command, path: &[String]) -> Option<&'a Command> {
    match path.split_first() {
        Some((name, rest)) => descend(cmd.find_subcommand(name)?, rest),
        None => Some(cmd),
    }
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("cli-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use clap::Arg;

    use super::*;

    fn good() -> Command {
        crate::vocabulary::apply(
            Command::new("t").subcommand(
                Command::new("run")
                    .arg(
                        Arg::new("wait_time_s")
                            .long("wait-time-s")
                            .value_parser(clap::value_parser!(u64)),
                    )
                    .arg(Arg::new("no_mps").long("no-mps").action(ArgAction::SetTrue))
                    .arg(
                        Arg::new("listen")
                            .long("listen")
                            .value_parser(clap::value_parser!(std::net::SocketAddr)),
                    ),
            ),
        )
    }

    #[test]
    fn a_conforming_command_passes() {
        assert_eq!(violations(good), Vec::<String>::new());
    }

    #[test]
    fn another_variable_or_unit_spelling_fails() {
        let bad = || {
            crate::vocabulary::apply(
                Command::new("u").arg(
                    Arg::new("timeout_secs")
                        .long("timeout-secs")
                        .value_parser(clap::value_parser!(u64)),
                ),
            )
            // What a hand-written `env = "TIMEOUT"` did before.
            .mut_arg("timeout_secs", |a| a.env("TIMEOUT"))
        };
        let found = violations(bad);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("not `secs`"), "{found:?}");
        assert!(found[1].contains("PARAKEET_TIMEOUT_SECS"), "{found:?}");
    }
}
