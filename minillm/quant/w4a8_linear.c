/* y = x . W^T with int4 weights AND int8 activations: integer dot products, as llama.cpp does
 * for its 4-bit files on a CPU (Q4_1 weights times Q8_1 activations).
 *
 * Why: quantized_linear.c's int4 kernel reads half a byte per weight but then converts every
 * code to float and does a float multiply-add: at batch 1 it is bound by that arithmetic, not
 * by the bytes (6.2 ms for 60 layers of 1536 x 576 = 4.3 GB/s of weights, a sixth of what the
 * memory gives). Rounding the activations to int8 too lets one instruction do 64 products:
 * AVX-512 VNNI's vpdpbusd multiplies 4 unsigned bytes (codes 0..15) by 4 signed bytes (the
 * activations) and adds the 4 products into each of 16 int32 lanes. The integer sums are exact;
 * the only new error is the activations' rounding (reference.py: quantize_activations_int8).
 *
 * Activations, per row, in blocks of B = 32 inputs:  x[k] ~ d[b] * qx[k],  qx in [-127, 127]
 * Weights (int4.py's scheme, groups of G inputs):   W[n][k] = minimum[g][n] + q[n][k] * scale[g][n]
 *     y[n] = sum_g ( scale[g][n] * sum_{b in g} d[b] * (sum_{k in b} qx[k] * q[n][k])   <- int32, exact
 *                    + minimum[g][n] * sum_{b in g} d[b] * (sum_{k in b} qx[k]) )
 * Weights in panels of P = 32 output columns; in a panel, for every 8 inputs k0..k0+7, column c
 * has 4 bytes: byte j = q[c][k0 + j] | q[c][k0 + 4 + j] << 4 (a 32-bit lane of vpdpbusd holds
 * 4 consecutive inputs of one column: the low nibbles are inputs k0..k0+3, the high k0+4..k0+7).
 *     wp[p][k/8][c][j]  (uint8, N/P x K/8 x P x 4 = N*K/2 bytes)
 *     sp[p][g][c], mp[p][g][c] = scale, minimum   (float16 bits, quantized_linear.c's layout)
 * The scales and minimums are float16 (int4.py rounds them so, as llama.cpp's Q4_1 stores them):
 * 4 bytes per 32 weights instead of 8, 0.625 bytes a weight instead of 0.75. Converted to float
 * as they are read; the sums are the float32 ones of the same values.
 *
 * Built with -march=native: the VNNI path where the CPU has it (__AVX512VNNI__), else a plain C
 * loop with the same integer sums (kernels built with -mno-avx512vnni test it on any machine).
 * N must be a multiple of P, K of G, G of B.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512VNNI__
#include <immintrin.h>
#endif

#define P 32    /* output columns per panel */
#define B 32    /* inputs per activation block (one scale d each) */
#define AHEAD 2048  /* bytes of codes asked for ahead of the ones read (__builtin_prefetch): one
                     * row of 1B-shaped layers 0.78x the time without (w4a8.py); 1 KB read alike */

/* One row to int8: per block, d = max|x| / 127 (1 for a block of zeros), qx = round(x / d)
 * (half to even, as torch.round). xs[b] = d * sum(qx): the block's sum as the weights see it.
 * A block holding NaN or inf gets d = NaN, so the outputs say NaN as a float layer's would. */
static void quantize_row(const float *x, int K, int8_t *qx, float *d, float *xs) {
    for (int b = 0; b < K / B; b++) {
        float largest = 0;
        int finite = 1;
        for (int k = b * B; k < (b + 1) * B; k++) {
            const float a = fabsf(x[k]);
            finite &= a <= FLT_MAX;             /* false for NaN and inf */
            largest = fmaxf(largest, a);
        }
        if (!finite) {
            memset(qx + b * B, 0, B);
            d[b] = xs[b] = NAN;
            continue;
        }
        const float db = largest > 0 ? largest / 127.0f : 1.0f;
        int sum = 0;
        for (int k = b * B; k < (b + 1) * B; k++) {
            float q = nearbyintf(x[k] / db);
            q = q > 127 ? 127 : (q < -127 ? -127 : q);
            qx[k] = (int8_t)q;
            sum += (int)q;
        }
        d[b] = db;
        xs[b] = db * (float)sum;
    }
}

