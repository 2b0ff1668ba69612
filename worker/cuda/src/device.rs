//! The engine's CUDA context: one device, one stream, the NVRTC-compiled kernel table and the
//! cuBLASLt handle. Everything the typed operations (in `ops/` and `matmul/`) launch goes
//! through here (and from here through the raw wrappers in `driver/`).

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{cudaError_enum, CUdevice_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError,
    LaunchArgs, LaunchConfig, ValidAsZeroBits,
};

use crate::driver::launch::{self, LaunchMode};
use crate::driver::nvrtc::{self, CompiledModule, KernelCode};
use crate::driver::{context, memory};
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernel_code::KernelBuild;
use crate::kernels::{Kernel, KernelModule};
use crate::matmul::Blas;
use crate::storage::StorageKind;

/// One GPU's CUDA state for one engine thread.
///
/// Owns a non-default stream: every kernel and matmul of this engine is ordered on it, so an
/// engine needs no synchronization between its own launches.
pub struct CudaEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compute_capability: (i32, i32),
    /// PTX or cubins, and the NVRTC and driver versions that decided it.
    kernel_build: KernelBuild,
    /// Indexed by `Kernel as usize`; filled for every kernel at creation (bf16 storage).
    functions: Vec<CudaFunction>,
    /// The f32-storage build of the storage-dependent kernels, compiled on first request
    /// ([`CudaEngine::load_f32_storage`]); `None` for kernels without a variant.
    f32_storage: OnceLock<Vec<Option<CudaFunction>>>,
    /// Dynamic shared memory the fused attention kernel is allowed, set on its first launch
    /// (the attribute call and occupancy query would otherwise cost host time every layer).
    pub(crate) fused_attention_shared: OnceLock<usize>,
    pub(crate) blas: Blas,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("ordinal", &self.ctx.ordinal())
            .field("compute_capability", &self.compute_capability)
            .field("kernel_build", &self.kernel_build)
            .finish_non_exhaustive()
    }
}

/// Checks that the driver, NVRTC and cuBLASLt libraries can be loaded, without loading any
/// symbol (cudarc panics on a missing library once a symbol is used, so this must come first).
pub fn check_cuda_libraries() -> Result<()> {
    let present = context::libraries_present();
    let missing: Vec<&str> = present
        .iter()
        .filter(|(_, found)| !found)
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CudaEngineError::NoDevice {
            reason: format!(
                "cannot load {} (searched the dynamic loader path; set LD_LIBRARY_PATH)",
                missing.join(", ")
            ),
        })
    }
}

