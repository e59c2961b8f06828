/// \file
/// \brief `GgufFile`: a reader of GGUF files (versions 2 and 3, little-endian).
///
/// GGUF is the format llama.cpp and most published quantized models use. The reader covers the
/// header, every metadata value type (arrays included), the tensor infos, `general.alignment`, and
/// the tensors of the data section, dequantized to float (`ggml_types.hpp`) or kept as they are
/// (`GgmlMatrix`). Every count, string length, dimension and offset is checked against the file's
/// size before it is used. Checked in the tests on files the tests write (every value type, each
/// defect), on the real SmolLM2-135M-Instruct file, and by a fuzz target.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/config.hpp"
#include "kvlab/core/ggml_matrix.hpp"
#include "kvlab/core/ggml_types.hpp"
#include "kvlab/matrix.hpp"

namespace kvlab {

/// The type of a GGUF metadata value, by the id the file stores (`gguf_type` in gguf.h).
enum class GgufType : std::uint32_t {
  UINT8 = 0,    ///< unsigned 8-bit integer
  INT8 = 1,     ///< signed 8-bit integer
  UINT16 = 2,   ///< unsigned 16-bit integer
  INT16 = 3,    ///< signed 16-bit integer
  UINT32 = 4,   ///< unsigned 32-bit integer
  INT32 = 5,    ///< signed 32-bit integer
  FLOAT32 = 6,  ///< float32
  BOOL = 7,     ///< one byte, 0 or 1
  STRING = 8,   ///< uint64 length, then that many bytes (UTF-8, no terminator)
  ARRAY = 9,    ///< uint32 element type, uint64 count, then the elements
  UINT64 = 10,  ///< unsigned 64-bit integer
  INT64 = 11,   ///< signed 64-bit integer
  FLOAT64 = 12  ///< float64
};

/// The name of GGUF value type id `id` ("uint32", "string", "array", ...), or "unknown type <id>".
inline std::string gguf_type_name(std::uint32_t id) {
  static const char* const kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                       "int32",  "float32", "bool",   "string", "array",
                                       "uint64", "int64",   "float64"};
  if (id < sizeof kNames / sizeof kNames[0]) return kNames[id];
  return "unknown type " + std::to_string(id);
}

/// One metadata value of a GGUF file. Integers (and bool) are kept in `integer` — as their value,
/// sign included, for the signed types and `UINT64` values up to 2^63 − 1; floats in `number`;
/// a string in `string`; an array's elements in `array`, each a `GgufValue` of `element_type`.
struct GgufValue {
  GgufType type = GgufType::UINT8;          ///< the value's type
  GgufType element_type = GgufType::UINT8;  ///< for an array: its elements' type
  std::int64_t integer = 0;                 ///< an integer's or a bool's value
  std::uint64_t unsigned_integer = 0;       ///< an unsigned integer's value (UINT64 in full)
  double number = 0;                        ///< a FLOAT32 or FLOAT64 value
  std::string string;                       ///< a STRING value
  std::vector<GgufValue> array;             ///< an ARRAY's elements, [count]

  /// True for the integer types (UINT8 … INT64), not BOOL.
  bool is_integer() const {
    switch (type) {
      case GgufType::UINT8:
      case GgufType::INT8:
      case GgufType::UINT16:
      case GgufType::INT16:
      case GgufType::UINT32:
      case GgufType::INT32:
      case GgufType::UINT64:
      case GgufType::INT64:
        return true;
      default:
        return false;
    }
  }
};

/// A tensor of a GGUF file as its tensor info describes it. `dims[0]` is ggml's `ne[0]`, the
/// innermost dimension (the length of a row): a matrix `[out, in]` of PyTorch's layout is stored
/// with `dims = {in, out}`.
struct GgufTensorInfo {
  std::string name;                 ///< e.g. "blk.0.attn_q.weight"
  std::vector<std::uint64_t> dims;  ///< [n_dims], innermost first, each >= 1
  GgmlType type = GgmlType::F32;    ///< how the values are stored
  std::uint64_t offset = 0;         ///< from the start of the data section, a multiple of alignment
  std::uint64_t elements = 0;       ///< product of dims
  std::uint64_t bytes = 0;          ///< bytes in the data section