#ifdef __AVX512VNNI__
/* 16 float16 values (their bits) as floats: vcvtph2ps. */
static inline __m512 halves(const uint16_t *h) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* One row times one panel: two 16-lane halves of the panel's 32 columns. */
static void panel_row(const int8_t *qx, const float *d, const float *xs, int K, const uint8_t *w,
                      const uint16_t *sc, const uint16_t *mn, int G, float *y) {
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int g = 0; g < K / G; g++) {
        const __m512 s0 = halves(sc + g * P), s1 = halves(sc + g * P + 16);
        float group_sum = 0;
        for (int b = g * (G / B); b < (g + 1) * (G / B); b++) {
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
            for (int k = b * B; k < (b + 1) * B; k += 8) {
                const uint8_t *wk = w + (int64_t)(k / 8) * P * 4;
                __builtin_prefetch(wk + AHEAD);         /* 128 bytes a step: two lines */
                __builtin_prefetch(wk + AHEAD + 64);
                const __m512i v0 = _mm512_loadu_si512(wk), v1 = _mm512_loadu_si512(wk + 64);
                int32_t a, c;
                memcpy(&a, qx + k, 4);          /* activations k..k+3, for the low nibbles */
                memcpy(&c, qx + k + 4, 4);      /* k+4..k+7, for the high nibbles */
                const __m512i xa = _mm512_set1_epi32(a), xc = _mm512_set1_epi32(c);
                i0 = _mm512_dpbusd_epi32(i0, _mm512_and_si512(v0, low), xa);
                i0 = _mm512_dpbusd_epi32(i0, _mm512_and_si512(_mm512_srli_epi16(v0, 4), low), xc);
                i1 = _mm512_dpbusd_epi32(i1, _mm512_and_si512(v1, low), xa);
                i1 = _mm512_dpbusd_epi32(i1, _mm512_and_si512(_mm512_srli_epi16(v1, 4), low), xc);
            }
            const __m512 db = _mm512_set1_ps(d[b]);
            acc0 = _mm512_fmadd_ps(_mm512_mul_ps(s0, db), _mm512_cvtepi32_ps(i0), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_mul_ps(s1, db), _mm512_cvtepi32_ps(i1), acc1);
            group_sum += xs[b];
        }
        const __m512 gs = _mm512_set1_ps(group_sum);
        acc0 = _mm512_fmadd_ps(halves(mn + g * P), gs, acc0);
        acc1 = _mm512_fmadd_ps(halves(mn + g * P + 16), gs, acc1);
    }
    _mm512_storeu_ps(y, acc0);
    _mm512_storeu_ps(y + 16, acc1);
}
#else
/* A float16 (its bits) as a float, exactly: normal, subnormal, zero, inf and NaN. */
static float half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 31, mantissa = h & 1023;
    uint32_t bits = sign | (exponent + 112) << 23 | mantissa << 13;        /* normal */
    if (exponent == 31) bits = sign | 0x7f800000 | mantissa << 13;         /* inf, NaN */
    float f;
    if (exponent == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)mantissa, -24);   /* zero, subnormal */
    memcpy(&f, &bits, 4);
    return f;
}

/* The same sums in plain C (no VNNI): slower, same integers, float epilogue in the same order. */
static void panel_row(const int8_t *qx, const float *d, const float *xs, int K, const uint8_t *w,
                      const uint16_t *sc, const uint16_t *mn, int G, float *y) {
    float acc[P] = {0};
    for (int g = 0; g < K / G; g++) {
        float group_sum = 0;
        for (int b = g * (G / B); b < (g + 1) * (G / B); b++) {
            int32_t isum[P] = {0};
            for (int k = b * B; k < (b + 1) * B; k += 8) {
                const uint8_t *wk = w + (int64_t)(k / 8) * P * 4;
                for (int c = 0; c < P; c++)
                    for (int j = 0; j < 4; j++)
                        isum[c] += (wk[c * 4 + j] & 15) * qx[k + j] + (wk[c * 4 + j] >> 4) * qx[k + 4 + j];
            }
            for (int c = 0; c < P; c++) acc[c] = fmaf(half(sc[g * P + c]) * d[b], (float)isum[c], acc[c]);
            group_sum += xs[b];
        }
        for (int c = 0; c < P; c++) acc[c] = fmaf(half(mn[g * P + c]), group_sum, acc[c]);
    }
    memcpy(y, acc, sizeof acc);
}
#endif

/* 1 if this build has the VNNI path (kernels report it; the tests check both builds). */
int w4a8_has_vnni(void) {
#ifdef __AVX512VNNI__
    return 1;
#else
    return 0;
#endif
}

/* y[M, N] = rows of x[M, K] (float32) quantized to int8, times the int4 panels. 0, or -1 when
 * the activations' buffers cannot be allocated (nothing written). */
int w4a8_linear(const float *x, int M, int K, const uint8_t *wp, const uint16_t *sp, const uint16_t *mp, int G,
                 int N, float *y, int num_threads) {
    int8_t *qx = malloc((size_t)M * K);
    float *d = malloc(sizeof(float) * (size_t)M * (K / B)), *xs = malloc(sizeof(float) * (size_t)M * (K / B));
    if (!qx || !d || !xs) {
        free(qx);
        free(d);
        free(xs);
        return -1;
    }
    for (int r = 0; r < M; r++)
        quantize_row(x + (int64_t)r * K, K, qx + (int64_t)r * K, d + (int64_t)r * (K / B), xs + (int64_t)r * (K / B));
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int p = 0; p < N / P; p++) {
        const uint8_t *w = wp + (int64_t)p * (K / 2) * P;
        const uint16_t *sc = sp + (int64_t)p * (K / G) * P, *mn = mp + (int64_t)p * (K / G) * P;
        for (int r = 0; r < M; r++)
            panel_row(qx + (int64_t)r * K, d + (int64_t)r * (K / B), xs + (int64_t)r * (K / B), K, w, sc, mn, G,
                      y + (int64_t)r * N + p * P);
    }
    free(qx);
    free(d);
    free(xs);
    return 0;
}
