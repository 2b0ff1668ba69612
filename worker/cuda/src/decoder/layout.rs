//! The decoding kernel's fixed shapes (`kernels/decoder.cu`): its block, the fields of its
//! row-state and bookkeeping buffers, and the layout of its dynamic shared memory.

use model_core::config::DecoderConfig;

use crate::storage::StorageKind;

/// The most tokens per encoder frame (80 ms) of an utterance that gets scores: 25 a second,
/// beyond any speech (Parakeet emits a few subword tokens a second). The decoder keeps this many
/// prediction outputs per frame of its workspace; a row with more tokens (a degenerate model)
/// goes unscored. The rule depends on the row alone, so a row's scores never depend on its
/// batch.
pub const SCORED_TOKENS_PER_FRAME: usize = 2;

/// Fields per row of the row-state buffer (`RS_FIELDS` in `decoder.cu`).
pub(crate) const RS_FIELDS: usize = 8;
pub(crate) const RS_TOKENS: usize = 6;
pub(crate) const RS_TIME: usize = 1;
pub(crate) const RS_FRAMES: usize = 0;
/// Fields of the loop bookkeeping buffer (`DS_FIELDS` in `decoder.cu`).
pub(crate) const DS_FIELDS: usize = 3;
pub(crate) const DS_STEPS: usize = 0;

/// Warps per block, batch rows per staged chunk of `tdt_decode` (`DEC_WARPS`, `ROW_CHUNK` in
/// `decoder.cu`), and 64-bit choice keys per block and row (the best label and duration).
const WARPS_PER_BLOCK: usize = 12;
const ROW_CHUNK: usize = 16;
pub(crate) const KEYS_PER_BLOCK_ROW: usize = 2;
/// The bf16 build's padding of a row in shared memory (`ROW_PAD`, elements) and the weight
/// rows one pass of its tensor-core products covers (`MMA_TILES` tiles of 8).
const BF16_ROW_PAD: usize = 8;
const MMA_PASS_ROWS: usize = 8 * 8;
pub(crate) const DECODE_THREADS: u32 = (WARPS_PER_BLOCK * 32) as u32;

/// The decoder's sizes that shape `tdt_decode`'s shared memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecoderDims {
    pub(crate) hidden: usize,
    pub(crate) joint_hidden: usize,
    pub(crate) n_out: usize,
    pub(crate) layers: usize,
    /// Rows of layer 0's per-label table: the vocabulary and blank.
    pub(crate) labels: usize,
}

impl DecoderDims {
    pub(crate) fn of(cfg: &DecoderConfig) -> Self {
        Self {
            hidden: cfg.pred_hidden,
            joint_hidden: cfg.joint_hidden,
            // Labels, blank, then one output per duration.
            n_out: cfg.vocab_size + 1 + cfg.durations.len(),
            layers: cfg.pred_rnn_layers,
            labels: cfg.vocab_size + 1,
        }
    }
}

/// `tdt_decode`'s dynamic shared memory for a build, row count and grid (the `shared_*`
/// fields of its parameters): the staged rows, the block's weight rows (all of them, resident
/// for the launch, or two streaming buffers of `piece_rows` rows), the products, the row state,
/// the block's biases, and in the bf16 build the warps' partial products; then, where the
/// weights are resident and there is room, the block's slice of layer 0's per-label table and
/// its units' cell state and recurrent products (else the kernel reads them from global memory:
/// the same values, so a row's result does not depend on where they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeLayout {
    /// 0: every weight row the block owns stays in shared memory for the launch.
    pub(crate) piece_rows: usize,
    /// Offsets in bytes from the start of the dynamic shared memory.
    pub(crate) weights_at: usize,
    pub(crate) products_at: usize,
    pub(crate) row_state_at: usize,
    pub(crate) biases_at: usize,
    pub(crate) warp_sums_at: usize,
    pub(crate) x_table_at: Option<usize>,
    pub(crate) cells_at: Option<usize>,
    pub(crate) bytes: usize,
}

