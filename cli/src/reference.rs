//! The settings reference (docs/settings/<binary>.md), rendered from the command itself so it
//! cannot drift: each binary's tests compare the checked-in file with [`markdown`].

use clap::{Arg, ArgAction, Command};

use crate::vocabulary::{env_name, key_of};

/// Markdown for `cmd` and its subcommands: one table of settings per command.
pub fn markdown(cmd: &Command) -> String {
    let mut cmd = cmd.clone();
    cmd.build();
    let name = cmd.get_name().to_owned();
    let mut out = format!(
        "# `{name}` settings\n\n\
         Generated from the code by `{name}`'s tests (`UPDATE_SETTINGS_REFERENCE=1 cargo test` \
         rewrites it). Every setting is a flag, an environment variable and a key of the TOML \
         file named by `--config` (`PARAKEET_CONFIG`), all three with the same name; a flag \
         wins over a variable, a variable over the file, the file over the default.\n"
    );
    section(&cmd, &name, &mut out);
    out
}

fn section(cmd: &Command, path: &str, out: &mut String) {
    let rows: Vec<String> = cmd
        .get_arguments()
        // Global flags are listed once, under the program.
        .filter(|a| !(a.is_hide_set() || (a.is_global_set() && path.contains(' '))))
        .filter_map(row)
        .collect();
    if !rows.is_empty() {
        out.push_str(&format!("\n## `{path}`\n\n"));
        if let Some(about) = cmd.get_about() {
            out.push_str(&format!("{}\n\n", one_paragraph(&about.to_string())));
        }
        out.push_str("| Flag | Variable | TOML key | Default | Meaning |\n|---|---|---|---|---|\n");
        for row in rows {
            out.push_str(&row);
        }
    }
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        section(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

fn row(arg: &Arg) -> Option<String> {
    let key = key_of(arg)?;
    let long = arg.get_long()?;
    let flag = match arg.get_action() {
        ArgAction::SetTrue => format!("`--{long}`"),
        _ => format!("`--{long} <{}>`", value_name(arg)),
    };
    let default = match arg.get_action() {
        ArgAction::SetTrue => "off".to_owned(),
        _ => arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut meaning = one_paragraph(
        &arg.get_help()
            .or(arg.get_long_help())
            .map(|h| h.to_string())
            .unwrap_or_default(),
    );
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !meaning.is_empty() && !meaning.ends_with(['.', '?', '!', ')']) {
        meaning.push('.');
    }
    if !values.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue) {
        meaning.push_str(&format!(" One of {}.", values.join(", ")));
    }
    Some(format!(
        "| {flag} | `{}` | `{key}` | {default} | {} |\n",
        env_name(&key),
        meaning.replace('|', "\\|")
    ))
}

fn value_name(arg: &Arg) -> String {
    arg.get_value_names()
        .and_then(|names| names.first())
        .map(|n| n.to_string())
        .unwrap_or_else(|| arg.get_id().to_string().to_uppercase())
}

/// The first paragraph of a help text, on one line.
fn one_paragraph(text: &str) -> String {
    text.split("\n\n")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Compares `path` (docs/settings/<binary>.md, from the workspace) with [`markdown`] of `cmd`;
/// with `UPDATE_SETTINGS_REFERENCE=1` rewrites it instead. For each binary's tests.
pub fn check_file(cmd: &Command, path: &std::path::Path) -> Result<(), String> {
    let want = markdown(cmd);
    if std::env::var_os("UPDATE_SETTINGS_REFERENCE").is_some() {
        return std::fs::write(path, &want).map_err(|e| format!("{}: {e}", path.display()));
    }
    let have = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if have == want {
        return Ok(());
    }
    let first = have
        .lines()
        .zip(want.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
    Err(format!(
        "{} is out of date from line {} (run `UPDATE_SETTINGS_REFERENCE=1 cargo test` and \
         commit it):\n  have: {}\n  want: {}",
        path.display(),
        first + 1,
        have.lines().nth(first).unwrap_or("<end>"),
        want.lines().nth(first).unwrap_or("<end>")
    ))
}
