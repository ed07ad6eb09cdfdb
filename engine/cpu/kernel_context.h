// Where a CPU kernel runs: which thread pool and which instruction set.
#ifndef TANDEM_ENGINE_CPU_KERNEL_CONTEXT_H_
#define TANDEM_ENGINE_CPU_KERNEL_CONTEXT_H_

#include <optional>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/thread_pool.h"

namespace tandem::cpu {

// The default runs on the calling thread with the process's ActiveIsa(). Not owned: the pool must
// outlive the call.
struct KernelContext {
  ThreadPool* pool = nullptr;  // nullptr: on the calling thread only
  std::optional<Isa> isa;      // empty: ActiveIsa(); one the CPU lacks falls back to the best
                               // supported ISA below it
};

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_KERNEL_CONTEXT_H_
