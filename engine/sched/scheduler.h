// Continuous (in-flight) batching over a BlockPool: which sequences run in the next engine step
// and which tokens of each, within a token budget. Every step:
//
//   1. sequences that are decoding get their one token first, so a long prompt never stalls them;
//   2. prompts, by priority: those still prefilling get the next chunk of their prompt that fits
//      the budget, and waiting sequences are admitted, highest priority then oldest first, before
//      any prompt in progress of lower priority (at equal priority the one in progress goes
//      first), reusing the longest prefix of their tokens that the prefix cache holds, while the
//      budget, the cap on running sequences and the free blocks allow.
//
// When a running sequence needs a block and none is left, the lowest-priority, newest running
// sequence is preempted: its blocks go back to the pool (its full blocks stay cached) and it
// waits to be recomputed from its tokens later. An allocation never fails a request.
//
//   Scheduler sched(pool, {.max_running = 64, .max_tokens_per_step = 512});
//   RETURN_IF_ERROR(sched.Add(id, prompt, /*max_new_tokens=*/128, /*priority=*/0));
//   while (sched.HasWork()) {
//     ScheduledStep step = sched.Schedule();
//     ... run the model on step.items; sample where item.samples ...
//     sched.Commit(step);
//     sched.AppendToken(id, token);  // per sampled sequence; Finish(id) when it stops
//   }
//
// Not thread-safe: the engine thread owns it.
#ifndef TANDEM_ENGINE_SCHED_SCHEDULER_H_
#define TANDEM_ENGINE_SCHED_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"

namespace tandem {

using SequenceId = uint64_t;

// A sequence's state inside Scheduler (scheduler.cc); opaque to everyone else.
struct SchedulerSequence;

struct SchedulerOptions {
  // Most sequences in one step's batch (vLLM's max_num_seqs).
  int64_t max_running = 64;
  // Most tokens computed in one step, prefill chunks and decode tokens together (vLLM's
  // max_num_batched_tokens). When it is below max_running, some decoding sequences skip a step.
  int64_t max_tokens_per_step = 512;
  // Longest piece of one sequence's prompt computed in one step; 0: the token budget.
  int64_t max_prefill_chunk = 0;
  // Most prompt tokens computed in one step, all prompts (and recomputes) together; 0: the token
  // budget. A step that computes prompts lasts at most about this many tokens' worth, so a prompt
  // of a higher class arriving meanwhile waits that long, not for whole long prompts: with 128
  // on one CPU thread, ~0.2 s instead of up to a 512-token step's ~0.8 s.
  int64_t max_prefill_tokens = 0;
  // Blocks kept free when admitting a new sequence, so running ones can grow without an
  // immediate preemption.
  int64_t admission_reserve_blocks = 1;
};

// The part of one sequence computed in a step.
struct ScheduledItem {
  SequenceId id = 0;
  // Tokens at positions start .. start + tokens.size() - 1; their K/V go into block_table.
  int64_t start = 0;
  absl::Span<const int32_t> tokens;
  absl::Span<const int32_t> block_table;
  // Whether this piece ends at the sequence's last token, so its logits give the next token.
  bool samples = false;
  // One token of a running sequence that is generating (not a prompt or recompute chunk).
  bool is_decode = false;
  // The scheduler's own record of the sequence, so that Commit and AppendToken(item, ...) need no
  // lookup by id; kept (marked finished) until the next Schedule when the sequence leaves.
  SchedulerSequence* sequence = nullptr;
};

struct ScheduledStep {
  std::vector<ScheduledItem> items;
  // Sequences preempted while scheduling this step (they wait to be recomputed).
  std::vector<SequenceId> preempted;
  int64_t num_tokens = 0;          // sum of items' tokens
  int64_t num_prefill_tokens = 0;  // tokens of items that are not single decode tokens
  int64_t num_decode_tokens = 0;
};

// Where another worker writes a sequence's prompt K/V (disaggregated prefill).
struct RemotePrefillPlan {
  // Leading prompt tokens this pool's prefix cache already holds (whole blocks); the peer writes
  // the rest.
  int64_t cached_tokens = 0;
  // The sequence's blocks for its whole prompt, in position order.
  std::vector<int32_t> blocks;
};

// Prompt work of one priority class not computed yet.
struct QueuedPrompts {
  int priority = 0;
  int64_t tokens = 0;   // not computed yet
  int64_t prompts = 0;  // sequences they belong to
};

struct SchedulerStats {
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;    // unreferenced, nothing cached
  int64_t cached_blocks = 0;  // unreferenced, reusable by prefix
  int64_t used_blocks = 0;    // held by sequences
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t remote_prefills = 0;  // sequences whose prompt K/V a peer is writing
  // Tokens of waiting and still-prefilling sequences not computed yet (their prefill work ahead).
  int64_t queued_prefill_tokens = 0;
  // The same by priority, highest first: what a prompt of each class waits for (a prompt waits
  // only for those of its priority and above, and for the step in progress).
  std::vector<QueuedPrompts> queued_by_priority;
  // Sum of the context lengths of the sequences that are decoding.
  int64_t active_decode_tokens = 0;
  // Prompt tokens of every sequence added (a counter).
  int64_t prompt_tokens = 0;
  // Sequences that left: finished or cancelled (a counter).
  int64_t finished_sequences = 0;
  // Over all admissions (a recomputed sequence counts again): tokens of the sequence when it was
  // admitted, and those of them found in the prefix cache.
  int64_t admitted_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t step_tokens = 0;       // tokens of all steps
  int64_t last_step_tokens = 0;
  // Slots that running sequences hold but have not filled, now.
  int64_t wasted_slots = 0;
  double prefix_hit_rate() const {
    return admitted_tokens == 0 ? 0.0 : static_cast<double>(prefix_hit_tokens) / admitted_tokens;
  }
};

// The part of SchedulerStats a router's load sample needs, for a caller that reads it often (the
// simulator, at every placement): the same figures, without stats()'s walk over every block table
// and its per-priority breakdown.
struct SchedulerLoad {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t remote_prefills = 0;
  int64_t queued_prefill_tokens = 0;
  int64_t active_decode_tokens = 0;
};

class Scheduler {
 public:
  // `pool` must outlive the scheduler.
  Scheduler(BlockPool* pool, const SchedulerOptions& options);
  ~Scheduler();

