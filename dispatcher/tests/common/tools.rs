//! External tools a test drives (ffmpeg, cfn-lint, hadolint, ...): present, or the test skips
//! loudly, unless the variable that makes them required is set (CI sets them).

use std::process::Command;

/// Whether every probe (a name for the message, then a command line that must succeed) runs.
/// Missing ones skip the test with a line on stderr, or panic when `require_var` is set.
pub fn present(test: &str, require_var: &str, probes: &[(&str, &[&str])], install: &str) -> bool {
    let missing: Vec<&str> = probes
        .iter()
        .filter(|(_, argv)| {
            !Command::new(argv[0])
                .args(&argv[1..])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os(require_var).is_none(),
        "{require_var} is set but {missing:?} are missing ({install})"
    );
    eprintln!("SKIPPED {test}: {missing:?} missing ({install})");
    false
}
