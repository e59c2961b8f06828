/// \file
/// \brief `GgmlMatrix`: a weight matrix kept as a GGUF file stores it, block by block.
///
/// A `[rows, cols]` matrix of one of the types of `ggml_types.hpp` (F32, F16, BF16, Q8_0, Q4_0,
/// Q4_1): each row `ggml_row_bytes(type, cols)` bytes, the rows one after the other, as the file
/// stores a tensor of ggml dims `{cols, rows}`. It takes the file's size in memory (a Q4_1 weight
/// 5 bits per value, not the 32 of its floats); `GgufFile::read_ggml_matrix` reads one, and
/// `cpu::reference_linear` (`kvlab/cpu/quantized_linear.hpp`) multiplies by it block by block.
/// Host code without Eigen, below the CPU products and the GGUF reader that use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/ggml_types.hpp"

namespace kvlab {

/// A `[rows, cols]` matrix of ggml type `type()`, in the bytes a GGUF file holds for it: row `r`
/// is `row_bytes()` bytes at `data() + r · row_bytes()`, decoded by `dequantize_row`. A weight
/// `[out, in]` (ggml dims `{in, out}`) is `out` rows of `in` values, as `RowMatrix` holds it.
class GgmlMatrix {
 public:
  /// An empty matrix: 0 × 0, F32.
  GgmlMatrix() = default;

  /// `rows` rows of `cols` values of `type`, held in `bytes` [rows · ggml_row_bytes(type, cols)],
  /// row after row. The values are not looked at (`GgufFile::read_ggml_matrix` checks that a
  /// file's are finite).
  /// \throws InvalidArgument if `type` is not one kvlab reads, `rows` or `cols` is negative,
  ///         `cols` is not a whole number of blocks of `type` (`ggml_block_values`), or
  ///         `bytes.size()` is not rows · ggml_row_bytes(type, cols).
  GgmlMatrix(GgmlType type, std::int64_t rows, std::int64_t cols, std::vector<unsigned char> bytes)
      : type_(type), rows_(rows), cols_(cols) {
    constexpr const char* kWhere = "kvlab::GgmlMatrix::GgmlMatrix";
    if (!ggml_type_supported(static_cast<std::uint32_t>(type))) {
      detail::fail(kWhere, "type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_1",
                   ggml_type_name(static_cast<std::uint32_t>(type)));
    }
    if (rows < 0) detail::fail(kWhere, "rows", ">= 0", rows);
    if (cols < 0) detail::fail(kWhere, "cols", ">= 0", cols);
    if (cols % ggml_block_values(type) != 0) {
      detail::fail(kWhere, "cols",
                   "a multiple of " + std::to_string(ggml_block_values(type)) + " (a " +
                       ggml_type_name(static_cast<std::uint32_t>(type)) + " block)",
                   cols);
    }
    row_bytes_ = static_cast<std::size_t>(ggml_row_bytes(type, static_cast<std::uint64_t>(cols)));
    const std::uint64_t expected = detail::checked_size_product(
        kWhere, "rows", row_bytes_, static_cast<std::uint64_t>(rows), "", detail::kMaxSignedSize);
    if (bytes.size() != expected) {
      detail::fail(
          kWhere, "bytes.size()",
          std::to_string(expected) + " (rows * " + std::to_string(row_bytes_) + " bytes of a row)",
          bytes.size());
    }
    bytes_ = std::move(bytes);
  }

  /// The values' type.
  GgmlType type() const { return type_; }
  /// Rows: a weight's outputs.
  std::int64_t rows() const { return rows_; }
  /// Values per row: a weight's inputs.
  std::int64_t cols() const { return cols_; }
  /// Bytes of one row: `ggml_row_bytes(type(), cols())`.
  std::size_t row_bytes() const { return row_bytes_; }
  /// Bytes of the whole matrix: what it takes in memory, as in the file.
  std::size_t size_bytes() const { return bytes_.size(); }
  /// The bytes, [rows · row_bytes], row after row.
  const unsigned char* data() const { return bytes_.data(); }

  /// Row `r`'s bytes, [row_bytes].
  /// \throws InvalidArgument if `r` is not in [0, rows).
  const unsigned char* row(std::int64_t r) const {
    check_row("kvlab::GgmlMatrix::row", r);
    return bytes_.data() + static_cast<std::size_t>(r) * row_bytes_;
  }

  /// Row `r` decoded into `out` [cols], as `dequantize_row` decodes it: row `r` of the floats
  /// `GgufFile::read_matrix` gives for the tensor.
  /// \throws InvalidArgument if `r` is not in [0, rows); `out` is then unchanged.
  void decode_row(std::int64_t r, float* out) const {
    check_row("kvlab::GgmlMatrix::decode_row", r);
    dequantize_row(type_, bytes_.data() + static_cast<std::size_t>(r) * row_bytes_, cols_, out);
  }

 private:
  void check_row(const char* where, std::int64_t r) const {
    if (r < 0 || r >= rows_) {
      detail::fail(where, "r", "in [0, " + std::to_string(rows_) + ") (rows)", r);
    }
  }

  GgmlType type_ = GgmlType::F32;
  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  std::size_t row_bytes_ = 0;
  std::vector<unsigned char> bytes_;  // [rows * row_bytes]
};

}  // namespace kvlab