  // Queues a sequence that starts with `prompt` and may grow by `max_new_tokens`. INVALID_ARGUMENT
  // for an empty prompt, a negative max_new_tokens or an id in use; RESOURCE_EXHAUSTED when the
  // whole pool could not hold the sequence at its longest. With `reuse_prefix` false the
  // sequence never starts from the prefix cache (every position is computed, for a caller that
  // needs each one's logits); its blocks are still cached for others.
  absl::Status Add(SequenceId id, std::vector<int32_t> prompt, int64_t max_new_tokens,
                   int priority = 0, bool reuse_prefix = true);
  // Disaggregated prefill. Adds a sequence whose prompt K/V another worker writes: takes its
  // cached prefix and allocates blocks for the rest of the prompt now. The sequence takes no part
  // in steps (and is never preempted) until CompleteRemotePrefill or FallBackToLocalPrefill; it
  // counts against max_running. Errors as Add, and RESOURCE_EXHAUSTED (nothing added) when the
  // batch is full or the blocks are not free now: the caller queues it with Add instead.
  absl::StatusOr<RemotePrefillPlan> AddRemotePrefill(SequenceId id, std::vector<int32_t> prompt,
                                                     int64_t max_new_tokens, int priority = 0);
  // The peer wrote the whole prompt: the sequence joins the batch, ready for AppendToken with the
  // first token (which the peer sampled).
  void CompleteRemotePrefill(SequenceId id);
  // The peer failed: the sequence releases its blocks and waits to be prefilled here.
  void FallBackToLocalPrefill(SequenceId id);

  // Drops a sequence, running, waiting or remote, and releases its blocks at once. False for an
  // unknown id.
  bool Finish(SequenceId id);
  // Drops a sequence like Finish but keeps its blocks allocated (used, neither cached nor
  // evictable, their contents unchanged) until ReleaseHeld(id): for K/V that a transfer still
  // reads after the sequence ended. The id stays in use until then. False for an unknown id.
  bool FinishAndHold(SequenceId id);
  // Releases the blocks FinishAndHold kept (full ones stay in the prefix cache). False when `id`
  // holds none.
  bool ReleaseHeld(SequenceId id);
  // Sequences in the batch and waiting for it (as stats(), without its walk over them).
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Sequences whose blocks FinishAndHold keeps, and those blocks.
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }
  int64_t num_held_blocks() const;

