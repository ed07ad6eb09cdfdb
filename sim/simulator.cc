#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/kv/block_pool.h"
#include "engine/sched/scheduler.h"
#include "router/placement/admission.h"
#include "router/placement/placement.h"
#include "sim/event_queue.h"

namespace tandem::sim {
namespace {

// SplitMix64's output function: spreads a key over 64 bits.
uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// FNV-1a: a prefix group's name as a key, the same in every run.
uint64_t KeyOf(absl::string_view s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ULL;
  return h;
}

int32_t TokenFromKey(uint64_t key, int64_t position) {
  return static_cast<int32_t>(Mix(key ^ Mix(static_cast<uint64_t>(position))) & 0x7FFFFFFF);
}

// Simulated seconds as the absl::Time that admission reads.
absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

// Memory that no one reads: the simulator's KV pools hold bookkeeping only.
alignas(64) std::byte kNoMemory[64];

KvAllocator NoMemoryAllocator() {
  return KvAllocator{.allocate = [](size_t) -> absl::StatusOr<void*> { return kNoMemory; },
                     .release = [](void*) {},
                     .zero = [](void*, size_t) {},
                     .copy = [](void*, const void*, size_t) {}};
}

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

SequenceId SeqId(uint32_t request, uint32_t attempt) {
  return (static_cast<uint64_t>(attempt) << 32) | request;
}
uint32_t RequestOf(SequenceId id) { return static_cast<uint32_t>(id & 0xFFFFFFFFu); }
uint32_t AttemptOf(SequenceId id) { return static_cast<uint32_t>(id >> 32); }

constexpr int32_t kNone = -1;

}  // namespace

class Simulator::Impl {
 public:
  Impl(const ClusterConfig& cluster, const SimulatorOptions& options)
      : cfg_(cluster), opts_(options), noise_state_(Mix(options.seed ^ 0x5157ULL)) {}

  absl::Status Init();
  absl::StatusOr<std::vector<RequestResult>> Run(absl::Span<const TraceRequest> trace);
  std::vector<std::string> WorkerIds() const {
    std::vector<std::string> ids;
    for (const auto& w : workers_) ids.push_back(w->id);
    return ids;
  }
  SimSummary summary_;

 private:
  struct Worker {
    std::string id;
    placement::Role role = placement::Role::kDecode;
    const PoolConfig* pool = nullptr;
    std::unique_ptr<BlockPool> kv;
    std::unique_ptr<Scheduler> sched;
    // The prefix cache as the router knows it: the hashes of the pool's KV events.
    absl::flat_hash_set<BlockHash> cached;
    std::optional<placement::StepCostModel> model;
    uint32_t cell = 0;
    uint32_t slot = 0;  // its index in its cell (and in the cell's view)
    bool alive = true;
    bool busy = false;
    bool dirty = true;
    uint64_t step_serial = 0;
    double step_start = 0;
    ScheduledStep step;
    // Requests this worker decodes, and those it prefills for another worker.
    absl::flat_hash_set<uint32_t> decoding;
    absl::flat_hash_set<uint32_t> prefilling;
    // Steps started so far: the step's index for its noise.
    uint64_t steps_started = 0;
    // A run of identical pure decode steps advanced without an event per step (fast_decode):
    // run_ends[k] is when its step k ends; the first run_done are done, and `step` is the one in
    // progress. One event, at the last step's end, stands for the run.
    bool run = false;
    std::vector<double> run_ends;
    size_t run_done = 0;
    int64_t run_batch = 0;
    placement::WorkerCandidate run_candidate;  // as the run began; see Refresh
  };
  struct Cell {
    std::vector<uint32_t> workers;
    std::vector<uint32_t> dirty;  // workers whose candidate in `view` is out of date
    placement::ClusterView view;
    std::unique_ptr<placement::PlacementPolicy> policy;
    std::optional<placement::Admission> admission;
    double deadline_pushed = -1;  // the admission deadline event pending, -1: none
  };
  // A request's progress.
  struct Live {
    uint32_t attempt = 0;
    int32_t decode = kNone;
    int32_t prefill = kNone;  // a remote prefill in progress (or its transfer)
    bool remote = false;
    bool transferring = false;  // the prefill worker computed it; the KV is on its way
    int64_t transfer_bytes = 0;
    int64_t generated = 0;
    double first_token_s = -1;
    double decode_start_s = -1;  // first token on the current decode worker
    bool done = false;
    uint32_t cell = 0;
    uint64_t id_key = 0;
    uint64_t group_key = 0;
  };

