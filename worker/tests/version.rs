//! `worker --version` names the program and its version (operators check what a host runs).

#[test]
fn version_is_printed() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_worker"))
        .arg("--version")
        .output()
        .expect("spawn worker");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        text.trim(),
        format!("worker {}", env!("CARGO_PKG_VERSION")),
        "{text}"
    );
}
