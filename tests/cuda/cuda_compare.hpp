// What the CUDA tests share: the per-element tolerance rule with its tolerances per storage
// type, values rounded through a storage type, and device copies of host test data.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../names_matcher.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/cuda/numeric.cuh"
#include "kvlab/matrix.hpp"

namespace kvlab_test {

/// Tolerances of `check_close` per storage type. The CPU reference runs in float on the very
/// values the GPU stores (rounded to T first), so the two differ by (1) the order of fp32
/// additions and the exp implementations: ~1e-6 relative, and (2) for fp16/bf16, the rounding
/// of the GPU's output to T: at most 2^-11 (fp16) or 2^-8 (bf16) relative.
///  - fp32: rtol 1e-5, atol 1e-6;
///  - fp16, bf16: rtol 1e-2, atol 1e-4.
template <typename T>
struct Tolerance {
  static constexpr double rtol = 1e-2;  ///< relative
  static constexpr double atol = 1e-4;  ///< absolute
};
/// fp32: rounding only.
template <>
struct Tolerance<float> {
  static constexpr double rtol = 1e-5;  ///< relative
  static constexpr double atol = 1e-6;  ///< absolute
};

/// Checks every element: |got - want| <= atol + rtol * magnitude (no NaN allowed anywhere), where
/// `magnitude` is the size the rounding error of that element scales with: |want| for most
/// results, but Σ_k |x_k w_k| for a dot product whose terms cancel (its result can be far
/// smaller than its rounding). On failure reports how many elements fail and the first one.
inline void check_close(const kvlab::RowMatrix<float>& got, const kvlab::RowMatrix<float>& want,
                        const kvlab::RowMatrix<float>& magnitude, double rtol, double atol) {
  REQUIRE(got.rows() == want.rows());
  REQUIRE(got.cols() == want.cols());
  REQUIRE(magnitude.rows() == want.rows());
  REQUIRE(magnitude.cols() == want.cols());
  long bad = 0;
  std::string first;
  double worst = 0;  // largest |diff| / (atol + rtol · magnitude)
  for (Eigen::Index r = 0; r < want.rows(); ++r)
    for (Eigen::Index c = 0; c < want.cols(); ++c) {
      const double g = got(r, c), w = want(r, c);
      const double allowed = atol + rtol * std::abs(static_cast<double>(magnitude(r, c)));
      const double diff = std::abs(g - w);
      if (!(diff <= allowed)) {  // NaN fails too
        if (bad++ == 0) {
          char text[160];
          std::snprintf(text, sizeof text, "(%ld, %ld): got %.8g, want %.8g", static_cast<long>(r),
                        static_cast<long>(c), g, w);
          first = text;
        }
      }
      if (std::isfinite(diff)) worst = std::max(worst, diff / allowed);
    }
  INFO("elements outside atol + rtol*|ref| (rtol " << rtol << ", atol " << atol << "): " << bad
                                                   << " of " << want.size() << "; first " << first
                                                   << "; worst ratio " << worst);
  CHECK(bad == 0);
}

/// Checks every element: |got - want| <= atol + rtol * |want|.
inline void check_close(const kvlab::RowMatrix<float>& got, const kvlab::RowMatrix<float>& want,
                        double rtol, double atol) {
  check_close(got, want, want.cwiseAbs(), rtol, atol);
}

/// `check_close` with the tolerances of storage type T.
template <typename T>
void check_close(const kvlab::RowMatrix<float>& got, const kvlab::RowMatrix<float>& want) {
  check_close(got, want, Tolerance<T>::rtol, Tolerance<T>::atol);
}

/// x rounded to storage type T and back (exact for float).
template <typename T>
float round_to(float x) {
  return kvlab::cuda::to_float(kvlab::cuda::from_float<T>(x));
}

/// Rounding through T, as a functor (for `RaggedBatch`).
template <typename T>
struct RoundTo {
  float operator()(float x) const { return round_to<T>(x); }
};

/// A [rows, cols] matrix uniform in [-1, 1), each value rounded through T.
template <typename T>
kvlab::RowMatrix<float> random_rounded(Eigen::Index rows, Eigen::Index cols, kvlab::Rng& rng) {
  kvlab::RowMatrix<float> m = kvlab::random_matrix<float>(rows, cols, rng);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = round_to<T>(m.data()[i]);
  return m;
}

}  // namespace kvlab_test
