// Attention for the CPU worker: decode over the pool's pages in place, and prefill over a
// pass's own fresh K/V; both share one per-row routine (scores, softmax, weighted V sum).
//
// Decode: the torch reference (kernels/paged_attention_ref.py) gathers every page a step
// reads into a private copy, zeroes the blocked slots, then runs SDPA: the copy is written
// and read again in every layer. This reads each readable token's K and V once, in place, and
// never touches a blocked slot (another writer's, unwritten, or past the sequence), so a
// poisoned or foreign slot cannot reach the output even as 0 * NaN. Which slots are blocked
// is the plan's decision (invariant I1, decode_plan_cpu.cpp); this file only obeys it.
//
// Built with -march=native: on AVX-512 machines the scores and the V sum run on 16-float
// vectors, on AVX2 + FMA machines (AMD Zen, older Intel) on 8-float ones; elsewhere (or for a
// head_dim that is not a multiple of the vector) plain loops compute the same thing.
#include "cpu_kernels.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#define PW_VECTOR 16
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PW_VECTOR 8
#else
#define PW_VECTOR 0
#endif

namespace {

struct Row {               // one sequence and one KV head
  const float* q;          // [G, D]: the query heads that share this KV head
  const float* const* k;   // [n]: each readable token's K row
  const float* const* v;   // [n]: each readable token's V row
  int64_t n, G, D;
  float scale;
  float* out;              // [G, D]
};

void softmax_generic(float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) m = std::max(m, s[t]);
  float z = 0.f;
  for (int64_t t = 0; t < n; ++t) { s[t] = std::exp(s[t] - m); z += s[t]; }
  const float inv = 1.f / z;
  for (int64_t t = 0; t < n; ++t) s[t] *= inv;
}

void attend_generic(const Row& r, float* s) {
  for (int64_t g = 0; g < r.G; ++g) {
    const float* qg = r.q + g * r.D;
    float* sg = s + g * r.n;
    for (int64_t t = 0; t < r.n; ++t) {
      float dot = 0.f;
      for (int64_t d = 0; d < r.D; ++d) dot += qg[d] * r.k[t][d];
      sg[t] = dot * r.scale;
    }
    softmax_generic(sg, r.n);
    float* og = r.out + g * r.D;
    std::fill(og, og + r.D, 0.f);
    for (int64_t t = 0; t < r.n; ++t) {
      const float w = sg[t];
      for (int64_t d = 0; d < r.D; ++d) og[d] += w * r.v[t][d];
    }
  }
}

// the K rows of tokens t0 .. t0+N (fewer at the end: the rest repeat row t0, computed and
// never stored); returns how many are real
template <int N>
inline int64_t block_rows(const float* const* k, int64_t t0, int64_t n, const float** kp) {
  const int64_t m = std::min<int64_t>(N, n - t0);
  for (int j = 0; j < N; ++j) kp[j] = k[t0 + (j < m ? j : 0)];
  return m;
}

