#include "worker/engine_loop.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/by_priority.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<EngineLoop>> EngineLoop::Start(const std::string& model_path,
                                                              const Options& options) {
  if (options.max_requests <= 0 || options.event_history == 0) {
    return absl::InvalidArgumentError("max_requests and event_history must be positive");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine,
                   LocalEngine::Open(model_path, options.engine));
  auto loop = std::unique_ptr<EngineLoop>(new EngineLoop(std::move(engine), options));
  loop->engine_->kv_pool().set_event_listener(
      [raw = loop.get()](const KvEvent& event) { raw->OnEvent(event); });
  loop->thread_ = std::thread([raw = loop.get()] { raw->Loop(); });
  return loop;
}

EngineLoop::EngineLoop(std::unique_ptr<LocalEngine> engine, const Options& options)
    : engine_(std::move(engine)),
      options_(options),
      layout_(engine_->kv_pool().layout()),
      max_running_(options.engine.scheduler.max_running) {
  if (options.export_metrics) metrics_ = std::make_unique<WorkerMetrics>();
  absl::MutexLock lock(&mu_);
  PublishStats();
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void EngineLoop::Loop() {
  // Whether the last step scheduled nothing: every sequence waits for something only a task can
  // bring (a remote prefill's KV, its fallback, a cancel), so the loop sleeps until one comes
  // instead of spinning through empty steps on a core the other workers need.
  bool idle_step = false;
  while (true) {
    std::deque<absl::AnyInvocable<void(LocalEngine*) &&>> tasks;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      if (!engine_->HasWork() || idle_step) {
        mu_.Await(absl::Condition(
            +[](EngineLoop* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
              return l->stopping_ || !l->tasks_.empty();
            },
            this));
      }
      tasks.swap(tasks_);
      stopping = stopping_;
    }
    for (auto& task : tasks) std::move(task)(engine_.get());
    if (stopping) break;
    if (!engine_->HasWork()) {
      // A task may have freed blocks (a cancel, a release of held ones) with no step to follow.
      if (!tasks.empty() && metrics_ != nullptr) {
        metrics_->Update(engine_->scheduler_stats(), nullptr);
      }
      continue;
    }
    StepInfo info;
    step_started_ns_.store(absl::ToUnixNanos(options_.clock->Now()), std::memory_order_relaxed);
    const absl::Status stepped = engine_->Step(&info);
    step_started_ns_.store(0, std::memory_order_relaxed);
    if (!stepped.ok()) LOG(ERROR) << "engine step failed: " << stepped;
    // A step that scheduled and preempted nothing did no work: it is no timing and no step.
    idle_step = info.batch_size == 0 && info.preempted == 0;
    if (!idle_step && metrics_ != nullptr) metrics_->Update(engine_->scheduler_stats(), &info);
    absl::MutexLock lock(&mu_);
    if (!idle_step) {
      steps_.push_back(info);
      if (steps_.size() > options_.step_history) steps_.pop_front();
      ++steps_total_;
    }
    PublishStats();  // the tasks may have changed it, even when the step did nothing
  }
  // Stopping: the last tasks run (their callers wait for them).
  std::deque<absl::AnyInvocable<void(LocalEngine*) &&>> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.swap(tasks_);
    exited_ = true;
  }
  for (auto& task : rest) std::move(task)(engine_.get());
}

void EngineLoop::PublishStats() { stats_ = engine_->scheduler_stats(); }

void EngineLoop::AddPosted(const Posted& p) {
  absl::MutexLock lock(&mu_);
  posted_.sequences += p.sequences;
  posted_.prompt_tokens += p.prompt_tokens;
  posted_.remote_prefills += p.remote_prefills;
  if (p.prompt_tokens > 0) {
    AddByPriority({.priority = p.priority, .tokens = p.prompt_tokens, .prompts = 1},
                  &posted_by_priority_);
  }
}

void EngineLoop::RemovePostedLocked(const Posted& p) {
  posted_.sequences -= p.sequences;
  posted_.prompt_tokens -= p.prompt_tokens;
  posted_.remote_prefills -= p.remote_prefills;
  if (p.prompt_tokens > 0) {
    AddByPriority({.priority = p.priority, .tokens = -p.prompt_tokens, .prompts = -1},
                  &posted_by_priority_);
    std::erase_if(posted_by_priority_, [](const QueuedPrompts& q) { return q.prompts == 0; });
  }
}