  // Picks the next step. Items point into the scheduler's state: their spans are valid until the
  // next call of a non-const method; Commit and AppendToken(item, ...) take them until the next
  // Schedule, whatever finished meanwhile.
  ScheduledStep Schedule();
  // The same into `*step`, reusing its vectors' storage (a caller that keeps one step object
  // allocates nothing per step).
  void Schedule(ScheduledStep* step);
  // Records that the step's tokens were computed (their K/V written): registers newly full blocks
  // in the prefix cache. Items of sequences that finished since Schedule are skipped.
  void Commit(const ScheduledStep& step);
  // Appends a generated token to a sequence whose item sampled in the last step.
  void AppendToken(SequenceId id, int32_t token);
  // The same for the sequence of `item` (of the last Schedule), which must not have finished:
  // without looking up its id.
  void AppendToken(const ScheduledItem& item, int32_t token);

  // For a simulator (sim/), which knows that the next `steps` steps can only repeat the last one:
  // does what `steps` rounds of Schedule (each giving every running sequence its decode token),
  // Commit and AppendToken(id, token(id, position)) would, at the cost of one. Every observable
  // result is the same (tokens, counters, the prefix cache's hashes; only which free block ids
  // the sequences get may differ). FAILED_PRECONDITION, with nothing changed, unless: nothing is
  // waiting; every running sequence is decoding with only its newest token not computed; they are
  // at most max_tokens_per_step; each may still grow by `steps` tokens; and the free blocks
  // (not cached ones: nothing is evicted) hold what they grow by. steps >= 0.
  absl::Status AdvanceDecode(int64_t steps,
                             absl::FunctionRef<int32_t(SequenceId id, int64_t position)> token);

  // Sequences in the batch or waiting (held blocks are not work).
  bool HasWork() const { return !sequences_.empty(); }
  bool Contains(SequenceId id) const { return sequences_.contains(id); }
  // The sequence's tokens so far (prompt, then generated).
  absl::Span<const int32_t> tokens(SequenceId id) const;
  // Leading prompt tokens its first admission found in the prefix cache (not computed for it);
  // 0 before it was admitted.
  int64_t cached_prompt_tokens(SequenceId id) const;
  SchedulerStats stats() const;
  // stats()'s running, waiting, remote_prefills, queued_prefill_tokens and active_decode_tokens.
  SchedulerLoad load() const;
  const SchedulerOptions& options() const { return options_; }

  // CHECK-fails when a sequence's state and its blocks disagree.
  void CheckInvariants() const;

 private:
  using Sequence = SchedulerSequence;
  bool ScheduleRunning(Sequence* seq, bool decoding, ScheduledStep* step, int64_t* budget);
  // Appends the next `n` tokens of `seq` (their slots already in its table) to the step.
  void AddItem(Sequence* seq, int64_t n, bool is_decode, ScheduledStep* step, int64_t* budget);
  bool TryAdmit(Sequence* seq, ScheduledStep* step, int64_t* budget);
  void AppendToken(Sequence* seq, int32_t token);
  // Starts `seq`'s empty table with the longest cached prefix of its blocks (never all of it).
  void AdoptCachedPrefix(Sequence* seq);
  void Preempt(Sequence* seq, ScheduledStep* step, int64_t* budget);
  // Blocks that preempting every running sequence of priority below `priority` would free.
  int64_t BlocksFreedByPreempting(int priority) const;
  // The running sequence that a preemption takes first: lowest priority, then newest.
  Sequence* PreemptionVictim() const;
  // Prompt tokens `step` may still take (max_prefill_tokens, else the token budget).
  int64_t PrefillLeft(const ScheduledStep& step) const;
  // Tokens of `seq` for `step`: its next chunk within `budget`, and within PrefillLeft(step)
  // when it is a prompt.
  int64_t ChunkFor(const Sequence& seq, const ScheduledStep& step, int64_t budget) const;

  BlockPool* pool_;
  SchedulerOptions options_;
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  std::vector<Sequence*> running_;  // in admission order
  std::vector<Sequence*> waiting_;  // unordered; Schedule sorts
  std::vector<Sequence*> remote_;   // being prefilled by a peer
  std::vector<Sequence*> order_, queue_;  // Schedule's copies of running_ and waiting_
  absl::flat_hash_map<SequenceId, BlockTable> held_;  // FinishAndHold's blocks
  // Sequences that finished since the last Schedule (their blocks released): the items of that
  // step may still point at them.
  std::vector<std::unique_ptr<Sequence>> retired_;
  uint64_t next_arrival_ = 0;
  SchedulerStats counters_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_SCHED_SCHEDULER_H_