// The build's vector: the operations the exp and the weighted V sum need, on either ISA
#if PW_VECTOR == 16
struct Vec {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V round(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  using Mask = __mmask16;
  static Mask less(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  // p * 2^n, and 0 on the lanes of `zero`
  static V scale2_or_zero(V p, V n, Mask zero) { return _mm512_maskz_scalef_ps(~zero, p, n); }
};
#elif PW_VECTOR == 8
struct Vec {
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  using Mask = __m256;
  static Mask less(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  // p * 2^n, and 0 on the lanes of `zero`; n must lie in [-126, 127]: 2^n is then a normal
  // float, built in the exponent bits (field n + 127)
  static V scale2_or_zero(V p, V n, Mask zero) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
};
#endif

#if PW_VECTOR > 0
// exp(x) for x <= 0 (a softmax after its max): Cody-Waite reduction, degree-6 polynomial,
// relative error about 2e-7. x below -87.3 gives 0 (as expf's underflow does, to a float's
// eyes): the clamp keeps n in [-126, 0], where 2^n is a normal float. NaN stays NaN, so a NaN
// score (NaN in q or in a readable K) turns its row to NaN, as in the plain loops and the
// torch reference
inline Vec::V exp_le0(Vec::V x) {
  using V = Vec::V;
  const V lo = Vec::set1(-87.3f);
  const Vec::Mask under = Vec::less(x, lo);
  x = Vec::max(lo, x);  // operand order: a NaN x comes through (max_ps returns its second on NaN)
  const V n = Vec::round(Vec::mul(x, Vec::set1(1.44269504088896341f)));
  V r = Vec::fnmadd(n, Vec::set1(0.693359375f), x);
  r = Vec::fnmadd(n, Vec::set1(-2.12194440e-4f), r);
  V p = Vec::set1(1.9875691500e-4f);
  p = Vec::fmadd(p, r, Vec::set1(1.3981999507e-3f));
  p = Vec::fmadd(p, r, Vec::set1(8.3334519073e-3f));
  p = Vec::fmadd(p, r, Vec::set1(4.1665795894e-2f));
  p = Vec::fmadd(p, r, Vec::set1(1.6666665459e-1f));
  p = Vec::fmadd(p, r, Vec::set1(5.0000001201e-1f));
  p = Vec::fmadd(p, Vec::mul(r, r), Vec::add(r, Vec::set1(1.f)));
  return Vec::scale2_or_zero(p, n, under);
}

// out[g0 .. g0+HP) = sum_t p[g, t] v[t]: HP heads share each V load, CP vectors of D at a
// time, 16 (AVX-512) or 8 (AVX2) accumulators in registers
template <int HP>
void pv_heads(const Row& r, const float* s, int64_t g0) {
  using V = Vec::V;
  constexpr int W = Vec::W, CP = W / HP;
  const int64_t D = r.D, n = r.n, NC = D / W;
  for (int64_t c0 = 0; c0 < NC; c0 += CP) {
    const int64_t nc = std::min<int64_t>(CP, NC - c0);
    V acc[HP][CP];
    for (int h = 0; h < HP; ++h)
      for (int c = 0; c < CP; ++c) acc[h][c] = Vec::zero();
    for (int64_t t = 0; t < n; ++t) {
      const float* vt = r.v[t] + W * c0;
      V w[HP];
      for (int h = 0; h < HP; ++h) w[h] = Vec::set1(s[(g0 + h) * n + t]);
      if (nc == CP) {  // the usual case: a loop the compiler unrolls in full
        for (int c = 0; c < CP; ++c) {
          const V vv = Vec::load(vt + W * c);
          for (int h = 0; h < HP; ++h) acc[h][c] = Vec::fmadd(w[h], vv, acc[h][c]);
        }
      } else {
        for (int c = 0; c < nc; ++c) {
          const V vv = Vec::load(vt + W * c);
          for (int h = 0; h < HP; ++h) acc[h][c] = Vec::fmadd(w[h], vv, acc[h][c]);
        }
      }
    }
    for (int h = 0; h < HP; ++h)
      for (int c = 0; c < nc; ++c) Vec::store(r.out + (g0 + h) * D + W * (c0 + c), acc[h][c]);
  }
}

// every head's out from its softmaxed scores: 4 heads per V load, then 2, then 1
void weighted_v(const Row& r, const float* s) {
  int64_t g0 = 0;
  for (; g0 + 4 <= r.G; g0 += 4) pv_heads<4>(r, s, g0);
  for (; g0 + 2 <= r.G; g0 += 2) pv_heads<2>(r, s, g0);
  for (; g0 < r.G; ++g0) pv_heads<1>(r, s, g0);
}
#endif

#if PW_VECTOR == 16
void softmax_avx512(float* s, int64_t n) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  float m = _mm512_reduce_max_ps(mv);
  for (int64_t u = t; u < n; ++u) m = std::max(m, s[u]);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 zv = _mm512_setzero_ps();
  for (t = 0; t < n; t += 16) {
    const __mmask16 k = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_le0(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), mb)));
    _mm512_mask_storeu_ps(s + t, k, e);
    zv = _mm512_add_ps(zv, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(zv));
  for (t = 0; t < n; t += 16) {
    const __mmask16 k = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
    _mm512_mask_storeu_ps(s + t, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + t), inv));
  }
}

// 16 vectors -> one vector of their 16 horizontal sums (lane j = sum of a[j])
inline __m512 reduce16(__m512* a) {
  // pairwise: fold 16 -> 8 vectors keeping [a_even halves | a_odd halves] then repeat
  for (int w = 8; w >= 1; w >>= 1) {
    for (int i = 0; i < w; ++i) {
      __m512 x = a[2 * i], y = a[2 * i + 1];
      __m512 lo, hi;
      if (w == 8) {        // swap 256-bit halves
        lo = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0));
        hi = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2));
      } else if (w == 4) { // swap 128-bit lanes
        lo = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0));
        hi = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1));
      } else if (w == 2) { // swap 64-bit pairs within lanes
        lo = _mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0));
        hi = _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2));
      } else {             // swap single floats
        lo = _mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0));
        hi = _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1));
      }
      a[i] = _mm512_add_ps(lo, hi);
    }
  }
  // lane 4L+j now holds token 4j+L: put token t in lane t
  const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(idx, a[0]);
}


