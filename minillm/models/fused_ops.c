/* The small elementwise work of a decoder layer, one call each instead of 6-10 torch ops.
 *
 * At batch 1 a layer's norms and RoPE touch a few thousand floats: the arithmetic takes
 * well under a microsecond, while each torch op costs a few microseconds of dispatch. So
 * one C call does what RMSNorm (float, pow, mean, add, rsqrt, mul, mul), the residual add,
 * and RoPE on q and k plus the K/V write (chunk, cat, neg, mul, mul, add, twice, then two
 * index_copy_) did. Read fused_layer.py for where each is called.
 *
 *   rms_norm       out = x / sqrt(mean(x^2) + eps) * w                          x, out [N, D]
 *   add_rms_norm   sum = x + delta; out = rms_norm(sum)                          all [N, D]
 *   rope_write_kv  qkv [N, (H + 2 Hkv) * Dh] (q | k | v, as the fused projection gives them):
 *                  q_out = rope(q); k_cache[slot] = rope(k); v_cache[slot] = v
 *                  rope(x)[i] = x[i] cos[i] - x[i + Dh/2] sin[i]          (i < Dh/2)
 *                  rope(x)[i] = x[i] cos[i] + x[i - Dh/2] sin[i]          (i >= Dh/2)
 *                  cos, sin [N, Dh]; caches [blocks, block_size, Hkv, Dh]; slots [N] int64;
 *                  returns 1, writing nothing, when a slot is outside the caches
 *   silu_mul       out = silu(gate) * up, gate_up [N, 2 I] = gate | up (the fused projection)  out [N, I]
 *
 * Threads: one, unless the rows are many (a prefill chunk): an OpenMP region costs a few
 * microseconds to open, more than a decode row's work. Compiled without -ffp-contract=fast,
 * so RoPE's multiply and add round as torch's do (no fused multiply-add): the same bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MANY_ROWS 64        /* from this many rows up, the rows are shared among threads */

static void norm_row(const float *x, const float *w, float eps, int d, float *out) {
    float sum = 0.f;
#pragma omp simd reduction(+:sum)
    for (int j = 0; j < d; j++) sum += x[j] * x[j];
    const float r = 1.f / sqrtf(sum / (float)d + eps);
#pragma omp simd
    for (int j = 0; j < d; j++) out[j] = w[j] * (x[j] * r);
}

void rms_norm(const float *x, const float *w, int n, int d, float eps, int num_threads, float *out) {
#pragma omp parallel for num_threads(num_threads) if (n >= MANY_ROWS)
    for (int i = 0; i < n; i++) norm_row(x + (int64_t)i * d, w, eps, d, out + (int64_t)i * d);
}

void add_rms_norm(const float *x, const float *delta, const float *w, int n, int d, float eps,
                  int num_threads, float *sum, float *out) {
#pragma omp parallel for num_threads(num_threads) if (n >= MANY_ROWS)
    for (int i = 0; i < n; i++) {
        const int64_t o = (int64_t)i * d;
#pragma omp simd
        for (int j = 0; j < d; j++) sum[o + j] = x[o + j] + delta[o + j];
        norm_row(sum + o, w, eps, d, out + o);
    }
}

static void rope_head(const float *x, const float *c, const float *s, int dh, float *out) {
    const int half = dh / 2;
    for (int j = 0; j < half; j++) {
        const float a = x[j] * c[j], b = x[j + half] * s[j];
        out[j] = a - b;
    }
    for (int j = half; j < dh; j++) {
        const float a = x[j] * c[j], b = x[j - half] * s[j];
        out[j] = a + b;
    }
}

int rope_write_kv(const float *qkv, const float *cos_, const float *sin_, float *k_cache, float *v_cache,
                  const int64_t *slots, int64_t num_slots, int n, int num_heads, int num_kv_heads, int head_dim,
                  int num_threads, float *q_out) {
    for (int i = 0; i < n; i++)             /* a slot outside the pool would write outside it: refuse */
        if (slots[i] < 0 || slots[i] >= num_slots) return 1;
    const int64_t width = (int64_t)(num_heads + 2 * num_kv_heads) * head_dim;
    const int64_t kv_row = (int64_t)num_kv_heads * head_dim;
#pragma omp parallel for num_threads(num_threads) if (n >= MANY_ROWS)
    for (int i = 0; i < n; i++) {
        const float *q = qkv + i * width, *k = q + num_heads * head_dim, *v = k + kv_row;
        const float *c = cos_ + (int64_t)i * head_dim, *s = sin_ + (int64_t)i * head_dim;
        for (int h = 0; h < num_heads; h++)
            rope_head(q + h * head_dim, c, s, head_dim, q_out + ((int64_t)i * num_heads + h) * head_dim);
        float *k_slot = k_cache + slots[i] * kv_row, *v_slot = v_cache + slots[i] * kv_row;
        for (int h = 0; h < num_kv_heads; h++) rope_head(k + h * head_dim, c, s, head_dim, k_slot + h * head_dim);
        memcpy(v_slot, v, sizeof(float) * kv_row);
    }
    return 0;
}

void silu_mul(const float *gate_up, int n, int width, int num_threads, float *out) {
#pragma omp parallel for num_threads(num_threads) if (n >= MANY_ROWS)
    for (int i = 0; i < n; i++) {
        const float *g = gate_up + (int64_t)i * 2 * width, *u = g + width;
        float *o = out + (int64_t)i * width;
        for (int j = 0; j < width; j++) o[j] = g[j] / (1.f + expf(-g[j])) * u[j];
    }
}
