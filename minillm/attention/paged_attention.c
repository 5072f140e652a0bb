/* Paged attention on the CPU, reading K/V blocks in place (no gather).
 *
 * The torch reference backend first copies every sequence's blocks into a padded
 * [B, L] tensor, then attends. At decode that copy costs more than the attention
 * itself: each step reads a few KB per token and writes it all again. This kernel
 * walks each query's block table instead, like the GPU kernels of vLLM do:
 *
 *   for each query token i and head h (in parallel):
 *       for each key position t <= position[i], block by block of its block table:
 *           slot = block_table[t / block_size] * block_size + t % block_size
 *           score[t] = q[i][h] . k_cache[slot][h / G] * scale      (G = H / Hkv, GQA)
 *       softmax over t
 *       out[i][h] = sum_t p[t] * v_cache[slot][h / G]
 *
 * Layouts (float32, contiguous): q and out [N, H, D]; caches [blocks, block_size, Hkv, D];
 * block_tables [N, max_blocks]: query i reads row i (one query per sequence at decode);
 * positions[i] is its position in that sequence.
 * Built and loaded by cpu_paged.py; any C99 compiler, OpenMP optional.
 *
 * The threads share (query, head) pairs: at batch-1 decode there is one query, and a loop over
 * queries alone ran it on one thread. Same sums per head, so the same bits. Measured on an
 * Intel Xeon, 2 threads, SmolLM2's shape at 128 tokens: 19.6 -> 12.7 us a call, hot
 * (`python -m minillm.quant.speed --per-call`); in a w4a8 batch-1 step, 30 calls, 1.53 -> 0.76 ms
 * (`python -m minillm.bench.step_profile --quantization w4a8`).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int paged_attention(const float *q, const float *k_cache, const float *v_cache,
                    const int64_t *block_tables, const int64_t *positions,
                    int num_tokens, int num_heads, int num_kv_heads, int head_dim, int block_size,
                    int max_blocks, float scale, int num_threads, float *out) {
    const int G = num_heads / num_kv_heads, D = head_dim, H = num_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim;     /* floats per slot */
    int failed = 0;
    /* One work item per (query, head): at batch 1 there is one query, and its heads are what
     * the threads can share (a loop over queries alone left all but one thread idle). */
#pragma omp parallel for schedule(dynamic) num_threads(num_threads)
    for (int64_t item = 0; item < (int64_t)num_tokens * H; item++) {
        const int i = (int)(item / H), h = (int)(item % H), kv = h / G;
        const int L = (int)positions[i] + 1;                    /* keys 0 .. position */
        const int num_blocks = (L + block_size - 1) / block_size;
        float *score = malloc(sizeof(float) * (size_t)L);
        float *acc = calloc((size_t)D, sizeof(float));
        if (!score || !acc) { free(score); free(acc); failed = 1; continue; }
        const float *qh = q + ((int64_t)i * H + h) * D;
        const int64_t *table = block_tables + (int64_t)i * max_blocks;

        for (int j = 0; j < num_blocks; j++) {                  /* scores: q . k, block by block */
            const float *block = k_cache + table[j] * block_size * row + kv * D;
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            for (int o = 0; o < n; o++) {
                const float *k = block + o * row;
                float dot = 0.f;
#pragma omp simd reduction(+:dot)
                for (int d = 0; d < D; d++) dot += qh[d] * k[d];
                score[j * block_size + o] = dot * scale;
            }
        }
        float top = -INFINITY, sum = 0.f;                       /* softmax */
        for (int t = 0; t < L; t++) top = score[t] > top ? score[t] : top;
        for (int t = 0; t < L; t++) { score[t] = expf(score[t] - top); sum += score[t]; }
        for (int t = 0; t < L; t++) score[t] /= sum;
        for (int j = 0; j < num_blocks; j++) {                  /* out = sum p v */
            const float *block = v_cache + table[j] * block_size * row + kv * D;
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            for (int o = 0; o < n; o++) {
                const float p = score[j * block_size + o], *v = block + o * row;
#pragma omp simd
                for (int d = 0; d < D; d++) acc[d] += p * v[d];
            }
        }
        memcpy(out + ((int64_t)i * H + h) * D, acc, sizeof(float) * (size_t)D);
        free(score);
        free(acc);
    }
    return failed;
}
