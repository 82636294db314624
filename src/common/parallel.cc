// The work-sharing layer (see parallel.h): a pool of helper threads per calling thread, one job at
// a time, chunks claimed from a shared counter, futexes for sleeping.
//
// The claim word packs (generation << 32 | chunks not yet claimed). A helper claims a chunk with a
// compare-and-swap that also checks the generation, so a helper that wakes up late, after its job
// is over, claims nothing and touches nothing of the caller's. The job's function and context are
// read only after a successful claim: the caller cannot have returned then, since it waits for
// every chunk to finish.
#include "common/parallel.h"

#include <dlfcn.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

namespace fusekit {
namespace {

void futex_wait(std::atomic<uint32_t> *word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t> *word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a helper (and a caller waiting for the last chunks) spins before sleeping.
std::chrono::nanoseconds spin_time() {
  static const std::chrono::nanoseconds t = [] {
    const char *e = std::getenv("FUSEKIT_SPIN_US");
    const long us = e != nullptr && *e != '\0' ? std::atol(e) : 50;
    return std::chrono::nanoseconds(std::max(0L, us) * 1000);
  }();
  return t;
}

// Spins until pred() or the spin time is over; returns pred().
template <typename Pred>
bool spin_until(Pred &&pred) {
  if (pred()) return true;
  const auto deadline = std::chrono::steady_clock::now() + spin_time();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      cpu_relax();
      if (pred()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

// The longest a helper spins for the rest of a job it took part in (see helper_main).
constexpr std::chrono::microseconds kMaxJobSpin{2000};

thread_local bool t_in_chunk = false;  // inside a chunk, or a helper thread: nested calls inline

class Pool {
 public:
  Pool() = default;
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;
  ~Pool() {
    stop_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&generation_);
    for (auto &t : workers_) t.join();
  }

  int helpers() const { return static_cast<int>(workers_.size()); }

  void run(int64_t units, int threads, int64_t per_unit, int64_t chunks, ChunkFn fn, void *ctx) {
    grow(threads - 1);
    const int nt = std::min(threads, helpers() + 1);
    fn_ = fn;
    ctx_ = ctx;
    units_ = units;
    per_unit_ = per_unit;
    chunks_ = chunks;
    pending_.store(static_cast<uint32_t>(units), std::memory_order_relaxed);
    participants_.store(nt, std::memory_order_relaxed);
    const uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store((uint64_t{g} << 32) | static_cast<uint64_t>(units), std::memory_order_release);
    generation_.store(g, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&generation_);
    work(g, 0);
    // Every chunk is claimed; wait for those still running on helpers.
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      for (uint32_t v; (v = pending_.load(std::memory_order_acquire)) != 0;) {
        caller_sleeping_.store(1, std::memory_order_seq_cst);
        if (pending_.load(std::memory_order_seq_cst) != 0) futex_wait(&pending_, v);
        caller_sleeping_.store(0, std::memory_order_relaxed);
      }
    }
  }

 private:
  void grow(int wanted) {
    while (helpers() < wanted) {
      try {
        const uint32_t g = generation_.load(std::memory_order_relaxed);
        const int id = helpers() + 1;
        workers_.emplace_back([this, id, g] { helper_main(id, g); });
      } catch (const std::system_error &) {
        return;  // no more threads: run with those there are
      }
    }
  }

  // Claims and runs chunks of generation g until none is left.
  void work(uint32_t g, int worker) {
    const bool was = t_in_chunk;
    t_in_chunk = true;
    uint64_t s = claim_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(s >> 32) != g || (s & 0xffffffffu) == 0) break;
      if (!claim_.compare_exchange_weak(s, s - 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;
      }
      const int64_t unit = units_ - static_cast<int64_t>(s & 0xffffffffu);
      const int64_t end = std::min(chunks_, (unit + 1) * per_unit_);
      for (int64_t c = unit * per_unit_; c < end; ++c) fn_(ctx_, c, worker);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
          caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
        futex_wake_all(&pending_);
      }
      s = claim_.load(std::memory_order_acquire);
    }
    t_in_chunk = was;
  }

