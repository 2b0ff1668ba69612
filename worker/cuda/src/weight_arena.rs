//! The encoder's matmul weights in one shareable allocation per GPU ([`SharedDeviceMemory`]), so
//! the workers on a GPU hold one copy between them instead of one each (1.2 GB in bf16 for
//! Parakeet TDT 0.6B).
//!
//! Every worker loads its weights privately first, as without sharing. The first on a GPU then
//! copies them into a new arena ([`move_into_arena`]); the others compare the arena byte for
//! byte with their own copy before they switch to it ([`adopt_arena`]), so a worker never
//! computes with weights it did not load itself. Either way the private copies are freed.

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::CudaSlice;

use crate::device::CudaEngine;
use crate::driver::memory;
use crate::error::{DriverContext, Result};
use crate::shared_memory::SharedDeviceMemory;
use crate::storage::Storage;

/// Arena offsets are multiples of this (cuBLASLt and the 16-byte kernels need far less).
const ALIGN_BYTES: usize = 256;

/// Bytes compared per weight per step when adopting an arena (bounds the host copies).
const COMPARE_CHUNK_BYTES: usize = 16 << 20;

/// A matmul weight on the device: its own allocation, or a range of a shared arena.
pub(crate) struct WeightBuffer<S> {
    /// A view of memory this value does not free through cudarc (see [`Backing`]).
    slice: ManuallyDrop<CudaSlice<S>>,
    backing: Backing,
}

/// Who owns a weight's memory.
enum Backing {
    /// A `cuMemAlloc` allocation of this weight alone, outside the stream-ordered pool: the small
    /// buffers allocated between the weights would pin the pool's chunks, so the memory of
    /// weights moved into an arena would never go back to the device.
    Own,
    /// A range of this arena (held so that it lives as long as the view).
    Arena { _arena: Arc<SharedDeviceMemory> },
}

impl<S: Storage> WeightBuffer<S> {
    /// Copies `host` into a new allocation of its own.
    pub(crate) fn upload(engine: &CudaEngine, host: &[S]) -> Result<Self> {
        let bytes = std::mem::size_of_val(host).max(1);
        engine
            .context()
            .bind_to_thread()
            .context(|| "binding the context to allocate a weight".into())?;
        // Owned by the returned value from here on; Drop releases it as `Backing::Own`.
        let mut slice = memory::alloc_own::<S>(engine.stream(), host.len())
            .context(|| format!("allocating {bytes} bytes for a weight"))?;
        let weight_bytes = std::mem::size_of_val(host);
        let copied = engine
            .stream()
            .memcpy_htod(host, &mut *slice)
            .context(|| format!("uploading {weight_bytes} weight bytes"));
        let weight = Self {
            slice,
            backing: Backing::Own,
        };
        copied?;
        Ok(weight)
    }
}

impl<S> WeightBuffer<S> {
    fn bytes(&self) -> usize {
        self.slice.len() * std::mem::size_of::<S>()
    }

    /// Points this weight at `offset` bytes into `arena` (same length); its own allocation, if
    /// any, is freed.
    ///
    /// # Safety
    /// `offset .. offset + self.bytes()` must lie inside `arena` and hold this weight's values.
    unsafe fn point_into(
        &mut self,
        engine: &CudaEngine,
        arena: &Arc<SharedDeviceMemory>,
        offset: usize,
    ) {
        // SAFETY: the caller guarantees the range is inside the mapped arena, which `self`
        // keeps alive (the backing) for as long as the view exists; the view is released, never
        // freed, since the arena's memory is not a cuMemAlloc allocation.
        let view = unsafe {
            memory::view::<S>(
                engine.stream(),
                arena.device_ptr() + offset as u64,
                self.slice.len(),
            )
        };
        let old = std::mem::replace(&mut self.slice, view);
        let old_backing = std::mem::replace(
            &mut self.backing,
            Backing::Arena {
                _arena: arena.clone(),
            },
        );
        release(old, old_backing);
    }
}

impl<S> Deref for WeightBuffer<S> {
    type Target = CudaSlice<S>;

    fn deref(&self) -> &CudaSlice<S> {
        &self.slice
    }
}

impl<S> Drop for WeightBuffer<S> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used again after this.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let backing = std::mem::replace(&mut self.backing, Backing::Own);
        release(ManuallyDrop::new(slice), backing);
    }
}

/// Frees an own allocation once the work queued on it is done; forgets a view into an arena
/// (the arena frees itself when its last user drops it).
/// Failures are recorded (`driver::drop_errors`): this runs in Drop.
fn release<S>(slice: ManuallyDrop<CudaSlice<S>>, backing: Backing) {
    let slice = ManuallyDrop::into_inner(slice);
    match backing {
        // SAFETY: an own backing's view came from `alloc_own` in `upload`, and nothing else
        // refers to its memory once the weight lets go of it.
        Backing::Own => unsafe { memory::free_own(slice) },
        Backing::Arena { .. } => {
            slice.leak();
        }
    }
}