  /// Values per row: `dims[0]`.
  std::uint64_t row_length() const { return dims.empty() ? 0 : dims[0]; }
  /// Rows: the product of the outer dimensions (1 for a vector).
  std::uint64_t rows() const { return row_length() == 0 ? 0 : elements / row_length(); }
  /// The dims written as ggml does, innermost first: "[576, 1536]".
  std::string shape() const {
    std::string s = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

/// A GGUF file, opened: its header, metadata and tensor infos are read and checked when it is
/// constructed; tensors are read on demand (`read_tensor`, `read_matrix`).
///
/// The layout (all little-endian; a string is a uint64 length and its bytes):
///  - magic "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count;
///  - metadata: per entry a string key, a uint32 value type (`GgufType`) and the value;
///  - tensor infos: per tensor a string name, uint32 n_dims (1–4), n_dims uint64 dims (innermost
///    first), uint32 ggml type, uint64 offset into the data section;
///  - padding to `general.alignment` (uint32, a power of two; 32 when absent), then the data
///    section: each tensor at its offset, a multiple of the alignment.
///
/// Every number is checked before it is used: a count cannot exceed what the bytes left could
/// hold, a string's length the bytes left, a tensor's bytes (from its dims and type) the data
/// section; keys and tensor names are unique; a tensor type other than F32, F16, BF16, Q8_0,
/// Q4_0 and Q4_1 is refused by name. Errors are InvalidArgument naming the file, the key or
/// tensor, what was expected and what was found, e.g.
/// `"kvlab::GgufFile: m.gguf: tensor 'blk.0.attn_q.weight': type: expected one of F32, F16,
/// BF16, Q8_0, Q4_0, Q4_1, got Q4_K"`. Version 1 files (32-bit counts) and big-endian files are
/// refused by name.
class GgufFile {
 public:
  /// The deepest nesting of arrays accepted (an array of arrays is depth 2).
  static constexpr int kMaxArrayDepth = 4;

  /// Opens `path` and reads its header, metadata and tensor infos.
  /// \throws InvalidArgument (see the class) for a file that cannot be opened or is not a valid
  ///         GGUF file of version 2 or 3.
  explicit GgufFile(const std::string& path) : path_(path), stream_(path, std::ios::binary) {
    if (path.empty()) detail::fail(kWhere, "path", "the name of a GGUF file", "''");
    if (!stream_)
      detail::fail(kWhere, path, "an existing, readable GGUF file", "a path that cannot be opened");
    stream_.seekg(0, std::ios::end);
    const std::streamoff end = stream_.tellg();
    if (!stream_ || end < 0)
      detail::fail(kWhere, path, "a file whose size can be read", "an error while seeking");
    size_ = static_cast<std::uint64_t>(end);
    stream_.seekg(0, std::ios::beg);
    parse();
  }

  /// The file's name, as given.
  const std::string& path() const { return path_; }
  /// Bytes in the file.
  std::uint64_t file_size() const { return size_; }
  /// The format version: 2 or 3.
  std::uint32_t version() const { return version_; }
  /// `general.alignment`, or 32 when the file does not set it.
  std::uint32_t alignment() const { return alignment_; }
  /// Where the data section starts, in bytes from the start of the file.
  std::uint64_t data_offset() const { return data_offset_; }

  /// The metadata, in the file's order: (key, value).
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// The value of `key`, or null when the file has none.
  const GgufValue* find(const std::string& key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
  }
  /// The value of `key`.
  /// \throws InvalidArgument naming the key when the file has none.
  const GgufValue& at(const std::string& key) const {
    const GgufValue* v = find(key);
    if (v == nullptr) fail_key(key, "present", "missing");
    return *v;
  }
  /// Integer `key` (any integer type).
  /// \throws InvalidArgument naming the key when it is missing, not an integer, or a UINT64
  ///         above 2^63 − 1.
  std::int64_t get_int(const std::string& key) const {
    const GgufValue& v = at(key);
    if (!v.is_integer())
      fail_key(key, "an integer", "a " + gguf_type_name(static_cast<std::uint32_t>(v.type)));
    if (v.type == GgufType::UINT64 && v.unsigned_integer > static_cast<std::uint64_t>(INT64_MAX))
      fail_key(key, "at most 2^63 - 1", std::to_string(v.unsigned_integer));
    return v.integer;
  }
  /// Number `key` (FLOAT32 or FLOAT64).
  /// \throws InvalidArgument naming the key when it is missing or not a float.
  double get_float(const std::string& key) const {
    const GgufValue& v = at(key);
    if (v.type != GgufType::FLOAT32 && v.type != GgufType::FLOAT64)
      fail_key(key, "a float32 or float64",
               "a " + gguf_type_name(static_cast<std::uint32_t>(v.type)));
    return v.number;
  }
  /// String `key`.
  /// \throws InvalidArgument naming the key when it is missing or not a string.
  const std::string& get_string(const std::string& key) const {
    const GgufValue& v = at(key);
    if (v.type != GgufType::STRING)
      fail_key(key, "a string", "a " + gguf_type_name(static_cast<std::uint32_t>(v.type)));
    return v.string;
  }
  /// Array of strings `key`, [count].
  /// \throws InvalidArgument naming the key when it is missing or not an array of strings.
  std::vector<std::string> get_strings(const std::string& key) const {
    const GgufValue& v = array_of(key, "strings", [](GgufType t) { return t == GgufType::STRING; });
    std::vector<std::string> out;
    out.reserve(v.array.size());
    for (const GgufValue& e : v.array) out.push_back(e.string);
    return out;
  }
  /// Array of integers `key` (any integer type), [count].
  /// \throws InvalidArgument naming the key when it is missing or not an array of integers.
  std::vector<std::int64_t> get_ints(const std::string& key) const {
    const GgufValue& v = array_of(key, "integers", [](GgufType t) {
      GgufValue probe;
      probe.type = t;
      return probe.is_integer();
    });
    std::vector<std::int64_t> out;
    out.reserve(v.array.size());
    for (const GgufValue& e : v.array) out.push_back(e.integer);
    return out;
  }

  /// The tensor infos, in the file's order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor named `name`, or null.
  const GgufTensorInfo* find_tensor(const std::string& name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// The tensor named `name`.
  /// \throws InvalidArgument naming it when the file has none.
  const GgufTensorInfo& tensor(const std::string& name) const {
    const GgufTensorInfo* t = find_tensor(name);
    if (t == nullptr) {
      detail::fail("kvlab::GgufFile::tensor", path_ + ": tensor '" + name + "'", "present",
                   "missing");
    }
    return *t;
  }

  /// Reads tensor `info` (one of `tensors()`) and decodes it to float: `out` [info.elements],
  /// row after row (`dequantize_row`).
  /// \throws InvalidArgument if the bytes cannot be read, or a value is NaN or infinite (named
  ///         by tensor and index); `out` is then unchanged.
  void read_tensor(const GgufTensorInfo& info, float* out) const {
    const std::vector<unsigned char> bytes =
        checked_tensor_bytes(info, "kvlab::GgufFile::read_tensor");  // [info.bytes]
    const std::uint64_t row_bytes = ggml_row_bytes(info.type, info.row_length());
    for (std::uint64_t r = 0; r < info.rows(); ++r) {
      dequantize_row(info.type, bytes.data() + r * row_bytes,
                     static_cast<std::int64_t>(info.row_length()), out + r * info.row_length());
    }
  }

  /// Tensor `name` as a matrix of `rows()` rows of `row_length()` values, dequantized to float:
  /// a weight `[out, in]` (ggml dims `{in, out}`) comes back `[out, in]`, row-major; a vector
  /// as one row. `expected_dims` (innermost first), when not empty, must equal the tensor's.
  /// \throws InvalidArgument naming the tensor when it is missing, its dims differ from
  ///         `expected_dims`, or `read_tensor` fails.
  RowMatrix<float> read_matrix(const std::string& name,
                               const std::vector<std::uint64_t>& expected_dims = {}) const {
    const GgufTensorInfo& info = tensor(name);
    check_dims("kvlab::GgufFile::read_matrix", info, expected_dims);
    RowMatrix<float> m(static_cast<Eigen::Index>(info.rows()),
                       static_cast<Eigen::Index>(info.row_length()));  // [rows, row_length]
    read_tensor(info, m.data());
    return m;
  }

  /// Tensor `name` as the file stores it: a `GgmlMatrix` of `rows()` rows of `row_length()`
  /// values of the tensor's type, its bytes as they are (a Q4_1 weight stays 5 bits per value;
  /// `read_matrix` gives the same values as floats). `expected_dims` as in `read_matrix`.
  /// \throws InvalidArgument naming the tensor when it is missing, its dims differ from
  ///         `expected_dims`, its bytes cannot be read, or a value is NaN or infinite.
  GgmlMatrix read_ggml_matrix(const std::string& name,
                              const std::vector<std::uint64_t>& expected_dims = {}) const {
    constexpr const char* kRead = "kvlab::GgufFile::read_ggml_matrix";
    const GgufTensorInfo& info = tensor(name);
    check_dims(kRead, info, expected_dims);
    return GgmlMatrix(info.type, static_cast<std::int64_t>(info.rows()),
                      static_cast<std::int64_t>(info.row_length()),
                      checked_tensor_bytes(info, kRead));
  }

 private:
  static constexpr const char* kWhere = "kvlab::GgufFile";

  // Fails (as `where`) unless `expected` is empty or equals the tensor's dims.
  void check_dims(const char* where, const GgufTensorInfo& info,
                  const std::vector<std::uint64_t>& expected) const {
    if (expected.empty() || expected == info.dims) return;
    GgufTensorInfo want;
    want.dims = expected;
    detail::fail(where, path_ + ": tensor '" + info.name + "': dims", want.shape(), info.shape());
  }

  // The bytes of tensor `info`, [info.bytes], once every value they hold is known to be finite
  // (each row decoded into a scratch row); fails (as `where`) on a read error or a value that is
  // not.
  std::vector<unsigned char> checked_tensor_bytes(const GgufTensorInfo& info,
                                                  const char* where) const {
    std::vector<unsigned char> bytes(static_cast<std::size_t>(info.bytes));  // [info.bytes]
    stream_.clear();
    stream_.seekg(static_cast<std::streamoff>(data_offset_ + info.offset), std::ios::beg);
    stream_.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(info.bytes));
    if (!stream_ || static_cast<std::uint64_t>(stream_.gcount()) != info.bytes) {
      detail::fail(where, path_ + ": tensor '" + info.name + "'",
                   std::to_string(info.bytes) + " readable bytes", "a read error");
    }
    const std::uint64_t row_bytes = ggml_row_bytes(info.type, info.row_length());
    std::vector<float> row(static_cast<std::size_t>(info.row_length()));  // [row_length]
    for (std::uint64_t r = 0; r < info.rows(); ++r) {
      dequantize_row(info.type, bytes.data() + r * row_bytes,
                     static_cast<std::int64_t>(info.row_length()), row.data());
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (!std::isfinite(row[i])) {
          detail::fail(
              where, path_ + ": tensor '" + info.name + "'", "finite values",
              std::to_string(row[i]) + " at index " + std::to_string(r * info.row_length() + i));
        }
      }
    }
    return bytes;
  }

  [[noreturn]] void fail_key(const std::string& key, const std::string& expected,
                             const std::string& got) const {
    detail::fail(kWhere, path_ + ": key '" + key + "'", expected, got);
  }

  template <typename Accept>
  const GgufValue& array_of(const std::string& key, const char* what, Accept accept) const {
    const GgufValue& v = at(key);
    if (v.type != GgufType::ARRAY || !accept(v.element_type)) {
      fail_key(key, std::string("an array of ") + what,
               v.type == GgufType::ARRAY
                   ? "an array of " + gguf_type_name(static_cast<std::uint32_t>(v.element_type))
                   : "a " + gguf_type_name(static_cast<std::uint32_t>(v.type)));
    }
    return v;
  }

  // --- reading with every size checked against the bytes left ---------------------------------

  // Fails unless `n` more bytes are left in the file at the current position.
  void need(std::uint64_t n, const std::string& what) const {
    if (n > size_ - pos_) {
      detail::fail(kWhere, path_ + ": " + what,
                   std::to_string(n) + " bytes at offset " + std::to_string(pos_),
                   "only " + std::to_string(size_ - pos_) + " bytes left in the file (truncated?)");
    }
  }
  void read_bytes(void* out, std::uint64_t n, const std::string& what) {
    need(n, what);
    stream_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!stream_)
      detail::fail(kWhere, path_ + ": " + what, std::to_string(n) + " readable bytes",
                   "a read error");
    pos_ += n;
  }
  template <typename T>
  T read(const std::string& what) {
    T value;
    read_bytes(&value, sizeof value, what);
    return value;
  }
  std::string read_string(const std::string& what) {
    const auto length = read<std::uint64_t>(what + " (its length)");
    need(length, what + " (a string of " + std::to_string(length) + " bytes)");
    std::string s(static_cast<std::size_t>(length), '\0');
    read_bytes(&s[0], length, what);
    return s;
  }

