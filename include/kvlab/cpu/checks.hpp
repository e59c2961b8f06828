/// \file
/// \brief Argument checks shared by the CPU attention paths (internal).
#pragma once

#include "kvlab/config.hpp"
#include "kvlab/core/shape.hpp"
#include "kvlab/cpu/types.hpp"

namespace kvlab::detail {

/// Checks the arguments shared by the attention paths: `q` is `[q_len >= 1, q_width]`.
template <typename T>
void check_queries(const char* where, const AttentionShape& shape, const RowMatrix<T>& q) {
  detail::require_at_least(where, "q.rows()", static_cast<long>(q.rows()), 1L);
  detail::require_equal(where, "q.cols()", static_cast<long>(q.cols()),
                        static_cast<long>(shape.q_width()), "num_heads * head_dim");
}

}  // namespace kvlab::detail
