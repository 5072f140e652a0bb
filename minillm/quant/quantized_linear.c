/* y = x . W^T for the few rows of a decode step, with int8 or int4 weights packed in panels.
 *
 * The same loop as models/small_batch_linear.c (read it first): weights packed once into
 * panels of P output columns, an R x P tile of sums kept in registers while k runs over the
 * inputs. What changes is the weight type: a byte (int8) or half a byte (int4) is read per
 * weight instead of four, and converted to float in registers. At decode that is the point:
 * the step is bound by the bytes it reads.
 *
 * int8 (per output channel):  W[n][k] = q[n][k] * scale[n]
 *     wp[p][k][c] = q[p*P + c][k]                        (int8,  panels N/P, K, P)
 *     y[r][n] = scale[n] * sum_k x[r][k] * q[n][k]         the scale leaves the sum
 *
 * int4 (groups of G inputs):   W[n][k] = minimum[g][n] + q[n][k] * scale[g][n],  g = k / G
 *     wp[p][k/2][c] = q[p*P+c][k] | q[p*P+c][k+1] << 4    (uint8, panels N/P, K/2, P)
 *     sp[p][g][c], mp[p][g][c] = scale, minimum           (float, panels N/P, K/G, P)
 *     y[r][n] = sum_g scale[g][n] * (sum_{k in g} x[r][k] * q[n][k]) + minimum[g][n] * (sum_{k in g} x[r][k])
 *
 * Built and loaded by kernels.py; N must be a multiple of P, K of G (and G even).
 *
 * Each k asks for the codes 32 k ahead (__builtin_prefetch): a panel is one stream of 32
 * (int8) or 16 (int4) bytes a k, too thin for the hardware prefetcher on an Intel Xeon
 * (Sapphire Rapids, 2 cores). `python -m minillm.quant.speed`, 30 layers, ms at 1 / 8 rows:
 * int8 17.8 / 30.8 -> 7.5 / 16.3, int4 (G = 32) 8.9 / 26.0 -> 6.2 / 22.8.
 */
#include <stdint.h>
#include <string.h>

#define P 32    /* output columns per panel */
#define R8 6    /* rows per tile, int8: 6 x 32 sums in 12 AVX-512 registers */
#define R4 4    /* rows per tile, int4: two sets of 4 x 32 sums (group and total) */

/* One R x P tile of int8 sums. Inlined with a constant R, so the R x P sums live in registers;
 * a batch of one row gets a 1-row tile instead of computing 6 and storing 1. */
static inline __attribute__((always_inline)) void int8_tile(const float *x, int M, int K, int r0, const int8_t *w,
                                                           const float *scale, int N, int p, float *y, const int R) {
    const float *xr[R8];      /* past the last row, repeat it (computed, never stored) */
    for (int r = 0; r < R; r++) xr[r] = x + (int64_t)(r0 + r < M ? r0 + r : M - 1) * K;
    float acc[R8][P] = {{0}};
    for (int k = 0; k < K; k++) {
        const int8_t *wk = w + (int64_t)k * P;
        __builtin_prefetch(wk + 32 * P);
        for (int r = 0; r < R; r++) {
            const float xv = xr[r][k];
#pragma omp simd
            for (int c = 0; c < P; c++) acc[r][c] += xv * (float)wk[c];
        }
    }
    for (int r = 0; r < R && r0 + r < M; r++)
        for (int c = 0; c < P; c++) y[(int64_t)(r0 + r) * N + p * P + c] = acc[r][c] * scale[p * P + c];
}

void int8_linear(const float *x, int M, int K, const int8_t *wp, const float *scale, int N, float *y,
                 int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < N / P; p++) {
        const int8_t *w = wp + (int64_t)p * K * P;
        for (int r0 = 0; r0 < M; r0 += R8) {
            if (M - r0 == 1) int8_tile(x, M, K, r0, w, scale, N, p, y, 1);
            else int8_tile(x, M, K, r0, w, scale, N, p, y, R8);
        }
    }
}

