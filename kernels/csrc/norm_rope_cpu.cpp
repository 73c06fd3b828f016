// RMSNorm and RoPE for the CPU worker, each one pass over its rows.
//
// In eager torch each is five or six ops, ~5 us apiece on this machine class: at the copy
// model's size that overhead, not the arithmetic, is the cost (a decode step runs five norms
// and two RoPEs). Same formulas as engine/model/layers.py, in float32; the sums run in
// another order, so results differ from torch's in the last bits.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>

#include <cmath>

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_tensor(x, torch::kFloat32, "x");
  check_tensor(weight, torch::kFloat32, "weight");
  const int64_t C = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == C, "weight must be [", C, "], got ", weight.sizes());
  x = x.contiguous();
  weight = weight.contiguous();
  auto out = torch::empty_like(x);
  const int64_t rows = C ? x.numel() / C : 0;
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * C;
      float* o = op + r * C;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(C) + static_cast<float>(eps));
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (xr[c] * inv) * wp[c];
    }
  });
  return out;
}

// x [T, heads, D] with unit stride in D (a view into the fused qkv output is fine);
// cos/sin [T, D]. out[d] = x[d] cos[d] - x[d + D/2] sin[d] for d < D/2, and
// x[d] cos[d] + x[d - D/2] sin[d] above: HF's rotate_half.
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  check_tensor(x, torch::kFloat32, "x");
  check_tensor(cos, torch::kFloat32, "cos");
  check_tensor(sin, torch::kFloat32, "sin");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x must be [tokens, heads, head_dim] with unit stride in head_dim");
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  TORCH_CHECK(D % 2 == 0, "head_dim ", D, " must be even");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == T && cos.size(1) == D,
              "cos and sin must be [", T, ", ", D, "]");
  cos = cos.contiguous();
  sin = sin.contiguous();
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t st = x.stride(0), sh = x.stride(1);
  at::parallel_for(0, T, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* c = cp + t * D;
      const float* s = sp + t * D;
      for (int64_t h = 0; h < H; ++h) {
        float* a = xp + t * st + h * sh;
        float* b = a + half;
#pragma omp simd
        for (int64_t d = 0; d < half; ++d) {
          const float x1 = a[d], x2 = b[d];
          a[d] = x1 * c[d] - x2 * s[d];
          b[d] = x2 * c[half + d] + x1 * s[half + d];
        }
      }
    }
  });
}
