// The KV block digest on the CPU (the definition: kernels/block_digest_ref.py), one block per
// task. The per-chunk terms are independent and summed mod 2^64, so the SIMD lanes and
// threads may add them in any order and still give the reference's bits.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

inline uint64_t key(uint64_t position) { return (position + 1) * kGamma; }

inline uint64_t term(uint64_t x, uint64_t key) {
  uint64_t z = x ^ key;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One segment of whole chunks; memcpy is an unaligned load, which x86 and ARM do at full speed.
uint64_t segment_sum(const uint8_t* seg, int64_t chunks, uint64_t first) {
  uint64_t acc = 0, k = key(first);
  // linear: the next chunk's key is this one's plus kGamma, an add where a multiply was
  // (a third of the vector multiplies per chunk)
#pragma omp simd reduction(+ : acc) linear(k : kGamma)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t x;
    std::memcpy(&x, seg + 8 * c, 8);
    acc += term(x, k);
    k += kGamma;
  }
  return acc;
}

// A row whose segments are not whole chunks: byte k of the row, in logical order, is byte
// k % seg_bytes of segment k / seg_bytes; the last chunk is zero-padded.
uint64_t row_sum_bytewise(const uint8_t* row, int64_t segments, int64_t seg_stride, int64_t seg_bytes,
                          uint64_t first) {
  const int64_t row_bytes = segments * seg_bytes, chunks = (row_bytes + 7) / 8;
  uint64_t acc = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t x = 0;
    for (int64_t t = 0; t < 8 && 8 * c + t < row_bytes; ++t) {
      const int64_t k = 8 * c + t;
      x |= static_cast<uint64_t>(row[(k / seg_bytes) * seg_stride + k % seg_bytes]) << (8 * t);
    }
    acc += term(x, key(first + static_cast<uint64_t>(c)));
  }
  return acc;
}

void prefetch(const uint8_t* piece, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(piece + line);
}

}  // namespace

torch::Tensor block_digest(torch::Tensor rows, torch::Tensor block_ids, torch::Tensor valid_rows) {
  check_tensor(rows, torch::kUInt8, "rows");
  check_tensor(block_ids, torch::kInt64, "block_ids");
  check_tensor(valid_rows, torch::kInt32, "valid_rows");
  TORCH_CHECK_VALUE(rows.dim() == 4 && (rows.size(3) <= 1 || rows.stride(3) == 1),
                    "rows must be a [num_blocks, rows, segments, segment_bytes] byte view with unit stride "
                    "in its last dim, got sizes ", rows.sizes(), " strides ", rows.strides());
  TORCH_CHECK_VALUE(block_ids.dim() == 1 && valid_rows.dim() == 1 && block_ids.size(0) == valid_rows.size(0),
                    "block_ids and valid_rows must be 1-D and the same length, got ", block_ids.sizes(), " and ",
                    valid_rows.sizes());
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the digest is defined on little-endian bytes");
  const int64_t n = block_ids.size(0), num_blocks = rows.size(0), per_block = rows.size(1);
  const int64_t segments = rows.size(2), seg_bytes = rows.size(3);
  block_ids = block_ids.contiguous();
  valid_rows = valid_rows.contiguous();
  const int64_t* ids = block_ids.data_ptr<int64_t>();
  const int32_t* valid = valid_rows.data_ptr<int32_t>();
  // every entry is checked before any block is read
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(ids[i] >= 0 && ids[i] < num_blocks, "block_ids[", i, "] = ", ids[i], " is out of range for ",
                      num_blocks, " blocks");
    TORCH_CHECK_VALUE(valid[i] >= 0 && valid[i] <= per_block, "valid_rows[", i, "] = ", valid[i], " is outside [0, ",
                      per_block, "] (rows per block) for block ", ids[i]);
  }
  auto out = torch::zeros({n}, torch::kUInt64);
  if (n == 0 || seg_bytes == 0) return out;
  uint64_t* digest = out.data_ptr<uint64_t>();
  const uint8_t* base = rows.data_ptr<uint8_t>();
  const int64_t sb = rows.stride(0), sr = rows.stride(1), ss = rows.stride(2);
  const bool whole_chunks = seg_bytes % 8 == 0;
  const int64_t row_chunks = (segments * seg_bytes + 7) / 8, seg_chunks = seg_bytes / 8;
  // a task should stream at least ~64 KiB, or threads cost more than they save
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, per_block * segments * seg_bytes));
  // the pieces (a row's segment) are walked in memory order, rows inside segments where the
  // segment stride is the larger (head-major blocks): the sum does not care about order, and a
  // strided walk ran ~3x slower here
  const bool rows_inner = segments > 1 && ss > sr;
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const uint8_t* block = base + ids[i] * sb;
      const int64_t v = valid[i], pieces = v * segments;
      uint64_t acc = 0;
      if (!whole_chunks) {
        for (int64_t r = 0; r < v; ++r)
          acc += row_sum_bytewise(block + r * sr, segments, ss, seg_bytes, static_cast<uint64_t>(r * row_chunks));
        digest[i] = acc;
        continue;
      }
      for (int64_t k = 0; k < pieces; ++k) {
        const int64_t r = rows_inner ? k % v : k / segments, s = rows_inner ? k / v : k % segments;
        // the next piece (or the next block's first) requested while this one is summed: the
        // hardware prefetcher stops at each 4 KiB page (1.1-1.4x single-threaded here)
        if (k + 1 < pieces) {
          const int64_t nr = rows_inner ? (k + 1) % v : (k + 1) / segments;
          const int64_t ns = rows_inner ? (k + 1) / v : (k + 1) % segments;
          prefetch(block + nr * sr + ns * ss, seg_bytes);
        } else if (i + 1 < hi && valid[i + 1] > 0) {
          prefetch(base + ids[i + 1] * sb, seg_bytes);
        }
        acc += segment_sum(block + r * sr + s * ss, seg_chunks, static_cast<uint64_t>(r * row_chunks + s * seg_chunks));
      }
      digest[i] = acc;
    }
  });
  return out;
}
