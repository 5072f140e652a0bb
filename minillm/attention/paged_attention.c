/* Paged attention on the CPU, reading K/V blocks in place (no gather).
 *
 * The torch reference backend first copies every sequence's blocks into a padded
 * [B, L] tensor, then attends. At decode that copy costs more than the attention
 * itself: each step reads a few KB per token and writes it all again. This kernel
 * walks each query's block table instead, like the GPU kernels of vLLM do:
 *
 *   for each query token i and KV head kv (in parallel), with its G = H / Hkv query heads:
 *       for each key position t <= position[i], block by block of its block table:
 *           slot = block_table[t / block_size] * block_size + t % block_size
 *           score[g][t] = q[i][kv*G + g] . k_cache[slot][kv] * scale     (every g: one read of k)
 *       softmax over t, for each g
 *       out[i][kv*G + g] = sum_t p[g][t] * v_cache[slot][kv]
 *
 * Layouts (contiguous): q and out [N, H, D] float32; caches [blocks, block_size, Hkv, D], float32
 * (`paged_attention`) or bfloat16 (`paged_attention_bf16`: each block's rows are widened to
 * float32 as they are read, the sums are float32); block_tables [N, max_blocks]: query i reads
 * row i (one query per sequence at decode); positions[i] is its position in that sequence.
 * Built and loaded by cpu_paged.py; any C99 compiler, OpenMP optional.
 *
 * Why it is shaped this way (a batch of decodes reads every cached token once a step, so this is
 * a memory-bound loop). A/B by a throwaway harness (both .so files called with ctypes, not kept),
 * on the 2-core Xeon, 2 threads, 30 layers' caches so they come from
 * DRAM as in a real step: 32 sequences of 256 tokens, SmolLM2's 9 heads over 3 KV heads, 1.94 ->
 * 1.05 ms a call (6.5 -> 12 GB/s); Llama-3.2-1B's 32 over 8 heads, 16 sequences of 512, 5.7 -> 2.9
 * ms. In the engine (`python -m minillm.bench.step_profile --batch 32 --context 256`): 54 -> 34 ms
 * of a 120 -> 102 ms float32 step.
 *   - the next block's rows are prefetched while this one is read: blocks sit anywhere in the
 *     pool, so the hardware prefetcher loses the stream at every block edge (most of the gain);
 *   - keys go four at a time, four independent sums, so no dot waits on the one before;
 *   - the G query heads that share a KV head are one work item: each K and V row is read once
 *     for all of them.
 * A head's sums do not depend on the batch, the threads or the other heads: a row's result is
 * the same alone or in any batch.
 * Tried and not kept (same A/B): a vectorizable exp instead of expf (8 % slower), the next block's
 * rows asked for a few at a time instead of all at once (5-10 % slower: perf puts the stall on the
 * prefetches because the memory system is what is busy), a whole query per work item so each block
 * is read front to back (8-12 % faster in a batch, but a second way to split the work).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One block's rows for this KV head as float32: in place for a float32 cache (`*stride` = a
 * slot's floats), widened into `buf` for a bfloat16 one (`*stride` = D). */
static const float *block_rows(const void *cache, int bf16, int64_t block, int block_size, int64_t row,
                               int kv, int D, int n, float *buf, int64_t *stride) {
    const int64_t first = block * block_size * row + (int64_t)kv * D;
    if (!bf16) { *stride = row; return (const float *)cache + first; }
    const uint16_t *src = (const uint16_t *)cache + first;
    for (int o = 0; o < n; o++)
        for (int d = 0; d < D; d++) {                     /* bfloat16 = the top half of a float32 */
            const uint32_t bits = (uint32_t)src[o * row + d] << 16;
            memcpy(buf + o * D + d, &bits, sizeof bits);
        }
    *stride = D;
    return buf;
}

/* Ask for a block's rows (this KV head's D values in each) before they are needed. */
static void prefetch_block(const void *cache, int elem_bytes, int64_t block, int block_size, int64_t row,
                           int kv, int D) {
    const char *first = (const char *)cache + (block * block_size * row + (int64_t)kv * D) * elem_bytes;
    for (int o = 0; o < block_size; o++)
        for (int b = 0; b < D * elem_bytes; b += 64) __builtin_prefetch(first + o * row * elem_bytes + b, 0, 3);
}

/* score[g * L + t0 + o] = q_g . k_o * scale for the n keys of one block (stride: floats between keys). */
static void block_scores(const float *qg, int G, int D, const float *k, int64_t stride, int n, float scale,
                         float *score, int L, int t0) {
    int o = 0;
    for (; o + 4 <= n; o += 4) {
        const float *k0 = k + o * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        for (int g = 0; g < G; g++) {
            const float *qh = qg + g * D;
            float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+:s0, s1, s2, s3)
            for (int d = 0; d < D; d++) {
                s0 += qh[d] * k0[d]; s1 += qh[d] * k1[d]; s2 += qh[d] * k2[d]; s3 += qh[d] * k3[d];
            }
            float *s = score + g * L + t0 + o;
            s[0] = s0 * scale; s[1] = s1 * scale; s[2] = s2 * scale; s[3] = s3 * scale;
        }
    }
    for (; o < n; o++) {                                  /* the last keys of a block, one by one */
        const float *k0 = k + o * stride;
        for (int g = 0; g < G; g++) {
            const float *qh = qg + g * D;
            float s0 = 0.f;
#pragma omp simd reduction(+:s0)
            for (int d = 0; d < D; d++) s0 += qh[d] * k0[d];
            score[g * L + t0 + o] = s0 * scale;
        }
    }
}

