/// \file
/// \brief Argument checks shared by the CPU attention paths (internal, `cpu::detail`).
#pragma once

#include <functional>
#include <type_traits>

#include "kvlab/config.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab::cpu::detail {

/// Checks the arguments shared by the attention paths: `q` is `[q_len >= 1, q_width]`.
template <typename T>
void check_queries(const char* where, const AttentionShape& shape,
                   const Eigen::Ref<const RowMatrix<T>>& q) {
  kvlab::detail::require_at_least(where, "q.rows()", static_cast<long>(q.rows()), 1L);
  kvlab::detail::require_equal(where, "q.cols()", static_cast<long>(q.cols()),
                               static_cast<long>(shape.q_width()), "num_heads * head_dim");
}

/// A read-only view of any Eigen expression of scalar `T` in kvlab's row-major layout: a
/// `RowMatrix<T>`, its rows and row blocks bind without a copy; other layouts (a column-major
/// matrix, a transposed or strided expression) are copied once into the view's own storage.
template <typename T>
using RowMatrixRef = Eigen::Ref<const RowMatrix<T>>;

/// True when the current storage of `out` and the memory that `m` reads overlap: writing `out`
/// (or resizing it) would then change or free `m`'s values while they are read.
template <typename T>
bool shares_memory(const RowMatrix<T>& out, const RowMatrixRef<T>& m) {
  if (out.size() == 0 || m.size() == 0) return false;
  const T* out_begin = out.data();
  const T* out_end = out_begin + out.size();
  const T* m_begin = m.data();
  const T* m_end = m_begin + (m.rows() - 1) * m.outerStride() + m.cols();
  const std::less<const T*> before;
  return before(out_begin, m_end) && before(m_begin, out_end);
}

/// Checks at compile time that an argument's scalar is `T`, the scalar of the call.
template <typename Derived, typename T>
constexpr void require_scalar() {
  static_assert(std::is_same<typename Derived::Scalar, T>::value,
                "kvlab::cpu: every matrix of one call must have the same scalar type");
}

}  // namespace kvlab::cpu::detail