// one row: scores, softmax, then the weighted sum of V; s holds G * n floats after kScoreSlack
void attend_avx512(const Row& r, float* s) {
  const int64_t G = r.G, D = r.D, n = r.n, NC = D / 16;
  const __m512 sc = _mm512_set1_ps(r.scale);
  int64_t g = 0;
  for (; g + 2 <= G; g += 2) {  // two query heads per K load, 8 tokens at a time
    const float* q0 = r.q + g * D;
    const float* q1 = q0 + D;
    float* s0 = s + g * n;
    float* s1 = s0 + n;
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
      const float* kp[8];
      const int64_t m = block_rows<8>(r.k, t0, n, kp);
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t c = 0; c < NC; ++c) {
        const __m512 a0 = _mm512_loadu_ps(q0 + 16 * c), a1 = _mm512_loadu_ps(q1 + 16 * c);
        for (int j = 0; j < 8; ++j) {
          const __m512 kv = _mm512_loadu_ps(kp[j] + 16 * c);
          acc[j] = _mm512_fmadd_ps(a0, kv, acc[j]);
          acc[8 + j] = _mm512_fmadd_ps(a1, kv, acc[8 + j]);
        }
      }
      const __m512 sums = _mm512_mul_ps(reduce16(acc), sc);  // lanes 0-7: head g, 8-15: head g+1
      const __mmask16 keep = (__mmask16)((1u << m) - 1);
      _mm512_mask_storeu_ps(s0 + t0, keep, sums);
      _mm512_mask_storeu_ps(s1 + t0 - 8, (__mmask16)(keep << 8), sums);
    }
  }
  for (; g < G; ++g) {
    const float* qg = r.q + g * D;
    float* sg = s + g * n;
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      const float* kp[16];
      const int64_t m = block_rows<16>(r.k, t0, n, kp);
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t c = 0; c < NC; ++c) {
        const __m512 qc = _mm512_loadu_ps(qg + 16 * c);
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(kp[j] + 16 * c), acc[j]);
      }
      const __m512 sums = _mm512_mul_ps(reduce16(acc), sc);
      _mm512_mask_storeu_ps(sg + t0, m >= 16 ? 0xFFFF : (__mmask16)((1u << m) - 1), sums);
    }
  }
  for (int64_t g = 0; g < G; ++g) softmax_avx512(s + g * n, n);
  weighted_v(r, s);
}
#endif

#if PW_VECTOR == 8
inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// the last n % 8 floats of s go through the vector code in a padded copy (pad: the
// value that leaves a max or a sum unchanged)
void softmax_avx2(float* s, int64_t n) {
  const int64_t full = n - n % 8, tail = n - full;
  alignas(32) float last[8];
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < full; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
  float m = hmax8(mv);
  for (int64_t u = full; u < n; ++u) m = std::max(m, s[u]);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 zv = _mm256_setzero_ps();
  for (int64_t t = 0; t < full; t += 8) {
    const __m256 e = exp_le0(_mm256_sub_ps(_mm256_loadu_ps(s + t), mb));
    _mm256_storeu_ps(s + t, e);
    zv = _mm256_add_ps(zv, e);
  }
  if (tail) {
    for (int j = 0; j < 8; ++j) last[j] = j < tail ? s[full + j] : -std::numeric_limits<float>::infinity();
    const __m256 e = exp_le0(_mm256_sub_ps(_mm256_load_ps(last), mb));  // -inf - m: exp gives 0
    _mm256_store_ps(last, e);
    zv = _mm256_add_ps(zv, e);
    for (int j = 0; j < tail; ++j) s[full + j] = last[j];
  }
  const float inv = 1.f / hsum8(zv);
  const __m256 iv = _mm256_set1_ps(inv);
  for (int64_t t = 0; t < full; t += 8) _mm256_storeu_ps(s + t, _mm256_mul_ps(_mm256_loadu_ps(s + t), iv));
  for (int64_t u = full; u < n; ++u) s[u] *= inv;
}

