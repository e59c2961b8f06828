// Fuzz target: block tables from arbitrary CSR arrays (`BlockTables`: indptr, indices,
// last_page_len, block_size, num_blocks) and, when they are accepted, a paged decode step
// through them (`cpu::paged_decode_attention` over a pool of exactly num_blocks blocks, both
// layouts). Accepted tables must give every sequence (pages - 1) · block_size + last_page_len
// tokens and a step that reads only the pool (AddressSanitizer sees a read past it) and returns
// finite outputs; refused ones the library's typed error.
//
// Input bytes, in order (a short input leaves the rest empty): block_size in [-1, 8],
// num_blocks in [-1, 14], the layout (even: NHD), the lengths of indptr (0..7) and indices
// (0..15), then indptr, indices and last_page_len as small signed values.
//
//   build-fuzz/tests/fuzz/fuzz_block_tables build-fuzz/tests/fuzz/corpus/block_tables -runs=1000000
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_support.hpp"
#include "kvlab/cache/block_tables.hpp"
#include "kvlab/core/random.hpp"
#include "kvlab/cpu/paged_attention.hpp"

namespace {

// Reads the input a byte at a time; 0 once it is used up.
struct Bytes {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t at = 0;
  int next() { return at < size ? data[at++] : 0; }
  int in(int lo, int hi) { return lo + next() % (hi - lo + 1); }  // in [lo, hi]
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  const int block_size = in.in(-1, 8);
  const int num_blocks = in.in(-1, 14);
  const kvlab::KVLayout layout = in.next() % 2 == 0 ? kvlab::KVLayout::NHD : kvlab::KVLayout::HND;
  const int indptr_size = in.in(0, 7);
  const int indices_size = in.in(0, 15);
  std::vector<std::int32_t> indptr, indices, last_page_len;
  for (int i = 0; i < indptr_size; ++i) indptr.push_back(in.in(-2, 17));
  for (int i = 0; i < indices_size; ++i) indices.push_back(in.in(-2, 16));
  for (int i = 0; i + 1 < indptr_size; ++i) last_page_len.push_back(in.in(-1, 9));

  kvlab_fuzz::expect_typed_errors_only([&] {
    const kvlab::BlockTables tables(indptr, indices, last_page_len, kvlab::BlockSize{block_size},
                                    kvlab::NumBlocks{num_blocks});
    for (int s = 0; s < tables.batch(); ++s) {  // every sequence's length from its CSR row
      const int pages =
          indptr[static_cast<std::size_t>(s) + 1] - indptr[static_cast<std::size_t>(s)];
      if (tables.seq_len(s) !=
          (pages - 1) * block_size + last_page_len[static_cast<std::size_t>(s)])
        __builtin_trap();
    }
    // A decode step through the tables: 4 query heads over 2 K/V heads of 8 values, a pool of
    // exactly num_blocks blocks (its vectors end where the pool ends, so ASan sees any read
    // past it).
    const kvlab::AttentionShape shape(4, 2, 8);
    kvlab::Rng rng(static_cast<std::uint64_t>(size));
    const std::size_t pool =
        static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(block_size) * 2 * 8;
    std::vector<float> k(pool), v(pool);  // [num_blocks, block_size, 2, 8] or HND
    for (std::size_t i = 0; i < pool; ++i) {
      k[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
      v[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
    }
    const kvlab::RowMatrix<float> q =
        kvlab::random_matrix<float>(tables.batch(), shape.q_width(), rng);  // [batch, q_width]
    const kvlab::RowMatrix<float> out =
        kvlab::cpu::paged_decode_attention(shape, q, tables.view(k.data(), v.data(), 2, 8, layout));
    if (!out.allFinite()) __builtin_trap();
  });
  return 0;
}
