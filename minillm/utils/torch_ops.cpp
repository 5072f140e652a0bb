// The C kernels as native torch ops: a thin C++ wrapper per kernel (read native_ops.py first).
//
// Each wrapper checks its tensors (dtype, shape, device, contiguity: a wrong one would make the
// C code read out of bounds), allocates the output and calls the C function through a pointer.
// The C files stay as they are, compiled by CKernel into their own libraries; Python hands this
// file their functions' addresses (set_kernel), and only then is the wrapper registered as the
// CPU kernel of `minillm::<op>`. So this file is compiled once per torch version, whatever the
// C kernels' flags, and an op whose C kernel did not build keeps its Python+ctypes fallback.
//
// Adding a kernel: its C signature as a pointer type, a wrapper named like the op, and one
// line in KERNELS below.
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t PANEL = 32;   // output columns per panel (cpu_linear.py's PANEL)

void check(const at::Tensor& t, const char* op, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == dtype && t.dim() == dim, "minillm::", op,
                    ": ", name, " must be a ", dim, "-d ", dtype, " CPU tensor, got ", t.dim(), "-d ",
                    t.scalar_type(), " on ", t.device());
}

// A weight is packed once (to_panels): contiguous, its sizes those of the layout named in `layout`.
void check_weight(const at::Tensor& t, const char* op, const char* name, at::ScalarType dtype,
                  std::vector<int64_t> sizes, const char* layout) {
  check(t, op, name, dtype, static_cast<int64_t>(sizes.size()));
  TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(sizes), "minillm::", op, ": ", name, " must be ", layout,
                    " = ", at::IntArrayRef(sizes), ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "minillm::", op, ": ", name, " must be contiguous");
}

at::Tensor empty(int64_t rows, int64_t cols) {
  return at::detail::empty_cpu({rows, cols}, at::kFloat);
}

// ---- panel_linear: y = x W^T, W float32 in panels (models/small_batch_linear.c) ----
using PanelLinearC = void (*)(const float*, int, int, const float*, int, float*, int);
PanelLinearC panel_linear_c = nullptr;