  // The request's tokens so far: its prompt, then what it generated. Valid until the next call
  // for another request or after it generated more (the last one is kept: placing a request and
  // starting it read the same tokens).
  const std::vector<int32_t>& Tokens(uint32_t i);
  // The router's view of `w` is out of date: Refresh makes it again.
  void MarkDirty(uint32_t w) {
    Worker& W = *workers_[w];
    if (W.dirty) return;
    W.dirty = true;
    cells_[W.cell].dirty.push_back(w);
  }
  void Refresh(Cell& cell);
  placement::WorkerCandidate CandidateOf(const Worker& w) const;
  absl::StatusOr<placement::Decision> Place(uint32_t i, bool placed_before);
  void OnArrival(uint32_t i);
  // Starts request `i` where `d` says. False when it failed (the result says why).
  void Start(uint32_t i, const placement::Decision& d);
  void Kick(uint32_t w);
  void StartStep(uint32_t w);
  // After StartStep scheduled a pure decode step: makes it the first of a run when the steps after
  // it can only repeat it (see Worker::run). `context` is the step's attention (its decode
  // tokens' positions + 1, summed).
  bool MaybeStartRun(uint32_t w, double context, double seconds);
  // Does the steps of `w`'s run that end at or before `t` (not the last), as their own events
  // would have.
  void Materialize(uint32_t w, double t);
  // Before anything changes or reads `w`'s scheduler: its run becomes an ordinary step in
  // progress (the steps done before now done).
  void Interrupt(uint32_t w);
  // Commits `w`'s step in progress and hands out its samples.
  void FinishStep(uint32_t w);
  void OnStepDone(uint32_t w, uint64_t serial);
  void OnSample(uint32_t w, const ScheduledItem& item);
  // `item`: the decode worker's item that sampled the token, if one did (no lookup by id then).
  void EmitToken(uint32_t i, const ScheduledItem* item = nullptr);
  void OnTransferDone(uint32_t i, uint32_t attempt, uint32_t p);
  void OnFailure(uint32_t w);
  // The decode worker waited prefill_timeout_s for prefill worker `p`: unless the KV is already
  // on its way, it cancels the prefill there and prefills the prompt itself.
  void OnPrefillTimeout(uint32_t i, uint32_t attempt, uint32_t p);
  void Migrate(uint32_t i);
  void DrainQueue(uint32_t c);
  void PushDeadline(uint32_t c);
  void Fail(uint32_t i, const absl::Status& status);
  void Complete(uint32_t i);
  // The jitter of step `index` of worker `w`: a function of the seed, the worker and the index,
  // so runs and single steps draw the same.
  double Noise(uint32_t w, uint64_t index) const;

  ClusterConfig cfg_;
  SimulatorOptions opts_;
  uint64_t noise_state_;
  std::vector<std::unique_ptr<Worker>> workers_;
  absl::flat_hash_map<std::string, uint32_t> worker_index_;
  std::vector<Cell> cells_;
  placement::TransferModel transfers_ = *placement::TransferModel::Create({});
  double seconds_per_byte_ = 0;
  double latency_s_ = 0;
  int64_t block_size_ = 16;
  uint64_t model_hash_ = 0;

