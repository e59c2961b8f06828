// The CPU emulator behind tests/cuda_emulation/include/cuda_runtime.h (the model and its limits
// are described there): device memory, the runtime calls kvlab uses, and kernel launches whose
// threads run as fibers, one block at a time.
#include <cuda_runtime.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

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
  bool reverse = false;   // this block resumes its threads in reverse order
  int block_arrived = 0;  // threads waiting at the current __syncthreads
  int exited = 0;         // threads that have exited
  const char* block_file = nullptr;
  int block_line = 0;
  unsigned char* smem = nullptr;
  std::string error;  // a kernel bug found in the running block
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

// The next thread after the running one, in this block's order, that is ready to run; null if
// none is. Switching to it directly halves the switches of a barrier.
Fiber* next_ready(Launch& l) {
  const int n = l.threads;
  const int step = l.reverse ? -1 : 1;
  for (int i = static_cast<int>(l.current - l.fibers.data()) + step; i >= 0 && i < n; i += step) {
    Fiber& f = l.fibers[static_cast<std::size_t>(i)];
    if (f.state == State::kReady) return &f;
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
  const int n = l.threads;
  // Each pass starts the first ready thread in the block's order; the threads then hand over
  // to each other (`yield`) and the last one of the pass comes back here.
  while (l.exited < n && l.error.empty()) {
    Fiber* first = nullptr;
    for (int k = 0; k < n && first == nullptr; ++k) {
      Fiber& f = l.fibers[static_cast<std::size_t>(l.reverse ? n - 1 - k : k)];
      if (f.state == State::kReady) first = &f;
    }
    if (first == nullptr) {
      l.error = describe_deadlock(l);
      break;
    }
    l.current = first;
    enter(*first);
    switch_context(l.scheduler, first->context);
  }
  if (!l.error.empty()) {
    for (Fiber& f : l.fibers) f.dirty = f.dirty || (f.state != State::kDone);
    return false;
  }
  return true;
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

  running = &l;
  blockDim = block;
  gridDim = grid;
  cudaError_t status = cudaSuccess;
  std::uint64_t index = 0;
  for (unsigned z = 0; z < grid.z && status == cudaSuccess; ++z)
    for (unsigned y = 0; y < grid.y && status == cudaSuccess; ++y)
      for (unsigned x = 0; x < grid.x && status == cudaSuccess; ++x, ++index) {
        blockIdx = make_uint3(x, y, z);
        if (smem_bytes > 0) {
          l.smem = static_cast<unsigned char*>(::operator new(smem_bytes, std::align_val_t(16)));
          std::memset(l.smem, 0xFF, smem_bytes);
        }
        l.reverse = index % 2 == 1;
        const bool ok = run_block(l);
        if (l.smem != nullptr) ::operator delete(l.smem, std::align_val_t(16));
        l.smem = nullptr;
        if (!ok) {
          std::fprintf(stderr,
                       "kvlab CUDA emulation: kernel bug in %s, block (%u,%u,%u) of grid "
                       "(%u,%u,%u), %u threads: %s\n",
                       name, x, y, z, grid.x, grid.y, grid.z, static_cast<unsigned>(threads),
                       l.error.c_str());
          status = cudaErrorLaunchFailure;
        }
      }
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
  // The last thread: release the others.
  l.block_arrived = 0;
  for (Fiber& other : l.fibers) {
    if (other.state == State::kAtBlockBarrier) other.state = State::kReady;
  }
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
  }
  return w.values[p][src];
}

}  // namespace detail

unsigned char* dynamic_shared_memory() { return running != nullptr ? running->smem : nullptr; }

}  // namespace kvlab_emulation

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