  void helper_main(int id, uint32_t seen) {
    t_in_chunk = true;
    for (;;) {
      uint32_t g = generation_.load(std::memory_order_acquire);
      if (g == seen) {
        // While the job this helper took part in is still running, another stage of the same
        // call usually follows at once: keep spinning (up to kMaxJobSpin) instead of falling asleep
        // and paying a wake-up (up to a millisecond for an idle vCPU); then the usual spin.
        const auto job_deadline = std::chrono::steady_clock::now() + kMaxJobSpin;
        while ((g = generation_.load(std::memory_order_acquire)) == seen &&
               pending_.load(std::memory_order_relaxed) != 0 &&
               std::chrono::steady_clock::now() < job_deadline) {
          for (int i = 0; i < 32; ++i) cpu_relax();
        }
        if (g == seen) {
          spin_until([&] { return (g = generation_.load(std::memory_order_acquire)) != seen; });
        }
        while (g == seen) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          if (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(&generation_, seen);
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
          g = generation_.load(std::memory_order_acquire);
        }
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = g;
      if (id < participants_.load(std::memory_order_relaxed)) work(g, id);
    }
  }

  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> pending_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> sleepers_{0};
  std::atomic<uint32_t> caller_sleeping_{0};
  std::atomic<int> participants_{0};
  std::atomic<bool> stop_{false};
  // The job: written before the claim word is published, read after a successful claim.
  ChunkFn fn_ = nullptr;
  void *ctx_ = nullptr;
  int64_t units_ = 0, per_unit_ = 1, chunks_ = 0;
  std::vector<std::thread> workers_;
};

Pool &this_threads_pool() {
  thread_local Pool pool;
  return pool;
}

// ---- the host process's OpenMP runtime (opt-in, FUSEKIT_THREADS_ON_OPENMP=1) ----
// Inside a PyTorch process, libgomp's workers spin after each torch op on the cores fusekit's
// helpers want. With the variable set, and libgomp loaded in the process, a call runs its chunks
// on the OpenMP team instead (GOMP_parallel; the calling thread is thread 0, `worker` its OpenMP
// thread number), chunks claimed from a shared counter as in the pool, so the bits are the same.
// Off by default: GOMP_parallel ends with a barrier that waits for every team thread, also one
// the OS has descheduled before it took a chunk, and the measurements (docs/architecture.md,
// "Threads") do not show it winning.
using GompParallelFn = void (*)(void (*)(void *), void *, unsigned, unsigned);
using OmpThreadNumFn = int (*)();
struct HostOpenMP {
  GompParallelFn parallel = nullptr;
  OmpThreadNumFn thread_num = nullptr;
};

bool host_openmp_wanted() {
  static const bool wanted = [] {
    const char *e = std::getenv("FUSEKIT_THREADS_ON_OPENMP");
    return e != nullptr && *e == '1';
  }();
  return wanted;
}

// libgomp's entry points once it is loaded (looked up again at most every 100 ms until then).
const HostOpenMP *host_openmp() {
  static std::atomic<bool> found{false};
  static HostOpenMP h;
  static std::atomic<int64_t> next_look{0};
  static std::atomic<bool> busy{false};
  if (found.load(std::memory_order_acquire)) return &h;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < next_look.load(std::memory_order_relaxed)) return nullptr;
  if (busy.exchange(true, std::memory_order_acquire)) return nullptr;
  auto p = reinterpret_cast<GompParallelFn>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
  auto t = reinterpret_cast<OmpThreadNumFn>(dlsym(RTLD_DEFAULT, "omp_get_thread_num"));
  if (p != nullptr && t != nullptr) {
    h.parallel = p;
    h.thread_num = t;
    found.store(true, std::memory_order_release);
  } else {
    next_look.store(now + std::chrono::nanoseconds(std::chrono::milliseconds(100)).count(),
                    std::memory_order_relaxed);
  }
  busy.store(false, std::memory_order_release);
  return found.load(std::memory_order_acquire) ? &h : nullptr;
}

struct OpenMPJob {
  std::atomic<int64_t> next{0};
  int64_t chunks = 0;
  ChunkFn fn = nullptr;
  void *ctx = nullptr;
  OmpThreadNumFn thread_num = nullptr;
};

void openmp_body(void *data) {
  auto *job = static_cast<OpenMPJob *>(data);
  const int worker = job->thread_num();
  const bool was = t_in_chunk;
  t_in_chunk = true;
  for (int64_t c; (c = job->next.fetch_add(1, std::memory_order_relaxed)) < job->chunks;) {
    job->fn(job->ctx, c, worker);
  }
  t_in_chunk = was;
}

}  // namespace

void parallel_chunks_raw(int64_t chunks, int threads, ChunkFn fn, void *ctx) {
  if (chunks <= 0) return;
  const int nt = static_cast<int>(std::clamp<int64_t>(threads, 1, chunks));
  if (nt == 1 || t_in_chunk) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c, 0);
    return;
  }
  if (host_openmp_wanted()) {
    if (const HostOpenMP *omp = host_openmp(); omp != nullptr) {
      OpenMPJob job;
      job.chunks = chunks;
      job.fn = fn;
      job.ctx = ctx;
      job.thread_num = omp->thread_num;
      omp->parallel(&openmp_body, &job, static_cast<unsigned>(nt), 0);
      return;
    }
  }
  // Claimed units of one or more chunks, so that the count fits the claim word.
  const int64_t max_units = int64_t{1} << 30;
  const int64_t per_unit = (chunks + max_units - 1) / max_units;
  const int64_t units = (chunks + per_unit - 1) / per_unit;
  this_threads_pool().run(units, nt, per_unit, chunks, fn, ctx);
}

int parallel_helpers_started() {
  return this_threads_pool().helpers();
}

}  // namespace fusekit
