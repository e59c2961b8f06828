// The CPU emulator behind emulator/include/cuda_runtime.h (the model and its limits
// are described there): device memory, the runtime calls kvlab uses, and kernel launches whose
// threads run as fibers, one block at a time.
#include <cuda_runtime.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

// KVLAB_EMULATION_ASAN: the program runs under AddressSanitizer. Defined here when this file is
// instrumented, and by the build when it is not (emulator/CMakeLists.txt: an AddressSanitizer
// build compiles this file without instrumentation, its kernels and tests with it).
#if defined(__SANITIZE_ADDRESS__)
#define KVLAB_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLAB_EMULATION_ASAN 1
#endif
#endif
#if defined(KVLAB_EMULATION_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace kvlab_emulation {
namespace {

// --- errors -------------------------------------------------------------------------------------

cudaError_t last_error = cudaSuccess;  // what cudaGetLastError returns (and clears)

cudaError_t fail(cudaError_t code) {
  last_error = code;
  return code;
}

// --- device memory ----------------------------------------------------------------------------

constexpr std::size_t kDeviceMemory = std::size_t{80} << 30;  // an 80 GiB GPU
constexpr std::size_t kAlignment = 256;                       // as cudaMalloc

std::mutex memory_mutex;
std::map<std::uintptr_t, std::size_t> allocations;  // start -> bytes
std::size_t allocated = 0;

// True if [p, p + bytes) lies inside one live allocation.
bool is_device_range(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations.upper_bound(at);
  if (it == allocations.begin()) return false;
  --it;
  return at - it->first <= it->second && bytes <= it->second - (at - it->first);
}

// True if p points into any live allocation.
bool is_device_pointer(const void* p) { return is_device_range(p, 1); }

// --- fibers -------------------------------------------------------------------------------------

#if defined(KVLAB_EMULATION_ASAN)
constexpr std::size_t kStackBytes = std::size_t{1} << 20;  // ASan's redzones make frames larger
#else
constexpr std::size_t kStackBytes = std::size_t{256} << 10;
#endif

// A stack and the saved state of a suspended execution (a fiber or the launching thread).
struct Context {
#if defined(__x86_64__)
  // saved stack pointer: callee-saved registers and the return address above it
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
  const void* stack_bottom = nullptr;  // for AddressSanitizer (null: the thread's own stack)
  std::size_t stack_size = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's state for this stack while switched away
};

#if defined(__x86_64__)
// Saves the callee-saved registers, the SSE and x87 control words and the stack pointer of the
// caller in *from_sp, and resumes the execution whose stack pointer is to_sp.
extern "C" void kvlab_emulation_switch(void** from_sp, void* to_sp);
asm(R"(
  .text
  .p2align 4
  .globl kvlab_emulation_switch
  .hidden kvlab_emulation_switch
  .type kvlab_emulation_switch, @function
kvlab_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvlab_emulation_switch, .-kvlab_emulation_switch
)");
#endif

// Switches from `from` to `to`; returns when something switches back to `from`. `finished`:
// `from` will never run again (AddressSanitizer frees its fake stack).
void switch_context(Context& from, Context& to, bool finished = false) {
#if defined(KVLAB_EMULATION_ASAN)
  __sanitizer_start_switch_fiber(finished ? nullptr : &from.fake_stack, to.stack_bottom,
                                 to.stack_size);
#else
  (void)finished;
#endif
#if defined(__x86_64__)
  kvlab_emulation_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
#if defined(KVLAB_EMULATION_ASAN)
  const void* bottom = nullptr;
  std::size_t size = 0;
  __sanitizer_finish_switch_fiber(from.fake_stack, &bottom, &size);
#endif
}

// --- the running launch ------------------------------------------------------------------------

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone, kFailed };

// How the threads of a block take turns between synchronisation points. A correct kernel gives
// the same result under every schedule; one that reads shared memory before the barrier that
// orders it sees other values (and other poison) under each.
enum class Schedule {
  kInOrder,    // the next ready thread after the running one, in thread order; then a new pass
  kReversed,   // the same in reverse thread order
  kWarpAhead,  // the lowest ready thread: a warp released by its shuffle runs on before the
               // warps after it have started
  kRandom,     // a new random (seeded) order of the threads at every pass
};
constexpr int kSchedules = 4;

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kInOrder:
      return "in order";
    case Schedule::kReversed:
      return "reversed";
    case Schedule::kWarpAhead:
      return "warp ahead";
    case Schedule::kRandom:
      return "random";
  }
  return "?";
}

// What fills dynamic shared memory when a block starts: NaN, or a large finite value of either
// sign, so that neither fmaxf/fminf (which ignore NaN) nor a sum hides a read of memory that the
// block has not written yet.
constexpr int kPoisons = 3;
constexpr float kPoisonValues[kPoisons] = {0.f, 1e30f, -1e30f};  // [0]: all bits set (NaN)

void poison(unsigned char* p, std::size_t bytes, int which) {
  if (which == 0) {
    std::memset(p, 0xFF, bytes);
    return;
  }
  std::size_t i = 0;
  for (; i + sizeof(float) <= bytes; i += sizeof(float))
    std::memcpy(p + i, &kPoisonValues[which], sizeof(float));
  std::memset(p + i, 0xFF, bytes - i);
}

