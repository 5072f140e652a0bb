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
 */
#include <stdint.h>

#define R 6     /* rows of x per tile: 6 x 32 sums fill 12 of AVX-512's 32 registers */
#define P 32    /* output columns per panel */

void small_batch_linear(const float *x, int M, int K, const float *wp, int N, float *y, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < N / P; p++) {
        const float *w = wp + (int64_t)p * K * P;
        for (int r0 = 0; r0 < M; r0 += R) {
            const float *xr[R];       /* past the last row, repeat it (computed, never stored) */
            for (int r = 0; r < R; r++) xr[r] = x + (int64_t)(r0 + r < M ? r0 + r : M - 1) * K;
            float acc[R][P] = {{0}};
            for (int k = 0; k < K; k++) {
                const float *wk = w + (int64_t)k * P;
                for (int r = 0; r < R; r++) {
                    const float xv = xr[r][k];
#pragma omp simd
                    for (int c = 0; c < P; c++) acc[r][c] += xv * wk[c];
                }
            }
            for (int r = 0; r < R && r0 + r < M; r++)
                for (int c = 0; c < P; c++) y[(int64_t)(r0 + r) * N + p * P + c] = acc[r][c];
        }
    }
}
