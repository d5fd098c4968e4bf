// A small work-sharing thread pool for the decode step's matvecs: the caller and the helpers take
// chunks from one counter, and the call returns once every chunk is done — not once every thread
// has arrived at a barrier. With OpenMP (at::parallel_for) each of the ~120 parallel regions per
// token waits for every worker; on a host where another process holds a core, a descheduled
// worker stalls each region by a scheduler tick (measured here: 2 threads 1.2 tok/s, 1 thread 15,
// one busy neighbour). Here a helper that is not running simply takes no chunk; only a helper
// descheduled in the middle of a chunk is waited for (chunks are small).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace opscope {

class WorkPool {
 public:
  static WorkPool& get() {
    static WorkPool* pool = new WorkPool();  // never destroyed: helpers may outlive static teardown
    return *pool;
  }

  // fn(i) for i in [0, n), on the caller and up to `threads - 1` helpers.
  void run(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
    if (n <= 0) return;
    if (threads <= 1 || n == 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    std::lock_guard<std::mutex> one_job(run_mu_);  // one job at a time (callers from two threads)
    ensure_helpers(threads - 1);
    fn_ = &fn;
    n_ = n;
    done_.store(0, std::memory_order_relaxed);
    active_ = threads - 1;
    const uint64_t gen = gen_.load(std::memory_order_relaxed) + 1;
    claim_.store(gen << 32, std::memory_order_release);  // index 0 of the new generation
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.store(gen, std::memory_order_release);
    }
    cv_.notify_all();
    work(gen);
    while (done_.load(std::memory_order_acquire) < n_) std::this_thread::yield();
    claim_.store((gen << 32) | 0xFFFFFFFFu, std::memory_order_release);  // nothing left to claim
  }

 private:
  WorkPool() = default;

  // Claim and run chunks of generation `gen` until none is left.
  void work(uint64_t gen) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    while ((c >> 32) == gen && int64_t(c & 0xFFFFFFFFu) < n_) {
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) {
        (*fn_)(int64_t(c & 0xFFFFFFFFu));
        done_.fetch_add(1, std::memory_order_release);
        c = claim_.load(std::memory_order_acquire);
      }
    }
  }

  void ensure_helpers(int want) {
    while (int(helpers_.size()) < want) {
      const int id = int(helpers_.size());
      helpers_.emplace_back([this, id] { helper(id); });
      helpers_.back().detach();
    }
  }

  void helper(int id) {
    uint64_t seen = gen_.load(std::memory_order_acquire);
    for (;;) {
      uint64_t g = seen;
      for (int spin = 0; spin < 20000 && (g = gen_.load(std::memory_order_acquire)) == seen; ++spin) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        g = gen_.load(std::memory_order_acquire);
      }
      seen = g;
      if (id < active_) work(g);
    }
  }

  std::mutex run_mu_, mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0}, claim_{0};
  std::atomic<int64_t> done_{0};
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int active_ = 0;
  std::vector<std::thread> helpers_;
};

}  // namespace opscope