struct Fiber {
  Context context;
  unsigned char* mapping = nullptr;  // the stack with a guard page below it
  bool dirty = false;                // abandoned mid-run: its stack's shadow may hold poison
  uint3 tid{};
  int lane = 0;
  int warp = 0;
  State state = State::kReady;
  const char* file = nullptr;  // where it waits
  int line = 0;
  int parity = 0;  // which half of the warp's exchange buffer its next shuffle uses
};

struct Warp {
  int lanes = 0;        // threads of the block in this warp
  int arrived = 0;      // lanes waiting at the current shuffle
  unsigned exited = 0;  // lanes that have exited
  int needed = 0;       // lanes the current shuffle waits for
  unsigned mask = 0;    // the current shuffle's mask
  const char* file = nullptr;
  int line = 0;
  // double-buffered: a lane reads [p], the next shuffle writes [p ^ 1]
  std::uint64_t values[2][32] = {};
};

struct Launch {
  void (*body)(void*) = nullptr;
  void* closure = nullptr;
  int threads = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Context scheduler;
  Fiber* current = nullptr;
  Schedule schedule = Schedule::kInOrder;  // how this block's threads take turns
  int first_ready = 0;                     // kWarpAhead: no thread below it is ready
  std::vector<int> order, rank;            // kRandom: this pass's order, and each thread's place
  std::uint64_t random = 0;                // kRandom's state (a splitmix64 sequence)
  int block_arrived = 0;                   // threads waiting at the current __syncthreads
  int exited = 0;                          // threads that have exited
  const char* block_file = nullptr;
  int block_line = 0;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
  std::string error;  // a kernel bug found in the running block
  // racecheck: the barrier that opened the current interval (null: the start of the kernel),
  // and the first race found in it, reported when the interval closes
  const char* interval_file = nullptr;
  int interval_line = 0;
  std::string race;
};

std::mutex launch_mutex;  // one launch at a time: the built-in variables are global
Launch* running = nullptr;
std::vector<Fiber> fiber_pool;  // stacks kept from launch to launch

std::string where(const char* file, int line) {
  std::string f = file != nullptr ? file : "?";
  const std::size_t slash = f.find_last_of('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(line);
}

std::string thread_name(const Fiber& f) {
  return "thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," +
         std::to_string(f.tid.z) + ")";
}

std::string last_bug;  // the last kernel bug reported

// Prints a kernel bug on stderr and keeps it for last_kernel_bug().
void report(const std::string& message) {
  last_bug = "kvlab CUDA emulation: " + message;
  std::fprintf(stderr, "%s\n", last_bug.c_str());
}

// Thrown through the frames of a thread that found a kernel bug, up to fiber_entry, so that
// they are unwound (their temporaries freed) before the block is abandoned.
struct KernelBug {};

// Records a kernel bug and ends the running thread.
[[noreturn]] void kernel_bug(const std::string& message) {
  Launch& l = *running;
  if (l.error.empty()) l.error = message;
  throw KernelBug{};
}

// Sets the built-in variables for `f`.
void enter(const Fiber& f) { threadIdx = f.tid; }

// --- racecheck
// ------------------------------------------------------------------------------------
//
// Built with KVLAB_EMULATION_RACECHECK (emulator/CMakeLists.txt), the kernels' code
// calls `access` before every load and store it makes through memory: GCC's kernel-address
// sanitizer in its out-of-line form emits those calls (__asan_load4_noabort, ...) and leaves the
// runtime to the program; this file is that runtime. Each byte of shared memory (the block's
// dynamic shared memory, and the executable's zero-initialised statics, where `__shared__`
// variables live) has a shadow cell saying which thread wrote it last, and which warps read it,
// in which barrier interval (the code between two __syncthreads of the block). Two accesses to
// one byte in the same interval by threads of different warps, at least one a write, are a race
// whatever the emulator's order of the threads; so is a read of dynamic shared memory that no
// thread of the block has written.

struct Cell {  // 16 bytes: the check reads one per byte of every shared memory access
  std::uint32_t written = 0;       // interval of the last write
  std::uint32_t read = 0;          // interval of the reads in reader_warps
  std::uint32_t reader_warps = 0;  // warps that read it in `read` (bit w: warp w)
  std::int16_t writer = 0;         // thread index of the last write (a block has <= 1024)
  std::int16_t reader = 0;         // the first thread that read it in `read`
};

// The running barrier interval, unique over all launches until it wraps (open_interval), and the
// running block's first: a cell written in an interval before it was written by an earlier block.
std::uint32_t interval_serial = 0;
std::uint32_t block_first_interval = 0;
std::vector<Cell> dynamic_cells;     // one per byte of the running launch's dynamic shared memory
std::vector<Cell> static_cells;      // one per byte of [__bss_start, _end), made when first used
std::uint64_t checked_accesses = 0;  // shared memory accesses checked, over all launches

}  // namespace
}  // namespace kvlab_emulation

extern "C" char __bss_start[];  // the executable's zero-initialised statics (GNU ld)
extern "C" char _end[];