  // Remote prefills' deadlines (prefill_timeout_s), due first at the front; one kPrefillTimeout
  // event stands for the front one.
  struct PrefillTimeout {
    double due;
    uint32_t request;
    uint32_t attempt;
    uint32_t worker;
  };
  std::deque<PrefillTimeout> timeouts_;
  bool timeout_event_pending_ = false;
  std::vector<int32_t> tokens_;  // Tokens' last answer: request tokens_of_ with that many generated
  uint32_t tokens_of_ = ~0u;
  int64_t tokens_generated_ = -1;
  EventQueue q_;
  double last_end_s_ = 0;  // when the last request ended
  double now_ = 0;  // the current event's time (a run's step end while Materialize does it)
  absl::Span<const TraceRequest> trace_;
  std::vector<Live> live_;
  std::vector<RequestResult> results_;
  uint32_t next_cell_ = 0;
  bool ran_ = false;
};

absl::Status Simulator::Impl::Init() {
  static constexpr const char* kPrefixes[] = {"p", "d", "w"};
  int64_t per_role[3] = {0, 0, 0};
  std::vector<std::pair<int, const PoolConfig*>> order;  // by role, then pool order
  for (int role = 0; role < 3; ++role) {
    for (const PoolConfig& pool : cfg_.pools) {
      if (static_cast<int>(pool.role) == role) order.emplace_back(role, &pool);
    }
  }
  for (const auto& [role, pool] : order) {
    for (int64_t k = 0; k < pool->count; ++k) {
      auto w = std::make_unique<Worker>();
      w->id = absl::StrCat(kPrefixes[role], per_role[role]++);
      w->role = pool->role;
      w->pool = pool;
      KvLayout layout{.num_blocks = pool->kv_blocks, .num_layers = 1, .block_size = pool->block_size,
                      .num_kv_heads = 1, .head_dim = 1};
      ASSIGN_OR_RETURN(w->kv, BlockPool::Create(layout, {.model_id = "tandem-sim",
                                                         .allocator = NoMemoryAllocator()}));
      Worker* raw = w.get();
      w->kv->set_event_listener([raw](const KvEvent& e) {
        switch (e.kind) {
          case KvEvent::Kind::kStored:
            raw->cached.insert(e.hashes.begin(), e.hashes.end());
            break;
          case KvEvent::Kind::kRemoved:
            for (BlockHash h : e.hashes) raw->cached.erase(h);
            break;
          case KvEvent::Kind::kCleared:
            raw->cached.clear();
            break;
        }
      });
      w->sched = std::make_unique<Scheduler>(
          w->kv.get(), SchedulerOptions{.max_running = pool->max_running,
                                        .max_tokens_per_step = pool->token_budget,
                                        .max_prefill_chunk = pool->max_prefill_chunk,
                                        .max_prefill_tokens = pool->max_prefill_tokens});
      ASSIGN_OR_RETURN(placement::StepCostModel model,
                       placement::StepCostModel::Create({.prior = pool->step}));
      w->model = std::move(model);
      worker_index_.emplace(w->id, static_cast<uint32_t>(workers_.size()));
      workers_.push_back(std::move(w));
    }
  }
  model_hash_ = workers_.front()->kv->model_hash();
  block_size_ = cfg_.pools.front().block_size;
  seconds_per_byte_ = 8.0 / (cfg_.links.bandwidth_gbps * 1e9);
  latency_s_ = cfg_.links.latency_us * 1e-6;
  ASSIGN_OR_RETURN(transfers_,
                   placement::TransferModel::Create({.default_seconds_per_byte = seconds_per_byte_}));

  const size_t n = workers_.size();
  const size_t cell_size = cfg_.router_cell_size > 0 ? static_cast<size_t>(cfg_.router_cell_size) : n;
  const size_t num_cells = (n + cell_size - 1) / cell_size;
  cells_.resize(num_cells);
  // Worker k goes to cell k mod cells: every cell gets its share of each role.
  for (size_t k = 0; k < n; ++k) {
    workers_[k]->cell = static_cast<uint32_t>(k % num_cells);
    workers_[k]->slot = static_cast<uint32_t>(cells_[k % num_cells].workers.size());
    cells_[k % num_cells].workers.push_back(static_cast<uint32_t>(k));
  }
  for (size_t c = 0; c < num_cells; ++c) {
    Cell& cell = cells_[c];
    placement::PolicyOptions po = cfg_.policy_options;
    po.seed = Mix(opts_.seed + c);
    ASSIGN_OR_RETURN(cell.policy, placement::CreatePolicy(cfg_.policy, po));
    ASSIGN_OR_RETURN(placement::Admission admission, placement::Admission::Create(cfg_.admission));
    cell.admission.emplace(std::move(admission));
    cell.view.transfers = &transfers_;
    bool can_decode = false;
    for (uint32_t w : cell.workers) {
      can_decode = can_decode || workers_[w]->role != placement::Role::kPrefill;
    }
    if (!can_decode) {
      return absl::InvalidArgumentError(absl::StrCat(
          "router cell ", c, " has no decode-capable worker: make router_cell_size larger"));
    }
  }
  for (const FailureConfig& f : cfg_.failures) {
    if (!worker_index_.contains(f.worker)) {
      return absl::InvalidArgumentError(
          absl::StrCat("failures: worker \"", f.worker, "\" is not in the cluster (workers are p0.., "
                                                        "d0.., w0.. by role)"));
    }
  }
  summary_.workers = static_cast<int64_t>(n);
  return absl::OkStatus();
}

double Simulator::Impl::Noise(uint32_t w, uint64_t index) const {
  if (cfg_.step_noise <= 0 && cfg_.step_factors.empty()) return 1.0;
  const uint64_t z = Mix(noise_state_ ^ Mix((static_cast<uint64_t>(w) << 40) ^ index));
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  if (!cfg_.step_factors.empty()) {
    const size_t n = cfg_.step_factors.size();
    return cfg_.step_factors[std::min(n - 1, static_cast<size_t>(u * static_cast<double>(n)))];
  }
  return 1.0 + cfg_.step_noise * (2 * u - 1);
}

const std::vector<int32_t>& Simulator::Impl::Tokens(uint32_t i) {
  const TraceRequest& r = trace_[i];
  const Live& l = live_[i];
  if (tokens_of_ == i && tokens_generated_ == l.generated) return tokens_;
  const int64_t n = r.prompt_tokens + l.generated;
  tokens_.resize(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {
    tokens_[static_cast<size_t>(p)] = TokenFromKey(p < r.prefix_tokens ? l.group_key : l.id_key, p);
  }
  tokens_of_ = i;
  tokens_generated_ = l.generated;
  return tokens_;
}

placement::WorkerCandidate Simulator::Impl::CandidateOf(const Worker& w) const {
  placement::WorkerCandidate c{.id = w.id, .role = w.role, .healthy = w.alive,
                               .max_running = w.pool->max_running};
  c.cached_hashes = &w.cached;
  c.slo.cost_model = &*w.model;
  c.slo.max_tokens_per_step = w.pool->token_budget;
  c.slo.max_prefill_tokens = w.pool->max_prefill_tokens;
  c.slo.kv_bytes_per_token = w.pool->kv_bytes_per_token;
  if (!w.alive) return c;
  // What the worker's load sample says (worker/worker_state_service.cc MakeLoad), read with no
  // delay: the simulated router sees each worker's state as of now.
  const SchedulerLoad s = w.sched->load();
  c.running_seqs = s.running + s.remote_prefills;
  c.waiting_seqs = s.waiting;
  c.queued_prefill_tokens = s.queued_prefill_tokens;
  c.slo.active_decode_tokens = s.active_decode_tokens;
  c.slo.step_elapsed_seconds = w.busy ? now_ - w.step_start : 0;
  if (cfg_.policy == "slo") {
    // Only the slo policy reads the queue by priority (the walk load() leaves out).
    for (const QueuedPrompts& q : w.sched->stats().queued_by_priority) {
      c.slo.queued_by_priority.push_back(
          {.priority = q.priority, .tokens = q.tokens, .prompts = q.prompts});
    }
    for (uint32_t i : w.decoding) {
      const Live& l = live_[i];
      const TraceRequest& r = trace_[i];
      placement::RunningGroup g{.tpot_ms = r.tpot_slo_ms ? static_cast<int64_t>(*r.tpot_slo_ms) : 0,
                                .max_tokens = r.output_tokens};
      if (l.decode_start_s >= 0) {
        g.decoded_tokens = std::max<int64_t>(l.generated - 1, 0);
        g.decode_seconds = now_ - l.decode_start_s;
      }
      c.slo.running_groups.push_back(g);
    }
  }
  return c;
}

void Simulator::Impl::Refresh(Cell& cell) {
  // The slo policy reads how long steps in progress have run and how far streams are: every
  // candidate changes with time. The others read only what changes when a worker does.
  // Each candidate is checked as the router's Place would check it, once when it changes, not
  // at every placement (ClusterView::candidates_checked); one that fails leaves the check to
  // Place, which fails the request with its message.
  if (cell.view.workers.size() != cell.workers.size() || cfg_.policy == "slo") {
    cell.view.workers.clear();
    for (uint32_t w : cell.workers) cell.view.workers.push_back(CandidateOf(*workers_[w]));
    for (uint32_t w : cell.workers) workers_[w]->dirty = false;
    cell.dirty.clear();
    cell.view.candidates_checked = placement::ValidateCandidates(cell.view.workers).ok();
    return;
  }
  for (uint32_t w : cell.dirty) {
    Worker& W = *workers_[w];
    // A worker's candidate changes in a run only by its active decode tokens (each step done adds
    // one per sequence), which only the slo policy reads, and slo has no runs: the candidate as
    // the run began stands. (Its new cached blocks hold generated tokens, which no other prompt's
    // chain of hashes reaches; a run takes only free blocks, so it evicts nothing.)
    placement::WorkerCandidate& c = cell.view.workers[W.slot];
    c = W.run ? W.run_candidate : CandidateOf(W);
    // (Ids never change: they stay unique.)
    if (!placement::ValidateCandidate(c).ok()) cell.view.candidates_checked = false;
    W.dirty = false;
  }
  cell.dirty.clear();
}

absl::StatusOr<placement::Decision> Simulator::Impl::Place(uint32_t i, bool placed_before) {
  const TraceRequest& r = trace_[i];
  const Live& l = live_[i];
  Cell& cell = cells_[l.cell];
  Refresh(cell);
  const std::vector<int32_t>& tokens = Tokens(i);
  placement::Request req{
      .prompt_tokens = static_cast<int64_t>(tokens.size()),
      .block_hashes = HashFullBlocks(model_hash_, tokens, block_size_),
      .block_size = block_size_,
      .priority = r.priority,
      .slo = {.ttft_ms = r.ttft_slo_ms ? static_cast<int64_t>(std::ceil(*r.ttft_slo_ms)) : 0,
              .tpot_ms = r.tpot_slo_ms ? static_cast<int64_t>(std::ceil(*r.tpot_slo_ms)) : 0},
      .max_tokens = r.output_tokens - l.generated,
      .placed_before = placed_before};
  return cell.policy->Place(req, cell.view);
}

void Simulator::Impl::OnArrival(uint32_t i) {
  Live& l = live_[i];
  l.cell = next_cell_;
  next_cell_ = (next_cell_ + 1) % static_cast<uint32_t>(cells_.size());
  absl::StatusOr<placement::Decision> d = Place(i, /*placed_before=*/false);
  if (!d.ok()) return Fail(i, d.status());
  Cell& cell = cells_[l.cell];
  const TraceRequest& r = trace_[i];
  absl::StatusOr<placement::Verdict> v = cell.admission->Offer(
      {.id = i, .priority = r.priority, .arrival = At(r.arrival_s),
       .prediction = placement::PredictionOf(*d)},
      At(now_));
  if (!v.ok()) return Fail(i, v.status());
  if (v->displaced.has_value()) {
    Fail(static_cast<uint32_t>(v->displaced->id),
         absl::ResourceExhaustedError(v->displaced->message));
  }
  switch (v->outcome) {
    case placement::Outcome::kAdmit:
      return Start(i, *d);
    case placement::Outcome::kQueue:
      // Queued requests are placed again at every step's end in the cell: no runs meanwhile.
      for (uint32_t w : cell.workers) Interrupt(w);
      return PushDeadline(l.cell);
    case placement::Outcome::kReject:
      return Fail(i, absl::ResourceExhaustedError(v->message));
  }
}

void Simulator::Impl::PushDeadline(uint32_t c) {
  Cell& cell = cells_[c];
  const std::optional<absl::Time> next = cell.admission->NextDeadline();
  if (!next.has_value()) return;
  const double t = std::max(absl::ToDoubleSeconds(*next - absl::UnixEpoch()), now_);
  if (cell.deadline_pushed >= 0 && cell.deadline_pushed <= t) return;
  cell.deadline_pushed = t;
  q_.Push(t, {.kind = EventKind::kAdmissionDeadline, .worker = c});
}

void Simulator::Impl::DrainQueue(uint32_t c) {
  Cell& cell = cells_[c];
  if (cell.admission->Size() == 0) return;
  for (const placement::Rejection& r : cell.admission->PopExpired(At(now_))) {
    Fail(static_cast<uint32_t>(r.id), absl::ResourceExhaustedError(r.message));
  }
  std::vector<std::pair<uint32_t, placement::Decision>> start;
  cell.admission->NextReady(At(now_), [&](const placement::QueuedRequest& q) {
    absl::StatusOr<placement::Decision> d = Place(static_cast<uint32_t>(q.id), true);
    if (!d.ok()) return false;
    if (!cell.admission->AdmitsQueued(q, placement::PredictionOf(*d), At(now_))) return false;
    // Started at once, so the next queued request is placed on the view with this one in it.
    Start(static_cast<uint32_t>(q.id), *d);
    return true;
  });
  PushDeadline(c);
}

void Simulator::Impl::Start(uint32_t i, const placement::Decision& d) {
  Live& l = live_[i];
  const TraceRequest& r = trace_[i];
  const uint32_t dw = worker_index_.at(d.decode_worker);
  Worker& D = *workers_[dw];
  Interrupt(dw);
  const SequenceId sid = SeqId(i, l.attempt);
  const int64_t max_new = r.output_tokens - l.generated;
  l.decode = static_cast<int32_t>(dw);
  l.decode_start_s = -1;
  D.decoding.insert(i);
  results_[i].decode_worker = D.id;
  MarkDirty(dw);
  bool local = d.local_prefill || d.prefill.empty();
  if (!local) {
    const std::vector<int32_t>& tokens = Tokens(i);
    absl::StatusOr<RemotePrefillPlan> plan = D.sched->AddRemotePrefill(sid, tokens, max_new,
                                                                       r.priority);
    if (plan.ok()) {
      const uint32_t pw = worker_index_.at(d.prefill.front().worker_id);
      Worker& P = *workers_[pw];
      Interrupt(pw);
      absl::Status added = P.sched->Add(sid, tokens, /*max_new_tokens=*/1, r.priority);
      if (added.ok()) {
        l.prefill = static_cast<int32_t>(pw);
        l.remote = true;
        l.transferring = false;
        // Every timeout is as long, so they come due in the order they were set: one queue,
        // and one event for its head, instead of an event each in the agenda.
        timeouts_.push_back({.due = now_ + cfg_.prefill_timeout_s, .request = i,
                             .attempt = l.attempt, .worker = pw});
        if (!timeout_event_pending_) {
          q_.Push(timeouts_.front().due, {.kind = EventKind::kPrefillTimeout});
          timeout_event_pending_ = true;
        }
        l.transfer_bytes = (static_cast<int64_t>(tokens.size()) - plan->cached_tokens) *
                           P.pool->kv_bytes_per_token;
        P.prefilling.insert(i);
        MarkDirty(pw);
        Kick(pw);
      } else {
        D.sched->FallBackToLocalPrefill(sid);  // the prefill worker refused it: prefill here
      }
      Kick(dw);
      return;
    }
    if (plan.status().code() != absl::StatusCode::kResourceExhausted ||
        !D.sched->Add(sid, tokens, max_new, r.priority).ok()) {
      D.decoding.erase(i);
      l.decode = kNone;
      return Fail(i, plan.status());
    }
    // The batch or the blocks are full now: the decode worker queues it and prefills it itself.
    Kick(dw);
    return;
  }
  if (absl::Status s = D.sched->Add(sid, Tokens(i), max_new, r.priority); !s.ok()) {
    D.decoding.erase(i);
    l.decode = kNone;
    return Fail(i, s);
  }
  Kick(dw);
}

void Simulator::Impl::Kick(uint32_t w) {
  Worker& W = *workers_[w];
  if (W.alive && !W.busy && W.sched->HasWork()) StartStep(w);
}

void Simulator::Impl::StartStep(uint32_t w) {
  Worker& W = *workers_[w];
  W.sched->Schedule(&W.step);
  if (!W.step.preempted.empty()) {
    summary_.preemptions += static_cast<int64_t>(W.step.preempted.size());
    for (SequenceId id : W.step.preempted) ++results_[RequestOf(id)].preemptions;
  }
  if (W.step.items.empty()) return;  // only remote prefills or nothing admissible: wait
  double prefill = 0, decode = 0, context = 0, prompt_context = 0;
  for (const ScheduledItem& item : W.step.items) {
    const double n = static_cast<double>(item.tokens.size());
    const double start = static_cast<double>(item.start);
    if (item.is_decode) {
      decode += n;
      context += start + 1;
    } else {
      prefill += n;
      prompt_context += n * start + n * (n + 1) / 2;
    }
  }
  const double seconds = W.pool->step.StepSeconds(prefill, decode, context, prompt_context) *
                         Noise(w, W.steps_started++);
  W.busy = true;
  W.step_start = now_;
  ++summary_.steps;
  MarkDirty(w);
  if (MaybeStartRun(w, context, seconds)) return;
  q_.Push(now_ + seconds, {.kind = EventKind::kStepDone, .worker = w, .serial = ++W.step_serial});
}

bool Simulator::Impl::MaybeStartRun(uint32_t w, double context, double seconds) {
  Worker& W = *workers_[w];
  const ScheduledStep& step = W.step;
  // Only a step of every running sequence's decode token, with nothing waiting, repeats itself;
  // a queued request in the cell is placed again at every step's end, so no run then; the slo
  // policy reads time-dependent state of every worker, so no run for it either.
  if (!opts_.fast_decode || cfg_.policy == "slo" || step.num_prefill_tokens > 0 ||
      !step.preempted.empty() || W.sched->num_waiting() > 0 ||
      static_cast<int64_t>(step.items.size()) != W.sched->num_running() ||
      cells_[W.cell].admission->Size() > 0) {
    return false;
  }
  // The run ends with the step that gives some sequence its last token, and before a step needs a
  // block that is not free (taking a cached one evicts it; none left preempts).
  constexpr int64_t kLongestRun = 4096;
  int64_t k_max = kLongestRun;
  for (const ScheduledItem& item : step.items) {
    const uint32_t i = RequestOf(item.id);
    k_max = std::min(k_max, trace_[i].output_tokens - live_[i].generated);
  }
  const int64_t bs = block_size_;
  const int64_t free_blocks = W.kv->num_free();
  auto extra_blocks = [&](int64_t k) {  // blocks steps 2..k allocate
    int64_t n = 0;
    for (const ScheduledItem& item : step.items) {
      n += (item.start + k + bs - 1) / bs - (item.start + 1 + bs - 1) / bs;
    }
    return n;
  };
  int64_t lo = 1, hi = k_max;  // the longest k with extra_blocks(k) <= free_blocks
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (extra_blocks(mid) <= free_blocks) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t k = lo;
  if (k < 2) return false;
  const double batch = static_cast<double>(step.items.size());
  W.run = true;
  W.run_done = 0;
  W.run_batch = static_cast<int64_t>(step.items.size());
  W.run_ends.resize(static_cast<size_t>(k));
  W.run_ends[0] = now_ + seconds;
  for (int64_t j = 1; j < k; ++j) {
    const double ctx = context + static_cast<double>(j) * batch;
    const double d = W.pool->step.StepSeconds(0, batch, ctx, 0) *
                     Noise(w, W.steps_started - 1 + static_cast<uint64_t>(j));
    W.run_ends[static_cast<size_t>(j)] = W.run_ends[static_cast<size_t>(j - 1)] + d;
  }
  W.run_candidate = CandidateOf(W);
  MarkDirty(w);
  q_.Push(W.run_ends.back(), {.kind = EventKind::kStepDone, .worker = w, .serial = ++W.step_serial});
  return true;
}

void Simulator::Impl::FinishStep(uint32_t w) {
  Worker& W = *workers_[w];
  W.busy = false;
  W.sched->Commit(W.step);
  for (const ScheduledItem& item : W.step.items) {
    // (A sequence dropped during the step, its request moved on to another attempt, samples
    // nothing.)
    if (item.samples && AttemptOf(item.id) == live_[RequestOf(item.id)].attempt) {
      OnSample(w, item);
    }
  }
  if (opts_.check_invariants) W.sched->CheckInvariants();
  MarkDirty(w);
}

void Simulator::Impl::Materialize(uint32_t w, double t) {
  Worker& W = *workers_[w];
  if (!W.run) return;
  // Steps of the run that ended by `t`, the last excepted (its own event ends it).
  const auto last = W.run_ends.end() - 1;
  const size_t target =
      static_cast<size_t>(std::upper_bound(W.run_ends.begin(), last, t) - W.run_ends.begin());
  if (target <= W.run_done) return;
  const double saved = now_;
  // The step in progress ends as any step does...
  now_ = W.run_ends[W.run_done];
  FinishStep(w);
  // ...the steps after it that ended by `t` repeat it, at once...
  const int64_t bulk = static_cast<int64_t>(target - W.run_done) - 1;
  if (bulk > 0) {
    CHECK_OK(W.sched->AdvanceDecode(bulk, [this](SequenceId id, int64_t position) {
      return TokenFromKey(live_[RequestOf(id)].id_key, position);
    }));
    for (const ScheduledItem& item : W.step.items) live_[RequestOf(item.id)].generated += bulk;
  }
  const uint64_t started = target - W.run_done;
  W.run_done = target;
  // ...and the next one starts.
  now_ = W.run_ends[target - 1];
  W.sched->Schedule(&W.step);
  W.busy = true;
  W.step_start = now_;
  W.steps_started += started;
  summary_.steps += static_cast<int64_t>(started);
  CHECK(W.step.num_prefill_tokens == 0 && W.step.preempted.empty() &&
        static_cast<int64_t>(W.step.items.size()) == W.run_batch)
      << "worker " << W.id << ": a decode run stopped repeating its first step";
  if (opts_.check_invariants) W.sched->CheckInvariants();
  now_ = saved;
}

void Simulator::Impl::Interrupt(uint32_t w) {
  Worker& W = *workers_[w];
  if (!W.run) return;
  Materialize(w, now_);
  W.run = false;
  q_.Push(W.run_ends[W.run_done],
          {.kind = EventKind::kStepDone, .worker = w, .serial = ++W.step_serial});
}

void Simulator::Impl::OnStepDone(uint32_t w, uint64_t serial) {
  Worker& W = *workers_[w];
  if (!W.alive || serial != W.step_serial) return;
  ++summary_.step_events;
  if (W.run) {
    Materialize(w, now_);
    W.run = false;
  }
  FinishStep(w);
  Kick(w);
  DrainQueue(W.cell);
}

void Simulator::Impl::OnSample(uint32_t w, const ScheduledItem& item) {
  Worker& W = *workers_[w];
  const SequenceId id = item.id;
  const uint32_t i = RequestOf(id);
  Live& l = live_[i];
  CHECK(AttemptOf(id) == l.attempt) << "a sequence of an abandoned attempt ran";
  if (l.remote && l.prefill == static_cast<int32_t>(w)) {
    // The prefill worker computed the prompt: its KV goes to the decode worker, which it holds
    // until the transfer has read it.
    results_[i].cached_tokens = W.sched->cached_prompt_tokens(id);
    CHECK(W.sched->FinishAndHold(id));
    l.transferring = true;
    q_.Push(now_ + latency_s_ + static_cast<double>(l.transfer_bytes) * seconds_per_byte_,
            {.kind = EventKind::kTransferDone, .worker = w, .request = i, .serial = l.attempt});
    return;
  }
  CHECK(l.decode == static_cast<int32_t>(w));
  if (l.generated == 0) results_[i].cached_tokens = W.sched->cached_prompt_tokens(id);
  EmitToken(i, &item);
}

void Simulator::Impl::EmitToken(uint32_t i, const ScheduledItem* item) {
  Live& l = live_[i];
  const TraceRequest& r = trace_[i];
  Worker& D = *workers_[static_cast<size_t>(l.decode)];
  const SequenceId sid = SeqId(i, l.attempt);
  if (l.first_token_s < 0) l.first_token_s = now_;
  if (l.decode_start_s < 0) l.decode_start_s = now_;
  ++l.generated;
  if (l.generated >= r.output_tokens) {
    CHECK(D.sched->Finish(sid));
    D.decoding.erase(i);
    return Complete(i);
  }
  const int32_t token = TokenFromKey(l.id_key, r.prompt_tokens + l.generated - 1);
  if (item != nullptr) {
    D.sched->AppendToken(*item, token);
  } else {
    D.sched->AppendToken(sid, token);
  }
}

void Simulator::Impl::OnTransferDone(uint32_t i, uint32_t attempt, uint32_t p) {
  Worker& P = *workers_[p];
  if (P.alive) {
    Interrupt(p);
    CHECK(P.sched->ReleaseHeld(SeqId(i, attempt)));
    P.prefilling.erase(i);
    MarkDirty(p);
    Kick(p);
  }
  Live& l = live_[i];
  if (l.done || l.attempt != attempt || !l.remote || l.prefill != static_cast<int32_t>(p)) return;
  l.remote = false;
  l.prefill = kNone;
  results_[i].prefill_worker = P.id;
  const uint32_t dw = static_cast<uint32_t>(l.decode);
  Interrupt(dw);
  workers_[dw]->sched->CompleteRemotePrefill(SeqId(i, attempt));
  EmitToken(i);  // the first token, which the prefill worker sampled
  MarkDirty(dw);
  Kick(dw);
  DrainQueue(workers_[dw]->cell);
}

void Simulator::Impl::OnPrefillTimeout(uint32_t i, uint32_t attempt, uint32_t p) {
  Live& l = live_[i];
  if (l.done || l.attempt != attempt || !l.remote || l.prefill != static_cast<int32_t>(p) ||
      l.transferring) {
    return;
  }
  Worker& P = *workers_[p];
  const SequenceId sid = SeqId(i, attempt);
  if (P.alive && P.sched->Contains(sid)) {
    Interrupt(p);
    P.sched->Finish(sid);
    P.prefilling.erase(i);
    MarkDirty(p);
    Kick(p);
  }
  l.remote = false;
  l.prefill = kNone;
  ++summary_.prefill_timeouts;
  const uint32_t dw = static_cast<uint32_t>(l.decode);
  Interrupt(dw);
  workers_[dw]->sched->FallBackToLocalPrefill(sid);
  MarkDirty(dw);
  Kick(dw);
}

void Simulator::Impl::Migrate(uint32_t i) {
  Live& l = live_[i];
  const SequenceId old = SeqId(i, l.attempt);
  if (l.remote && l.prefill != kNone) {
    Worker& P = *workers_[static_cast<size_t>(l.prefill)];
    // A prefill not finished is dropped; one whose transfer is under way ends with it.
    if (P.alive && P.sched->Contains(old)) {
      Interrupt(static_cast<uint32_t>(l.prefill));
      P.sched->Finish(old);
      P.prefilling.erase(i);
      MarkDirty(static_cast<uint32_t>(l.prefill));
    }
  }
  ++l.attempt;
  l.remote = false;
  l.transferring = false;
  l.prefill = kNone;
  l.decode = kNone;
  results_[i].migrated = true;
  ++summary_.migrations;
  absl::StatusOr<placement::Decision> d = Place(i, /*placed_before=*/true);
  if (!d.ok()) return Fail(i, d.status());
  Start(i, *d);
}

void Simulator::Impl::OnFailure(uint32_t w) {
  Worker& W = *workers_[w];
  if (!W.alive) return;
  Interrupt(w);  // the steps that ended before now happened
  W.alive = false;
  W.busy = false;
  ++W.step_serial;
  MarkDirty(w);
  // Its prefills for other workers: those decode workers prefill the prompts themselves.
  std::vector<uint32_t> prefilling(W.prefilling.begin(), W.prefilling.end());
  std::sort(prefilling.begin(), prefilling.end());
  for (uint32_t i : prefilling) {
    Live& l = live_[i];
    if (l.done || !l.remote || l.prefill != static_cast<int32_t>(w)) continue;
    l.remote = false;
    l.transferring = false;
    l.prefill = kNone;
    const uint32_t dw = static_cast<uint32_t>(l.decode);
    Interrupt(dw);
    workers_[dw]->sched->FallBackToLocalPrefill(SeqId(i, l.attempt));
    MarkDirty(dw);
    Kick(dw);
  }
  // What it decoded: the router places it again with the tokens generated so far.
  std::vector<uint32_t> decoding(W.decoding.begin(), W.decoding.end());
  std::sort(decoding.begin(), decoding.end());
  W.decoding.clear();
  W.prefilling.clear();
  W.sched.reset();
  W.kv.reset();
  W.cached.clear();
  for (uint32_t i : decoding) {
    if (!live_[i].done) Migrate(i);
  }
}

void Simulator::Impl::Fail(uint32_t i, const absl::Status& status) {
  Live& l = live_[i];
  if (l.done) return;
  l.done = true;
  RequestResult& res = results_[i];
  res.ok = false;
  res.error = StatusText(status);
  res.output_tokens = l.generated;
  if (l.first_token_s >= 0) res.ttft_ms = (l.first_token_s - trace_[i].arrival_s) * 1e3;
  ++summary_.failed;
  last_end_s_ = std::max(last_end_s_, now_);
}

void Simulator::Impl::Complete(uint32_t i) {
  Live& l = live_[i];
  l.done = true;
  l.decode = kNone;
  RequestResult& res = results_[i];
  const double arrival = trace_[i].arrival_s;
  res.ok = true;
  res.ttft_ms = (l.first_token_s - arrival) * 1e3;
  res.e2e_ms = (now_ - arrival) * 1e3;
  res.output_tokens = l.generated;
  ++summary_.ok;
  last_end_s_ = std::max(last_end_s_, now_);
}

absl::StatusOr<std::vector<RequestResult>> Simulator::Impl::Run(
    absl::Span<const TraceRequest> trace) {
  if (ran_) return absl::FailedPreconditionError("a Simulator runs once");
  ran_ = true;
  if (trace.size() >= (size_t{1} << 32) - 1) {
    return absl::InvalidArgumentError("a trace holds fewer than 2^32 - 1 requests");
  }
  for (size_t k = 1; k < trace.size(); ++k) {
    if (trace[k].arrival_s < trace[k - 1].arrival_s) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", k, " (\"", trace[k].id, "\") arrives before the one before it"));
    }
  }
  trace_ = trace;
  live_.assign(trace.size(), Live{});
  results_.assign(trace.size(), RequestResult{});
  for (size_t k = 0; k < trace.size(); ++k) {
    live_[k].id_key = Mix(k + 1);
    live_[k].group_key = trace[k].prefix_group.empty() ? 0 : KeyOf(trace[k].prefix_group);
  }
  for (const FailureConfig& f : cfg_.failures) {
    q_.Push(f.at_s, {.kind = EventKind::kFailure, .worker = worker_index_.at(f.worker)});
  }
  size_t next_arrival = 0;
  auto push_arrival = [&] {
    if (next_arrival < trace.size()) {
      q_.Push(trace[next_arrival].arrival_s,
              {.kind = EventKind::kArrival, .request = static_cast<uint32_t>(next_arrival)});
      ++next_arrival;
    }
  };
  push_arrival();
  while (!q_.empty()) {
    const Event e = q_.Pop();
    now_ = e.time;
    switch (e.kind) {
      case EventKind::kArrival:
        push_arrival();
        OnArrival(e.request);
        break;
      case EventKind::kStepDone:
        OnStepDone(e.worker, e.serial);
        break;
      case EventKind::kTransferDone:
        OnTransferDone(e.request, static_cast<uint32_t>(e.serial), e.worker);
        break;
      case EventKind::kFailure:
        OnFailure(e.worker);
        break;
      case EventKind::kPrefillTimeout:
        timeout_event_pending_ = false;
        while (!timeouts_.empty() && timeouts_.front().due <= now_) {
          const PrefillTimeout t = timeouts_.front();
          timeouts_.pop_front();
          OnPrefillTimeout(t.request, t.attempt, t.worker);
        }
        if (!timeouts_.empty()) {
          q_.Push(timeouts_.front().due, {.kind = EventKind::kPrefillTimeout});
          timeout_event_pending_ = true;
        }
        break;
      case EventKind::kAdmissionDeadline:
        if (cells_[e.worker].deadline_pushed == e.time) cells_[e.worker].deadline_pushed = -1;
        DrainQueue(e.worker);
        break;
    }
  }
  for (size_t k = 0; k < trace.size(); ++k) {
    const Live& l = live_[k];
    CHECK(l.done) << "request " << k << " (\"" << trace[k].id << "\") never ended: attempt "
                  << l.attempt << ", decode worker " << l.decode << ", prefill worker "
                  << l.prefill << ", remote " << l.remote << ", generated " << l.generated;
    results_[k].output_tokens = live_[k].generated;
  }
  summary_.requests = static_cast<int64_t>(trace.size());
  summary_.simulated_seconds = last_end_s_;
  summary_.events = static_cast<int64_t>(q_.popped());
  return std::move(results_);
}

Simulator::Simulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Simulator::~Simulator() = default;

absl::StatusOr<std::unique_ptr<Simulator>> Simulator::Create(const ClusterConfig& cluster,
                                                             const SimulatorOptions& options) {
  auto impl = std::make_unique<Impl>(cluster, options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Simulator>(new Simulator(std::move(impl)));
}

absl::StatusOr<std::vector<RequestResult>> Simulator::Run(absl::Span<const TraceRequest> trace) {
  return impl_->Run(trace);
}

const SimSummary& Simulator::summary() const { return impl_->summary_; }

std::vector<std::string> Simulator::WorkerIds() const { return impl_->WorkerIds(); }

}  // namespace tandem::sim
