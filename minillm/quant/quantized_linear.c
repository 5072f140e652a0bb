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
 * Each k asks for the codes ahead (__builtin_prefetch): a panel is one stream of 32 (int8) or
 * 16 (int4) bytes a k, too thin for the hardware prefetcher on an Intel Xeon (Sapphire Rapids,
 * 2 cores). `python -m minillm.quant.speed`, 30 layers, ms at 1 / 8 rows: int8 17.8 / 30.8 ->
 * 7.5 / 16.3, int4 (G = 32) 8.9 / 26.0 -> 6.2 / 22.8.
 *
 * int8 then split each sum in two over k and, for one or two rows, reads two panels at once
 * (int8_tile says why): the output head of Llama-3.2-1B (128256 x 2048, 262 MB of int8) took
 * 17.6 ms at one row, 15 GB/s of the ~25 the CPU reads (bench.step_profile, quiet). One run,
 * old source against new in alternation, same weights (ratios only: the 2-core Xeon had a load
 * average of 8-10 from other jobs, so the absolute ms mean nothing):
 *     python -m minillm.quant.speed --against OLD.c --shape llama-3.2-1b --head-only --rows 1 8 --repeats 15
 *     head, new / old:   1 row 0.609 (2 threads) 0.612 (1 thread);   8 rows 0.530 / 0.528
 *     later, the load down to ~1, 2 threads: 1 row 17.22 -> 11.08 ms (0.643; 15.3 -> 23.7 GB/s,
 *     near the ~25 GB/s the CPU reads), 8 rows 40.09 -> 23.46 ms (0.585)
 *     --shape smollm2-135m --threads 1 --rows 1 8 32, 30 layers:  0.60 / 0.58 / 0.67
 * The tile is 4 rows (was 6; with two partial sums 6 rows take 24 of the 32 registers), which
 * also stops an 8-row call computing 12 rows (6 + 6). Old = this file before that change
 * (`git log` it). Same bits for a row whatever shares its call (tests/test_quantization.py).
 */
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define P 32    /* output columns per panel */
#define R8 4    /* rows per tile, int8: 4 rows x 32 columns x 2 partial sums = 16 AVX-512 registers */
#define R4 4    /* rows per tile, int4: two sets of 4 x 32 sums (group and total) */
#define AHEAD 64 /* int8: the codes of input k + AHEAD are asked for at input k (2 KB a panel) */

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
#define TO_FLOAT(v) __builtin_convertvector(__builtin_convertvector((v), i32x16), f32x16)

/* 16 int8 codes of a panel (inputs k, columns 16h ..) as floats. AVX-512: vpmovsxbd + vcvtdq2ps
 * (gcc 12 compiles __builtin_convertvector of int8 x 16 to scalar code: 4x slower, measured). */
static inline __attribute__((always_inline)) f32x16 codes8(const int8_t *w, int64_t k, int h) {
#ifdef __AVX512F__
    return (f32x16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + k * P + 16 * h))));
#else
    f32x16 v;
    for (int c = 0; c < 16; c++) v[c] = (float)w[k * P + 16 * h + c];
    return v;
#endif
}

/* An R x (Q * P) tile of int8 sums: rows r0 .. r0+R-1, panels p .. p+Q-1 (Q = 1 or 2). Inlined
 * with constant R and Q, so the sums live in registers.
 *
 * Each sum is split in two over k: `even` takes the even inputs, `odd` the odd ones (and the
 * last input when K is odd), and y = (even + odd) * scale. Why: one chain of multiply-adds per
 * 16 columns waits on its own previous result (4 cycles on this CPU) at every k; two chains
 * per 16 columns, and for one row two panels at once (8 chains, two streams of codes), keep
 * the units busy while the codes arrive. The order is the same for every R and Q: a row gets
 * the same bits alone or with others in the call (the batch invariance w4a8.py explains). */