// 8 vectors -> one vector of their 8 horizontal sums (lane j = sum of a[j])
inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // 128-bit halves: 0-3 | 4-7 of each
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// the scores of HH query heads (HH = 1 or 2) against 8 / HH tokens per block: each K load
// serves HH heads, 8 accumulators in registers
template <int HH>
void scores_avx2(const Row& r, float* s, int64_t g) {
  constexpr int TT = 8 / HH;
  const int64_t D = r.D, n = r.n, NC = D / 8;
  const __m256 sc = _mm256_set1_ps(r.scale);
  alignas(32) float sums[8];
  for (int64_t t0 = 0; t0 < n; t0 += TT) {
    const float* kp[TT];
    const int64_t m = block_rows<TT>(r.k, t0, n, kp);
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < NC; ++c) {
      __m256 qh[HH];
      for (int h = 0; h < HH; ++h) qh[h] = _mm256_loadu_ps(r.q + (g + h) * D + 8 * c);
      for (int j = 0; j < TT; ++j) {
        const __m256 kv = _mm256_loadu_ps(kp[j] + 8 * c);
        for (int h = 0; h < HH; ++h) acc[h * TT + j] = _mm256_fmadd_ps(qh[h], kv, acc[h * TT + j]);
      }
    }
    _mm256_store_ps(sums, _mm256_mul_ps(reduce8(acc), sc));  // lane h * TT + j: head g + h, token t0 + j
    for (int h = 0; h < HH; ++h)
      for (int j = 0; j < m; ++j) s[(g + h) * n + t0 + j] = sums[h * TT + j];
  }
}

// one row: scores, softmax, then the weighted sum of V
void attend_avx2(const Row& r, float* s) {
  const int64_t G = r.G, n = r.n;
  int64_t g = 0;
  for (; g + 2 <= G; g += 2) scores_avx2<2>(r, s, g);
  for (; g < G; ++g) scores_avx2<1>(r, s, g);
  for (int64_t h = 0; h < G; ++h) softmax_avx2(s + h * n, n);
  weighted_v(r, s);
}
#endif

// one row on the path this build and head_dim allow; s: the row's G * n scores, after
// kScoreSlack floats that the AVX-512 path's masked stores may address but never write
constexpr int64_t kScoreSlack = 16;

#if PW_VECTOR == 16
// A block of query rows that read the same keys (a prefill's query tokens of one sequence and
// KV head, each with its G query heads), as two small matrix products instead of row by row:
// every K and V load then serves many rows. Row r sees keys 0 .. len[r] - 1.
struct Block {
  const float* const* q;    // [R]: each row's query, D floats
  float* const* out;        // [R]: each row's output, D floats
  const int64_t* len;       // [R]: keys each row reads, 1 .. L
  int64_t R;
  const float* const* k;    // [L]: each key's K row
  const float* const* v;    // [L]: each key's V row
  int64_t L, D;
  float scale;
};

constexpr int kKeys = 32;  // keys per score tile: two vectors
constexpr int kRows = 12;  // rows per score tile: 24 accumulators

