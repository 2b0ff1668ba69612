//! The process's open-file limit. Every job in flight may hold a connection or a file at once,
//! and many hosts start processes with a soft limit of 1 024 (login shells, systemd's
//! default `1024:524288`) while a GPU host's pipeline keeps hundreds to thousands of jobs in flight (544 on
//! one H100/H200 with 16 cores, over 4 000 on eight GPUs). Past the limit every connect fails
//! with "Too many open files": measured with `dispatcher run --max-in-flight 544` under a soft
//! limit of 200, message deletes failed and 535 messages came back to be found already done.
//! So the dispatcher raises its soft limit towards the hard one at start (as Go's runtime does)
//! and sizes the jobs in flight within what it got (`app::Sizing`, rule 6).

/// The soft limit asked for: far above what any pipeline here holds (8 GPUs: some 9 000), and
/// low enough that a child process looping over every descriptor stays quick.
const WANTED: u64 = 65_536;

/// Raises the soft limit to [`WANTED`] or the hard limit, whichever is lower, and returns the
/// soft limit now in force (never lowers it).
pub fn raise() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(WANTED)
}

/// The soft limit in force (`u64::MAX` where the platform has none or it cannot be read).
pub fn limit() -> u64 {
    rlimit::Resource::NOFILE
        .get()
        .map_or(u64::MAX, |(soft, _hard)| soft)
}