impl CudaEngine {
    /// Opens GPU `ordinal`, creates the engine's stream and cuBLASLt workspace, and compiles every
    /// kernel module with NVRTC for this GPU's compute capability: to PTX, or to cubins where
    /// NVRTC is newer than the driver ([`KernelBuild::for_versions`]).
    ///
    /// Returns [`CudaEngineError::NoDevice`] (never panics) when the CUDA libraries or a device
    /// are missing.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::open(ordinal, None)
    }

    /// [`CudaEngine::new`] with the kernels compiled to `code` whatever the versions (tests
    /// compare both forms on one machine).
    pub fn with_kernel_code(ordinal: usize, code: KernelCode) -> Result<Self> {
        Self::open(ordinal, Some(code))
    }

    fn open(ordinal: usize, code: Option<KernelCode>) -> Result<Self> {
        check_cuda_libraries()?;
        let mut kernel_build = KernelBuild::for_this_machine()?;
        if let Some(code) = code {
            kernel_build.code = code;
        }
        let ctx = CudaContext::new(ordinal).map_err(|source| no_device_or(source, ordinal))?;
        // SAFETY: every buffer of this engine is used on its one stream only (kernels, copies and
        // captured graphs are all ordered there), so cudarc's cross-stream events are not needed;
        // they would also be recorded into graph captures.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .context(|| format!("creating a stream on GPU {ordinal}"))?;
        let compute_capability = ctx
            .compute_capability()
            .context(|| format!("reading the compute capability of GPU {ordinal}"))?;
        let target = KernelTarget {
            code: kernel_build.code,
            compute_capability,
        };
        let functions = load_kernels(&ctx, target, StorageKind::Bf16)?
            .into_iter()
            .map(|f| f.expect("every kernel has a bf16-storage build (bug)"))
            .collect();
        // The whole device's multiprocessors, also under an MPS thread limit (the limit shows
        // in the context's execution affinity, not in this attribute).
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .context(|| format!("reading the SM count of GPU {ordinal}"))?;
        let blas = Blas::new(stream.clone(), compute_capability, sm_count)?;
        Ok(Self {
            ctx,
            stream,
            compute_capability,
            kernel_build,
            functions,
            f32_storage: OnceLock::new(),
            fused_attention_shared: OnceLock::new(),
            blas,
        })
    }

    /// Compiles the f32-storage build of the storage-dependent kernels (once; later calls
    /// return at once). Needed before any f32-storage operation.
    pub fn load_f32_storage(&self) -> Result<()> {
        if self.f32_storage.get().is_none() {
            let loaded = load_kernels(&self.ctx, self.kernel_target(), StorageKind::F32)?;
            // A concurrent caller may have set it first; both builds are identical.
            let _ = self.f32_storage.set(loaded);
        }
        Ok(())
    }

    /// PTX or cubins, and the NVRTC and driver versions that decided it.
    pub fn kernel_build(&self) -> KernelBuild {
        self.kernel_build
    }

    fn kernel_target(&self) -> KernelTarget {
        KernelTarget {
            code: self.kernel_build.code,
            compute_capability: self.compute_capability,
        }
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every operation of this engine runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// (major, minor), e.g. (9, 0) for H100/H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> Result<String> {
        self.ctx.name().context(|| "reading the device name".into())
    }

    /// Makes every wait for the GPU (stream synchronisation, copies to the host) sleep on the
    /// driver instead of spinning on a core. A spinning wait saves microseconds per batch but
    /// takes a whole core from the host for as long as the GPU works, and a host feeding the
    /// GPU needs those cores to decode audio.
    pub fn set_blocking_sync(&self) -> Result<()> {
        self.ctx
            .set_blocking_synchronize()
            .context(|| "setting blocking synchronisation on the context".into())
    }

    /// Waits for all work queued on the engine's stream; surfaces asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .context(|| "synchronizing the engine stream".into())
    }

    /// Device memory in use by every process, in bytes (total minus free, as the driver sees it).
    pub fn used_memory_bytes(&self) -> Result<usize> {
        memory::used_bytes(self.context())
    }

    /// Returns the memory that freed buffers left in the stream-ordered allocator's pool to the
    /// device (the pool keeps it for reuse otherwise), after the queued work completes.
    pub fn release_pooled_memory(&self) -> Result<()> {
        self.synchronize()?;
        memory::trim_pool(self.context())
    }

    /// Copies a host slice into a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(host)
            .context(|| format!("uploading {} elements", host.len()))
    }

    /// Copies `host` into the start of an existing device buffer (ordered on the stream).
    pub fn upload_into<T: DeviceRepr>(&self, host: &[T], device: &mut CudaSlice<T>) -> Result<()> {
        if device.len() < host.len() {
            return Err(CudaEngineError::Shape {
                op: "upload_into",
                detail: format!("{} elements into a buffer of {}", host.len(), device.len()),
            });
        }
        self.stream
            .memcpy_htod(host, device)
            .context(|| format!("uploading {} elements", host.len()))
    }

    /// Copies a device buffer (or a view of one) back to the host (waits for the stream).
    pub fn download<T: DeviceRepr, S: DevicePtr<T>>(&self, device: &S) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(device)
            .context(|| format!("downloading {} elements", device.len()))
    }

    /// A zero-filled device buffer.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(len)
            .context(|| format!("allocating {len} elements"))
    }

    /// The most dynamic shared memory one block may use after opting in.
    fn max_shared_bytes_optin(&self) -> Result<usize> {
        self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    }

    fn attribute(&self, attribute: CUdevice_attribute) -> Result<usize> {
        let value = self
            .ctx
            .attribute(attribute)
            .context(|| format!("reading device attribute {attribute:?}"))?;
        Ok(usize::try_from(value).unwrap_or(0))
    }

    /// Lets the build of `kernel` for `storage` use as much dynamic shared memory per block as
    /// the device allows next to its static shared memory. Returns that many bytes and how many
    /// blocks of `threads` threads using them fit on one multiprocessor.
    pub(crate) fn allow_max_shared_bytes(
        &self,
        storage: StorageKind,
        kernel: Kernel,
        threads: u32,
    ) -> Result<(usize, usize)> {
        let function = self.function(storage, kernel)?;
        launch::allow_max_dynamic_shared(
            function,
            kernel.name(),
            self.max_shared_bytes_optin()?,
            threads,
        )
    }

    /// Launches `kernel` on the engine stream with the arguments `push` adds.
    ///
    /// # Safety
    ///
    /// `push` must add exactly the arguments of the kernel's CUDA signature, in order and with
    /// the same types, and every index the kernel computes from them must stay inside the buffers
    /// passed (the typed wrappers validate shapes against buffer lengths before calling this).
    pub(crate) unsafe fn launch<'a>(
        &'a self,
        kernel: Kernel,
        config: LaunchConfig,
        shape: impl FnOnce() -> String,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_as(StorageKind::Bf16, kernel, config, shape, push) }
    }

    /// [`CudaEngine::launch`] of the build of `kernel` for `storage`.
    ///
    /// # Safety
    ///
    /// As for [`CudaEngine::launch`], with `bf16_t` meaning the storage type.
    pub(crate) unsafe fn launch_as<'a>(
        &'a self,
        storage: StorageKind,
        kernel: Kernel,
        config: LaunchConfig,
        shape: impl FnOnce() -> String,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_with(LaunchMode::Plain, storage, kernel, config, shape, push) }
    }

    /// [`CudaEngine::launch_as`], started as `mode` says: [`LaunchMode::Cooperative`] has the
    /// driver start it only if every block can be resident at once, which a kernel whose blocks
    /// wait for each other relies on.
    ///
    /// # Safety
    ///
    /// As for [`CudaEngine::launch_as`].
    pub(crate) unsafe fn launch_with<'a>(
        &'a self,
        mode: LaunchMode,
        storage: StorageKind,
        kernel: Kernel,
        config: LaunchConfig,
        shape: impl FnOnce() -> String,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<()> {
        let function = self.function(storage, kernel)?;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            launch::launch(
                &self.stream,
                function,
                kernel.name(),
                mode,
                config,
                shape,
                push,
            )
        }
    }

    /// The build of `kernel` for `storage`.
    fn function(&self, storage: StorageKind, kernel: Kernel) -> Result<&CudaFunction> {
        match storage {
            StorageKind::Bf16 => Ok(&self.functions[kernel as usize]),
            StorageKind::F32 => self
                .f32_storage
                .get()
                .and_then(|table| table[kernel as usize].as_ref())
                .ok_or_else(|| CudaEngineError::Shape {
                    op: kernel.name(),
                    detail: "no f32-storage build of this kernel (call \
                             CudaEngine::load_f32_storage first; feature kernels and the fused \
                             attention have none)"
                        .into(),
                }),
        }
    }
}

