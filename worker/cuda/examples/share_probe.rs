//! Does shareable device memory work between two processes on this GPU (also as MPS clients)?
//!
//! `share_probe [--bytes N]` creates N bytes of shareable memory and fills it with a pattern.
//! It then starts itself as a child with `--child SOCKET` and sends the child the memory's
//! descriptor. The child maps it, checks the pattern and writes a marker at offset 0; the parent
//! then reads the marker back. Exit status 0 and a `PASS` line: both processes saw the same
//! physical memory. Under MPS, run it with the daemon's `CUDA_MPS_PIPE_DIRECTORY` set: both
//! processes are then MPS clients.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use cuda_engine::internals::{receive_shared, send_shared, SharedDeviceMemory};
use cuda_engine::CudaEngine;

const MARKER: &[u8] = b"child was here";

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--child") => child(PathBuf::from(args.get(2).context("--child SOCKET")?)),
        Some("--bytes") => parent(args.get(2).context("--bytes N")?.parse()?),
        None => parent(64 << 20),
        Some(other) => bail!("unknown argument {other}: use [--bytes N]"),
    }
}

fn parent(bytes: usize) -> Result<()> {
    let engine = CudaEngine::new(0)?;
    let started = Instant::now();
    let memory = SharedDeviceMemory::create(&engine, bytes)?;
    memory.write(0, &pattern(memory.bytes()))?;
    println!(
        "parent: {} bytes of shareable memory filled in {:?}",
        memory.bytes(),
        started.elapsed()
    );
    let socket = std::env::temp_dir().join(format!("share_probe-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(&socket)
        .spawn()?;
    let (stream, _) = listener.accept()?;
    send_shared(stream.as_fd(), &memory)?;
    let status = child.wait()?;
    let _ = std::fs::remove_file(&socket);
    ensure!(status.success(), "child failed: {status}");
    let mut seen = vec![0u8; MARKER.len()];
    memory.read(0, &mut seen)?;
    ensure!(
        seen == MARKER,
        "the child's marker is not visible to the parent"
    );
    let mut rest = vec![0u8; memory.bytes() - MARKER.len()];
    memory.read(MARKER.len(), &mut rest)?;
    ensure!(
        rest == pattern(memory.bytes())[MARKER.len()..],
        "the pattern beyond the marker changed"
    );
    println!(
        "PASS: parent and child mapped the same {} bytes",
        memory.bytes()
    );
    Ok(())
}

fn child(socket: PathBuf) -> Result<()> {
    let engine = CudaEngine::new(0)?;
    let stream = UnixStream::connect(&socket)?;
    let started = Instant::now();
    let memory = receive_shared(&engine, stream.as_fd())?;
    let mut seen = vec![0u8; memory.bytes()];
    memory.read(0, &mut seen)?;
    ensure!(
        seen == pattern(memory.bytes()),
        "child: the pattern differs from the parent's"
    );
    memory.write(0, MARKER)?;
    println!(
        "child: imported and checked {} bytes in {:?}",
        memory.bytes(),
        started.elapsed()
    );
    Ok(())
}