namespace kvlab_emulation {
namespace {

// Records the first race of the running interval (reported when the interval closes).
void found_race(Launch& l, const std::string& what) {
  if (!l.race.empty()) return;
  l.race = what + ", in the barrier interval between " +
           (l.interval_file == nullptr
                ? std::string("the start of the kernel")
                : "__syncthreads (" + where(l.interval_file, l.interval_line) + ")");
}

std::string thread_at(const Launch& l, int index) {
  return thread_name(l.fibers[static_cast<std::size_t>(index)]) + " (warp " +
         std::to_string(index / 32) + ")";
}

// Where racecheck looks, set while a block runs (sizes 0 otherwise, and when it is off): the
// block's dynamic shared memory and the executable's zero-initialised statics.
std::uintptr_t watched_smem = 0;
std::size_t watched_smem_bytes = 0;
std::uintptr_t watched_statics = 0;
std::size_t watched_statics_bytes = 0;
// On unless KVLAB_EMULATION_RACECHECK=0 (then the instrumented code only costs its calls).
bool racecheck_on = [] {
  const char* env = std::getenv("KVLAB_EMULATION_RACECHECK");
  return env == nullptr || std::string(env) != "0";
}();

// Records the race that thread `t`'s access (a write if `write`) finds on byte `i` of `region`,
// whose cell `c` still holds the state before the access. Out of line: check_access's loop, which
// runs for every byte of every shared memory access, stays a few loads and compares.
[[gnu::noinline, gnu::cold]] void report_race(Launch& l, const Cell& c, const char* region,
                                              bool dynamic, std::size_t i, int t, bool write) {
  if (!l.race.empty()) return;  // only the first race of an interval is reported
  const int w = t / 32;
  const std::uint32_t bit = 1u << w;
  const bool written_here = c.written == interval_serial && c.writer / 32 != w;
  char at[64];
  if (dynamic) {
    std::snprintf(at, sizeof at, "byte %zu", i);
  } else {  // a static: its address, for a debugger (`info symbol`)
    std::snprintf(at, sizeof at, "address %p", static_cast<void*>(__bss_start + i));
  }
  const auto race = [&](const char* kind, const std::string& other) {
    found_race(l, std::string(kind) + " race on " + region + " (" + at + "): " + thread_at(l, t) +
                      (write ? " writes" : " reads") + " a byte that " + other);
  };
  if (written_here) {
    race(write ? "write-after-write" : "read-after-write", thread_at(l, c.writer) + " wrote");
  } else if (write) {
    const int other = c.reader / 32 != w ? c.reader : -1;
    race("write-after-read",
         (other >= 0 ? thread_at(l, other)
                     : "a thread of warp " + std::to_string(__builtin_ctz(c.reader_warps & ~bit))) +
             " read");
  } else {
    found_race(l, thread_at(l, t) + " reads byte " + std::to_string(i) +
                      " of dynamic shared memory, which no thread of the block has written");
  }
}

// Checks and records an access of `bytes` bytes at `offset` of `region` by the running thread.
void check_access(std::vector<Cell>& cells, const char* region, std::size_t offset,
                  std::size_t limit, std::size_t bytes, bool write) {
  Launch& l = *running;
  ++checked_accesses;
  const int t = static_cast<int>(l.current - l.fibers.data());
  const int w = t / 32;
  const std::uint32_t bit = 1u << w;
  const bool dynamic = &cells == &dynamic_cells;
  // copies: the stores to the cells below could otherwise be the globals' for the compiler
  const std::uint32_t interval = interval_serial;
  const std::uint32_t first = block_first_interval;
  const std::size_t end = std::min(offset + bytes, limit);
  Cell* const cell = cells.data();
  for (std::size_t i = offset; i < end; ++i) {
    Cell& c = cell[i];
    const bool written_here = c.written == interval && c.writer / 32 != w;  // by another warp
    const bool read_here = c.read == interval;
    if (write) {
      if (written_here || (read_here && (c.reader_warps & ~bit) != 0)) {
        report_race(l, c, region, dynamic, i, t, write);
      }
      c.written = interval;
      c.writer = static_cast<std::int16_t>(t);
    } else {
      if (written_here || (dynamic && c.written < first)) {
        report_race(l, c, region, dynamic, i, t, write);
      }
      if (!read_here) {
        c.read = interval;
        c.reader_warps = 0;
        c.reader = static_cast<std::int16_t>(t);
      }
      c.reader_warps |= bit;
    }
  }
}

// An access of `bytes` bytes at `address` by instrumented code: checked if it is shared memory
// of the running block (two comparisons otherwise: it runs for every load and store). Unused
// where the AddressSanitizer build leaves out racecheck's entry points (below).
[[maybe_unused]] inline void access(std::uintptr_t address, std::size_t bytes, bool write) {
  if (address - watched_smem < watched_smem_bytes) {
    check_access(dynamic_cells, "dynamic shared memory", address - watched_smem, watched_smem_bytes,
                 bytes, write);
  } else if (address - watched_statics < watched_statics_bytes) {
    check_access(static_cells, "static shared memory", address - watched_statics,
                 watched_statics_bytes, bytes, write);
  }
}

// Racecheck watches the running block (`smem`: its dynamic shared memory), or nothing.
void watch(const Launch* l) {
  const bool on = l != nullptr && racecheck_on;
  watched_smem = on ? reinterpret_cast<std::uintptr_t>(l->smem) : 0;
  watched_smem_bytes = on && l->smem != nullptr ? l->smem_bytes : 0;
  watched_statics = reinterpret_cast<std::uintptr_t>(__bss_start);
  watched_statics_bytes = on ? static_cast<std::size_t>(_end - __bss_start) : 0;
  if (on && static_cells.size() < watched_statics_bytes) static_cells.resize(watched_statics_bytes);
}

// A new barrier interval (a block starts, or its threads pass a __syncthreads at file:line).
// Before the serial wraps, the cells are renumbered: what the running block wrote keeps interval
// 1, the rest (earlier blocks' writes, every read) 0, and the new interval is 2.
void open_interval(Launch& l, const char* file, int line) {
  if (interval_serial == std::numeric_limits<std::uint32_t>::max()) {
    for (std::vector<Cell>* cells : {&dynamic_cells, &static_cells}) {
      for (Cell& c : *cells) c = Cell{c.written >= block_first_interval ? 1u : 0u};
    }
    interval_serial = 1;
    block_first_interval = 1;
  }
  ++interval_serial;
  l.interval_file = file;
  l.interval_line = line;
}

// The next value of a splitmix64 sequence.
std::uint64_t next_random(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The thread to run next under the block's schedule (`Schedule`); null if none is ready, or
// (in order, reversed) none is ready after the running one: the pass ends and the scheduler
// starts the next. Switching from thread to thread directly halves the switches of a barrier.
Fiber* next_ready(Launch& l, bool new_pass = false) {
  const int n = l.threads;
  const auto ready = [&](int i) -> Fiber* {
    Fiber& f = l.fibers[static_cast<std::size_t>(i)];
    return f.state == State::kReady ? &f : nullptr;
  };
  const int at = new_pass ? -1 : static_cast<int>(l.current - l.fibers.data());
  switch (l.schedule) {
    case Schedule::kInOrder:
      for (int i = at + 1; i < n; ++i)
        if (Fiber* f = ready(i)) return f;
      return nullptr;
    case Schedule::kReversed:
      for (int i = new_pass ? n - 1 : at - 1; i >= 0; --i)
        if (Fiber* f = ready(i)) return f;
      return nullptr;
    case Schedule::kWarpAhead:
      // no thread below first_ready is ready (it is lowered whenever threads are released)
      for (int i = l.first_ready; i < n; ++i) {
        if (Fiber* f = ready(i)) {
          l.first_ready = i;
          return f;
        }
      }
      l.first_ready = n;
      return nullptr;
    case Schedule::kRandom: {
      // a new random order for every pass (Fisher-Yates), followed like kInOrder's
      if (new_pass) {
        l.order.resize(static_cast<std::size_t>(n));
        l.rank.resize(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) l.order[static_cast<std::size_t>(i)] = i;
        for (int i = n - 1; i > 0; --i) {
          const auto j = next_random(l.random) % static_cast<std::uint64_t>(i + 1);
          std::swap(l.order[static_cast<std::size_t>(i)], l.order[j]);
        }
        for (int i = 0; i < n; ++i)
          l.rank[static_cast<std::size_t>(l.order[static_cast<std::size_t>(i)])] = i;
      }
      for (int k = new_pass ? 0 : l.rank[static_cast<std::size_t>(at)] + 1; k < n; ++k)
        if (Fiber* f = ready(l.order[static_cast<std::size_t>(k)])) return f;
      return nullptr;
    }
  }
  return nullptr;
}

// Leaves the running fiber (for good if `finished`) for the next ready thread of the pass, or the
// scheduler at the end of the pass.
void yield(bool finished) {
  Launch& l = *running;
  Fiber& from = *l.current;
  Fiber* next = l.error.empty() ? next_ready(l) : nullptr;
  if (next == nullptr) {
    switch_context(from.context, l.scheduler, finished);
    return;
  }
  l.current = next;
  enter(*next);
  switch_context(from.context, next->context, finished);
}

// Suspends the running fiber until another thread releases it and it is resumed.
void suspend() { yield(false); }

// The code every fiber starts in: runs the kernel, then returns to the scheduler for good.
[[noreturn]] void fiber_entry() {
  Launch& l = *running;
#if defined(KVLAB_EMULATION_ASAN)
  // The stack we came from: the launching thread's the first time (later, maybe another fiber's).
  const void* from_bottom = nullptr;
  std::size_t from_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (l.scheduler.stack_bottom == nullptr) {
    l.scheduler.stack_bottom = from_bottom;
    l.scheduler.stack_size = from_size;
  }
#endif
  try {
    l.body(l.closure);
  } catch (const KernelBug&) {
    // l.error says what
  } catch (const std::exception& e) {
    if (l.error.empty()) l.error = thread_name(*l.current) + " threw: " + e.what();
  } catch (...) {
    if (l.error.empty()) l.error = thread_name(*l.current) + " threw an exception";
  }
  Fiber& f = *l.current;
  if (l.error.empty()) {
    // A thread that exits while others wait for it at a barrier leaves them waiting forever.
    if (l.block_arrived > 0) {
      l.error = thread_name(f) + " exited while " + std::to_string(l.block_arrived) +
                " threads wait at __syncthreads (" + where(l.block_file, l.block_line) +
                "): a barrier that only part of the block reaches";
    } else {
      const Warp& w = l.warps[static_cast<std::size_t>(f.warp)];
      if (w.arrived > 0 && (w.mask >> f.lane & 1u) != 0) {
        l.error = thread_name(f) + " exited while " + std::to_string(w.arrived) +
                  " lanes of its warp wait for it at " + "__shfl_xor_sync (" +
                  where(w.file, w.line) + ")";
      }
    }
  }
  f.state = l.error.empty() ? State::kDone : State::kFailed;
  ++l.exited;
  l.warps[static_cast<std::size_t>(f.warp)].exited |= 1u << f.lane;
  yield(true);
  std::abort();  // never resumed
}

// A fresh fiber stack (mmap: committed as it is touched; a guard page below catches overflow).
void map_stack(Fiber& f) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* p =
      mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "kvlab CUDA emulation: cannot map a %zu-byte fiber stack\n", kStackBytes);
    std::abort();
  }
  f.mapping = static_cast<unsigned char*>(p);
  mprotect(f.mapping, page, PROT_NONE);
  f.context.stack_bottom = f.mapping + page;
  f.context.stack_size = kStackBytes;
}