// s[r][t0 .. t0 + 32) = scale * q[r] . K^T[:, t0 .. t0 + 32) for RB rows; kt: K transposed in
// tiles of 32 keys, [Lp / 32][D][32] (a tile is one contiguous run); qt: the RB rows' queries
// transposed, [D][RB] (one base register for every broadcast)
template <int RB>
void score_tile(const float* qt, const float* kt, int64_t Lp, int64_t D, int64_t t0, float scale, float* s) {
  __m512 acc[RB][2];
  for (int r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* tile = kt + t0 * D;  // (t0 / 32) * D * 32
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = tile + d * kKeys;
    const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16);
    const float* qd = qt + d * RB;
    for (int r = 0; r < RB; ++r) {
      const __m512 qv = _mm512_set1_ps(qd[r]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < RB; ++r) {
    _mm512_storeu_ps(s + r * Lp + t0, _mm512_mul_ps(acc[r][0], sc));
    _mm512_storeu_ps(s + r * Lp + t0 + 16, _mm512_mul_ps(acc[r][1], sc));
  }
}

template <int RB>
void score_rows(const Block& b, int64_t r0, const float* kt, int64_t Lp, int64_t upto, float* qt, float* s) {
  for (int64_t d = 0; d < b.D; ++d)
    for (int r = 0; r < RB; ++r) qt[d * RB + r] = b.q[r0 + r][d];
  for (int64_t t0 = 0; t0 < upto; t0 += kKeys) score_tile<RB>(qt, kt, Lp, b.D, t0, b.scale, s + r0 * Lp);
}

// out[r] = sum_t p[r][t] v[t] for RB rows, CP vectors of D from c0 on, over keys 0 .. n
template <int RB, int CP>
void pv_tile(const Block& b, int64_t r0, const float* p, int64_t Lp, int64_t n, int64_t c0) {
  __m512 acc[RB][CP];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CP; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const float* vt = b.v[t] + 16 * c0;
    __m512 w[RB];
    for (int r = 0; r < RB; ++r) w[r] = _mm512_set1_ps(p[(r0 + r) * Lp + t]);
    for (int c = 0; c < CP; ++c) {
      const __m512 vv = _mm512_loadu_ps(vt + 16 * c);
      for (int r = 0; r < RB; ++r) acc[r][c] = _mm512_fmadd_ps(w[r], vv, acc[r][c]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CP; ++c) _mm512_storeu_ps(b.out[r0 + r] + 16 * (c0 + c), acc[r][c]);
}

template <int RB>
void pv_rows(const Block& b, int64_t r0, const float* p, int64_t Lp, int64_t n) {
  const int64_t NC = b.D / 16;
  int64_t c0 = 0;
  for (; c0 + 8 <= NC; c0 += 8) pv_tile<RB, 8>(b, r0, p, Lp, n, c0);
  if (c0 + 4 <= NC) { pv_tile<RB, 4>(b, r0, p, Lp, n, c0); c0 += 4; }
  if (c0 + 2 <= NC) { pv_tile<RB, 2>(b, r0, p, Lp, n, c0); c0 += 2; }
  if (c0 < NC) pv_tile<RB, 1>(b, r0, p, Lp, n, c0);
}

// K is transposed once for all the block's rows; scores, softmax and the weighted V sum then go
// a pass of `pass` rows at a time (their scores stay in cache). kt and s: scratch, resized here
void attend_block_avx512(const Block& b, int64_t pass, std::vector<float>& kt, std::vector<float>& s) {
  const int64_t L = b.L, D = b.D, Lp = (L + kKeys - 1) / kKeys * kKeys;
  kt.resize(D * Lp + D * kRows);  // K^T, then the queries of one tile transposed
  float* qt = kt.data() + D * Lp;
  s.resize(std::min(pass, b.R) * Lp);
  for (int64_t t = 0; t < Lp; ++t) {  // K^T by tiles of 32 keys, zero past the last key
    float* column = kt.data() + (t / kKeys) * D * kKeys + t % kKeys;
    if (t < L) {
      const float* kr = b.k[t];
      for (int64_t d = 0; d < D; ++d) column[d * kKeys] = kr[d];
    } else {
      for (int64_t d = 0; d < D; ++d) column[d * kKeys] = 0.f;
    }
  }
  for (int64_t p0 = 0; p0 < b.R; p0 += pass) {
    const Block part{b.q + p0, b.out + p0, b.len + p0, std::min(pass, b.R - p0), b.k, b.v, L, D, b.scale};
    // scores, a tile of rows at a time, over the keys the longest of them reads
    for (int64_t r0 = 0; r0 < part.R; r0 += kRows) {
      const int64_t rb = std::min<int64_t>(kRows, part.R - r0);
      int64_t upto = 0;
      for (int64_t r = r0; r < r0 + rb; ++r) upto = std::max(upto, part.len[r]);
      switch (rb) {
        case 12: score_rows<12>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 11: score_rows<11>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 10: score_rows<10>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 9: score_rows<9>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 8: score_rows<8>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 7: score_rows<7>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 6: score_rows<6>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 5: score_rows<5>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 4: score_rows<4>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 3: score_rows<3>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        case 2: score_rows<2>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
        default: score_rows<1>(part, r0, kt.data(), Lp, upto, qt, s.data()); break;
      }
    }
    // each row's softmax over the keys it reads; zero weight on the rest up to the padded width
    for (int64_t r = 0; r < part.R; ++r) {
      float* row = s.data() + r * Lp;
      softmax_avx512(row, part.len[r]);
      std::fill(row + part.len[r], row + Lp, 0.f);
    }
    int64_t r0 = 0;
    for (; r0 + 3 <= part.R; r0 += 3)
      pv_rows<3>(part, r0, s.data(), Lp, std::max({part.len[r0], part.len[r0 + 1], part.len[r0 + 2]}));
    for (; r0 < part.R; ++r0) pv_rows<1>(part, r0, s.data(), Lp, part.len[r0]);
  }
}
#endif

// returns whether the vector path ran (false: the plain loops)
bool attend_row(const Row& r, float* s, bool vectorized) {
#if PW_VECTOR == 16
  if (vectorized) {
    attend_avx512(r, s);
    return true;
  }
#elif PW_VECTOR == 8
  if (vectorized) {
    attend_avx2(r, s);
    return true;
  }
#endif
  (void)vectorized;
  attend_generic(r, s);
  return false;
}

// one call's rows, [plain loops, vector path]: each parallel chunk adds its count once
struct PathCount {
  std::atomic<int64_t> rows[2] = {0, 0};

  void add(const int64_t (&chunk)[2]) {
    for (int p = 0; p < 2; ++p)
      if (chunk[p]) rows[p].fetch_add(chunk[p], std::memory_order_relaxed);
  }
  PathRows result() const { return {rows[0].load(std::memory_order_relaxed), rows[1].load(std::memory_order_relaxed)}; }
};

}  // namespace

bool vectorized_for(int64_t D) {
  return PW_VECTOR > 0 && D % (PW_VECTOR > 0 ? PW_VECTOR : 1) == 0;
}

std::string vector_isa() {
  return PW_VECTOR == 16 ? "AVX-512" : PW_VECTOR == 8 ? "AVX2" : "";
}

// out[b, h] = softmax(scale * q[b, h] . K[t]) V[t] over the tokens t of row b that blocked
// leaves readable; a row with none is zero. k_cache/v_cache: [pages, page_size, kv_heads, D]
// with unit stride in D (the pool's per-layer views are strided over pages). vectorized=false
// forces the plain loop (tests compare both). Returns the rows this call attended on each path,
// (plain loops, vector path): what ran, where vectorized_for() only says what should.
PathRows paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor pages,
                      torch::Tensor blocked, double scale, torch::Tensor out, bool vectorized) {
  check_tensor(q, torch::kFloat32, "q");
  check_tensor(k_cache, torch::kFloat32, "k_cache");
  check_tensor(v_cache, torch::kFloat32, "v_cache");
  check_tensor(pages, torch::kInt64, "pages");
  check_tensor(blocked, torch::kBool, "blocked");
  check_tensor(out, torch::kFloat32, "out");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && out.is_contiguous() && out.sizes() == q.sizes(),
              "q and out must be contiguous [batch, heads, head_dim] of one shape");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides(),
              "k_cache and v_cache must be [pages, page_size, kv_heads, head_dim] with the same strides");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t num_pages = k_cache.size(0), PS = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && k_cache.stride(3) == 1, "k_cache must have head_dim ", D, " at unit stride");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "query heads ", H, " are not a multiple of kv heads ", KVH);
  TORCH_CHECK(pages.dim() == 2 && pages.size(0) == B && pages.is_contiguous(), "pages must be contiguous [", B, ", P]");
  const int64_t P = pages.size(1), T = P * PS, G = H / KVH;
  TORCH_CHECK(blocked.dim() == 2 && blocked.size(0) == B && blocked.size(1) == T && blocked.is_contiguous(),
              "blocked must be contiguous [", B, ", ", T, "]");
  vectorized = vectorized && vectorized_for(D);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* pg = pages.data_ptr<int64_t>();
  const bool* bl = blocked.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  for (int64_t i = 0; i < B * T; ++i) {  // every page a readable token names lies in the pool
    if (bl[i]) continue;
    const int64_t page = pg[(i / T) * P + (i % T) / PS];
    TORCH_CHECK(page >= 0 && page < num_pages, "page ", page, " is outside the pool of ", num_pages, " pages");
  }
  const int64_t page_stride = k_cache.stride(0), tok_stride = k_cache.stride(1), head_stride = k_cache.stride(2);
  PathCount count;
  at::parallel_for(0, B * KVH, 1, [&](int64_t lo, int64_t hi) {
    std::vector<const float*> kptr(T), vptr(T);
    std::vector<float> scores(kScoreSlack + G * T);
    int64_t rows[2] = {0, 0};
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t b = job / KVH, h = job % KVH;
      const bool* blk = bl + b * T;
      int64_t n = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (blk[t]) continue;
        const int64_t off = pg[b * P + t / PS] * page_stride + (t % PS) * tok_stride + h * head_stride;
        kptr[n] = kp + off;
        vptr[n] = vp + off;
        ++n;
      }
      float* o = op + (b * H + h * G) * D;
      if (n == 0) {
        std::fill(o, o + G * D, 0.f);
        continue;
      }
      const Row r{qp + (b * H + h * G) * D, kptr.data(), vptr.data(), n, G, D, static_cast<float>(scale), o};
      ++rows[attend_row(r, scores.data() + kScoreSlack, vectorized)];
    }
    count.add(rows);
  });
  return count.result();
}