impl DecodeLayout {
    /// The resident layout where it fits in `max_bytes` (unless `piece_rows` asks to stream),
    /// else two streaming buffers of `piece_rows` rows (default: as many as fit). `None`: not
    /// even one row per buffer fits.
    pub(crate) fn new(
        dims: DecoderDims,
        storage: StorageKind,
        rows: usize,
        grid: usize,
        max_bytes: usize,
        piece_rows: Option<usize>,
    ) -> Option<Self> {
        // Block 0 owns the most: ceil(n / grid) of every kind (`Owned` in decoder.cu).
        let grid = grid.max(1);
        let units = dims.hidden.div_ceil(grid);
        let pred = dims.joint_hidden.div_ceil(grid);
        let joint = dims.n_out.div_ceil(grid);
        let lstm_rows = if dims.layers > 1 { 8 * units } else { 0 };
        let product_rows = lstm_rows.max(pred + 4 * units).max(joint);
        let biases = (dims.layers - 1) * 4 * units + pred + joint;
        // Element bytes and padding of a row in shared memory, staged rows, bytes of the warps'
        // partial products.
        let (elem_bytes, row_pad, stage_rows, warp_sums) = match storage {
            // The micro-tiles read rows 0..1, 0..4 or 0..16 of the stage.
            StorageKind::F32 => {
                let stage_rows = match rows {
                    0..=1 => 1,
                    2..=4 => 4,
                    _ => ROW_CHUNK,
                };
                (4, 0, stage_rows, 0)
            }
            // The mma tiles read all 16 rows; every warp keeps a pass's sums.
            StorageKind::Bf16 => (
                2,
                BF16_ROW_PAD,
                ROW_CHUNK,
                WARPS_PER_BLOCK * MMA_PASS_ROWS * ROW_CHUNK * 4,
            ),
        };
        // Bytes of one row of k values in shared memory (a multiple of 16).
        let row_bytes = |k: usize| (k + row_pad) * elem_bytes;
        let width = row_bytes(dims.hidden.max(dims.joint_hidden));
        let weights_at = stage_rows * width;
        let place = |piece_rows: usize, weight_bytes: usize| {
            let products_at = weights_at + weight_bytes;
            let row_state_at = products_at + product_rows * ROW_CHUNK * 4;
            let biases_at = row_state_at + rows * RS_FIELDS * 4;
            let warp_sums_at = (biases_at + biases * 4).next_multiple_of(16);
            Self {
                piece_rows,
                weights_at,
                products_at,
                row_state_at,
                biases_at,
                warp_sums_at,
                x_table_at: None,
                cells_at: None,
                bytes: warp_sums_at + warp_sums,
            }
        };
        let layout = |piece_rows: usize, weight_bytes: usize| {
            Some(place(piece_rows, weight_bytes)).filter(|l| l.bytes <= max_bytes)
        };
        let resident_bytes = (dims.layers - 1) * 8 * units * row_bytes(dims.hidden)
            + (pred + 4 * units) * row_bytes(dims.hidden)
            + joint * row_bytes(dims.joint_hidden);
        if piece_rows.is_none() {
            if let Some(mut resident) = layout(0, resident_bytes) {
                // The table slice first (its misses are on every predicting step's path), then
                // the cells: c and four recurrent products per layer, row and unit.
                let table = dims.labels * units * 4 * elem_bytes;
                resident.x_table_at = append(&mut resident.bytes, table, max_bytes);
                let cells = dims.layers * rows * units * 5 * 4;
                resident.cells_at = append(&mut resident.bytes, cells, max_bytes);
                return Some(resident);
            }
        }
        // Everything but the weight rows (whose bytes keep the alignment of what follows them).
        let fixed = place(0, 0).bytes;
        let piece = piece_rows
            .unwrap_or(max_bytes.saturating_sub(fixed) / (2 * width))
            .min(product_rows);
        if piece == 0 {
            return None;
        }
        layout(piece, 2 * piece * width)
    }
}

