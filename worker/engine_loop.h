// A LocalEngine on a thread of its own, for a worker's RPC handlers: they submit and cancel
// requests from any thread and receive each request's tokens through its callback, while the
// engine thread steps the batch whenever there is work. It also keeps what WatchState needs: a
// consistent snapshot of the prefix cache, the KV events since, the latest scheduler counters and
// the recent step timings.
//
//   ASSIGN_OR_RETURN(auto loop, EngineLoop::Start(model_path, {}));
//   RETURN_IF_ERROR(loop->Submit(id, std::move(request), [queue](const GenerationDelta& d) {
//     queue->Push(d);  // on the engine thread: must not block
//   }));
//   ...
//   loop->Cancel(id);  // no delta follows
#ifndef TANDEM_WORKER_ENGINE_LOOP_H_
#define TANDEM_WORKER_ENGINE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "engine/runtime/local_engine.h"
#include "worker/worker_metrics.h"

namespace tandem {

class EngineLoop {
 public:
  struct Options {
    LocalEngine::Options engine;
    // Requests in the engine (running, waiting or awaiting a remote prefill) beyond which Submit
    // refuses with RESOURCE_EXHAUSTED, so a flood cannot grow memory without bound.
    int64_t max_requests = 1024;
    // KV events kept for subscribers that read late; one that falls further behind gets
    // OUT_OF_RANGE and must take a new snapshot.
    size_t event_history = 1 << 16;
    // Step timings kept for load samples.
    size_t step_history = 64;
    // Export the worker's metrics (worker_metrics.h) in the process registry.
    bool export_metrics = true;
    // Times the step in progress (StepElapsed) and stamps the load samples of WatchState. Must
    // outlive the loop.
    Clock* clock = RealClock();
  };

  // Loads the model and starts the engine thread.
  static absl::StatusOr<std::unique_ptr<EngineLoop>> Start(const std::string& model_path,
                                                           const Options& options);
  // Stops the thread. Requests still in the engine are dropped without a further delta: stop
  // whatever submits (the RPC servers, which cancel their calls) first.
  ~EngineLoop();