void EngineLoop::Post(absl::AnyInvocable<void(LocalEngine*) &&> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!exited_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)(nullptr);
}

bool EngineLoop::RunOnEngine(absl::AnyInvocable<void(LocalEngine&) &&> task) {
  absl::Notification done;
  bool ran = false;
  Post([&](LocalEngine* engine) {
    if (engine != nullptr) {
      std::move(task)(*engine);
      ran = true;
    }
    done.Notify();
  });
  done.WaitForNotification();
  return ran;
}

namespace {

// Runs an asynchronous form and waits for its result.
template <typename Result, typename Start>
Result Await(Start start) {
  absl::Notification done;
  std::optional<Result> result;
  start([&](Result r) {
    result.emplace(std::move(r));
    done.Notify();
  });
  done.WaitForNotification();
  return *std::move(result);
}

absl::Status Stopped() { return absl::UnavailableError("the engine stopped"); }

}  // namespace

absl::Status EngineLoop::Admit() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is stopping");
  if (requests_ >= options_.max_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the worker holds ", requests_, " requests, its limit"));
  }
  ++requests_;
  return absl::OkStatus();
}

LocalEngine::DeltaCallback EngineLoop::Counted(LocalEngine::DeltaCallback on_delta) {
  return [this, on_delta = std::move(on_delta)](const GenerationDelta& d) {
    on_delta(d);
    if (d.finish != sampling::FinishReason::kNone) {
      absl::MutexLock lock(&mu_);
      --requests_;
    }
  };
}

absl::Status EngineLoop::CompileFormat(const GenerationRequest& request) const {
  if (!request.sampling.response_format.constrained()) return absl::OkStatus();
  return engine_->CompileFormat(request.sampling.response_format).status();
}

void EngineLoop::SubmitAsync(uint64_t id, GenerationRequest request,
                             LocalEngine::DeltaCallback on_delta,
                             absl::AnyInvocable<void(absl::Status) &&> done) {
  if (absl::Status s = CompileFormat(request); !s.ok()) return std::move(done)(std::move(s));
  if (absl::Status s = Admit(); !s.ok()) return std::move(done)(std::move(s));
  const Posted posted = {.sequences = 1,
                         .prompt_tokens = static_cast<int64_t>(request.prompt.size()),
                         .priority = request.priority};
  AddPosted(posted);
  Post([this, id, posted, request = std::move(request), on_delta = std::move(on_delta),
        done = std::move(done)](LocalEngine* engine) mutable {
    absl::Status status =
        engine == nullptr ? Stopped()
                          : engine->Add(id, std::move(request), Counted(std::move(on_delta)));
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok()) --requests_;
      RemovePostedLocked(posted);
      if (engine != nullptr) PublishStats();
    }
    std::move(done)(std::move(status));
  });
}

void EngineLoop::SubmitRemotePrefillAsync(
    uint64_t id, GenerationRequest request, LocalEngine::DeltaCallback on_delta,
    absl::AnyInvocable<void(absl::StatusOr<RemotePrefillPlan>) &&> done) {
  if (absl::Status s = CompileFormat(request); !s.ok()) return std::move(done)(std::move(s));
  if (absl::Status s = Admit(); !s.ok()) return std::move(done)(std::move(s));
  const Posted posted = {.remote_prefills = 1};
  AddPosted(posted);
  Post([this, id, posted, request = std::move(request), on_delta = std::move(on_delta),
        done = std::move(done)](LocalEngine* engine) mutable {
    absl::StatusOr<RemotePrefillPlan> plan =
        engine == nullptr
            ? absl::StatusOr<RemotePrefillPlan>(Stopped())
            : engine->AddRemotePrefill(id, std::move(request), Counted(std::move(on_delta)));
    {
      absl::MutexLock lock(&mu_);
      if (!plan.ok()) --requests_;
      RemovePostedLocked(posted);
      if (engine != nullptr) PublishStats();
    }
    std::move(done)(std::move(plan));
  });
}

void EngineLoop::CompleteRemotePrefillAsync(uint64_t id, sampling::SampledToken first_token,
                                            absl::AnyInvocable<void(absl::Status) &&> done) {
  Post([this, id, first_token = std::move(first_token),
        done = std::move(done)](LocalEngine* engine) mutable {
    absl::Status status =
        engine == nullptr ? Stopped()
                          : engine->CompleteRemotePrefill(id, std::move(first_token));
    if (engine != nullptr) {
      absl::MutexLock lock(&mu_);
      PublishStats();
    }
    std::move(done)(std::move(status));
  });
}

