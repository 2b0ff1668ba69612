//! `dispatcher --version` names the program and its version, as `worker` and `fleet` do.

#[test]
fn version_is_printed() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("--version")
        .output()
        .expect("spawn dispatcher");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        text.trim(),
        format!("dispatcher {}", env!("CARGO_PKG_VERSION")),
        "{text}"
    );
}