// Prepares `f` to start at fiber_entry on its own stack.
void start_fiber(Fiber& f) {
  unsigned char* bottom = static_cast<unsigned char*>(const_cast<void*>(f.context.stack_bottom));
#if defined(KVLAB_EMULATION_ASAN)
  // Frames that never returned keep their redzones poisoned: fiber_entry and the switch below
  // it at the top of the stack, any frame of a thread abandoned in a failed block.
  constexpr std::size_t kTopBytes = 16 << 10;
  if (f.dirty) {
    __asan_unpoison_memory_region(bottom, kStackBytes);
  } else {
    __asan_unpoison_memory_region(bottom + kStackBytes - kTopBytes, kTopBytes);
  }
#endif
  f.dirty = false;
  f.context.fake_stack = nullptr;
#if defined(__x86_64__)
  auto top = reinterpret_cast<std::uintptr_t>(bottom + kStackBytes) & ~std::uintptr_t{15};
  auto* frame = reinterpret_cast<std::uint64_t*>(top - 72);  // see kvlab_emulation_switch
  std::uint32_t mxcsr = 0;
  std::uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = static_cast<std::uint64_t>(mxcsr) | static_cast<std::uint64_t>(fpucw) << 32;
  for (int i = 1; i <= 6; ++i) frame[i] = 0;                 // r15 r14 r13 r12 rbx rbp
  frame[7] = reinterpret_cast<std::uint64_t>(&fiber_entry);  // where `ret` goes
  frame[8] = 0;                                              // fiber_entry never returns
  f.context.sp = frame;
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = bottom;
  f.context.uc.uc_stack.ss_size = kStackBytes;
  f.context.uc.uc_link = nullptr;
  makecontext(&f.context.uc, reinterpret_cast<void (*)()>(&fiber_entry), 0);
#endif
}

