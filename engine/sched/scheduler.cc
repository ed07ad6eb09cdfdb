#include "engine/sched/scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/by_priority.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tandem {

// Aligned so that the fields load() and the step's bookkeeping read first (to `decoding`) share
// one cache line: at scale (the simulator's thousands of workers) each sequence is cold.
struct alignas(64) SchedulerSequence {
  SchedulerSequence(SequenceId id, std::vector<int32_t> tokens, int64_t max_total, int priority,
                    uint64_t arrival, BlockPool* pool)
      : id(id),
        tokens(std::move(tokens)),
        max_total(max_total),
        arrival(arrival),
        priority(priority),
        table(pool) {}

  SequenceId id;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t max_total;            // longest the sequence may grow
  uint64_t arrival;             // order of Add; kept across preemptions
  int64_t num_computed = 0;     // leading tokens whose K/V are in `table`
  int priority;
  // Every known token was computed once since the last admission: the sequence is generating,
  // and its next single token is a decode (not the end of a prompt or recompute chunk).
  bool decoding = false;
  bool running = false;
  // Its prompt's K/V are being written by another worker into `table` (disaggregated prefill).
  bool remote = false;
  // It left the scheduler (Finish); kept in retired_ until the next Schedule.
  bool finished = false;
  bool reuse_prefix = true;  // Add's
  std::vector<BlockHash> hashes;  // of the full blocks of `tokens`
  BlockTable table;
  // Prompt tokens taken from the prefix cache at the first admission; -1 before it.
  int64_t first_cached_tokens = -1;

  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
};

namespace {

// Scheduling order: higher priority first, then earlier arrival.
template <typename S>
bool Before(const S* a, const S* b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  return a->arrival < b->arrival;
}

}  // namespace

Scheduler::Scheduler(BlockPool* pool, const SchedulerOptions& options)
    : pool_(pool), options_(options) {
  CHECK(options_.max_running > 0 && options_.max_tokens_per_step > 0 &&
        options_.max_prefill_chunk >= 0 && options_.max_prefill_tokens >= 0 &&
        options_.admission_reserve_blocks >= 0)
      << "invalid scheduler options";
}

Scheduler::~Scheduler() = default;

absl::Status Scheduler::Add(SequenceId id, std::vector<int32_t> prompt, int64_t max_new_tokens,
                            int priority, bool reuse_prefix) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens ", max_new_tokens, " < 0"));
  }
  if (sequences_.contains(id) || held_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("sequence id ", id, " is in use"));
  }
  const int64_t max_total = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  const int64_t bs = pool_->block_size();
  const int64_t blocks = (max_total + bs - 1) / bs;
  if (blocks > pool_->num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the sequence may grow to ", max_total, " tokens (", blocks, " KV blocks); the pool has ",
        pool_->num_blocks(), " blocks of ", bs, " tokens"));
  }
  counters_.prompt_tokens += static_cast<int64_t>(prompt.size());
  auto seq = std::make_unique<Sequence>(id, std::move(prompt), max_total, priority,
                                        next_arrival_++, pool_);
  if (pool_->prefix_caching()) ExtendBlockHashes(pool_->model_hash(), seq->tokens, bs, &seq->hashes);
  seq->reuse_prefix = reuse_prefix;
  waiting_.push_back(seq.get());
  sequences_.emplace(id, std::move(seq));
  return absl::OkStatus();
}

bool Scheduler::Finish(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  Sequence* seq = it->second.get();
  auto& list = seq->running ? running_ : seq->remote ? remote_ : waiting_;
  list.erase(std::find(list.begin(), list.end(), seq));
  seq->table.Release();
  seq->finished = true;
  retired_.push_back(std::move(it->second));
  sequences_.erase(it);
  ++counters_.finished_sequences;
  return true;
}

bool Scheduler::FinishAndHold(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  held_.emplace(id, std::move(it->second->table));
  return Finish(id);
}

bool Scheduler::ReleaseHeld(SequenceId id) {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  it->second.Release();
  held_.erase(it);
  return true;
}

