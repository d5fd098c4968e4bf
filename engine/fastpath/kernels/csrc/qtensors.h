// Tensor-level entry points (ops.cpp), shared with the Python bindings (decode.cpp).
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include "qkernels.h"

namespace opscope {

// Checks quantized tensors against K and wraps their pointers (the caller keeps the tensors alive):
// SoA qs/d/m for qtype 0/1, raw blocks qs [N, row_bytes] (d, m absent) for QTYPE_RAW + ggml type.
Weights make_weights(int64_t qtype, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                     const c10::optional<at::Tensor>& m, int64_t K);

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                   const c10::optional<at::Tensor>& m, int64_t qtype, int64_t act_mode,
                   int64_t gemm_min_rows, c10::ScalarType gemm_dtype);

at::Tensor dequantize(const at::Tensor& qs, const c10::optional<at::Tensor>& d, const c10::optional<at::Tensor>& m,
                      int64_t qtype, int64_t K, c10::ScalarType dtype);

at::Tensor dequantize_scalar(const at::Tensor& qs, int64_t qtype, int64_t K);

at::Tensor qembedding(const at::Tensor& idx, const at::Tensor& qs, const c10::optional<at::Tensor>& d,
                      const c10::optional<at::Tensor>& m, int64_t qtype, int64_t K);

std::vector<int64_t> pin_threads(std::vector<int64_t> cpus);

}  // namespace opscope
