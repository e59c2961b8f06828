/// \file
/// \brief `cpu::reference_linear`: rows times a weight kept in its GGUF type, block by block.
///
/// The product `cpu::linear` computes, `out = x · Wᵀ` for a weight stored `[out, in]`, with `W` a
/// `GgmlMatrix` (F32, F16, BF16, Q8_0, Q4_0, Q4_1) read as the file stores it: each of its rows
/// decoded once (`GgmlMatrix::decode_row`, ggml's decoding), then each output summed in double
/// precision. It is the plain reference that the tuned products over quantized blocks are
/// tested against; checked in the tests on hand-built blocks whose products are known exactly,
/// on random and adversarial blocks, and on the real model's tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/ggml_matrix.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu {

/// `out = x · Wᵀ`, `W` the decoded `w`: out(r, o) = Σ_c W(o, c) · x(r, c), each product and the
/// sum in double precision, rounded to float once. The error against the exact sum of the
/// decoded weights' products is at most 2⁻²⁴ of the result plus cols · 2⁻⁵³ · Σ_c |W(o, c) x(r, c)|
/// (the products of two floats are exact in double; each of the cols − 1 additions rounds once).
/// \param x    [rows, in]
/// \param w    [out, in], any type that `GgmlMatrix` holds
/// \param out  [rows, out] (resized); must not be `x`
/// \throws InvalidArgument if `x.cols() != w.cols()` or `out` is `x`. Nothing is resized then.
inline void reference_linear(const RowMatrix<float>& x, const GgmlMatrix& w,
                             RowMatrix<float>& out) {
  constexpr const char* kWhere = "kvlab::cpu::reference_linear";
  kvlab::detail::require_equal(kWhere, "x.cols()", static_cast<long>(x.cols()),
                               static_cast<long>(w.cols()), "w.cols()");
  if (&out == &x) kvlab::detail::fail(kWhere, "out", "a matrix other than x", "x");
  out.resize(x.rows(), static_cast<Eigen::Index>(w.rows()));
  std::vector<float> weights(static_cast<std::size_t>(w.cols()));  // W's row o, decoded: [in]
  for (std::int64_t o = 0; o < w.rows(); ++o) {
    w.decode_row(o, weights.data());
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      double sum = 0.0;
      for (Eigen::Index c = 0; c < x.cols(); ++c) {
        sum += static_cast<double>(weights[static_cast<std::size_t>(c)]) *
               static_cast<double>(x(r, c));
      }
      out(r, static_cast<Eigen::Index>(o)) = static_cast<float>(sum);
    }
  }
}

}  // namespace kvlab::cpu