int64_t Scheduler::num_held_blocks() const {
  int64_t n = 0;
  for (const auto& [id, table] : held_) n += static_cast<int64_t>(table.blocks().size());
  return n;
}

absl::Span<const int32_t> Scheduler::tokens(SequenceId id) const {
  auto it = sequences_.find(id);
  CHECK(it != sequences_.end()) << "unknown sequence " << id;
  return it->second->tokens;
}

int64_t Scheduler::cached_prompt_tokens(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : std::max<int64_t>(it->second->first_cached_tokens, 0);
}

int64_t Scheduler::PrefillLeft(const ScheduledStep& step) const {
  const int64_t cap = options_.max_prefill_tokens > 0 ? options_.max_prefill_tokens
                                                      : options_.max_tokens_per_step;
  return cap - step.num_prefill_tokens;
}

int64_t Scheduler::ChunkFor(const Sequence& seq, const ScheduledStep& step, int64_t budget) const {
  int64_t n = std::min(seq.remaining(), budget);
  if (seq.decoding && seq.remaining() == 1) return n;  // a decode token
  if (seq.remaining() > 1 && options_.max_prefill_chunk > 0) {
    n = std::min(n, options_.max_prefill_chunk);
  }
  return std::min(n, PrefillLeft(step));
}

int64_t Scheduler::BlocksFreedByPreempting(int priority) const {
  // A block comes free when every reference to it belongs to a preempted sequence.
  absl::flat_hash_map<int32_t, int32_t> references;
  for (const Sequence* s : running_) {
    if (s->priority >= priority) continue;
    for (int32_t b : s->table.blocks()) ++references[b];
  }
  int64_t freed = 0;
  for (const auto& [block, count] : references) {
    if (count == pool_->ref_count(block)) ++freed;
  }
  return freed;
}

Scheduler::Sequence* Scheduler::PreemptionVictim() const {
  Sequence* victim = nullptr;
  for (Sequence* s : running_) {
    if (victim == nullptr || Before(victim, s)) victim = s;
  }
  return victim;
}

void Scheduler::Preempt(Sequence* seq, ScheduledStep* step, int64_t* budget) {
  for (auto it = step->items.begin(); it != step->items.end(); ++it) {
    if (it->id != seq->id) continue;
    const int64_t n = static_cast<int64_t>(it->tokens.size());
    *budget += n;
    step->num_tokens -= n;
    (it->is_decode ? step->num_decode_tokens : step->num_prefill_tokens) -= n;
    step->items.erase(it);
    break;
  }
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  seq->running = false;
  seq->table.Release();
  seq->num_computed = 0;
  seq->decoding = false;
  waiting_.push_back(seq);
  step->preempted.push_back(seq->id);
  ++counters_.preemptions;
}

void Scheduler::AddItem(Sequence* seq, int64_t n, bool is_decode, ScheduledStep* step,
                        int64_t* budget) {
  const int64_t size = static_cast<int64_t>(seq->tokens.size());
  step->items.push_back(ScheduledItem{
      .id = seq->id,
      .start = seq->num_computed,
      .tokens = absl::MakeConstSpan(seq->tokens).subspan(static_cast<size_t>(seq->num_computed),
                                                         static_cast<size_t>(n)),
      .block_table = seq->table.blocks(),
      .samples = seq->num_computed + n == size,
      .is_decode = is_decode,
      .sequence = seq});
  step->num_tokens += n;
  (is_decode ? step->num_decode_tokens : step->num_prefill_tokens) += n;
  *budget -= n;
}

bool Scheduler::ScheduleRunning(Sequence* seq, bool decoding, ScheduledStep* step,
                                int64_t* budget) {
  const int64_t n = ChunkFor(*seq, *step, *budget);
  if (n <= 0) return false;
  while (seq->table.BlocksNeededFor(n) > pool_->num_available()) {
    Sequence* victim = PreemptionVictim();
    Preempt(victim, step, budget);
    if (victim == seq) return false;
  }
  CHECK_OK(seq->table.AppendSlots(n));
  AddItem(seq, n, decoding, step, budget);
  return true;
}

