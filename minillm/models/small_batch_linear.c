/* y = x . W^T for the few rows of a decode step, reading weights packed in panels.
 *
 * At decode a step multiplies a few dozen rows by every weight matrix. A general GEMM
 * (MKL) re-lays out ("packs") the weight into cache-friendly panels on every call;
 * with so few rows that repacking costs about as much as the multiply itself. Here the
 * weight is packed once, at load, into panels of P output columns:
 *
 *     wp[p][k][c] = W[p * P + c][k]        (panels N/P, K, P)
 *
 * and each call walks it once. For each panel (in parallel) and each group of R rows,
 * an R x P tile of sums stays in registers while k runs over the inputs:
 *
 *     acc[r][c] += x[r][k] * wp[p][k][c]
 *
 * Every output is the same k-ordered sum whatever M is, so a row gets the same bits
 * alone or in a batch. Built and loaded by cpu_linear.py; N must be a multiple of P.
 *
 * Two details decide its speed at batch 1. The tile is as tall as the rows there are
 * (6, 2 or 1), not 6 with a lone row computed six times. And each k asks for the weights
 * 32 k ahead (__builtin_prefetch): a panel is one stream, and on an Intel Xeon (Sapphire
 * Rapids, 2 cores) the hardware prefetcher alone fed it at ~10 ns a k whatever its width.
 * `python -m minillm.quant.speed --methods float32 panel`, 30 layers, ms at 1 / 8 / 32 rows:
 * before 26.7 / 33.1 / 48.4, after 20.7-22.3 / 28.4-29.8 / 43.0-45.6 over runs (16 or 32 k
 * ahead measured alike; MKL's F.linear 14.9-17.0 / 34-38 / 49-54: MKL still wins at one row on
 * that CPU; quantized_linear.c gains more, int8 17.8 -> 7.5).
 */
#include <stdint.h>

#define P 32    /* output columns per panel */

/* Rows r0 .. r0 + RR - 1 of x against panel w: an RR x P tile of sums in registers while k runs.
 * One body, stamped out for a few constant RR, so a step with fewer rows than the widest
 * tile does only its own rows' work (a batch-1 step is one row, not one row computed 6 times). */
#define ROW_TILE(RR)                                                                            \
static inline void tile_##RR(const float *x, int K, const float *w, int N, int p, int r0, float *y) { \
    float acc[RR][P] = {{0}};                                                                   \
    for (int k = 0; k < K; k++) {                                                               \
        const float *wk = w + (int64_t)k * P;                                                   \
        __builtin_prefetch(wk + 32 * P); __builtin_prefetch(wk + 32 * P + 16);                  \
        for (int r = 0; r < RR; r++) {                                                          \
            const float xv = x[(int64_t)(r0 + r) * K + k];                                      \
_Pragma("omp simd")                                                                             \
            for (int c = 0; c < P; c++) acc[r][c] += xv * wk[c];                                \
        }                                                                                       \
    }                                                                                           \
    for (int r = 0; r < RR; r++)                                                                \
        for (int c = 0; c < P; c++) y[(int64_t)(r0 + r) * N + p * P + c] = acc[r][c];           \
}
ROW_TILE(6)   /* 6 x 32 sums fill 12 of AVX-512's 32 registers */
ROW_TILE(2)
ROW_TILE(1)

void small_batch_linear(const float *x, int M, int K, const float *wp, int N, float *y, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < N / P; p++) {
        const float *w = wp + (int64_t)p * K * P;
        int r0 = 0;
        for (; r0 + 6 <= M; r0 += 6) tile_6(x, K, w, N, p, r0, y);
        for (; r0 + 2 <= M; r0 += 2) tile_2(x, K, w, N, p, r0, y);
        for (; r0 < M; r0++) tile_1(x, K, w, N, p, r0, y);
    }
}
