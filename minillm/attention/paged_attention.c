/* Paged attention on the CPU, reading K/V blocks in place (no gather).
 *
 * The torch reference backend first copies every sequence's blocks into a padded
 * [B, L] tensor, then attends. At decode that copy costs more than the attention
 * itself: each step reads a few KB per token and writes it all again. This kernel
 * walks each query's block table instead, like the GPU kernels of vLLM do:
 *
 *   for each query token i (in parallel):
 *       for each key position t <= position[i], block by block of its block table:
 *           slot = block_table[t / block_size] * block_size + t % block_size
 *           score[h][t] = q[i][h] . k_cache[slot][h / G] * scale      (G = H / Hkv, GQA)
 *       softmax over t, per head
 *       out[i][h] = sum_t p[h][t] * v_cache[slot][h / G]
 *
 * Layouts (float32, contiguous): q and out [N, H, D]; caches [blocks, block_size, Hkv, D];
 * block_tables [N, max_blocks]: query i reads row i (one query per sequence at decode);
 * positions[i] is its position in that sequence.
 * Built and loaded by cpu_paged.py; any C99 compiler, OpenMP optional.
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
#pragma omp parallel for schedule(dynamic) num_threads(num_threads)
    for (int i = 0; i < num_tokens; i++) {
        const int L = (int)positions[i] + 1;                    /* keys 0 .. position */
        const int num_blocks = (L + block_size - 1) / block_size;
        float *score = malloc(sizeof(float) * (size_t)H * L);   /* score[h * L + t] */
        float *acc = calloc((size_t)H * D, sizeof(float));
        if (!score || !acc) { free(score); free(acc); failed = 1; continue; }
        const float *qi = q + (int64_t)i * H * D;
        const int64_t *table = block_tables + (int64_t)i * max_blocks;

        for (int j = 0; j < num_blocks; j++) {                  /* scores: q . k, block by block */
            const float *block = k_cache + table[j] * block_size * row;
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            for (int o = 0; o < n; o++) {
                const int t = j * block_size + o;
                for (int kv = 0; kv < num_kv_heads; kv++) {
                    const float *k = block + o * row + kv * D;
                    for (int h = kv * G; h < (kv + 1) * G; h++) {   /* the G query heads sharing k */
                        const float *qh = qi + h * D;
                        float dot = 0.f;
#pragma omp simd reduction(+:dot)
                        for (int d = 0; d < D; d++) dot += qh[d] * k[d];
                        score[h * L + t] = dot * scale;
                    }
                }
            }
        }
        for (int h = 0; h < H; h++) {                           /* softmax per head */
            float *s = score + h * L, top = -INFINITY, sum = 0.f;
            for (int t = 0; t < L; t++) top = s[t] > top ? s[t] : top;
            for (int t = 0; t < L; t++) { s[t] = expf(s[t] - top); sum += s[t]; }
            for (int t = 0; t < L; t++) s[t] /= sum;
        }
        for (int j = 0; j < num_blocks; j++) {                  /* out = sum p v */
            const float *block = v_cache + table[j] * block_size * row;
            const int n = L - j * block_size < block_size ? L - j * block_size : block_size;
            for (int o = 0; o < n; o++) {
                const int t = j * block_size + o;
                for (int kv = 0; kv < num_kv_heads; kv++) {
                    const float *v = block + o * row + kv * D;
                    for (int h = kv * G; h < (kv + 1) * G; h++) {
                        const float p = score[h * L + t];
                        float *a = acc + h * D;
#pragma omp simd
                        for (int d = 0; d < D; d++) a[d] += p * v[d];
                    }
                }
            }
        }
        memcpy(out + (int64_t)i * H * D, acc, sizeof(float) * (size_t)H * D);
        free(score);
        free(acc);
    }
    return failed;
}