void Scheduler::AdoptCachedPrefix(Sequence* seq) {
  if (!seq->reuse_prefix) {
    seq->num_computed = seq->table.num_tokens();  // nothing: an admission starts empty
    return;
  }
  // At least the last token is computed, for its logits: a fully cached prompt reuses all but
  // its last block.
  const size_t reusable = std::min(seq->hashes.size(),
                                   (seq->tokens.size() - 1) / static_cast<size_t>(pool_->block_size()));
  seq->table.AdoptCachedPrefix(
      pool_->AcquirePrefix(absl::MakeConstSpan(seq->hashes).first(reusable)));
  seq->num_computed = seq->table.num_tokens();
}

bool Scheduler::TryAdmit(Sequence* seq, ScheduledStep* step, int64_t* budget) {
  AdoptCachedPrefix(seq);
  const int64_t n = ChunkFor(*seq, *step, *budget);
  const int64_t reserve = running_.empty() ? 0 : options_.admission_reserve_blocks;
  const int64_t needed = seq->table.BlocksNeededFor(n) + reserve;
  if (needed > pool_->num_available()) {
    // Only a strictly more important sequence takes blocks from running ones, and only when
    // preempting all of those would free enough: nobody loses work for nothing.
    if (needed > pool_->num_available() + BlocksFreedByPreempting(seq->priority)) {
      seq->table.Release();
      seq->num_computed = 0;
      return false;
    }
    while (seq->table.BlocksNeededFor(n) + reserve > pool_->num_available()) {
      Preempt(PreemptionVictim(), step, budget);
    }
  }
  const int64_t cached_tokens = seq->num_computed;
  CHECK_OK(seq->table.AppendSlots(n));
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  running_.push_back(seq);
  seq->running = true;
  AddItem(seq, n, /*is_decode=*/false, step, budget);
  counters_.admitted_tokens += static_cast<int64_t>(seq->tokens.size());
  counters_.prefix_hit_tokens += cached_tokens;
  if (seq->first_cached_tokens < 0) seq->first_cached_tokens = cached_tokens;
  return true;
}

absl::StatusOr<RemotePrefillPlan> Scheduler::AddRemotePrefill(SequenceId id,
                                                             std::vector<int32_t> prompt,
                                                             int64_t max_new_tokens, int priority) {
  if (static_cast<int64_t>(running_.size() + remote_.size()) >= options_.max_running) {
    return absl::ResourceExhaustedError(absl::StrCat("the batch is full (", options_.max_running,
                                                     " sequences)"));
  }
  RETURN_IF_ERROR(Add(id, std::move(prompt), max_new_tokens, priority));
  Sequence* seq = sequences_.at(id).get();
  AdoptCachedPrefix(seq);
  const int64_t cached = seq->num_computed;
  const int64_t rest = static_cast<int64_t>(seq->tokens.size()) - cached;
  const int64_t reserve = running_.empty() ? 0 : options_.admission_reserve_blocks;
  if (seq->table.BlocksNeededFor(rest) + reserve > pool_->num_available()) {
    Finish(id);
    return absl::ResourceExhaustedError(
        absl::StrCat("no KV blocks for a ", rest, "-token remote prefill now"));
  }
  CHECK_OK(seq->table.AppendSlots(rest));
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  remote_.push_back(seq);
  seq->remote = true;
  seq->num_computed = cached;
  counters_.admitted_tokens += static_cast<int64_t>(seq->tokens.size());
  counters_.prefix_hit_tokens += cached;
  seq->first_cached_tokens = cached;
  const auto blocks = seq->table.blocks();
  return RemotePrefillPlan{.cached_tokens = cached,
                           .blocks = std::vector<int32_t>(blocks.begin(), blocks.end())};
}

void Scheduler::CompleteRemotePrefill(SequenceId id) {
  auto it = sequences_.find(id);
  CHECK(it != sequences_.end() && it->second->remote) << "sequence " << id << " is not remote";
  Sequence* seq = it->second.get();
  remote_.erase(std::find(remote_.begin(), remote_.end(), seq));
  seq->remote = false;
  seq->running = true;
  seq->decoding = true;
  seq->num_computed = static_cast<int64_t>(seq->tokens.size());
  running_.push_back(seq);
  if (pool_->prefix_caching()) seq->table.RegisterFullBlocks(seq->hashes);
}