static inline __attribute__((always_inline)) void int8_tile(const float *x, int M, int K, int r0, const int8_t *w,
                                                           const float *scale, int N, int p, float *y,
                                                           const int R, const int Q) {
    const float *xr[R8];      /* past the last row, repeat it (computed, never stored) */
    for (int r = 0; r < R; r++) xr[r] = x + (int64_t)(r0 + r < M ? r0 + r : M - 1) * K;
    const int8_t *wq[2] = {w, w + (int64_t)K * P};     /* panel p, and p + 1 when Q = 2 */
    f32x16 even[R8][2][2], odd[R8][2][2];              /* [row][panel][half of the 32 columns] */
    for (int r = 0; r < R; r++)
        for (int q = 0; q < Q; q++)
            for (int h = 0; h < 2; h++) even[r][q][h] = odd[r][q][h] = (f32x16){0};
    int k = 0;
    for (; k + 1 < K; k += 2) {
        for (int q = 0; q < Q; q++) __builtin_prefetch(wq[q] + (int64_t)(k + AHEAD) * P);    /* a line: 2 k */
#pragma GCC unroll 2
        for (int q = 0; q < Q; q++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const f32x16 w0 = codes8(wq[q], k, h), w1 = codes8(wq[q], k + 1, h);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    even[r][q][h] += xr[r][k] * w0;
                    odd[r][q][h] += xr[r][k + 1] * w1;
                }
            }
    }
    if (k < K)
        for (int q = 0; q < Q; q++)
            for (int h = 0; h < 2; h++) {
                const f32x16 w0 = codes8(wq[q], k, h);
                for (int r = 0; r < R; r++) even[r][q][h] += xr[r][k] * w0;
            }
    for (int r = 0; r < R && r0 + r < M; r++)
        for (int q = 0; q < Q; q++)
            for (int h = 0; h < 2; h++) {
                f32x16 s;
                memcpy(&s, scale + (p + q) * P + 16 * h, 64);
                const f32x16 out = (even[r][q][h] + odd[r][q][h]) * s;
                memcpy(y + (int64_t)(r0 + r) * N + (p + q) * P + 16 * h, &out, 64);
            }
}

/* Panels lo .. hi-1 (one thread's share): two at a time while the rows come one or two at a
 * time, one at a time under the 4-row tiles (2 x 16 sums of 4 rows x 2 panels would not fit
 * in 32 registers). */
static void int8_panels(const float *x, int M, int K, const int8_t *wp, const float *scale, int N, float *y,
                        int lo, int hi) {
    for (int p = lo; p < hi; p += 2) {
        const int pair = hi - p >= 2;
        const int8_t *w = wp + (int64_t)p * K * P;
        for (int r0 = 0; r0 < M;) {
            if (M - r0 >= 3) {              /* 3 rows: a 4-row tile with the last one repeated */
                int8_tile(x, M, K, r0, w, scale, N, p, y, R8, 1);
                if (pair) int8_tile(x, M, K, r0, w + (int64_t)K * P, scale, N, p + 1, y, R8, 1);
                r0 += R8;
            } else if (M - r0 == 2) {
                if (pair) int8_tile(x, M, K, r0, w, scale, N, p, y, 2, 2);
                else int8_tile(x, M, K, r0, w, scale, N, p, y, 2, 1);
                r0 += 2;
            } else {
                if (pair) int8_tile(x, M, K, r0, w, scale, N, p, y, 1, 2);
                else int8_tile(x, M, K, r0, w, scale, N, p, y, 1, 1);
                r0 += 1;
            }
        }
    }
}

void int8_linear(const float *x, int M, int K, const int8_t *wp, const float *scale, int N, float *y,
                 int num_threads) {
    const int panels = N / P, shares = num_threads < panels ? num_threads : panels;
    if (shares < 1) return;
    /* one contiguous share of the panels per thread (pairs are made inside a share, so an odd
     * count of panels does not leave one thread a pair more) */
#pragma omp parallel for schedule(static) num_threads(shares)
    for (int t = 0; t < shares; t++)
        int8_panels(x, M, K, wp, scale, N, y, (int)((int64_t)panels * t / shares),
                    (int)((int64_t)panels * (t + 1) / shares));
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