/* acc_g += sum_o p_g[t0 + o] * v_o over the n values of one block. */
static void block_values(const float *p, int G, int D, const float *v, int64_t stride, int n, int L, int t0,
                         float *acc) {
    int o = 0;
    for (; o + 4 <= n; o += 4) {
        const float *v0 = v + o * stride, *v1 = v0 + stride, *v2 = v1 + stride, *v3 = v2 + stride;
        for (int g = 0; g < G; g++) {
            const float *pg = p + g * L + t0 + o, p0 = pg[0], p1 = pg[1], p2 = pg[2], p3 = pg[3];
            float *a = acc + g * D;
#pragma omp simd
            for (int d = 0; d < D; d++) a[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
        }
    }
    for (; o < n; o++) {
        const float *v0 = v + o * stride;
        for (int g = 0; g < G; g++) {
            const float p0 = p[g * L + t0 + o];
            float *a = acc + g * D;
#pragma omp simd
            for (int d = 0; d < D; d++) a[d] += p0 * v0[d];
        }
    }
}

static void softmax(float *s, int L) {
    float top = -INFINITY, sum = 0.f;
    for (int t = 0; t < L; t++) top = s[t] > top ? s[t] : top;
    for (int t = 0; t < L; t++) { s[t] = expf(s[t] - top); sum += s[t]; }
    for (int t = 0; t < L; t++) s[t] /= sum;
}

static int paged_attention_any(const float *q, const void *k_cache, const void *v_cache, int bf16,
                               const int64_t *block_tables, const int64_t *positions, int num_tokens,
                               int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks,
                               float scale, int num_threads, float *out) {
    const int G = num_heads / num_kv_heads, D = head_dim, H = num_heads, elem = bf16 ? 2 : 4;
    const int64_t row = (int64_t)num_kv_heads * head_dim;     /* values per slot */
    int failed = 0;
    /* One work item per (query, KV head): a batch gives many; at batch 1 the KV heads are what
     * the threads share. */
#pragma omp parallel for schedule(dynamic) num_threads(num_threads)
    for (int64_t item = 0; item < (int64_t)num_tokens * num_kv_heads; item++) {
        const int i = (int)(item / num_kv_heads), kv = (int)(item % num_kv_heads);
        const int L = (int)positions[i] + 1;                    /* keys 0 .. position */
        const int num_blocks = (L + block_size - 1) / block_size;
        float *score = malloc(sizeof(float) * (size_t)L * G);
        float *acc = calloc((size_t)G * D, sizeof(float));
        float *buf = bf16 ? malloc(sizeof(float) * (size_t)block_size * D) : NULL;
        if (!score || !acc || (bf16 && !buf)) { free(score); free(acc); free(buf); failed = 1; continue; }
        const float *qg = q + ((int64_t)i * H + (int64_t)kv * G) * D;
        const int64_t *table = block_tables + (int64_t)i * max_blocks;
        int64_t stride;
        for (int j = 0; j < num_blocks; j++) {                  /* scores: q . k, block by block */
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            if (j + 1 < num_blocks) prefetch_block(k_cache, elem, table[j + 1], block_size, row, kv, D);
            const float *k = block_rows(k_cache, bf16, table[j], block_size, row, kv, D, n, buf, &stride);
            block_scores(qg, G, D, k, stride, n, scale, score, L, j * block_size);
        }
        for (int g = 0; g < G; g++) softmax(score + g * L, L);
        for (int j = 0; j < num_blocks; j++) {                  /* out = sum p v */
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            if (j + 1 < num_blocks) prefetch_block(v_cache, elem, table[j + 1], block_size, row, kv, D);
            const float *v = block_rows(v_cache, bf16, table[j], block_size, row, kv, D, n, buf, &stride);
            block_values(score, G, D, v, stride, n, L, j * block_size, acc);
        }
        memcpy(out + ((int64_t)i * H + (int64_t)kv * G) * D, acc, sizeof(float) * (size_t)G * D);
        free(score);
        free(acc);
        free(buf);
    }
    return failed;
}

int paged_attention(const float *q, const float *k_cache, const float *v_cache,
                    const int64_t *block_tables, const int64_t *positions,
                    int num_tokens, int num_heads, int num_kv_heads, int head_dim, int block_size,
                    int max_blocks, float scale, int num_threads, float *out) {
    return paged_attention_any(q, k_cache, v_cache, 0, block_tables, positions, num_tokens, num_heads,
                               num_kv_heads, head_dim, block_size, max_blocks, scale, num_threads, out);
}

int paged_attention_bf16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                         const int64_t *block_tables, const int64_t *positions,
                         int num_tokens, int num_heads, int num_kv_heads, int head_dim, int block_size,
                         int max_blocks, float scale, int num_threads, float *out) {
    return paged_attention_any(q, k_cache, v_cache, 1, block_tables, positions, num_tokens, num_heads,
                               num_kv_heads, head_dim, block_size, max_blocks, scale, num_threads, out);
}
