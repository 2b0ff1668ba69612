//! The `--config` TOML file: each key becomes its setting's default, so a flag or a variable
//! still wins. A key no command of the binary knows is an error (a typo must not be ignored);
//! a key only another subcommand knows is left for that one (one file serves `run` and
//! `reconcile`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Command;

use crate::error::CliError;
use crate::vocabulary::{key_of, CONFIG};

/// `cmd` with the defaults from the config file that `args` (or `PARAKEET_CONFIG`) names.
pub(crate) fn apply(cmd: Command, args: &[OsString]) -> Result<Command, CliError> {
    let Some((path, route)) = config_path(&cmd, args) else {
        return Ok(cmd);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| CliError::ConfigRead {
        path: path.clone(),
        source,
    })?;
    let table: toml::Table = text.parse().map_err(|source| CliError::ConfigParse {
        path: path.clone(),
        source: Box::new(source),
    })?;
    let mut cmd = cmd;
    for (key, value) in table {
        let values = values_of(&path, &key, &value)?;
        let mut found = false;
        cmd = set_default(cmd, &route, &key, &values, &mut found);
        if !found && !knows(&cmd, &key) {
            return Err(CliError::UnknownKey { path, key });
        }
    }
    Ok(cmd)
}

/// The config file and the subcommands on the command line, from a lenient first pass.
fn config_path(cmd: &Command, args: &[OsString]) -> Option<(PathBuf, Vec<String>)> {
    let matches = cmd
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok()?;
    let mut route = Vec::new();
    let mut level = &matches;
    let mut path = level.get_one::<PathBuf>(CONFIG).cloned();
    while let Some((name, sub)) = level.subcommand() {
        route.push(name.to_owned());
        level = sub;
        path = path.or_else(|| level.get_one::<PathBuf>(CONFIG).cloned());
    }
    Some((path?, route))
}

/// A TOML value as the strings clap parses: scalars as written, arrays one value each.
fn values_of(path: &Path, key: &str, value: &toml::Value) -> Result<Vec<String>, CliError> {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    };
    let values = match value {
        toml::Value::Array(items) => items.iter().map(scalar).collect(),
        v => scalar(v).map(|s| vec![s]),
    };
    values.ok_or_else(|| CliError::ConfigValue {
        path: path.to_owned(),
        key: key.to_owned(),
        found: value.type_str(),
    })
}

/// Sets `key`'s default on `cmd` and on every subcommand along `route` that has it.
fn set_default(
    cmd: Command,
    route: &[String],
    key: &str,
    values: &[String],
    found: &mut bool,
) -> Command {
    let id = cmd
        .get_arguments()
        .find(|a| key_of(a).as_deref() == Some(key))
        .map(|a| a.get_id().clone());
    let cmd = match id {
        Some(id) => {
            *found = true;
            let values: Vec<clap::builder::OsStr> =
                values.iter().map(|v| v.clone().into()).collect();
            // A setting the file gives is no longer missing: clap refuses a required
            // argument with a default.
            cmd.mut_arg(id, |arg| arg.default_values(values).required(false))
        }
        None => cmd,
    };
    match route.split_first() {
        Some((name, rest)) => {
            cmd.mut_subcommand(name, |sub| set_default(sub, rest, key, values, found))
        }
        None => cmd,
    }
}

/// Whether any command of the tree has the setting `key`.
fn knows(cmd: &Command, key: &str) -> bool {
    cmd.get_arguments()
        .any(|a| key_of(a).as_deref() == Some(key))
        || cmd.get_subcommands().any(|s| knows(s, key))
}

#[cfg(test)]
mod tests {
    use clap::{Arg, ArgAction};

    use super::*;

    fn cmd() -> Command {
        crate::vocabulary::apply(
            Command::new("t")
                .arg(Arg::new("verbose_name").long("verbose-name").global(true))
                .subcommand(
                    Command::new("run")
                        .arg(Arg::new("wait_time_s").long("wait-time-s").required(true))
                        .arg(
                            Arg::new("gpus")
                                .long("gpus")
                                .value_delimiter(',')
                                .action(ArgAction::Append),
                        )
                        .arg(Arg::new("no_mps").long("no-mps").action(ArgAction::SetTrue)),
                )
                .subcommand(Command::new("other").arg(Arg::new("queue").long("queue"))),
        )
    }

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).expect("write");
        let path = path.to_string_lossy().into_owned();
        (dir, path)
    }

    #[test]
    fn file_gives_defaults_and_flags_win() {
        let (_dir, path) = file(
            "wait_time_s = 7\ngpus = [0, 1]\nno_mps = true\nqueue = \"q\"\nverbose_name = \"v\"\n",
        );
        let m = crate::matches_from(cmd(), args(&["t", "run", "--config", &path])).expect("parse");
        let (_, run) = m.subcommand().expect("run");
        assert_eq!(
            run.get_one::<String>("wait_time_s").map(String::as_str),
            Some("7")
        );
        let gpus: Vec<&String> = run.get_many::<String>("gpus").expect("gpus").collect();
        assert_eq!(gpus, ["0", "1"]);
        assert!(run.get_flag("no_mps"));
        assert_eq!(
            run.get_one::<String>("verbose_name").map(String::as_str),
            Some("v")
        );
        let m = crate::matches_from(
            cmd(),
            args(&["t", "run", "--wait-time-s", "3", "--config", &path]),
        )
        .expect("parse");
        let (_, run) = m.subcommand().expect("run");
        assert_eq!(
            run.get_one::<String>("wait_time_s").map(String::as_str),
            Some("3")
        );
    }

    #[test]
    fn unknown_keys_and_tables_are_refused() {
        let (_dir, path) = file("wait_time_secs = 7\n");
        let error =
            crate::matches_from(cmd(), args(&["t", "run", "--config", &path])).expect_err("typo");
        let text = error.to_string();
        assert!(
            text.contains("wait_time_secs") && text.contains(&path),
            "{text}"
        );
        let (_dir, path) = file("[wait_time_s]\nx = 1\n");
        let error =
            crate::matches_from(cmd(), args(&["t", "run", "--config", &path])).expect_err("table");
        assert!(error.to_string().contains("a TOML table"), "{error}");
    }
}