void EngineLoop::FallBackToLocalPrefillAsync(uint64_t id,
                                             absl::AnyInvocable<void(absl::Status) &&> done) {
  Post([this, id, done = std::move(done)](LocalEngine* engine) mutable {
    absl::Status status = engine == nullptr ? Stopped() : engine->FallBackToLocalPrefill(id);
    if (engine != nullptr) {
      absl::MutexLock lock(&mu_);
      PublishStats();
    }
    std::move(done)(std::move(status));
  });
}

void EngineLoop::CancelAsync(uint64_t id, absl::AnyInvocable<void(bool) &&> done) {
  Post([this, id, done = std::move(done)](LocalEngine* engine) mutable {
    const bool found = engine != nullptr && engine->Cancel(id);
    if (engine != nullptr) {
      absl::MutexLock lock(&mu_);
      if (found) --requests_;
      PublishStats();
    }
    if (done != nullptr) std::move(done)(found);
  });
}

bool EngineLoop::AwaitStats(const std::function<bool(const SchedulerStats&)>& done,
                            absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(stats_); };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

void EngineLoop::ReleaseKvAsync(uint64_t id, absl::AnyInvocable<void(bool) &&> done) {
  Post([this, id, done = std::move(done)](LocalEngine* engine) mutable {
    const bool found = engine != nullptr && engine->ReleaseKv(id);
    if (found) {
      absl::MutexLock lock(&mu_);
      PublishStats();
    }
    if (done != nullptr) std::move(done)(found);
  });
}

absl::Status EngineLoop::Submit(uint64_t id, GenerationRequest request,
                                LocalEngine::DeltaCallback on_delta) {
  return Await<absl::Status>([&](auto done) {
    SubmitAsync(id, std::move(request), std::move(on_delta), std::move(done));
  });
}

absl::StatusOr<RemotePrefillPlan> EngineLoop::SubmitRemotePrefill(
    uint64_t id, GenerationRequest request, LocalEngine::DeltaCallback on_delta) {
  return Await<absl::StatusOr<RemotePrefillPlan>>([&](auto done) {
    SubmitRemotePrefillAsync(id, std::move(request), std::move(on_delta), std::move(done));
  });
}

absl::Status EngineLoop::CompleteRemotePrefill(uint64_t id, sampling::SampledToken first_token) {
  return Await<absl::Status>(
      [&](auto done) { CompleteRemotePrefillAsync(id, std::move(first_token), std::move(done)); });
}

absl::Status EngineLoop::FallBackToLocalPrefill(uint64_t id) {
  return Await<absl::Status>(
      [&](auto done) { FallBackToLocalPrefillAsync(id, std::move(done)); });
}

bool EngineLoop::Cancel(uint64_t id) {
  return Await<bool>([&](auto done) { CancelAsync(id, std::move(done)); });
}