fn no_device_or(source: DriverError, ordinal: usize) -> CudaEngineError {
    match source.0 {
        cudaError_enum::CUDA_ERROR_NO_DEVICE
        | cudaError_enum::CUDA_ERROR_INVALID_DEVICE
        | cudaError_enum::CUDA_ERROR_NOT_INITIALIZED => CudaEngineError::NoDevice {
            reason: format!("GPU {ordinal}: {source}"),
        },
        _ => CudaEngineError::Driver {
            context: format!("opening GPU {ordinal}"),
            source,
        },
    }
}

/// What the kernel modules are compiled for: the device's compute capability, as PTX or cubins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelTarget {
    code: KernelCode,
    compute_capability: (i32, i32),
}

/// Compiles every module (for f32 storage: every module with a storage variant) for `target`
/// and resolves its kernel symbols once. Indexed by `Kernel as usize`.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    target: KernelTarget,
    storage: StorageKind,
) -> Result<Vec<Option<CudaFunction>>> {
    let mut modules = Vec::with_capacity(KernelModule::ALL.len());
    for (module, code) in compile_modules(storage, target)? {
        let loaded = ctx.load_module(code.into_loadable()).context(|| {
            format!(
                "loading kernel module {} ({:?})",
                module.name(),
                target.code
            )
        })?;
        modules.push((module, loaded));
    }
    Kernel::ALL
        .iter()
        .map(|kernel| {
            let Some((_, loaded)) = modules
                .iter()
                .find(|(module, _)| *module == kernel.module())
            else {
                return Ok(None);
            };
            loaded
                .load_function(kernel.name())
                .map(Some)
                .context(|| format!("resolving kernel {}", kernel.name()))
        })
        .collect()
}