// Causal self-attention of a prefill pass over its own fresh K/V: query token i of a
// sequence attends tokens start..i of that sequence, with the same per-row code as decode.
// q [T, H, D], k/v [T, KVH, D], each with unit stride in D; starts [S + 1] int64, the packed
// sequences' bounds; out [T, H, D] contiguous. Work goes out in blocks of 16 query tokens
// per sequence and KV head. Each query re-reads its keys, O(n^2) reads per sequence: the
// caller keeps long sequences on SDPA, whose blocked loops read K once per query block.
//
// A sequence may start after a cached prefix of whole pages already in the pool (the prefix
// cache): prefix_pages lists them, sequence s owning prefix_pages[prefix_starts[s] ..
// prefix_starts[s + 1]), and k_cache/v_cache are the layer's [pages, page_size, KVH, D] views.
// Its queries then attend every prefix token first, then their own suffix causally. The
// caller has checked those pages against I1 (their tags and prefix keys) before this reads them.
// Returns the rows attended on each path, as paged_decode does.
PathRows causal_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor starts, double scale,
                        torch::Tensor out, bool vectorized, c10::optional<torch::Tensor> k_cache,
                        c10::optional<torch::Tensor> v_cache, c10::optional<torch::Tensor> prefix_pages,
                        c10::optional<torch::Tensor> prefix_starts) {
  check_tensor(q, torch::kFloat32, "q");
  check_tensor(k, torch::kFloat32, "k");
  check_tensor(v, torch::kFloat32, "v");
  check_tensor(starts, torch::kInt64, "starts");
  check_tensor(out, torch::kFloat32, "out");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes() && k.strides() == v.strides(),
              "q must be [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim] with one stride");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k.size(1);
  TORCH_CHECK(k.size(0) == T && k.size(2) == D && KVH > 0 && H % KVH == 0, "q ", q.sizes(), " and k ", k.sizes(),
              " do not fit");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == D && k.stride(2) == 1,
              "head_dim must be at unit stride and q's heads packed");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes(), "out must be contiguous like q");
  TORCH_CHECK(starts.dim() == 1 && starts.is_contiguous() && starts.numel() >= 1, "starts must be [sequences + 1]");
  const int64_t S = starts.numel() - 1, G = H / KVH;
  const int64_t* st = starts.data_ptr<int64_t>();
  TORCH_CHECK(st[0] == 0 && st[S] == T, "starts must run from 0 to ", T);
  for (int64_t s = 0; s < S; ++s) TORCH_CHECK(st[s] <= st[s + 1], "starts must not decrease");
  const bool prefixed = prefix_pages.has_value();
  TORCH_CHECK(prefixed == prefix_starts.has_value() && prefixed == k_cache.has_value() &&
              prefixed == v_cache.has_value(), "a cached prefix needs k_cache, v_cache, prefix_pages and prefix_starts");
  const float *kc = nullptr, *vc = nullptr;
  const int64_t *pp = nullptr, *pst = nullptr;
  int64_t PS = 0, page_stride = 0, tok_stride = 0, head_stride = 0;
  if (prefixed) {
    check_tensor(*k_cache, torch::kFloat32, "k_cache");
    check_tensor(*v_cache, torch::kFloat32, "v_cache");
    check_tensor(*prefix_pages, torch::kInt64, "prefix_pages");
    check_tensor(*prefix_starts, torch::kInt64, "prefix_starts");
    TORCH_CHECK(k_cache->dim() == 4 && k_cache->sizes() == v_cache->sizes() &&
                k_cache->strides() == v_cache->strides(),
                "k_cache and v_cache must be [pages, page_size, kv_heads, head_dim] with the same strides");
    TORCH_CHECK(k_cache->size(2) == KVH && k_cache->size(3) == D && k_cache->stride(3) == 1,
                "k_cache must have ", KVH, " kv heads of head_dim ", D, " at unit stride");
    TORCH_CHECK(prefix_starts->dim() == 1 && prefix_starts->is_contiguous() && prefix_starts->numel() == S + 1,
                "prefix_starts must be [", S + 1, "]");
    TORCH_CHECK(prefix_pages->dim() == 1 && prefix_pages->is_contiguous(), "prefix_pages must be contiguous [N]");
    pst = prefix_starts->data_ptr<int64_t>();
    pp = prefix_pages->data_ptr<int64_t>();
    TORCH_CHECK(pst[0] == 0 && pst[S] == prefix_pages->numel(), "prefix_starts must run from 0 to ",
                prefix_pages->numel());
    for (int64_t s = 0; s < S; ++s) TORCH_CHECK(pst[s] <= pst[s + 1], "prefix_starts must not decrease");
    const int64_t num_pages = k_cache->size(0);
    for (int64_t i = 0; i < prefix_pages->numel(); ++i)
      TORCH_CHECK(pp[i] >= 0 && pp[i] < num_pages, "prefix page ", pp[i], " is outside the pool of ", num_pages,
                  " pages");
    kc = k_cache->data_ptr<float>();
    vc = v_cache->data_ptr<float>();
    PS = k_cache->size(1);
    page_stride = k_cache->stride(0);
    tok_stride = k_cache->stride(1);
    head_stride = k_cache->stride(2);
  }
  vectorized = vectorized && vectorized_for(D);
  // query tokens per job: the AVX-512 path transposes a job's keys once and goes through its
  // rows 16 tokens at a time, so it takes more of them per job
  const int64_t block = PW_VECTOR == 16 && vectorized ? 64 : 16;
  struct Job { int64_t seq, head, first, last; };
  std::vector<Job> jobs;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < KVH; ++h)
      for (int64_t i = st[s]; i < st[s + 1]; i += block) jobs.push_back({s, h, i, std::min(i + block, st[s + 1])});
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs = q.stride(0), ks = k.stride(0), kh = k.stride(1);
  // Causal jobs differ in cost (a late block of a long sequence reads every key before it), and
  // at::parallel_for hands each thread one contiguous run of its range: so each thread gets a
  // share of jobs balanced by cost (the costliest first, each to the least loaded share).
  auto cached_of = [&](int64_t seq) -> int64_t { return prefixed ? (pst[seq + 1] - pst[seq]) * PS : 0; };
  auto cost = [&](const Job& job) { return (job.last - job.first) * (cached_of(job.seq) + job.last - st[job.seq]); };
  const int64_t shares = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), jobs.size()));
  std::vector<std::vector<int64_t>> share(shares);
  {
    std::vector<int64_t> order(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) order[j] = static_cast<int64_t>(j);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost(jobs[a]) > cost(jobs[b]); });
    std::vector<int64_t> load(shares, 0);
    for (int64_t j : order) {
      const int64_t least = std::min_element(load.begin(), load.end()) - load.begin();
      share[least].push_back(j);
      load[least] += cost(jobs[j]);
    }
  }
  PathCount count;
  at::parallel_for(0, shares, 1, [&](int64_t lo, int64_t hi) {
    std::vector<const float*> kptr, vptr;
    std::vector<float> scores;
#if PW_VECTOR == 16
    std::vector<float> kt;
    std::vector<const float*> qrows;
    std::vector<float*> orows;
    std::vector<int64_t> lens;
#endif
    int64_t rows[2] = {0, 0};
    for (int64_t c = lo; c < hi; ++c)
    for (int64_t j : share[c]) {
      const Job& job = jobs[j];
      const int64_t start = st[job.seq], n_max = job.last - start;
      const int64_t cached = cached_of(job.seq);
      kptr.resize(cached + n_max);
      vptr.resize(cached + n_max);
      for (int64_t t = 0; t < cached; ++t) {
        const int64_t off = pp[pst[job.seq] + t / PS] * page_stride + (t % PS) * tok_stride + job.head * head_stride;
        kptr[t] = kc + off;
        vptr[t] = vc + off;
      }
      for (int64_t t = 0; t < n_max; ++t) {
        kptr[cached + t] = kp + (start + t) * ks + job.head * kh;
        vptr[cached + t] = vp + (start + t) * ks + job.head * kh;
      }
#if PW_VECTOR == 16
      if (vectorized) {  // the block's rows: each query token's G heads, as two small matrix products
        const int64_t R = (job.last - job.first) * G;
        qrows.resize(R);
        orows.resize(R);
        lens.resize(R);
        for (int64_t i = job.first; i < job.last; ++i)
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = (i - job.first) * G + g;
            qrows[r] = qp + i * qs + (job.head * G + g) * D;
            orows[r] = op + (i * H + job.head * G + g) * D;
            lens[r] = cached + i - start + 1;
          }
        const Block b{qrows.data(), orows.data(), lens.data(), R, kptr.data(), vptr.data(), cached + n_max, D,
                      static_cast<float>(scale)};
        attend_block_avx512(b, 16 * G, kt, scores);
        rows[1] += job.last - job.first;
        continue;
      }
#endif
      scores.resize(kScoreSlack + G * (cached + n_max));
      for (int64_t i = job.first; i < job.last; ++i) {
        const Row r{qp + i * qs + job.head * G * D, kptr.data(), vptr.data(), cached + i - start + 1, G, D,
                    static_cast<float>(scale), op + (i * H + job.head * G) * D};
        ++rows[attend_row(r, scores.data() + kScoreSlack, vectorized)];
      }
    }
    count.add(rows);
  });
  return count.result();
}