absl::Status EngineLoop::Calibrate() {
  const int64_t vocab = config().vocab_size;
  if (vocab <= 256) return absl::FailedPreconditionError("the vocabulary is too small to calibrate");
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto token = [&] {  // a fixed LCG: the same shapes and tokens on every start
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>(256 + (state >> 33) % static_cast<uint64_t>(vocab - 256));
  };
  struct Wave {
    int64_t requests, prompt_tokens, max_tokens;
    // The prompts start with the 192-token prompt of an earlier wave, which the prefix cache
    // holds: the steps decode a batch over a long context at the cost of a few prompt tokens.
    bool long_context = false;
  };
  // The big batch is near the largest a TPOT objective admits on a CPU worker (40-60 streams with
  // the packed kernels): fitted from batches of at most 16, the step of a 60-stream batch came out
  // ~25% short of what it took.
  const int64_t batch = std::min<int64_t>(max_running_, 48);
  // The first wave only warms up (the first passes fault the weights in and are slow); its
  // steps are forgotten. The two batches of 4 differ in context only (~40 and ~800 tokens), so
  // that the fit tells the per-context-token cost of decode attention from the per-sequence cost
  // (ten steps each: with four, one worker's fit came out at half the cost a token its later
  // steps showed); in prefill steps the two grow together.
  const int64_t four = std::min<int64_t>(batch, 4);
  const Wave waves[] = {{2, 16, 2},     {1, 32, 3},           {1, 192, 2},
                        {four, 8, 10}, {four, 8, 10, true}, {batch, 4, 4}};
  std::vector<int32_t> long_prefix;
  uint64_t id = uint64_t{1} << 62;  // far from the ids of the worker's services
  int64_t pool_blocks = 0;
  RunOnEngine([&](LocalEngine& engine) { pool_blocks = engine.kv_pool().num_blocks(); });
  for (const Wave& wave : waves) {
    // A model or pool too small for four 200-token sequences keeps the short waves only.
    if (wave.long_context && (config().max_context < 256 || pool_blocks < 64)) continue;
    if (&wave == &waves[1]) {
      absl::MutexLock lock(&mu_);
      steps_.clear();
    }
    absl::BlockingCounter done(static_cast<int>(wave.requests));
    absl::Status added = absl::OkStatus();
    // All of a wave joins the engine at once, so that they share steps.
    const bool ran = RunOnEngine([&](LocalEngine& engine) {
      for (int64_t i = 0; i < wave.requests && added.ok(); ++i) {
        GenerationRequest r;
        if (wave.long_context) r.prompt = long_prefix;
        for (int64_t t = 0; t < wave.prompt_tokens; ++t) r.prompt.push_back(token());
        if (wave.prompt_tokens == 192) long_prefix = r.prompt;
        r.sampling.temperature = 0;
        r.sampling.ignore_eos = true;
        r.sampling.max_tokens = wave.max_tokens;
        added = engine.Add(id++, std::move(r), [&done](const GenerationDelta& d) {
          if (d.finish != sampling::FinishReason::kNone) done.DecrementCount();
        });
        if (!added.ok()) {
          for (int64_t rest = i; rest < wave.requests; ++rest) done.DecrementCount();
        }
      }
      absl::MutexLock lock(&mu_);
      PublishStats();
    });
    if (!ran) return absl::UnavailableError("the engine stopped");
    done.Wait();
    if (!added.ok()) return added;
  }
  // The last deltas come during the last step; its counters are published after it.
  RunOnEngine([](LocalEngine&) {});
  return absl::OkStatus();
}

EngineLoop::State EngineLoop::Snapshot() {
  State state;
  RunOnEngine([&](LocalEngine& engine) {
    state.cache = engine.kv_pool().Snapshot();
    state.stats = engine.scheduler_stats();
    absl::MutexLock lock(&mu_);
    state.recent_steps.assign(steps_.begin(), steps_.end());
    state.steps_total = steps_total_;
  });
  return state;
}

void EngineLoop::OnEvent(const KvEvent& event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(event);
  last_event_id_ = event.event_id;
  while (events_.size() > options_.event_history) events_.pop_front();
}

absl::StatusOr<std::vector<KvEvent>> EngineLoop::EventsAfter(uint64_t after,
                                                             absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, after]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || last_event_id_ > after;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  std::vector<KvEvent> out;
  if (last_event_id_ <= after) return out;
  if (events_.empty() || events_.front().event_id > after + 1) {
    return absl::OutOfRangeError(absl::StrCat("KV events after ", after,
                                              " are no longer kept; take a new snapshot"));
  }
  for (const KvEvent& e : events_) {
    if (e.event_id > after) out.push_back(e);
  }
  return out;
}

SchedulerStats EngineLoop::stats() {
  absl::MutexLock lock(&mu_);
  SchedulerStats s = stats_;
  s.waiting += posted_.sequences;
  s.queued_prefill_tokens += posted_.prompt_tokens;
  for (const QueuedPrompts& q : posted_by_priority_) AddByPriority(q, &s.queued_by_priority);
  s.prompt_tokens += posted_.prompt_tokens;  // received
  s.remote_prefills += posted_.remote_prefills;
  return s;
}

absl::Duration EngineLoop::StepElapsed() const {
  const int64_t started = step_started_ns_.load(std::memory_order_relaxed);
  if (started == 0) return absl::ZeroDuration();
  return absl::Nanoseconds(
      std::max<int64_t>(absl::ToUnixNanos(options_.clock->Now()) - started, 0));
}

std::vector<StepInfo> EngineLoop::StepsAfter(uint64_t after, uint64_t* newest) {
  absl::MutexLock lock(&mu_);
  *newest = steps_total_;
  std::vector<StepInfo> out;
  const uint64_t first = steps_total_ - steps_.size();  // step number of steps_.front() is first+1
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (first + i + 1 > after) out.push_back(steps_[i]);
  }
  return out;
}

}  // namespace tandem