  // The fewest bytes one value of type `t` takes: what a count is checked against.
  static std::uint64_t min_bytes(GgufType t) {
    switch (t) {
      case GgufType::UINT8:
      case GgufType::INT8:
      case GgufType::BOOL:
        return 1;
      case GgufType::UINT16:
      case GgufType::INT16:
        return 2;
      case GgufType::UINT32:
      case GgufType::INT32:
      case GgufType::FLOAT32:
        return 4;
      case GgufType::STRING:  // its length
      case GgufType::UINT64:
      case GgufType::INT64:
      case GgufType::FLOAT64:
        return 8;
      case GgufType::ARRAY:  // element type, count
        return 12;
    }
    return 1;
  }

  GgufType read_type(const std::string& what) {
    const auto id = read<std::uint32_t>(what);
    if (id > static_cast<std::uint32_t>(GgufType::FLOAT64)) {
      detail::fail(kWhere, path_ + ": " + what, "a GGUF value type (0 to 12)", id);
    }
    return static_cast<GgufType>(id);
  }

  GgufValue read_value(GgufType type, const std::string& what, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::UINT8:
        v.integer = read<std::uint8_t>(what);
        break;
      case GgufType::INT8:
        v.integer = read<std::int8_t>(what);
        break;
      case GgufType::UINT16:
        v.integer = read<std::uint16_t>(what);
        break;
      case GgufType::INT16:
        v.integer = read<std::int16_t>(what);
        break;
      case GgufType::UINT32:
        v.integer = read<std::uint32_t>(what);
        break;
      case GgufType::INT32:
        v.integer = read<std::int32_t>(what);
        break;
      case GgufType::INT64:
        v.integer = read<std::int64_t>(what);
        break;
      case GgufType::UINT64:
        v.unsigned_integer = read<std::uint64_t>(what);
        v.integer = static_cast<std::int64_t>(v.unsigned_integer);  // get_int checks the range
        break;
      case GgufType::FLOAT32:
        v.number = read<float>(what);
        break;
      case GgufType::FLOAT64:
        v.number = read<double>(what);
        break;
      case GgufType::BOOL: {
        const auto b = read<std::uint8_t>(what);
        if (b > 1)
          detail::fail(kWhere, path_ + ": " + what, "a bool (0 or 1)", static_cast<int>(b));
        v.integer = b;
        break;
      }
      case GgufType::STRING:
        v.string = read_string(what);
        break;
      case GgufType::ARRAY: {
        if (depth >= kMaxArrayDepth) {
          detail::fail(kWhere, path_ + ": " + what,
                       "arrays nested at most " + std::to_string(kMaxArrayDepth) + " deep",
                       "a deeper array");
        }
        v.element_type = read_type(what + " (its element type)");
        const auto count = read<std::uint64_t>(what + " (its count)");
        const std::uint64_t room = (size_ - pos_) / min_bytes(v.element_type);
        if (count > room) {
          detail::fail(kWhere, path_ + ": " + what + " (its count)",
                       "at most " + std::to_string(room) + " (the " +
                           gguf_type_name(static_cast<std::uint32_t>(v.element_type)) +
                           " elements that the " + std::to_string(size_ - pos_) +
                           " bytes left could hold)",
                       count);
        }
        v.array.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t i = 0; i < count; ++i)
          v.array.push_back(
              read_value(v.element_type, what + "[" + std::to_string(i) + "]", depth + 1));
        break;
      }
    }
    return v;
  }

  void parse() {
    std::uint32_t magic = 0;
    const std::uint32_t one = 1;
    unsigned char first = 0;
    std::memcpy(&first, &one, 1);
    if (first != 1)
      detail::fail(kWhere, path_ + ": byte order", "a little-endian host", "big-endian");
    if (size_ < 4) {
      detail::fail(kWhere, path_ + ": magic", "the 4 bytes \"GGUF\"",
                   std::to_string(size_) + " bytes (the whole file)");
    }
    magic = read<std::uint32_t>("magic");
    if (magic != 0x46554747u) {  // "GGUF" read as a little-endian uint32
      char text[5] = {};
      std::memcpy(text, &magic, 4);
      for (char& c : text)
        if (c != '\0' && (c < 32 || c > 126)) c = '?';
      detail::fail(kWhere, path_ + ": magic", "\"GGUF\" (a GGUF file)",
                   "\"" + std::string(text, 4) + "\"");
    }
    version_ = read<std::uint32_t>("version");
    if (version_ == 0x02000000u || version_ == 0x03000000u) {
      detail::fail(kWhere, path_ + ": version", "2 or 3, little-endian",
                   "version " + std::to_string(version_ >> 24) + " of a big-endian file");
    }
    if (version_ == 1) {
      detail::fail(kWhere, path_ + ": version",
                   "2 or 3 (version 1 has 32-bit counts; a current llama.cpp converts it)", 1);
    }
    if (version_ != 2 && version_ != 3)
      detail::fail(kWhere, path_ + ": version", "2 or 3", version_);
    const auto tensor_count = read<std::uint64_t>("tensor count");
    const auto metadata_count = read<std::uint64_t>("metadata count");
    // A metadata entry takes at least 13 bytes (key length, type, a 1-byte value); a tensor
    // info at least 32 (name length, n_dims, one dim, type, offset).
    if (metadata_count > (size_ - pos_) / 13) {
      detail::fail(kWhere, path_ + ": metadata count",
                   "at most " + std::to_string((size_ - pos_) / 13) +
                       " (entries of >= 13 bytes in the bytes left)",
                   metadata_count);
    }
    if (tensor_count > (size_ - pos_) / 32) {
      detail::fail(kWhere, path_ + ": tensor count",
                   "at most " + std::to_string((size_ - pos_) / 32) +
                       " (infos of >= 32 bytes in the bytes left)",
                   tensor_count);
    }
    metadata_.reserve(static_cast<std::size_t>(metadata_count));
    for (std::uint64_t i = 0; i < metadata_count; ++i) {
      const std::string entry = "metadata entry " + std::to_string(i);
      std::string key = read_string(entry + " key");
      const std::string what = "key '" + key + "'";
      if (key_index_.count(key) != 0)
        detail::fail(kWhere, path_ + ": " + what, "unique keys", "a second entry");
      const GgufType type = read_type(what + " type");
      GgufValue value = read_value(type, what, 0);
      key_index_.emplace(key, metadata_.size());
      metadata_.emplace_back(std::move(key), std::move(value));
    }
    if (const GgufValue* a = find("general.alignment")) {
      if (a->type != GgufType::UINT32) {
        fail_key("general.alignment", "a uint32",
                 "a " + gguf_type_name(static_cast<std::uint32_t>(a->type)));
      }
      if (a->integer == 0 || (a->integer & (a->integer - 1)) != 0)
        fail_key("general.alignment", "a power of two", std::to_string(a->integer));
      alignment_ = static_cast<std::uint32_t>(a->integer);
    }
    tensors_.reserve(static_cast<std::size_t>(tensor_count));
    for (std::uint64_t i = 0; i < tensor_count; ++i) read_tensor_info(i);
    // The data section starts at the next multiple of the alignment.
    const std::uint64_t pad = (alignment_ - pos_ % alignment_) % alignment_;
    if (pad > size_ - pos_ && tensor_count > 0) {
      detail::fail(kWhere, path_ + ": data section",
                   "to start at offset " + std::to_string(pos_ + pad) + " (aligned to " +
                       std::to_string(alignment_) + ")",
                   "a file of " + std::to_string(size_) + " bytes");
    }
    data_offset_ = pos_ + pad;
    const std::uint64_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;
    for (const GgufTensorInfo& t : tensors_) {
      const std::string what = path_ + ": tensor '" + t.name + "'";
      if (t.offset % alignment_ != 0) {
        detail::fail(kWhere, what + ": offset", "a multiple of " + std::to_string(alignment_),
                     t.offset);
      }
      if (t.offset > data_size || t.bytes > data_size - t.offset) {
        detail::fail(kWhere, what + ": offset",
                     "its " + std::to_string(t.bytes) + " bytes within the data section of " +
                         std::to_string(data_size) + " bytes",
                     std::to_string(t.offset) + " (the file is truncated, or the offset is wrong)");
      }
    }
  }

  void read_tensor_info(std::uint64_t i) {
    GgufTensorInfo t;
    t.name = read_string("tensor info " + std::to_string(i) + " name");
    const std::string what = "tensor '" + t.name + "'";
    if (tensor_index_.count(t.name) != 0) {
      detail::fail(kWhere, path_ + ": " + what, "unique tensor names",
                   "a second tensor of this name");
    }
    const auto n_dims = read<std::uint32_t>(what + " n_dims");
    if (n_dims < 1 || n_dims > 4)
      detail::fail(kWhere, path_ + ": " + what + ": n_dims", "1 to 4", n_dims);
    t.elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = read<std::uint64_t>(what + " dims[" + std::to_string(d) + "]");
      if (dim < 1)
        detail::fail(kWhere, path_ + ": " + what + ": dims[" + std::to_string(d) + "]", ">= 1",
                     dim);
      t.elements = detail::checked_size_product(
          kWhere, path_ + ": " + what + ": dims[" + std::to_string(d) + "]", t.elements, dim, "",
          detail::kMaxSignedSize);
      t.dims.push_back(dim);
    }
    const auto type = read<std::uint32_t>(what + " type");
    if (!ggml_type_supported(type)) {
      detail::fail(kWhere, path_ + ": " + what + ": type",
                   "one of F32, F16, BF16, Q8_0, Q4_0, Q4_1", ggml_type_name(type));
    }
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % static_cast<std::uint64_t>(ggml_block_values(t.type)) != 0) {
      detail::fail(kWhere, path_ + ": " + what + ": dims[0]",
                   "a multiple of " + std::to_string(ggml_block_values(t.type)) + " (whole " +
                       ggml_type_name(type) + " blocks per row)",
                   t.dims[0]);
    }
    t.bytes = detail::checked_size_product(kWhere, path_ + ": " + what + ": rows",
                                           ggml_row_bytes(t.type, t.dims[0]),
                                           t.elements / t.dims[0], "", detail::kMaxSignedSize);
    t.offset = read<std::uint64_t>(what + " offset");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  std::string path_;
  mutable std::ifstream stream_;  // open, binary; read_tensor seeks
  std::uint64_t size_ = 0;        // bytes in the file
  std::uint64_t pos_ = 0;         // the parser's position
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;  // [metadata count], file order
  std::map<std::string, std::size_t> key_index_;             // key -> index in metadata_
  std::vector<GgufTensorInfo> tensors_;                      // [tensor count], file order
  std::map<std::string, std::size_t> tensor_index_;          // name -> index in tensors_
};

}  // namespace kvlab