void Scheduler::FallBackToLocalPrefill(SequenceId id) {
  auto it = sequences_.find(id);
  CHECK(it != sequences_.end() && it->second->remote) << "sequence " << id << " is not remote";
  Sequence* seq = it->second.get();
  remote_.erase(std::find(remote_.begin(), remote_.end(), seq));
  seq->remote = false;
  // What the peer wrote cannot be trusted: only the cached prefix stays, as for a preemption.
  seq->table.Release();
  seq->num_computed = 0;
  waiting_.push_back(seq);
}

ScheduledStep Scheduler::Schedule() {
  ScheduledStep step;
  Schedule(&step);
  return step;
}

void Scheduler::Schedule(ScheduledStep* out) {
  retired_.clear();
  out->items.clear();
  out->preempted.clear();
  out->num_tokens = out->num_prefill_tokens = out->num_decode_tokens = 0;
  ScheduledStep& step = *out;
  int64_t budget = options_.max_tokens_per_step;
  std::sort(running_.begin(), running_.end(), Before<Sequence>);
  // Preemption changes running_, so walk a copy and skip what left it (kept between steps: no
  // allocation per step).
  order_.assign(running_.begin(), running_.end());
  const std::vector<Sequence*>& order = order_;
  for (Sequence* seq : order) {
    if (budget <= 0) break;
    if (seq->running && seq->decoding && seq->remaining() == 1) {
      ScheduleRunning(seq, /*decoding=*/true, &step, &budget);
    }
  }
  // Prompts, in progress or waiting, by priority: a waiting sequence of higher priority is
  // admitted before a prompt in progress gets its next chunk (a long low-priority prompt must not
  // hold a higher class's first token for its whole length); at equal priority the prompt in
  // progress goes first. No admission once the step preempted: the preempted sequences wait
  // ahead of the queue.
  std::sort(waiting_.begin(), waiting_.end(), Before<Sequence>);
  queue_.assign(waiting_.begin(), waiting_.end());
  const std::vector<Sequence*>& queue = queue_;
  size_t next = 0;
  bool admitting = true;
  // Admits waiting sequences of priority above `priority` while the budget, the batch and the
  // blocks allow, and nothing was preempted in this step.
  auto admit_above = [&](int64_t priority) {
    if (!step.preempted.empty()) admitting = false;
    while (admitting && next < queue.size() && queue[next]->priority > priority) {
      if (budget <= 0 || PrefillLeft(step) <= 0 ||
          static_cast<int64_t>(running_.size() + remote_.size()) >= options_.max_running) {
        admitting = false;
        break;
      }
      Sequence* seq = queue[next++];
      if (seq->running) continue;
      // A sequence preempted for this one ranks above everything after it in the queue: those
      // wait, or they would take the blocks the preempted one needs next.
      if (!TryAdmit(seq, &step, &budget) || !step.preempted.empty()) admitting = false;
    }
  };
  for (Sequence* seq : order) {
    if (!seq->running || (seq->decoding && seq->remaining() == 1)) continue;
    admit_above(seq->priority);
    if (budget <= 0) break;
    // (An admission may have preempted it.)
    if (seq->running) ScheduleRunning(seq, /*decoding=*/false, &step, &budget);
  }
  admit_above(std::numeric_limits<int64_t>::min());
}

void Scheduler::Commit(const ScheduledStep& step) {
  for (const ScheduledItem& item : step.items) {
    Sequence* seq = item.sequence;
    if (seq->finished) continue;  // finished (and its id maybe reused) since Schedule
    CHECK(seq->num_computed == item.start) << "sequence " << item.id << " committed out of order";
    seq->num_computed += static_cast<int64_t>(item.tokens.size());
    if (seq->remaining() == 0) seq->decoding = true;
    CHECK(seq->num_computed == seq->table.num_tokens());
    if (pool_->prefix_caching()) seq->table.RegisterFullBlocks(seq->hashes);
  }
  ++counters_.steps;
  counters_.step_tokens += step.num_tokens;
  counters_.last_step_tokens = step.num_tokens;
}

