//! How many workers share a GPU when the user does not say: read the GPU through `worker
//! probe` (the same binary and CUDA libraries the workers will use, so a GPU the workers cannot
//! open fails here, before anything starts), then apply the rules of [`auto_instances`].

use std::path::Path;

use worker_protocol::DeviceReport;

use crate::error::FleetError;

/// Most workers per GPU: the seed deployment's cap, and the layout that measured best on the
/// H200 (MPS 4 x 25 %: docs/benchmarks.md, the SLA sweep).
pub const MAX_INSTANCES_PER_GPU: usize = 4;
/// Fewest SMs a worker should get: below this a 30 s segment's encoder pass is slow enough to
/// break the latency target on its own.
pub const MIN_SMS_PER_INSTANCE: u32 = 16;
/// GPU memory one transcription worker may need: its weights before they are shared, the
/// activations of a 16 x 30 s batch and the CUDA context (measured 2 454 MiB alone).
pub const MEMORY_PER_INSTANCE_BYTES: u64 = 2_600 << 20;
/// Share of the GPU's memory the workers may plan to use (the rest: MPS server, diarization).
pub const MEMORY_SHARE: f64 = 0.8;
/// Host cores each worker needs to be fed: a GPU gets one worker per this many cores of the
/// host's (per GPU), up to the cap. Measured on an H200 host with 16 cores (docs/benchmarks.md,
/// session 28, 96 h of mixed formats): the main job ran at 10 738 audio-s/s with 4 x 25 % under
/// MPS against 9 333 with 2 x 50 % in the same call, its dispatcher busy on about 9 of the 16
/// cores decoding (about 1 200 audio seconds per core-second of that mix), so 4 cores feed
/// about one worker's share of the GPU. Fewer cores than 16 per GPU were not measured.
pub const HOST_CORES_PER_WORKER: usize = 4;

/// Host memory one loading worker may hold, as a multiple of its checkpoint file's size (the
/// file's bytes, the parsed tensors and their converted copies).
pub const LOAD_MEMORY_PER_CHECKPOINT_BYTE: u64 = 3;

/// How many workers may load their model at once: as many as `available_bytes` of host memory
/// hold at [`LOAD_MEMORY_PER_CHECKPOINT_BYTE`] each, at least one, at most `workers`. One after
/// another, four workers of the full-size model took 9.7 s to be ready on the H200 host (the
/// consumer starts with the first).
pub fn concurrent_loads(checkpoint_bytes: u64, available_bytes: u64, workers: usize) -> usize {
    let per_load = checkpoint_bytes.max(1) * LOAD_MEMORY_PER_CHECKPOINT_BYTE;
    ((available_bytes / per_load) as usize).clamp(1, workers.max(1))
}

/// `MemAvailable` of /proc/meminfo, in bytes; `None` where it cannot be read.
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The workers chosen for one GPU, and why (for the start-up log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub instances: usize,
    pub reason: String,
}

/// Rules, the smallest wins:
/// 1. at most [`MAX_INSTANCES_PER_GPU`];
/// 2. at least [`MIN_SMS_PER_INSTANCE`] SMs each;
/// 3. [`MEMORY_PER_INSTANCE_BYTES`] each within [`MEMORY_SHARE`] of the GPU's memory;
/// 4. one per [`HOST_CORES_PER_WORKER`] of the host's cores per GPU (the host decodes the
///    audio: more workers than it can feed only wait);
/// 5. at least one.
pub fn auto_instances(device: &DeviceReport, host_cores_per_gpu: usize) -> Layout {
    let by_sms = (device.sm_count / MIN_SMS_PER_INSTANCE) as usize;
    let budget = (device.memory_bytes as f64 * MEMORY_SHARE) as u64;
    let by_memory = (budget / MEMORY_PER_INSTANCE_BYTES) as usize;
    let by_host = host_cores_per_gpu / HOST_CORES_PER_WORKER;
    let instances = MAX_INSTANCES_PER_GPU
        .min(by_sms)
        .min(by_memory)
        .min(by_host)
        .max(1);
    let reason = format!(
        "{} with {} SMs and {} MiB, {host_cores_per_gpu} host cores for it: min(cap \
         {MAX_INSTANCES_PER_GPU}, {by_sms} by SMs at {MIN_SMS_PER_INSTANCE} each, {by_memory} \
         by memory at {} MiB each, {by_host} by the host's cores at {HOST_CORES_PER_WORKER} each)",
        device.name,
        device.sm_count,
        device.memory_bytes >> 20,
        MEMORY_PER_INSTANCE_BYTES >> 20,
    );
    Layout { instances, reason }
}

