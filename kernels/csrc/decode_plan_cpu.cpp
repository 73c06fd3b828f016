// The decode step's I1 plan for the CPU worker: which token slots each row may read.
//
// The same rule as kernels/paged_attention_ref.py's plan_decode, which stays the oracle (the
// tests compare the two on random tables, tags and corruptions): a slot row b needs is
// readable only if the reader itself wrote it in the epoch of its grant (its writer tag
// equals the row's expected tag for that page column). A needed slot with another tag is
// foreign; one that nobody wrote since its scrub (NO_WRITER) is unwritten; both are counted,
// and masked unless mask_foreign is off (the detector without the defence). A page shared
// through the prefix cache is readable only when its prefix key (page_keys[page]) equals the
// key the row computed from its own tokens and salt (expected_keys[b, j]); empty key tensors
// mean no page is keyed. In torch that is about twenty small ops per step; here it is one
// pass over the slots the step needs.
#include "cpu_kernels.h"

#include <algorithm>

namespace {
constexpr int64_t NO_WRITER = -1;  // engine.wire.page_tags.NO_WRITER (a test checks they agree)
}

std::vector<torch::Tensor> plan_tags(torch::Tensor block_table, torch::Tensor expected, torch::Tensor seq_lens,
                                     torch::Tensor token_writer, int64_t num_pages_seq, bool check_tags,
                                     bool mask_foreign, torch::Tensor page_keys, torch::Tensor expected_keys) {
  TORCH_CHECK(block_table.device().is_cpu() && seq_lens.device().is_cpu(),
              "block_table and seq_lens must be on the CPU");
  block_table = block_table.to(torch::kInt64).contiguous();
  seq_lens = seq_lens.to(torch::kInt64).contiguous();
  expected = expected.to(torch::kInt64).contiguous();
  check_tensor(expected, torch::kInt64, "expected_tags");
  check_tensor(token_writer, torch::kInt64, "token_writer");
  TORCH_CHECK(token_writer.dim() == 2, "token_writer must be [pages, page_size]");
  token_writer = token_writer.contiguous();
  const int64_t B = block_table.size(0), W = block_table.size(1);
  const int64_t num_pages = token_writer.size(0), PS = token_writer.size(1), P = num_pages_seq, T = P * PS;
  TORCH_CHECK(P <= W, "the step needs ", P, " pages per row but block_table has ", W);
  TORCH_CHECK(expected.sizes() == block_table.sizes(), "expected_tags must match block_table");
  TORCH_CHECK(seq_lens.numel() == B, "seq_lens must be [", B, "]");
  const bool keyed = page_keys.numel() > 0;
  if (keyed) {
    check_tensor(page_keys, torch::kInt64, "page_keys");
    check_tensor(expected_keys, torch::kInt64, "expected_keys");
    page_keys = page_keys.contiguous();
    expected_keys = expected_keys.contiguous();
    TORCH_CHECK(page_keys.numel() == num_pages, "page_keys must be [", num_pages, "]");
    TORCH_CHECK(expected_keys.sizes() == block_table.sizes(), "expected_keys must match block_table");
  }
  const int64_t* pk = keyed ? page_keys.data_ptr<int64_t>() : nullptr;
  const int64_t* ek = keyed ? expected_keys.data_ptr<int64_t>() : nullptr;
  auto pages = torch::zeros({B, P}, torch::kInt64);
  auto blocked = torch::empty({B, T}, torch::kBool);
  auto violations = torch::zeros({B, 2}, torch::kInt32);
  auto foreign = check_tags ? torch::zeros({B, T}, torch::kBool) : torch::Tensor();
  auto empty = torch::empty({B}, torch::kBool);
  const int64_t* bt = block_table.data_ptr<int64_t>();
  const int64_t* ex = expected.data_ptr<int64_t>();
  const int64_t* sl = seq_lens.data_ptr<int64_t>();
  const int64_t* tw = token_writer.data_ptr<int64_t>();
  int64_t* pg = pages.data_ptr<int64_t>();
  bool* bl = blocked.data_ptr<bool>();
  int32_t* vi = violations.data_ptr<int32_t>();
  bool* fo = check_tags ? foreign.data_ptr<bool>() : nullptr;
  bool* em = empty.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b) {
    int32_t n_foreign = 0, n_unwritten = 0;
    bool any = false;
    for (int64_t j = 0; j < P; ++j) {
      const int64_t needed = std::clamp<int64_t>(sl[b] - j * PS, 0, PS);
      const int64_t page = needed > 0 ? bt[b * W + j] : 0;  // padding may hold garbage: never used
      TORCH_CHECK(page >= 0 && page < num_pages, "row ", b, " names page ", page, " outside the pool of ", num_pages,
                  " pages");
      pg[b * P + j] = page;
      const int64_t* tags = tw + page * PS;
      const int64_t mine_tag = ex[b * W + j];
      const bool key_ok = !keyed || pk[page] == ek[b * W + j];
      for (int64_t s = 0; s < PS; ++s) {
        const int64_t t = j * PS + s;
        bool attend = s < needed;
        if (attend && check_tags && (tags[s] != mine_tag || !key_ok)) {
          const bool unwritten = tags[s] == NO_WRITER;
          n_unwritten += unwritten;
          n_foreign += !unwritten;
          fo[b * T + t] = !unwritten;
          attend = !mask_foreign;
        }
        bl[b * T + t] = !attend;
        any = any || attend;
      }
    }
    vi[b * 2] = n_foreign;
    vi[b * 2 + 1] = n_unwritten;
    em[b] = !any;
  }
  return {pages, blocked, violations, check_tags ? foreign : torch::Tensor(), empty};
}
