//! `worker`: serves one model instance (built in the worker-fleet issue).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("the worker process is not built yet: see the worker-fleet issue")
}