// Why the block cannot go on: every thread that has not exited waits.
std::string describe_deadlock(const Launch& l) {
  std::string text = "deadlock: no thread of the block can go on;";
  int shown = 0;
  for (const Fiber& f : l.fibers) {
    if (f.state == State::kDone) continue;
    if (shown++ == 4) {
      text += " ...";
      break;
    }
    text += " " + thread_name(f) + " waits at " +
            (f.state == State::kAtBlockBarrier ? "__syncthreads" : "__shfl_xor_sync") + " (" +
            where(f.file, f.line) + ");";
  }
  int exited = 0;
  for (const Fiber& f : l.fibers) exited += f.state == State::kDone;
  return text + " " + std::to_string(exited) + " threads have exited";
}

// Runs one block to completion; false (with l.error set) if it failed.
bool run_block(Launch& l) {
  for (Fiber& f : l.fibers) {
    f.state = State::kReady;
    f.parity = 0;
    start_fiber(f);
  }
  for (Warp& w : l.warps) {
    w.arrived = 0;
    w.exited = 0;
    w.mask = 0;
  }
  l.block_arrived = 0;
  l.exited = 0;
  l.first_ready = 0;
  l.race.clear();
  open_interval(l, nullptr, 0);
  block_first_interval = interval_serial;
  const int n = l.threads;
  // Each pass starts the first ready thread in the block's order; the threads then hand over
  // to each other (`yield`) and the last one of the pass comes back here.
  while (l.exited < n && l.error.empty()) {
    Fiber* first = next_ready(l, true);
    if (first == nullptr) {
      l.error = describe_deadlock(l);
      break;
    }
    l.current = first;
    enter(*first);
    switch_context(l.scheduler, first->context);
  }
  if (l.error.empty() && !l.race.empty()) l.error = l.race + " and the end of the kernel";
  if (!l.error.empty()) {
    for (Fiber& f : l.fibers) f.dirty = f.dirty || (f.state != State::kDone);
    return false;
  }
  return true;
}