/// Where each weight goes in an arena: byte offsets in visiting order, and the total size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ArenaLayout {
    pub(crate) offsets: Vec<usize>,
    pub(crate) bytes: usize,
}

impl ArenaLayout {
    pub(crate) fn new(sizes: impl IntoIterator<Item = usize>) -> Self {
        let mut offsets = Vec::new();
        let mut end = 0usize;
        for size in sizes {
            let offset = end.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
            offsets.push(offset);
            end = offset + size;
        }
        Self {
            offsets,
            bytes: end,
        }
    }

    pub(crate) fn of<S>(weights: &[&mut WeightBuffer<S>]) -> Self {
        Self::new(weights.iter().map(|w| w.bytes()))
    }
}

/// Copies `weights` into a new arena laid out by [`ArenaLayout::of`] and points them at it.
pub(crate) fn move_into_arena<S: Storage>(
    engine: &CudaEngine,
    weights: &mut [&mut WeightBuffer<S>],
) -> Result<Arc<SharedDeviceMemory>> {
    let layout = ArenaLayout::of(weights);
    let arena = Arc::new(SharedDeviceMemory::create(engine, layout.bytes)?);
    for (weight, &offset) in weights.iter_mut().zip(&layout.offsets) {
        let mut view = arena_view::<S>(engine, &arena, offset, weight.slice.len());
        let copied = engine
            .stream()
            .memcpy_dtod(&*weight.slice, &mut *view)
            .context(|| format!("copying {} weight bytes into the arena", weight.bytes()));
        ManuallyDrop::into_inner(view).leak();
        copied?;
    }
    engine.synchronize()?;
    for (weight, &offset) in weights.iter_mut().zip(&layout.offsets) {
        // SAFETY: the layout places every weight inside the arena (sized from the same
        // layout), and the copies into those ranges have completed.
        unsafe { weight.point_into(engine, &arena, offset) };
    }
    Ok(arena)
}

/// What [`adopt_arena`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// Every byte equal: the weights now live in the arena.
    Adopted,
    /// The arena is not this model's weights; the private copies are kept.
    Refused(String),
}

/// Points `weights` at `arena` if it holds exactly their bytes at [`ArenaLayout::of`]'s offsets.
pub(crate) fn adopt_arena<S: Storage>(
    engine: &CudaEngine,
    weights: &mut [&mut WeightBuffer<S>],
    arena: &Arc<SharedDeviceMemory>,
) -> Result<Adoption> {
    let layout = ArenaLayout::of(weights);
    if arena.bytes() < layout.bytes {
        return Ok(Adoption::Refused(format!(
            "the arena has {} bytes, these weights need {}",
            arena.bytes(),
            layout.bytes
        )));
    }
    let chunk = (COMPARE_CHUNK_BYTES / std::mem::size_of::<S>()).max(1);
    for (index, (weight, &offset)) in weights.iter().zip(&layout.offsets).enumerate() {
        let view = arena_view::<S>(engine, arena, offset, weight.slice.len());
        let equal = compare_chunks(engine, &weight.slice, &view, chunk);
        ManuallyDrop::into_inner(view).leak();
        if !equal? {
            return Ok(Adoption::Refused(format!(
                "weight {index} (at byte {offset}) differs from this worker's copy"
            )));
        }
    }
    for (weight, &offset) in weights.iter_mut().zip(&layout.offsets) {
        // SAFETY: the range is inside the arena (size checked above) and holds exactly this
        // weight's bytes (compared above).
        unsafe { weight.point_into(engine, arena, offset) };
    }
    Ok(Adoption::Adopted)
}

fn compare_chunks<S: Storage>(
    engine: &CudaEngine,
    ours: &CudaSlice<S>,
    arena: &CudaSlice<S>,
    chunk: usize,
) -> Result<bool> {
    let len = ours.len();
    for start in (0..len).step_by(chunk) {
        let end = (start + chunk).min(len);
        let a = engine.download(&ours.slice(start..end))?;
        let b = engine.download(&arena.slice(start..end))?;
        if bytemuck::cast_slice::<S, u8>(&a) != bytemuck::cast_slice::<S, u8>(&b) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A temporary typed view of `len` elements at `offset` bytes into the arena. The caller must
/// `leak` it (never drop it: the memory is the arena's).
fn arena_view<S>(
    engine: &CudaEngine,
    arena: &SharedDeviceMemory,
    offset: usize,
    len: usize,
) -> ManuallyDrop<CudaSlice<S>> {
    // SAFETY: callers pass offsets of an `ArenaLayout` whose total fits in `arena`, so the
    // range is mapped; the view is leaked, never freed, and does not outlive the call.
    unsafe { memory::view::<S>(engine.stream(), arena.device_ptr() + offset as u64, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_weight_and_sums_the_sizes() {
        let layout = ArenaLayout::new([1000, 256, 3, 512]);
        assert_eq!(layout.offsets, vec![0, 1024, 1280, 1536]);
        assert_eq!(layout.bytes, 2048);
        assert!(layout.offsets.iter().all(|o| o % ALIGN_BYTES == 0));
        assert_eq!(ArenaLayout::new([]).bytes, 0);
    }
}