at::Tensor panel_linear(const at::Tensor& x_, const at::Tensor& panels) {
  check(x_, "panel_linear", "x", at::kFloat, 2);
  auto x = x_.contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = panels.size(0) * PANEL;
  check_weight(panels, "panel_linear", "panels", at::kFloat, {n / PANEL, k, PANEL}, "[N / 32, K, 32]");
  auto y = empty(m, n);
  panel_linear_c(x.const_data_ptr<float>(), m, k, panels.const_data_ptr<float>(), n,
                 y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

// ---- int8_linear: int8 weights in panels, one scale per output (quant/quantized_linear.c) ----
using Int8LinearC = void (*)(const float*, int, int, const int8_t*, const float*, int, float*, int);
Int8LinearC int8_linear_c = nullptr;

at::Tensor int8_linear(const at::Tensor& x_, const at::Tensor& panels, const at::Tensor& scale) {
  check(x_, "int8_linear", "x", at::kFloat, 2);
  auto x = x_.contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = panels.size(0) * PANEL;
  check_weight(panels, "int8_linear", "panels", at::kChar, {n / PANEL, k, PANEL}, "[N / 32, K, 32]");
  check_weight(scale, "int8_linear", "scale", at::kFloat, {n}, "[N]");
  auto y = empty(m, n);
  int8_linear_c(x.const_data_ptr<float>(), m, k, panels.const_data_ptr<int8_t>(),
                scale.const_data_ptr<float>(), n, y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

// ---- int4_linear and w4a8_linear: int4 codes, a scale and a minimum per group of inputs ----
using Int4LinearC = void (*)(const float*, int, int, const uint8_t*, const float*, const float*, int, int,
                             float*, int);
using W4A8LinearC = int (*)(const float*, int, int, const uint8_t*, const uint16_t*, const uint16_t*, int, int,
                            float*, int);   // scales and minimums: float16 bits
Int4LinearC int4_linear_c = nullptr;
W4A8LinearC w4a8_linear_c = nullptr;

// The shared checks; returns x contiguous. w4a8 packs 8 inputs in [.., 4] bytes, int4 2 in one.
at::Tensor check_int4(const char* op, const at::Tensor& x_, const at::Tensor& panels, const at::Tensor& sp,
                      const at::Tensor& mp, int64_t g, bool w4a8) {
  const bool x_ok = x_.device().is_cpu() && x_.scalar_type() == at::kFloat && x_.dim() == 2;
  const int64_t k = x_ok ? x_.size(1) : 0, n = panels.size(0) * PANEL;
  TORCH_CHECK_VALUE(x_ok && g > 0 && k % g == 0 && g % (w4a8 ? 32 : 2) == 0, "minillm::", op, " takes float32 ",
                    "[M, K] on CPU with K a multiple of group_size",
                    w4a8 ? " and group_size of 32" : " and group_size even",
                    "; got ", x_.scalar_type(), " ", x_.sizes(), " on ", x_.device(), ", group_size ", g);
  if (w4a8)
    check_weight(panels, op, "panels", at::kByte, {n / PANEL, k / 8, PANEL, 4}, "[N / 32, K / 8, 32, 4]");
  else
    check_weight(panels, op, "panels", at::kByte, {n / PANEL, k / 2, PANEL}, "[N / 32, K / 2, 32]");
  const auto scales = w4a8 ? at::kHalf : at::kFloat;   // w4a8 reads float16 scales and minimums
  check_weight(sp, op, "scale_panels", scales, {n / PANEL, k / g, PANEL}, "[N / 32, K / group_size, 32]");
  check_weight(mp, op, "minimum_panels", scales, {n / PANEL, k / g, PANEL}, "[N / 32, K / group_size, 32]");
  return x_.contiguous();
}

at::Tensor int4_linear(const at::Tensor& x_, const at::Tensor& panels, const at::Tensor& sp,
                       const at::Tensor& mp, int64_t group_size) {
  auto x = check_int4("int4_linear", x_, panels, sp, mp, group_size, false);
  const int64_t m = x.size(0), k = x.size(1), n = panels.size(0) * PANEL;
  auto y = empty(m, n);
  int4_linear_c(x.const_data_ptr<float>(), m, k, panels.const_data_ptr<uint8_t>(), sp.const_data_ptr<float>(),
                mp.const_data_ptr<float>(), group_size, n, y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

at::Tensor w4a8_linear(const at::Tensor& x_, const at::Tensor& panels, const at::Tensor& sp,
                       const at::Tensor& mp, int64_t group_size) {
  auto x = check_int4("w4a8_linear", x_, panels, sp, mp, group_size, true);
  const int64_t m = x.size(0), k = x.size(1), n = panels.size(0) * PANEL;
  auto y = empty(m, n);
  const int failed = w4a8_linear_c(x.const_data_ptr<float>(), m, k, panels.const_data_ptr<uint8_t>(),
                                   static_cast<const uint16_t*>(sp.const_data_ptr()),
                                   static_cast<const uint16_t*>(mp.const_data_ptr()), group_size, n,
                                   y.mutable_data_ptr<float>(), at::get_num_threads());
  TORCH_CHECK_WITH(OutOfMemoryError, !failed, "minillm::w4a8_linear could not allocate the int8 activations of a ",
                   m, " x ", k, " input");
  return y;
}

// ---- paged_decode_attention: one query per row, reading its blocks in place (paged_attention.c) ----
using PagedAttentionC = int (*)(const float*, const float*, const float*, const int64_t*, const int64_t*, int,
                                int, int, int, int, int, float, int, float*);
PagedAttentionC paged_decode_attention_c = nullptr;

at::Tensor paged_decode_attention(const at::Tensor& q_, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& tables_, const at::Tensor& positions_) {
  const char* op = "paged_decode_attention";
  check(q_, op, "q", at::kFloat, 3);
  check(k_cache, op, "k_cache", at::kFloat, 4);
  const int64_t t = q_.size(0), h = q_.size(1), kv = k_cache.size(2), d = k_cache.size(3);
  check_weight(k_cache, op, "k_cache", at::kFloat, k_cache.sizes().vec(), "[blocks, block_size, kv_heads, D]");
  check_weight(v_cache, op, "v_cache", at::kFloat, k_cache.sizes().vec(), "k_cache's shape");
  TORCH_CHECK_VALUE(q_.size(2) == d && h % kv == 0, "minillm::", op, ": q must be [tokens, heads, ", d,
                    "] with heads a multiple of the cache's ", kv, " kv heads, got ", q_.sizes());
  check(tables_, op, "block_tables", at::kLong, 2);
  check(positions_, op, "positions", at::kLong, 1);
  TORCH_CHECK_VALUE(tables_.size(0) == t && positions_.size(0) == t, "minillm::", op, ": block_tables and ",
                    "positions need one row per query (", t, "), got ", tables_.sizes(), " and ", positions_.sizes());
  auto q = q_.contiguous(), tables = tables_.contiguous(), positions = positions_.contiguous();
  auto out = at::Tensor(at::detail::empty_cpu(q.sizes(), at::kFloat));
  const int failed = paged_decode_attention_c(
      q.const_data_ptr<float>(), k_cache.const_data_ptr<float>(), v_cache.const_data_ptr<float>(),
      tables.const_data_ptr<int64_t>(), positions.const_data_ptr<int64_t>(), t, h, kv, d, k_cache.size(1),
      tables.size(1), static_cast<float>(std::pow(static_cast<double>(d), -0.5)), at::get_num_threads(),
      out.mutable_data_ptr<float>());
  TORCH_CHECK_WITH(OutOfMemoryError, !failed, "minillm::paged_decode_attention: out of memory for its score buffers");
  return out;
}

// ---- the fused elementwise kernels of a decoder layer (models/fused_ops.c) ----
using RmsNormC = void (*)(const float*, const float*, int, int, float, int, float*);
using AddRmsNormC = void (*)(const float*, const float*, const float*, int, int, float, int, float*, float*);
using RopeWriteKvC = int (*)(const float*, const float*, const float*, float*, float*, const int64_t*, int64_t,
                             int, int, int, int, int, float*);
using SiluMulC = void (*)(const float*, int, int, int, float*);
RmsNormC rms_norm_c = nullptr;
SiluMulC silu_mul_c = nullptr;
AddRmsNormC add_rms_norm_c = nullptr;
RopeWriteKvC rope_write_kv_c = nullptr;

// x [..., D] and a D-long weight, float32, contiguous (fused_ops.usable checked the rest).
void check_norm(const char* op, const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1 &&
                    w.device().is_cpu() && w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 1 &&
                    w.size(0) == x.size(-1), "minillm::", op, ": x must be contiguous float32 [..., D] on CPU and ",
                    "weight float32 [D], got ", x.sizes(), " and ", w.sizes());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_norm("rms_norm", x, w);
  auto out = at::Tensor(at::detail::empty_cpu(x.sizes(), at::kFloat));
  const int64_t d = x.size(-1);
  rms_norm_c(x.const_data_ptr<float>(), w.const_data_ptr<float>(), x.numel() / d, d, static_cast<float>(eps),
             at::get_num_threads(), out.mutable_data_ptr<float>());
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                                                double eps) {
  check_norm("add_rms_norm", x, w);
  TORCH_CHECK_VALUE(delta.sizes() == x.sizes() && delta.scalar_type() == at::kFloat && delta.is_contiguous() &&
                    delta.device().is_cpu(), "minillm::add_rms_norm: delta must be like x ", x.sizes());
  auto total = at::Tensor(at::detail::empty_cpu(x.sizes(), at::kFloat));
  auto out = at::Tensor(at::detail::empty_cpu(x.sizes(), at::kFloat));
  const int64_t d = x.size(-1);
  add_rms_norm_c(x.const_data_ptr<float>(), delta.const_data_ptr<float>(), w.const_data_ptr<float>(),
                 x.numel() / d, d, static_cast<float>(eps), at::get_num_threads(), total.mutable_data_ptr<float>(),
                 out.mutable_data_ptr<float>());
  return {total, out};
}

at::Tensor rope_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                         at::Tensor& v_cache, const at::Tensor& slots, int64_t heads, int64_t kv_heads) {
  const char* op = "rope_write_kv";
  check(k_cache, op, "k_cache", at::kFloat, 4);
  const int64_t d = k_cache.size(3), n = qkv.size(0);
  check_weight(k_cache, op, "k_cache", at::kFloat, {k_cache.size(0), k_cache.size(1), kv_heads, d},
               "[blocks, block_size, kv_heads, D]");
  check_weight(v_cache, op, "v_cache", at::kFloat, k_cache.sizes().vec(), "k_cache's shape");
  check_weight(qkv, op, "qkv", at::kFloat, {n, (heads + 2 * kv_heads) * d}, "[N, (heads + 2 kv_heads) D]");
  for (const auto* t : {&cos, &sin})        // [N, D], or [N, 1, D] as RotaryEmbedding gives them: same bytes
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                      t->numel() == n * d && t->size(-1) == d, "minillm::rope_write_kv: cos and sin must be ",
                      "contiguous float32 [N, D] = [", n, ", ", d, "] on CPU, got ", t->sizes());
  check_weight(slots, op, "slots", at::kLong, {n}, "[N]");
  auto q = at::Tensor(at::detail::empty_cpu({n, heads, d}, at::kFloat));
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int failed = rope_write_kv_c(qkv.const_data_ptr<float>(), cos.const_data_ptr<float>(),
                                     sin.const_data_ptr<float>(), k_cache.mutable_data_ptr<float>(),
                                     v_cache.mutable_data_ptr<float>(), slots.const_data_ptr<int64_t>(), num_slots,
                                     n, heads, kv_heads, d, at::get_num_threads(), q.mutable_data_ptr<float>());
  TORCH_CHECK_INDEX(!failed, "minillm::rope_write_kv: a slot is outside the cache's ", num_slots, " slots");
  return q;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK_VALUE(gate_up.device().is_cpu() && gate_up.scalar_type() == at::kFloat && gate_up.dim() == 2 &&
                    gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "minillm::silu_mul: gate_up must be ",
                    "contiguous float32 [N, 2 I] on CPU, got ", gate_up.sizes());
  const int64_t n = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = empty(n, width);
  silu_mul_c(gate_up.const_data_ptr<float>(), n, width, at::get_num_threads(), out.mutable_data_ptr<float>());
  return out;
}

// ---- the table: op name, where its C function's address goes, how its wrapper is registered ----
struct Kernel {
  const char* op;
  void** c_function;
  void (*register_impl)(torch::Library&);
};
#define MINILLM_KERNEL(op) \
  Kernel{#op, reinterpret_cast<void**>(&op##_c), [](torch::Library& lib) { lib.impl(#op, TORCH_FN(op)); }}
const Kernel KERNELS[] = {
    MINILLM_KERNEL(panel_linear),
    MINILLM_KERNEL(int8_linear),
    MINILLM_KERNEL(int4_linear),
    MINILLM_KERNEL(w4a8_linear),
    MINILLM_KERNEL(paged_decode_attention),
    MINILLM_KERNEL(rms_norm),
    MINILLM_KERNEL(add_rms_norm),
    MINILLM_KERNEL(rope_write_kv),
    MINILLM_KERNEL(silu_mul),
};

std::mutex registering;
std::vector<std::unique_ptr<torch::Library>> registered;   // alive as long as the process: the impls stay

// Point op's wrapper at the C function at `address`, then (first time) make it minillm::<op>'s CPU kernel.
// Python defines minillm::<op> (its schema) before calling this; the dispatcher checks the wrapper's
// C++ signature against that schema here. False if this file has no wrapper for op.
bool set_kernel(const std::string& op, int64_t address) {
  std::lock_guard<std::mutex> lock(registering);
  for (const auto& kernel : KERNELS) {
    if (op != kernel.op) continue;
    TORCH_CHECK_VALUE(address != 0, "minillm_native::set_kernel: null address for ", op);
    const bool first = *kernel.c_function == nullptr;
    *kernel.c_function = reinterpret_cast<void*>(static_cast<intptr_t>(address));
    if (first) {
      auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "minillm", c10::DispatchKey::CPU,
                                                  __FILE__, __LINE__);
      kernel.register_impl(*lib);
      registered.push_back(std::move(lib));
    }
    return true;
  }
  return false;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minillm_native, m) {
  m.def("set_kernel(str op, int address) -> bool", &set_kernel);
}