// Runs the blocks of the launch in order (only block `only` when it is not -1), block i under
// schedule (i + offset) % kSchedules and the poison that goes with it; a kernel bug stops it.
cudaError_t run_grid(Launch& l, const char* name, dim3 grid, std::uint64_t offset,
                     std::int64_t only = -1) {
  std::uint64_t index = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++index) {
        if (only >= 0 && index != static_cast<std::uint64_t>(only)) continue;
        blockIdx = make_uint3(x, y, z);
        // Neighbouring blocks take turns and are poisoned differently (every pair within
        // kSchedules * kPoisons blocks): a kernel whose result depends on either has a race.
        const std::uint64_t turn = index + offset;
        l.schedule = static_cast<Schedule>(turn % kSchedules);
        l.random = turn * 0x2545F4914F6CDD1Dull + 1;
        if (l.smem_bytes > 0) {
          l.smem = static_cast<unsigned char*>(::operator new(l.smem_bytes, std::align_val_t(16)));
          poison(l.smem, l.smem_bytes, static_cast<int>(turn / kSchedules % kPoisons));
        }
        watch(&l);
        const bool ok = run_block(l);
        watch(nullptr);
        if (l.smem != nullptr) ::operator delete(l.smem, std::align_val_t(16));
        l.smem = nullptr;
        if (!ok) {
          report(std::string("kernel bug in ") + name + ", block (" + std::to_string(x) + "," +
                 std::to_string(y) + "," + std::to_string(z) + ") of grid (" +
                 std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                 std::to_string(grid.z) + "), " + std::to_string(l.threads) +
                 " threads, schedule \"" + schedule_name(l.schedule) + "\": " + l.error);
          return cudaErrorLaunchFailure;
        }
      }
  return cudaSuccess;
}

// KVLAB_EMULATION_SCHEDULES: how many times each launch runs, each time under other schedules
// (1 when unset: once).
int schedule_runs() {
  const char* env = std::getenv("KVLAB_EMULATION_SCHEDULES");
  return env != nullptr && std::atoi(env) > 1 ? std::atoi(env) : 1;
}

// The contents of every device allocation (start, bytes).
using Snapshot = std::vector<std::pair<std::uintptr_t, std::vector<unsigned char>>>;

Snapshot take_snapshot() {
  std::lock_guard<std::mutex> lock(memory_mutex);
  Snapshot s;
  s.reserve(allocations.size());
  for (const auto& [start, bytes] : allocations) {
    const auto* p = reinterpret_cast<const unsigned char*>(start);
    s.emplace_back(start, std::vector<unsigned char>(p, p + bytes));
  }
  return s;
}

void restore(const Snapshot& s) {
  for (const auto& [start, bytes] : s)
    std::memcpy(reinterpret_cast<void*>(start), bytes.data(), bytes.size());
}

// Where `a` and `b` first differ ("" if nowhere).
std::string first_difference(const Snapshot& a, const Snapshot& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::vector<unsigned char>& x = a[i].second;
    const std::vector<unsigned char>& y = b[i].second;
    for (std::size_t k = 0; k < x.size(); ++k) {
      if (x[k] != y[k]) {
        char text[160];
        std::snprintf(text, sizeof text,
                      "byte %zu of the %zu-byte allocation at %p: 0x%02x vs 0x%02x", k, x.size(),
                      reinterpret_cast<void*>(a[i].first), x[k], y[k]);
        return text;
      }
    }
  }
  return "";
}

// The launch ran once (under offset 0) from `before`: runs it `runs` - 1 more times from
// `before`, each under other schedules and poison (offsets 1, 2, ...), and requires each to leave
// device memory bit for bit as the first did. On a difference, runs the blocks one at a time to
// find the first whose result depends on the schedule. Leaves device memory as the first run did.
cudaError_t compare_schedules(Launch& l, const char* name, dim3 grid, int runs,
                              const Snapshot& before) {
  const Snapshot first = take_snapshot();
  for (int run = 1; run < runs; ++run) {
    restore(before);
    const auto offset = static_cast<std::uint64_t>(run);
    if (run_grid(l, name, grid, offset) != cudaSuccess) return cudaErrorLaunchFailure;
    const std::string diff = first_difference(first, take_snapshot());
    if (diff.empty()) continue;
    // Which block: each alone, from `before`, under both offsets.
    std::string block = "no single block (blocks that depend on each other)";
    const std::uint64_t blocks = 1ull * grid.x * grid.y * grid.z;
    for (std::uint64_t i = 0; i < blocks; ++i) {
      restore(before);
      if (run_grid(l, name, grid, 0, static_cast<std::int64_t>(i)) != cudaSuccess) break;
      const Snapshot a = take_snapshot();
      const Schedule sa = l.schedule;
      restore(before);
      if (run_grid(l, name, grid, offset, static_cast<std::int64_t>(i)) != cudaSuccess) break;
      if (first_difference(a, take_snapshot()).empty()) continue;
      block = "block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
              std::to_string(blockIdx.z) + "), whose result differs between schedules \"" +
              schedule_name(sa) + "\" and \"" + schedule_name(l.schedule) + "\"";
      break;
    }
    restore(first);
    report(std::string("race in ") + name +
           ": its result depends on the order of the threads (run 0 and run " +
           std::to_string(run) + " of KVLAB_EMULATION_SCHEDULES differ at " + diff + "); " + block);
    return cudaErrorLaunchFailure;
  }
  restore(first);
  return cudaSuccess;
}

}  // namespace