  // Immutable after Start; safe from any thread.
  const ModelConfig& config() const { return engine_->config(); }
  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  const absl::StatusOr<ChatTemplate>& chat_template() const { return engine_->chat_template(); }
  const std::string& model_id() const { return engine_->model_id(); }
  // The KV pool's memory (for registering it with a transport) and shape.
  KvStorage& kv_storage() { return engine_->kv_pool().storage(); }
  const KvLayout& kv_layout() const { return layout_; }
  int64_t max_running() const { return max_running_; }
  int64_t max_tokens_per_step() const { return options_.engine.scheduler.max_tokens_per_step; }
  int64_t max_prefill_tokens() const { return options_.engine.scheduler.max_prefill_tokens; }
  std::vector<int32_t> EncodePrompt(absl::string_view text) const {
    return engine_->EncodePrompt(text);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const {
    return engine_->EncodeChat(messages);
  }

  // Thread-safe. As LocalEngine::Add / AddRemotePrefill / CompleteRemotePrefill /
  // FallBackToLocalPrefill / Cancel, run on the engine thread; `on_delta` runs there too and must
  // not block. RESOURCE_EXHAUSTED beyond Options::max_requests; UNAVAILABLE once stopping.
  absl::Status Submit(uint64_t id, GenerationRequest request, LocalEngine::DeltaCallback on_delta);
  absl::StatusOr<RemotePrefillPlan> SubmitRemotePrefill(uint64_t id, GenerationRequest request,
                                                        LocalEngine::DeltaCallback on_delta);
  absl::Status CompleteRemotePrefill(uint64_t id, sampling::SampledToken first_token);
  absl::Status FallBackToLocalPrefill(uint64_t id);
  // Drops the request at once and frees its blocks; no delta follows. False for an unknown id.
  bool Cancel(uint64_t id);

  // The same without waiting for the engine thread, for handlers that must not block (gRPC's
  // callback API): `done` gets the result on the engine thread and must not block either, or on
  // the calling thread before the call returns when the engine has stopped or Submit* refuses at
  // once (RESOURCE_EXHAUSTED, UNAVAILABLE). Each `done` runs exactly once; results are as in the
  // blocking forms. A request's response_format is compiled on the calling thread first (a
  // large schema takes tens of milliseconds; compiled formats are kept), so that it never stalls
  // the engine's step; a format that does not compile is refused there, as Submit* would.
  void SubmitAsync(uint64_t id, GenerationRequest request, LocalEngine::DeltaCallback on_delta,
                   absl::AnyInvocable<void(absl::Status) &&> done);
  void SubmitRemotePrefillAsync(uint64_t id, GenerationRequest request,
                                LocalEngine::DeltaCallback on_delta,
                                absl::AnyInvocable<void(absl::StatusOr<RemotePrefillPlan>) &&> done);
  void CompleteRemotePrefillAsync(uint64_t id, sampling::SampledToken first_token,
                                  absl::AnyInvocable<void(absl::Status) &&> done);
  void FallBackToLocalPrefillAsync(uint64_t id, absl::AnyInvocable<void(absl::Status) &&> done);
  void CancelAsync(uint64_t id, absl::AnyInvocable<void(bool) &&> done = nullptr);
  // As LocalEngine::ReleaseKv, on the engine thread: frees the blocks a hold_kv request kept when
  // it ended. `done` (optional) as above.
  void ReleaseKvAsync(uint64_t id, absl::AnyInvocable<void(bool) &&> done = nullptr);

  // Runs a few requests of known shapes after a warm-up -- prompts alone (prefill steps of 32
  // and 192 tokens),
  // then batches of 4 and of min(max_running, 48) short ones decoding together -- and waits for
  // them, so that the step timings a router fits its cost model to (StepsAfter, docs/slo.md)
  // describe this machine before the first real request. For a worker's start-up, before it
  // serves: the requests bypass max_requests and their blocks stay in the prefix cache (random
  // tokens no prompt shares; evicted first).
  absl::Status Calibrate();

  // The prefix cache and counters at one moment, consistent with the events up to last_event_id.
  struct State {
    SchedulerStats stats;
    KvCacheSnapshot cache;
    std::vector<StepInfo> recent_steps;  // oldest first
    uint64_t steps_total = 0;            // steps since start (StepsAfter's cursor)
  };
  State Snapshot();
  // The KV events with event_id > `after`, waiting up to `timeout` for the first one (an empty
  // result means none came). OUT_OF_RANGE when events after `after` were already dropped from the
  // history: take a new Snapshot.
  absl::StatusOr<std::vector<KvEvent>> EventsAfter(uint64_t after, absl::Duration timeout);
  // The latest counters (updated after every step and request change). Requests submitted but
  // not yet taken by the engine thread (it takes them between steps) count already: as waiting
  // sequences with all their prompt tokens queued (and received, in prompt_tokens), or as remote
  // prefills.
  SchedulerStats stats();
  // Waits up to `timeout` until `done` holds for the latest counters (as stats()); false when it
  // did not. For tests and tools that wait on the engine without polling.
  bool AwaitStats(const std::function<bool(const SchedulerStats&)>& done, absl::Duration timeout);
  // Step timings after step number `after` (at most Options::step_history), and the newest
  // step number.
  std::vector<StepInfo> StepsAfter(uint64_t after, uint64_t* newest);
  // How long the engine step in progress has run, on Options::clock; zero between steps.
  absl::Duration StepElapsed() const;
  Clock* clock() const { return options_.clock; }

 private:
  EngineLoop(std::unique_ptr<LocalEngine> engine, const Options& options);
  void Loop();
  // The request's response_format compiled (OK when it has none), for the engine to find kept.
  absl::Status CompileFormat(const GenerationRequest& request) const;
  friend struct EngineLoopTestPeer;  // engine_loop_test.cc: holds the engine thread

  // Runs `task` once: on the engine thread with the engine, or on this thread with nullptr once
  // the thread has stopped.
  void Post(absl::AnyInvocable<void(LocalEngine*) &&> task);
  // Runs `task` on the engine thread and waits for it; false (and `task` never runs) once the
  // thread has stopped.
  bool RunOnEngine(absl::AnyInvocable<void(LocalEngine&) &&> task);
  void OnEvent(const KvEvent& event);  // the pool's listener, on the engine thread
  void PublishStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a new request against Options::max_requests (RESOURCE_EXHAUSTED beyond it).
  absl::Status Admit();
  // Wraps a request's callback so that its last delta uncounts it.
  LocalEngine::DeltaCallback Counted(LocalEngine::DeltaCallback on_delta);

  std::unique_ptr<LocalEngine> engine_;
  const Options options_;
  std::unique_ptr<WorkerMetrics> metrics_;  // engine thread only
  const KvLayout layout_;
  const int64_t max_running_;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void(LocalEngine*) &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;  // the thread takes no more tasks
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;  // submitted and not finished or cancelled
  SchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  // Submissions posted to the engine thread and not taken yet (stats() adds them).
  struct Posted {
    int64_t sequences = 0;
    int64_t prompt_tokens = 0;
    int64_t remote_prefills = 0;
    int priority = 0;  // of prompt_tokens
  };
  Posted posted_ ABSL_GUARDED_BY(mu_);
  // posted_.prompt_tokens by priority (SchedulerStats::queued_by_priority).
  std::vector<QueuedPrompts> posted_by_priority_ ABSL_GUARDED_BY(mu_);
  void AddPosted(const Posted& p) ABSL_LOCKS_EXCLUDED(mu_);
  void RemovePostedLocked(const Posted& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::deque<KvEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t last_event_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<StepInfo> steps_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_total_ ABSL_GUARDED_BY(mu_) = 0;
  // Options::clock's time (Unix nanoseconds) when the step in progress began; 0 between steps.
  std::atomic<int64_t> step_started_ns_{0};
};

}  // namespace tandem

#endif  // TANDEM_WORKER_ENGINE_LOOP_H_