/* One R x P tile of int4 sums, like int8_tile. */
static inline __attribute__((always_inline)) void int4_tile(const float *x, int M, int K, int r0, const uint8_t *w,
                                                           const float *sc, const float *mn, int G, int N, int p,
                                                           float *y, const int R) {
    const float *xr[R4];
    for (int r = 0; r < R; r++) xr[r] = x + (int64_t)(r0 + r < M ? r0 + r : M - 1) * K;
    float acc[R4][P] = {{0}};
    for (int g = 0; g < K / G; g++) {
        float part[R4][P] = {{0}}, xsum[R4] = {0};
        for (int k = g * G; k < (g + 1) * G; k += 2) {
            const uint8_t *wk = w + (int64_t)(k / 2) * P;
            __builtin_prefetch(wk + 32 * P);
            for (int r = 0; r < R; r++) {
                const float x0 = xr[r][k], x1 = xr[r][k + 1];
                xsum[r] += x0 + x1;
#pragma omp simd
                for (int c = 0; c < P; c++) part[r][c] += x0 * (float)(wk[c] & 15) + x1 * (float)(wk[c] >> 4);
            }
        }
        const float *s = sc + (int64_t)g * P, *m = mn + (int64_t)g * P;
        for (int r = 0; r < R; r++)
#pragma omp simd
            for (int c = 0; c < P; c++) acc[r][c] += s[c] * part[r][c] + m[c] * xsum[r];
    }
    for (int r = 0; r < R && r0 + r < M; r++)
        for (int c = 0; c < P; c++) y[(int64_t)(r0 + r) * N + p * P + c] = acc[r][c];
}

/* One row (batch 1, the common decode case). A 4-row tile computes 4x the sums it needs, and
 * gcc does not vectorize int4_tile well with R = 1 (measured 2.4x slower than the 4-row tile).
 * So the 32 columns of a panel are two 16-lane vectors (gcc's vector extensions: AVX-512 with
 * -march=native on x86, plain loops where there is no such unit). Per 16 bytes of codes: mask
 * and shift out the two nibbles, widen to int32, convert to float, two FMAs. Widening in two
 * steps matters: a direct uint8 -> float conversion compiled to scalar code (36 ms below).
 * Measured: 60 layers of 1536 x 576, one row, 1 thread, AMD EPYC (Zen 4): float32 12.9 ms,
 * int8 6.2 ms, int4 with the 4-row tile 10.1 ms, with this 6.2 ms. */
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
#define TO_FLOAT(v) __builtin_convertvector(__builtin_convertvector((v), i32x16), f32x16)

static void int4_row(const float *x, int K, const uint8_t *w, const float *sc, const float *mn, int G,
                     float *y) {
    f32x16 acc[2] = {{0}, {0}};
    for (int g = 0; g < K / G; g++) {
        f32x16 part[2] = {{0}, {0}};
        float xsum = 0;
        for (int k = g * G; k < (g + 1) * G; k += 2) {
            const float x0 = x[k], x1 = x[k + 1];
            xsum += x0 + x1;
            __builtin_prefetch(w + (int64_t)(k / 2) * P + 32 * P);
            for (int h = 0; h < 2; h++) {
                u8x16 b;
                memcpy(&b, w + (int64_t)(k / 2) * P + 16 * h, 16);
                part[h] += x0 * TO_FLOAT(b & 15) + x1 * TO_FLOAT(b >> 4);
            }
        }
        for (int h = 0; h < 2; h++) {
            f32x16 s, m;
            memcpy(&s, sc + (int64_t)g * P + 16 * h, 64);
            memcpy(&m, mn + (int64_t)g * P + 16 * h, 64);
            acc[h] += s * part[h] + m * xsum;
        }
    }
    memcpy(y, &acc[0], 64);
    memcpy(y + 16, &acc[1], 64);
}

void int4_linear(const float *x, int M, int K, const uint8_t *wp, const float *sp, const float *mp, int G,
                 int N, float *y, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < N / P; p++) {
        const uint8_t *w = wp + (int64_t)p * (K / 2) * P;
        const float *sc = sp + (int64_t)p * (K / G) * P, *mn = mp + (int64_t)p * (K / G) * P;
        for (int r0 = 0; r0 < M; r0 += R4) {
            if (M - r0 == 1) int4_row(x + (int64_t)r0 * K, K, w, sc, mn, G, y + (int64_t)r0 * N + p * P);
            else int4_tile(x, M, K, r0, w, sc, mn, G, N, p, y, R4);
        }
    }
}