/// Reads GPU `gpu` (a host ordinal) with `<worker> probe --require-cuda`, outside any MPS
/// daemon, so the SM count is the whole device's.
pub fn probe_gpu(worker_binary: &Path, gpu: u32) -> Result<DeviceReport, FleetError> {
    let output = crate::worker_command::worker_command(worker_binary)
        .args(["probe", "--require-cuda"])
        .env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .env_remove("CUDA_MPS_PIPE_DIRECTORY")
        .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .output()
        .map_err(FleetError::io("running `probe` of", worker_binary))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(FleetError::GpuProbe {
            gpu,
            detail: last_line(&stderr)
                .or_else(|| last_line(&stdout))
                .unwrap_or("no output")
                .to_owned(),
        });
    }
    parse_probe(&stdout).ok_or_else(|| FleetError::GpuProbe {
        gpu,
        detail: "`worker probe` printed no `device {...}` line".into(),
    })
}

/// The `device {json}` line of `worker probe`'s output.
fn parse_probe(stdout: &str) -> Option<DeviceReport> {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("device "))
        .and_then(|json| serde_json::from_str(json).ok())
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, sm_count: u32, memory_gib: u64) -> DeviceReport {
        DeviceReport {
            ordinal: 0,
            name: name.into(),
            sm_count,
            compute_capability: (9, 0),
            memory_bytes: memory_gib << 30,
            mps: None,
        }
    }

    #[test]
    fn big_gpus_on_big_hosts_get_the_cap_small_ones_fewer() {
        let cores = 64;
        assert_eq!(auto_instances(&gpu("H200", 132, 141), cores).instances, 4);
        assert_eq!(auto_instances(&gpu("L40S", 142, 45), cores).instances, 4);
        // 40 SMs: two workers of 20 SMs each.
        assert_eq!(auto_instances(&gpu("small", 40, 48), cores).instances, 2);
        // 8 GiB: 6.4 GiB usable, two workers of 2.6 GiB.
        assert_eq!(auto_instances(&gpu("8 GB card", 58, 8), cores).instances, 2);
        // Never zero, however small.
        assert_eq!(auto_instances(&gpu("tiny", 8, 2), cores).instances, 1);
        let why = auto_instances(&gpu("NVIDIA H200", 132, 141), cores).reason;
        assert!(
            why.contains("NVIDIA H200") && why.contains("132 SMs"),
            "{why}"
        );
    }

    #[test]
    fn a_host_too_small_to_feed_several_workers_gets_fewer() {
        let h200 = gpu("NVIDIA H200", 132, 141);
        assert_eq!(auto_instances(&h200, 2).instances, 1);
        assert_eq!(auto_instances(&h200, 7).instances, 1);
        assert_eq!(auto_instances(&h200, 8).instances, 2);
        assert_eq!(auto_instances(&h200, 12).instances, 3);
        assert_eq!(auto_instances(&h200, 16).instances, 4);
        assert_eq!(auto_instances(&h200, 96).instances, 4);
        let why = auto_instances(&h200, 16).reason;
        assert!(why.contains("16 host cores"), "{why}");
    }

    #[test]
    fn loads_run_together_as_far_as_host_memory_holds_them() {
        let gib = 1u64 << 30;
        // 2.5 GB checkpoint: 7.5 GB per load.
        let ckpt = 5 * gib / 2;
        assert_eq!(concurrent_loads(ckpt, 120 * gib, 4), 4);
        assert_eq!(concurrent_loads(ckpt, 16 * gib, 4), 2);
        assert_eq!(concurrent_loads(ckpt, 4 * gib, 4), 1);
        assert_eq!(concurrent_loads(ckpt, 120 * gib, 1), 1);
        assert_eq!(concurrent_loads(0, 0, 0), 1);
    }

    #[test]
    fn the_probe_line_is_read_from_the_workers_output() {
        let out = "engine cpu: available\nengine cuda: available: ...\n\
                   device {\"ordinal\":0,\"name\":\"NVIDIA H200\",\"sm_count\":132,\
                   \"compute_capability\":[9,0],\"memory_bytes\":150754820096,\"mps\":null}\n";
        let report = parse_probe(out).expect("device line");
        assert_eq!(
            (report.sm_count, report.name.as_str()),
            (132, "NVIDIA H200")
        );
        assert!(parse_probe("engine cuda: unavailable: no device").is_none());
    }

    #[test]
    fn a_worker_without_a_gpu_is_a_typed_error_naming_the_gpu() {
        // `false` exits 1 with no output, as a worker whose probe fails would.
        let error = probe_gpu(Path::new("false"), 3).expect_err("no GPU");
        assert!(
            matches!(error, FleetError::GpuProbe { gpu: 3, .. }),
            "{error}"
        );
        let missing = probe_gpu(Path::new("/nonexistent/worker"), 0).expect_err("no binary");
        assert!(
            missing.to_string().contains("/nonexistent/worker"),
            "{missing}"
        );
    }
}