void Scheduler::AppendToken(SequenceId id, int32_t token) {
  auto it = sequences_.find(id);
  CHECK(it != sequences_.end()) << "unknown sequence " << id;
  AppendToken(it->second.get(), token);
}

void Scheduler::AppendToken(const ScheduledItem& item, int32_t token) {
  CHECK(!item.sequence->finished) << "sequence " << item.id << " finished";
  AppendToken(item.sequence, token);
}

void Scheduler::AppendToken(Sequence* seq, int32_t token) {
  const SequenceId id = seq->id;
  CHECK(seq->running && seq->remaining() == 0)
      << "sequence " << id << " gets a token before its last one was computed";
  CHECK(static_cast<int64_t>(seq->tokens.size()) < seq->max_total)
      << "sequence " << id << " grows past the " << seq->max_total << " tokens it was added with";
  seq->tokens.push_back(token);
  if (pool_->prefix_caching()) {
    ExtendBlockHashes(pool_->model_hash(), seq->tokens, pool_->block_size(), &seq->hashes);
    seq->table.RegisterFullBlocks(seq->hashes);
  }
}

absl::Status Scheduler::AdvanceDecode(
    int64_t steps, absl::FunctionRef<int32_t(SequenceId id, int64_t position)> token) {
  if (steps < 0) return absl::InvalidArgumentError(absl::StrCat("steps ", steps, " < 0"));
  if (steps == 0) return absl::OkStatus();
  if (!waiting_.empty()) {
    return absl::FailedPreconditionError("sequences are waiting: a step would admit them");
  }
  if (static_cast<int64_t>(running_.size()) > options_.max_tokens_per_step) {
    return absl::FailedPreconditionError("the batch exceeds the token budget");
  }
  const int64_t bs = pool_->block_size();
  int64_t blocks = 0;
  for (const Sequence* seq : running_) {
    if (!seq->decoding || seq->remaining() != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq->id, " is not decoding its newest token"));
    }
    const int64_t size = static_cast<int64_t>(seq->tokens.size());
    if (size + steps > seq->max_total) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq->id, " cannot grow by ", steps, " tokens"));
    }
    // The slots of `steps` steps: up to its newest token, then steps - 1 more.
    blocks += seq->table.BlocksNeededFor(size + steps - 1 - seq->table.num_tokens());
  }
  if (blocks > pool_->num_free()) {
    return absl::FailedPreconditionError(
        absl::StrCat(steps, " steps need ", blocks, " blocks; ", pool_->num_free(), " are free"));
  }
  for (Sequence* seq : running_) {
    // Round r (1-based) computes position size - 1 + (r - 1) and appends the token after it.
    const int64_t size = static_cast<int64_t>(seq->tokens.size());
    CHECK_OK(seq->table.AppendSlots(size + steps - 1 - seq->table.num_tokens()));
    for (int64_t r = 0; r < steps; ++r) seq->tokens.push_back(token(seq->id, size + r));
    seq->num_computed = size + steps - 1;
    if (pool_->prefix_caching()) {
      ExtendBlockHashes(pool_->model_hash(), seq->tokens, bs, &seq->hashes);
      seq->table.RegisterFullBlocks(seq->hashes);
    }
  }
  const int64_t batch = static_cast<int64_t>(running_.size());
  counters_.steps += steps;
  counters_.step_tokens += steps * batch;
  counters_.last_step_tokens = batch;
  return absl::OkStatus();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = counters_;
  s.total_blocks = pool_->num_blocks();
  s.free_blocks = pool_->num_free();
  s.cached_blocks = pool_->num_cached();
  s.used_blocks = pool_->num_used();
  s.running = static_cast<int64_t>(running_.size());
  s.remote_prefills = static_cast<int64_t>(remote_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.wasted_slots = 0;
  for (const Sequence* seq : running_) {
    s.wasted_slots += seq->table.capacity() - seq->table.num_tokens();
    if (seq->decoding) {
      s.active_decode_tokens += static_cast<int64_t>(seq->tokens.size());
    } else {
      s.queued_prefill_tokens += seq->remaining();
      AddByPriority({.priority = seq->priority, .tokens = seq->remaining(), .prompts = 1},
                    &s.queued_by_priority);
    }
  }
  for (const Sequence* seq : waiting_) {
    s.queued_prefill_tokens += seq->remaining();
    AddByPriority({.priority = seq->priority, .tokens = seq->remaining(), .prompts = 1},
                  &s.queued_by_priority);
  }
  return s;
}