/// Where `extra` bytes go after `bytes` (16-byte aligned) if they fit in `max_bytes`.
fn append(bytes: &mut usize, extra: usize, max_bytes: usize) -> Option<usize> {
    let at = bytes.next_multiple_of(16);
    (at + extra <= max_bytes).then(|| {
        *bytes = at + extra;
        at
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parakeet TDT 0.6B v2's decoder: 2-layer LSTM 640, joint 640, 1024 tokens + blank + 5
    /// durations.
    const PARAKEET: DecoderDims = DecoderDims {
        hidden: 640,
        joint_hidden: 640,
        n_out: 1030,
        layers: 2,
        labels: 1025,
    };
    /// The opt-in shared memory per block of an H100/H200 (227 KiB), less tdt_decode's static
    /// 144 bytes (the step's row masks and two flags).
    const HOPPER_BYTES: usize = 232_448 - 144;

    #[test]
    fn parakeet_weights_stay_resident_on_a_whole_hopper_gpu() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::F32, 16, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert_eq!(layout.piece_rows, 0);
        // Stage 16 x 640, weights (40 + 25 + 8) rows x 640, products 40 x 16, row state,
        // biases 4 x 5 + 5 + 8; f32, no padding, no warp sums.
        assert_eq!(layout.weights_at, 16 * 640 * 4);
        assert_eq!(layout.products_at, layout.weights_at + 73 * 640 * 4);
        assert_eq!(layout.row_state_at, layout.products_at + 40 * 16 * 4);
        assert_eq!(layout.biases_at, layout.row_state_at + 16 * RS_FIELDS * 4);
        assert_eq!(layout.warp_sums_at, layout.biases_at + 33 * 4 + 12);
        assert_eq!(layout.bytes, layout.warp_sums_at);
        assert!(layout.bytes <= HOPPER_BYTES);
        // No room for the f32 table slice (82 KB) or the cells: both stay in global memory.
        assert_eq!((layout.x_table_at, layout.cells_at), (None, None));
    }

    #[test]
    fn the_bf16_build_pads_its_rows_and_keeps_the_warp_sums() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 1, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert_eq!(layout.piece_rows, 0);
        // Rows of 640 bf16 + 8 of padding; the stage always holds 16 rows.
        let row = 648 * 2;
        assert_eq!(layout.weights_at, 16 * row);
        assert_eq!(layout.products_at, layout.weights_at + 73 * row);
        assert_eq!(layout.warp_sums_at % 16, 0);
        let sums_end = layout.warp_sums_at + 12 * 64 * 16 * 4;
        // Then the table slice (1025 labels x 5 units x 4 gates of bf16) and the cells (2
        // layers x 1 row x 5 units x 5 floats), each 16-byte aligned.
        assert_eq!(layout.x_table_at, Some(sums_end));
        let cells_at = (sums_end + 1025 * 5 * 4 * 2).next_multiple_of(16);
        assert_eq!(layout.cells_at, Some(cells_at));
        assert_eq!(layout.bytes, cells_at + 2 * 5 * 5 * 4);
        assert!(layout.bytes <= HOPPER_BYTES);
        // 64 rows still fit both; with a little less room the cells stay in global memory.
        let rows64 = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 64, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert!(rows64.x_table_at.is_some() && rows64.cells_at.is_some());
        let tight = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 64, 132, rows64.bytes - 1, None)
            .expect("fits");
        assert_eq!(tight.x_table_at, rows64.x_table_at);
        assert_eq!(tight.cells_at, None);
        assert_eq!(
            Some(tight.bytes),
            tight.x_table_at.map(|at| at + 1025 * 5 * 4 * 2)
        );
        let streamed = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 16, 33, HOPPER_BYTES, None)
            .expect("fits");
        assert!(streamed.piece_rows > 0 && streamed.piece_rows <= 160);
        assert_eq!((streamed.x_table_at, streamed.cells_at), (None, None));
        assert_eq!(
            streamed.products_at,
            streamed.weights_at + 2 * streamed.piece_rows * row
        );
        assert!(streamed.bytes <= HOPPER_BYTES);
    }

    #[test]
    fn a_quarter_of_the_gpu_streams_the_weights_in_two_buffers() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::F32, 16, 33, HOPPER_BYTES, None)
            .expect("fits");
        // 20 units, 20 joint.pred outputs, 32 joint outputs per block: 160 LSTM rows at most.
        assert!(layout.piece_rows > 0 && layout.piece_rows <= 160);
        assert_eq!(
            layout.products_at,
            layout.weights_at + 2 * layout.piece_rows * 640 * 4
        );
        assert!(layout.bytes <= HOPPER_BYTES);
        let more = DecodeLayout::new(
            PARAKEET,
            StorageKind::F32,
            16,
            33,
            HOPPER_BYTES + 2 * 640 * 4,
            None,
        )
        .expect("fits");
        assert_eq!(
            more.piece_rows,
            layout.piece_rows + 1,
            "as many rows as fit"
        );
    }

    #[test]
    fn streaming_can_be_forced_and_an_impossible_fit_is_none() {
        let f32_layout = |rows, bytes, piece| {
            DecodeLayout::new(PARAKEET, StorageKind::F32, rows, 132, bytes, piece)
        };
        let forced = f32_layout(16, HOPPER_BYTES, Some(7)).expect("fits");
        assert_eq!(forced.piece_rows, 7);
        // One row per buffer is the least; the stage alone needs 16 x 640 floats.
        assert!(f32_layout(16, 16 * 640 * 4, None).is_none());
        // Small row counts stage 1 or 4 rows.
        let one = f32_layout(1, HOPPER_BYTES, None).expect("fits");
        assert_eq!(one.weights_at, 640 * 4);
        let three = f32_layout(3, HOPPER_BYTES, None).expect("fits");
        assert_eq!(three.weights_at, 4 * 640 * 4);
    }
}
