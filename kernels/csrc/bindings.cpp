// One Python module for the CPU kernels (kernels/cpu_extension.py loads it).
#include "cpu_kernels.h"

void check_tensor(const torch::Tensor& t, c10::ScalarType dtype, const char* name) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode,
        "decode attention over the unblocked slots of each row's pages; returns this call's rows: (plain, vector)");
  m.def("causal_prefill", &causal_prefill,
        "causal self-attention of packed sequences over their fresh K/V, each after its cached prefix pages "
        "where given; returns this call's rows: (plain, vector)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("starts"), py::arg("scale"), py::arg("out"),
        py::arg("vectorized"), py::arg("k_cache") = py::none(), py::arg("v_cache") = py::none(),
        py::arg("prefix_pages") = py::none(), py::arg("prefix_starts") = py::none());
  m.def("vectorized_for", &vectorized_for, "whether head_dim D takes this build's vector path");
  m.def("vector_isa", &vector_isa, "the vector path this build has: AVX-512, AVX2 or none");
  m.def("plan_tags", &plan_tags, "the decode step's I1 plan: pages, blocked slots, violations, foreign, empty rows");
  m.def("rms_norm", &rms_norm, "x * rsqrt(mean(x^2) + eps) * weight over the last dim, float32");
  m.def("block_digest", &block_digest, "64-bit digest of each block's first valid rows (kernels/block_digest_ref.py)");
  m.def("rope_", &rope_, "rotary embedding (rotate-half convention) applied in place");
}
