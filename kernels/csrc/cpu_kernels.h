// The CPU kernels of kernels/csrc, one extension module (kernels/cpu_extension.py builds it).
#pragma once
#include <torch/extension.h>

#include <string>
#include <utility>
#include <vector>

// attention_cpu.cpp
using PathRows = std::pair<int64_t, int64_t>;  // one call's rows: (plain loops, vector path)
bool vectorized_for(int64_t head_dim);
std::string vector_isa();  // "AVX-512", "AVX2" or "" (plain loops only)
PathRows paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor pages,
                      torch::Tensor blocked, double scale, torch::Tensor out, bool vectorized);
PathRows causal_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor starts, double scale,
                        torch::Tensor out, bool vectorized, c10::optional<torch::Tensor> k_cache,
                        c10::optional<torch::Tensor> v_cache, c10::optional<torch::Tensor> prefix_pages,
                        c10::optional<torch::Tensor> prefix_starts);

// norm_rope_cpu.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);

// decode_plan_cpu.cpp: (pages, blocked, violations, foreign or undefined, empty rows)
std::vector<torch::Tensor> plan_tags(torch::Tensor block_table, torch::Tensor expected, torch::Tensor seq_lens,
                                     torch::Tensor token_writer, int64_t num_pages_seq, bool check_tags,
                                     bool mask_foreign, torch::Tensor page_keys, torch::Tensor expected_keys);

// block_digest_cpu.cpp: uint64 [n], one digest per block of rows (a uint8 [blocks, rows, segments, bytes] view)
torch::Tensor block_digest(torch::Tensor rows, torch::Tensor block_ids, torch::Tensor valid_rows);

// bindings.cpp: a tensor's dtype and device, named in the error when they are wrong
void check_tensor(const torch::Tensor& t, c10::ScalarType dtype, const char* name);