namespace detail {

cudaError_t run_launch(const char* name, dim3 grid, dim3 block, std::size_t smem_bytes,
                       cudaStream_t /*stream*/, void (*body)(void*), void* closure) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535) {
    return fail(cudaErrorInvalidConfiguration);
  }
  // more needs cudaFuncSetAttribute
  if (smem_bytes > 48 * 1024) return fail(cudaErrorInvalidValue);

  std::lock_guard<std::mutex> lock(launch_mutex);
  Launch l;
  l.body = body;
  l.closure = closure;
  l.threads = static_cast<int>(threads);
  if (fiber_pool.size() < threads) {
    const std::size_t old = fiber_pool.size();
    fiber_pool.resize(threads);
    for (std::size_t i = old; i < threads; ++i) map_stack(fiber_pool[i]);
  }
  l.fibers.assign(fiber_pool.begin(), fiber_pool.begin() + static_cast<std::ptrdiff_t>(threads));
  for (int i = 0; i < l.threads; ++i) {
    Fiber& f = l.fibers[static_cast<std::size_t>(i)];
    const unsigned u = static_cast<unsigned>(i);
    f.tid = make_uint3(u % block.x, u / block.x % block.y, u / (block.x * block.y));
    f.lane = i % 32;
    f.warp = i / 32;
  }
  l.warps.assign(static_cast<std::size_t>((l.threads + 31) / 32), Warp{});
  for (std::size_t w = 0; w < l.warps.size(); ++w) {
    l.warps[w].lanes = std::min(32, l.threads - static_cast<int>(w) * 32);
  }

  l.smem_bytes = smem_bytes;
  if (dynamic_cells.size() < smem_bytes) dynamic_cells.resize(smem_bytes);
  running = &l;
  blockDim = block;
  gridDim = grid;
  const int runs = schedule_runs();
  const Snapshot before = runs > 1 ? take_snapshot() : Snapshot{};
  cudaError_t status = run_grid(l, name, grid, 0);
  if (status == cudaSuccess && runs > 1) status = compare_schedules(l, name, grid, runs, before);
  // Keep the stacks (and whether they need cleaning) for the next launch.
  std::copy(l.fibers.begin(), l.fibers.end(), fiber_pool.begin());
  running = nullptr;
  return status == cudaSuccess ? cudaSuccess : fail(status);
}

void sync_block(const char* file, int line) {
  Launch& l = *running;
  Fiber& f = *l.current;
  if (l.block_arrived > 0 && (file != l.block_file || line != l.block_line)) {
    kernel_bug(thread_name(f) + " waits at __syncthreads (" + where(file, line) +
               ") while others wait at " + where(l.block_file, l.block_line) +
               ": divergent barriers");
  }
  if (l.exited > 0) {
    kernel_bug(thread_name(f) + " reached __syncthreads (" + where(file, line) + ") after " +
               std::to_string(l.exited) +
               " threads of its block exited: a barrier that only part of the block reaches");
  }
  if (++l.block_arrived < l.threads) {
    f.state = State::kAtBlockBarrier;
    f.file = file;
    f.line = line;
    l.block_file = file;
    l.block_line = line;
    suspend();
    return;
  }
  // The last thread: close the interval (reporting its race) and release the others.
  if (!l.race.empty()) kernel_bug(l.race + " and __syncthreads (" + where(file, line) + ")");
  open_interval(l, file, line);
  l.block_arrived = 0;
  for (Fiber& other : l.fibers) {
    if (other.state == State::kAtBlockBarrier) other.state = State::kReady;
  }
  l.first_ready = 0;
}

std::uint64_t exchange_xor(const char* file, int line, unsigned mask, std::uint64_t value,
                           int lane_mask, int width) {
  Launch& l = *running;
  Fiber& f = *l.current;
  Warp& w = l.warps[static_cast<std::size_t>(f.warp)];
  const auto call = [&] { return "__shfl_xor_sync (" + where(file, line) + ")"; };
  const unsigned present = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1u;
  if ((mask >> f.lane & 1u) == 0)
    kernel_bug(thread_name(f) + " calls " + call() + " with a mask without its own lane");
  if ((mask & ~present) != 0) {
    kernel_bug(thread_name(f) + ": the mask of " + call() +
               " names lanes that the block does not have (" + std::to_string(w.lanes) +
               " threads in this warp)");
  }
  // Whole-warp masks only: the exchange buffer's halves alternate per lane, which stays in step
  // across the warp only if every lane takes part in every shuffle (kvlab's kernels use no other
  // mask). A partial mask is refused rather than emulated wrongly.
  if (mask != present) {
    kernel_bug(thread_name(f) + " calls " + call() + " with mask " + std::to_string(mask) +
               ": the emulator supports only masks of the whole warp (" + std::to_string(present) +
               ")");
  }
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    kernel_bug(call() + ": width is not a power of two <= 32");
  if (w.arrived > 0 && (w.mask != mask || w.file != file || w.line != line)) {
    kernel_bug(thread_name(f) + " calls " + call() + " while its warp waits at __shfl_xor_sync (" +
               where(w.file, w.line) + ") with mask " + std::to_string(w.mask) +
               ": divergent shuffles");
  }
  if ((mask & w.exited) != 0) {
    kernel_bug(thread_name(f) + " calls " + call() +
               " with a mask that names lanes which have exited (" +
               std::to_string(mask & w.exited) + ")");
  }
  int src = f.lane ^ lane_mask;
  // a later segment: its own value
  if (src >= (f.lane / width + 1) * width || src > 31) src = f.lane;
  if ((mask >> src & 1u) == 0) {
    kernel_bug(thread_name(f) + " reads lane " + std::to_string(src) + " outside the mask in " +
               call());
  }

  const int p = f.parity;
  f.parity ^= 1;
  w.values[p][f.lane] = value;
  if (w.arrived == 0) w.needed = __builtin_popcount(mask);
  if (++w.arrived < w.needed) {
    w.mask = mask;
    w.file = file;
    w.line = line;
    f.state = State::kAtWarpBarrier;
    f.file = file;
    f.line = line;
    suspend();
  } else {
    w.arrived = 0;
    for (int lane = 0; lane < w.lanes; ++lane) {
      Fiber& other = l.fibers[static_cast<std::size_t>(f.warp * 32 + lane)];
      if (other.state == State::kAtWarpBarrier) other.state = State::kReady;
    }
    l.first_ready = std::min(l.first_ready, f.warp * 32);
  }
  return w.values[p][src];
}

}  // namespace detail