SchedulerLoad Scheduler::load() const {
  SchedulerLoad l{.running = static_cast<int64_t>(running_.size()),
                  .waiting = static_cast<int64_t>(waiting_.size()),
                  .remote_prefills = static_cast<int64_t>(remote_.size())};
  for (const Sequence* seq : running_) {
    if (seq->decoding) {
      l.active_decode_tokens += static_cast<int64_t>(seq->tokens.size());
    } else {
      l.queued_prefill_tokens += seq->remaining();
    }
  }
  for (const Sequence* seq : waiting_) l.queued_prefill_tokens += seq->remaining();
  return l;
}

void Scheduler::CheckInvariants() const {
  pool_->CheckInvariants();
  std::vector<int32_t> holders(static_cast<size_t>(pool_->num_blocks()), 0);
  for (const auto& [id, seq] : sequences_) {
    const bool in_running = std::find(running_.begin(), running_.end(), seq.get()) != running_.end();
    const bool in_waiting = std::find(waiting_.begin(), waiting_.end(), seq.get()) != waiting_.end();
    const bool in_remote = std::find(remote_.begin(), remote_.end(), seq.get()) != remote_.end();
    CHECK(int{in_running} + int{in_waiting} + int{in_remote} == 1)
        << "sequence " << id << " is not in exactly one queue";
    CHECK(in_running == seq->running);
    CHECK(in_remote == seq->remote);
    if (seq->remote) {
      // Slots for the whole prompt; what the peer writes is not computed here yet.
      CHECK(seq->table.num_tokens() == static_cast<int64_t>(seq->tokens.size()));
      for (int32_t b : seq->table.blocks()) ++holders[static_cast<size_t>(b)];
      continue;
    }
    CHECK(static_cast<int64_t>(seq->tokens.size()) <= seq->max_total);
    if (!seq->running) {
      CHECK(seq->table.blocks().empty() && seq->num_computed == 0)
          << "waiting sequence " << id << " holds blocks";
      continue;
    }
    // Between Schedule and Commit a scheduled sequence holds slots for tokens not yet computed.
    CHECK(seq->table.num_tokens() >= seq->num_computed);
    CHECK(seq->table.capacity() >= seq->table.num_tokens());
    CHECK(seq->table.capacity() - seq->table.num_tokens() < pool_->block_size())
        << "sequence " << id << " holds a block it does not need";
    for (int32_t b : seq->table.blocks()) ++holders[static_cast<size_t>(b)];
  }
  CHECK(sequences_.size() == running_.size() + waiting_.size() + remote_.size());
  for (const auto& [id, table] : held_) {
    CHECK(!sequences_.contains(id)) << "sequence " << id << " runs and is held";
    for (int32_t b : table.blocks()) ++holders[static_cast<size_t>(b)];
  }
  for (size_t b = 0; b < holders.size(); ++b) {
    CHECK(holders[b] == pool_->ref_count(static_cast<int32_t>(b)))
        << "block " << b << " has a reference count that no sequence accounts for";
  }
  // A block shared by two sequences is full in both: nobody writes into it.
  for (const Sequence* seq : running_) {
    const auto blocks = seq->table.blocks();
    const int64_t full = seq->num_computed / pool_->block_size();
    for (size_t k = static_cast<size_t>(full); k < blocks.size(); ++k) {
      CHECK(pool_->ref_count(blocks[k]) == 1)
          << "sequence " << seq->id << " writes into block " << blocks[k] << " that it shares";
    }
  }
}

}  // namespace tandem