/// The modules built for `storage`, compiled at once on a thread each, in `KernelModule::ALL`
/// order. NVRTC compiles independent programs concurrently; the decoder module alone is about
/// 40 % of the sequential time, which bounds this one (part of every worker's start).
fn compile_modules(
    storage: StorageKind,
    target: KernelTarget,
) -> Result<Vec<(KernelModule, CompiledModule)>> {
    let modules = modules_for(storage);
    std::thread::scope(|scope| {
        let compiling: Vec<_> = modules
            .iter()
            .map(|&module| scope.spawn(move || compile_module(module, storage, target)))
            .collect();
        modules
            .iter()
            .zip(compiling)
            .map(|(&module, thread)| {
                let code = thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                Ok((module, code))
            })
            .collect()
    })
}

/// The modules built for `storage`: all for bf16, those with a storage variant for f32.
fn modules_for(storage: StorageKind) -> Vec<KernelModule> {
    KernelModule::ALL
        .into_iter()
        .filter(|module| storage == StorageKind::Bf16 || module.has_storage_variant())
        .collect()
}

/// NVRTC's PTX or cubin of one module for one storage type.
fn compile_module(
    module: KernelModule,
    storage: StorageKind,
    target: KernelTarget,
) -> Result<CompiledModule> {
    let options = vec![
        // Exact division and square roots: these kernels are parity references first.
        "--prec-sqrt=true".to_owned(),
        "--prec-div=true".to_owned(),
        "--fmad=true".to_owned(),
        nvrtc::arch_option(target.code, target.compute_capability),
        "--std=c++17".to_owned(),
    ];
    nvrtc::compile(
        module.source_for(storage),
        &format!("{}.cu", module.name()),
        &options,
        target.code,
    )
    .map_err(|log| CudaEngineError::Compile {
        module: module.name(),
        options,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<CudaEngine>();
    }

    /// NVRTC needs no GPU: where its library is found (e.g. `LD_LIBRARY_PATH` naming a CUDA
    /// toolkit or the `nvidia-cuda-nvrtc` wheel), every module must compile for both storage
    /// types, to PTX and to a cubin, so a kernel typo fails here and not first on the GPU
    /// machine. The concurrent build the engine uses must give every module the same code as a
    /// build of it alone.
    #[test]
    fn every_module_compiles_for_both_storages_and_forms_where_nvrtc_is_present() {
        if !context::nvrtc_present() {
            assert!(
                std::env::var("REQUIRE_NVRTC").as_deref() != Ok("1"),
                "REQUIRE_NVRTC=1 but libnvrtc is not on the loader path"
            );
            eprintln!("SKIPPED: libnvrtc not found on the loader path (REQUIRE_NVRTC=1 fails)");
            return;
        }
        eprintln!("NVRTC {}", nvrtc::nvrtc_version().expect("NVRTC version"));
        for code in [KernelCode::Ptx, KernelCode::Cubin] {
            let target = KernelTarget {
                code,
                compute_capability: (9, 0),
            };
            for storage in [StorageKind::Bf16, StorageKind::F32] {
                let label = format!("{storage:?} storage, {code:?}");
                let compiled = compile_modules(storage, target)
                    .unwrap_or_else(|error| panic!("{label}: {error}"));
                let modules: Vec<KernelModule> =
                    compiled.iter().map(|(module, _)| *module).collect();
                assert_eq!(modules, modules_for(storage), "{label}: modules");
                for (module, compiled) in &compiled {
                    match (code, compiled) {
                        (KernelCode::Ptx, CompiledModule::Ptx(text)) => assert!(
                            text.contains(".target sm_90"),
                            "{} ({label}): PTX for another target",
                            module.name()
                        ),
                        // Every cubin is an ELF image.
                        (KernelCode::Cubin, CompiledModule::Cubin(bytes)) => assert!(
                            bytes.starts_with(b"\x7fELF"),
                            "{} ({label}): not an ELF cubin",
                            module.name()
                        ),
                        _ => panic!("{} ({label}): compiled to the other form", module.name()),
                    }
                    let alone = compile_module(*module, storage, target)
                        .unwrap_or_else(|error| panic!("{} ({label}): {error}", module.name()));
                    assert!(
                        *compiled == alone,
                        "{} ({label}): concurrent and single builds differ",
                        module.name()
                    );
                }
            }
        }
    }

    #[test]
    fn library_check_never_panics() {
        // On a machine without CUDA this is the NoDevice path that CI relies on.
        match check_cuda_libraries() {
            Ok(()) | Err(CudaEngineError::NoDevice { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}
