// Row softmax of attention scores with a length mask, one block per row.
//
// scores: [batch, heads, tq, row_stride] f32 (row_stride >= tk); lengths: [batch] valid frames
// per utterance. probs: same layout, bf16. Key columns c >= len and every column of query rows
// q >= len are 0, as NeMo zeroes masked attention weights after its softmax. `scale` multiplies
// the scores first. Columns tk ..< row_stride are neither read nor written.

extern "C" __global__ void masked_softmax_f32_bf16(const float* scores, const int* lengths,
                                                   float scale, int heads, int tq, int tk,
                                                   int row_stride, bf16_t* probs) {
    const long long row = blockIdx.x;
    const int q = (int)(row % tq);
    const int b = (int)(row / ((long long)heads * tq));
    const int valid = min(max(lengths[b], 0), tk);
    const float* s = scores + row * row_stride;
    bf16_t* p = probs + row * row_stride;

    if (q >= valid) {
        for (int c = threadIdx.x; c < tk; c += blockDim.x) p[c] = 0;
        return;
    }

    float m = -F32_INFINITY;
    for (int c = threadIdx.x; c < valid; c += blockDim.x) m = fmaxf(m, s[c] * scale);
    m = block_max(m);

    float sum = 0.0f;
    for (int c = threadIdx.x; c < valid; c += blockDim.x) sum += expf(s[c] * scale - m);
    const float inv_sum = 1.0f / block_sum(sum);

    for (int c = threadIdx.x; c < tk; c += blockDim.x) {
        p[c] = c < valid ? f32_to_bf16(expf(s[c] * scale - m) * inv_sum) : (bf16_t)0;
    }
}