unsigned char* dynamic_shared_memory() { return running != nullptr ? running->smem : nullptr; }

std::uint64_t checked_shared_accesses() { return checked_accesses; }

void set_interval_serial(std::uint32_t serial) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  interval_serial = serial;
}

const char* last_kernel_bug() { return last_bug.c_str(); }

bool set_racecheck(bool on) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  const bool was = racecheck_on;
  racecheck_on = on;
  return was;
}

}  // namespace kvlab_emulation

// --- racecheck's entry points
// --------------------------------------------------------------------- Called by code built with
// -fsanitize=kernel-address and out-of-line checks (see `access`). Not defined under
// AddressSanitizer, whose runtime has functions of these names (the two cannot be combined; that
// build checks memory, this one races).
#if !defined(KVLAB_EMULATION_ASAN)
extern "C" {
#define KVLAB_EMULATION_ACCESS(n)                          \
  void __asan_load##n##_noabort(std::uintptr_t address) {  \
    kvlab_emulation::access(address, n, false);            \
  }                                                        \
  void __asan_store##n##_noabort(std::uintptr_t address) { \
    kvlab_emulation::access(address, n, true);             \
  }
KVLAB_EMULATION_ACCESS(1)
KVLAB_EMULATION_ACCESS(2)
KVLAB_EMULATION_ACCESS(4)
KVLAB_EMULATION_ACCESS(8)
KVLAB_EMULATION_ACCESS(16)
#undef KVLAB_EMULATION_ACCESS
void __asan_loadN_noabort(std::uintptr_t address, std::size_t bytes) {
  kvlab_emulation::access(address, bytes, false);
}
void __asan_storeN_noabort(std::uintptr_t address, std::size_t bytes) {
  kvlab_emulation::access(address, bytes, true);
}
// Called around dynamic initialisation and before noreturn calls: nothing to do.
void __asan_handle_no_return() {}
void __asan_before_dynamic_init(const char* /*module*/) {}
void __asan_after_dynamic_init() {}
}
#endif

// --- the runtime API ----------------------------------------------------------------------------

using kvlab_emulation::fail;
using kvlab_emulation::is_device_pointer;
using kvlab_emulation::is_device_range;
using kvlab_emulation::last_error;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

// The emulated device's multiprocessors: 16, a small GPU; KVLAB_EMULATION_SM_COUNT overrides it.
static int emulated_sm_count() {
  const char* env = std::getenv("KVLAB_EMULATION_SM_COUNT");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 16;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = emulated_sm_count();
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue);
  }
}

// The fields a program may print or plan with; the rest stay zero. The name says what it is.
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "kvlab CPU emulator (not a GPU)");
  prop->multiProcessorCount = emulated_sm_count();
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t /*stream*/) { return cudaSuccess; }

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (a kernel bug found by the CPU emulator)";
    default:
      return "unknown error";
  }
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  using namespace kvlab_emulation;
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  *pointer = nullptr;
  if (bytes == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(memory_mutex);
  if (bytes > kDeviceMemory - allocated) return fail(cudaErrorMemoryAllocation);
  void* p = ::operator new(bytes, std::align_val_t(kAlignment), std::nothrow);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  allocated += bytes;
  *pointer = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  using namespace kvlab_emulation;
  if (pointer == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(memory_mutex);
  const auto it = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == allocations.end()) return fail(cudaErrorInvalidDevicePointer);
  allocated -= it->second;
  allocations.erase(it);
  ::operator delete(pointer, std::align_val_t(kAlignment));
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t /*stream*/) {
  return cudaMalloc(pointer, bytes);
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t /*stream*/) { return cudaFree(pointer); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  const bool dst_device = is_device_pointer(dst), src_device = is_device_pointer(src);
  if (kind == cudaMemcpyDefault) {
    kind = dst_device ? (src_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                      : (src_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool want_dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyHostToDevice &&
      kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice) {
    return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (want_dst_device ? !is_device_range(dst, bytes) : dst_device)
    return fail(cudaErrorInvalidValue);
  if (want_src_device ? !is_device_range(src, bytes) : src_device)
    return fail(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t /*stream*/) {
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!is_device_range(pointer, bytes)) return fail(cudaErrorInvalidValue);
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

}  // extern "C"
