// What the router knows of one worker, built only from the worker's WatchState stream
// (tandem.v1.WorkerState; DESIGN.md §4): the first message, a Snapshot, gives everything; then
// KV events keep the set of cached block hashes current and load samples the load. What the
// router placed there itself and has not seen reported is its LoadLedger's (load_ledger.h).
//
//   WorkerView view;
//   while (stream->Read(&update)) {
//     absl::MutexLock lock(&mu);
//     if (absl::Status s = view.Apply(update); !s.ok()) {
//       // FAILED_PRECONDITION: missed events; cancel the call and subscribe again (the new
//       // stream starts with a Snapshot, which heals the view).
//     }
//   }
//   ...
//   std::optional<placement::WorkerCandidate> c = ToCandidate(view);  // under the same lock
//
// Event order: every KvEvent must carry event_id == last_event_id() + 1 (the snapshot's
// last_event_id, then each event's). A gap, or an event of a kind this build does not know, makes
// the view stale: Apply then fails every update but a Snapshot with FAILED_PRECONDITION
// ("missed events, re-subscribe"), and ready() is false. A stale view keeps its last numbers and
// hashes (approximate, but better than nothing for a caller that wants them).
//
// No I/O, no threads. Thread-compatible: the caller serializes access (the registry's lock);
// references returned stay valid until the next non-const call.
#ifndef TANDEM_ROUTER_REGISTRY_WORKER_VIEW_H_
#define TANDEM_ROUTER_REGISTRY_WORKER_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "router/placement/placement.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// A worker's load as it last reported it (tandem.v1.LoadSample, or the Snapshot's).
struct WorkerLoad {
  // When the sample was taken, wall clock, microseconds since the Unix epoch (worker's clock).
  uint64_t timestamp_us = 0;
  // Sequences in the running batch / admitted but waiting.
  int64_t running_seqs = 0;
  int64_t waiting_seqs = 0;
  // Blocks: allocatable now (cached ones included), held by sequences, and free but still holding
  // a reusable cached block.
  int64_t free_blocks = 0;
  int64_t used_blocks = 0;
  int64_t cached_blocks = 0;
  // Prompt tokens admitted but not computed yet.
  int64_t queued_prefill_tokens = 0;
  // Sum of the context lengths of the decoding sequences, tokens.
  int64_t active_decode_tokens = 0;
  // How long the engine step in progress had run when the sample was taken; 0 between steps.
  int64_t step_elapsed_us = 0;
  // queued_prefill_tokens by priority class, highest first; empty: not reported.
  std::vector<placement::QueuedClass> queued_by_priority = {};
};

class WorkerView {
 public:
  WorkerView() = default;

  // Applies one message of the worker's WatchState stream.
  //   Snapshot      replaces everything and
  //                 clears staleness. INVALID_ARGUMENT for block_size 0: nothing is replaced and
  //                 the view is stale.
  //   KvEventBatch  applies stored / removed / cleared in order. FAILED_PRECONDITION ("missed
  //                 events, re-subscribe") for an event_id that is not last_event_id() + 1 or an
  //                 event of unknown kind; events before it are applied, and the view is stale.
  //   LoadSample    replaces the load numbers.
  //   unknown case  ignored (OK), as the protocol says, whatever the view's state.
  // Before the first Snapshot, and while stale, a KvEventBatch or LoadSample is
  // FAILED_PRECONDITION and changes nothing.
  absl::Status Apply(const v1::WorkerStateUpdate& update);

  // Whether a Snapshot has been applied.
  bool has_snapshot() const { return has_snapshot_; }
  // Whether the view missed events (or got an invalid snapshot) and waits for a new Snapshot.
  bool stale() const { return stale_; }
  // Current: has a snapshot and is not stale.
  bool ready() const { return has_snapshot_ && !stale_; }

  // From the last Snapshot ("" / 0 / ROLE_UNSPECIFIED before the first).
  const std::string& worker_id() const { return snapshot_.worker_id(); }
  v1::WorkerRole role() const { return snapshot_.role(); }
  const std::string& model_id() const { return snapshot_.model_id(); }
  // Tokens per KV block.
  int64_t block_size() const { return snapshot_.block_size(); }
  // Blocks in the worker's KV pool.
  int64_t total_blocks() const { return snapshot_.total_blocks(); }
  // Longest sequence (prompt plus output) the worker accepts, tokens.
  int64_t max_context() const { return snapshot_.max_context(); }
  // Largest number of sequences in one batch.
  int64_t max_running() const { return snapshot_.max_running(); }
  // 0: not reported (an older worker).
  int64_t max_tokens_per_step() const { return snapshot_.max_tokens_per_step(); }
  int64_t max_prefill_tokens() const { return snapshot_.max_prefill_tokens(); }
  const std::string& engine() const { return snapshot_.engine(); }
  const std::string& version() const { return snapshot_.version(); }
  // The worker's KV pool descriptor, kept as sent (empty on prefill-only workers).
  const v1::KvPoolDescriptor& kv_pool() const { return snapshot_.kv_pool(); }

  // Id of the last KV event applied (the snapshot's last_event_id before any event).
  uint64_t last_event_id() const { return last_event_id_; }

  // Latest load numbers (the last LoadSample, else the Snapshot's; free_blocks from the Snapshot's
  // own field until a LoadSample comes).
  const WorkerLoad& load() const { return load_; }
  // Blocks allocatable now (load().free_blocks).
  int64_t free_blocks() const { return load_.free_blocks; }
  // The latest LoadSample as sent, for what WorkerLoad leaves out (recent step timings for cost
  // models, prefix-hit counters).
  const v1::LoadSample& last_load_sample() const { return last_sample_; }
  // The worker is shutting down (LoadSample.draining of the latest sample, else the Snapshot's):
  // it takes no new work and finishes what it holds.
  bool draining() const { return last_sample_.draining(); }

  // Hashes of the full blocks the worker's prefix cache holds.
  const absl::flat_hash_set<BlockHash>& cached_hashes() const { return cached_; }
  // How many leading entries of `hashes` (a prompt's block hashes in order) the worker holds.
  int64_t CachedPrefixLength(absl::Span<const BlockHash> hashes) const;
  // The same in tokens: CachedPrefixLength(hashes) * block_size().
  int64_t CachedPrefixTokens(absl::Span<const BlockHash> hashes) const;

  // Counters for metrics and tests.
  int64_t snapshots_applied() const { return snapshots_applied_; }
  int64_t events_applied() const { return events_applied_; }
  // Times the view went stale (gaps and unknown events).
  int64_t resyncs_needed() const { return resyncs_needed_; }

 private:
  absl::Status ApplySnapshot(const v1::Snapshot& snapshot);
  absl::Status ApplyEvents(const v1::KvEventBatch& batch);
  void ApplyLoad(const v1::LoadSample& sample);
  absl::Status MarkStale(absl::string_view why);

  bool has_snapshot_ = false;
  bool stale_ = false;
  // The last Snapshot without its cached hashes and load (those live below).
  v1::Snapshot snapshot_;
  uint64_t last_event_id_ = 0;
  WorkerLoad load_;
  v1::LoadSample last_sample_;
  absl::flat_hash_set<BlockHash> cached_;
  int64_t snapshots_applied_ = 0;
  int64_t events_applied_ = 0;
  int64_t resyncs_needed_ = 0;
};

// K and V of every layer for one token, from a KV pool's layout; 0 when its dtype is unknown.
int64_t KvBytesPerToken(const v1::KvLayout& layout);

// The view as a placement candidate: the role mapped, the reported load, the KV bytes per token
// from the pool's layout, and a pointer to the view's cached hashes (valid while the view lives
// and is not changed, so under the caller's lock). healthy = ready() and not draining() (a
// draining worker is placed on neither for decode nor for prefill). The caller adds what the
// view does not hold: the router's own placed load and ended streams (LoadLedger::Apply), the
// worker's cost model. nullopt when the view has no snapshot or its role is ROLE_UNSPECIFIED or
// unknown (not a candidate). The router may clear `healthy` further (a broken connection, a
// worker to avoid).
std::optional<placement::WorkerCandidate> ToCandidate(const WorkerView& view);

// A reported step as the step cost model observes it (placement::StepObservation): its attention
// split into the decode tokens' and the prompt tokens' parts. Workers that predate
// prompt_attended_tokens report no split: a step with prompt tokens is then taken to have computed
// them from position 0, the least attention they can have had; workers that predate
// attended_tokens report the per-sequence context sum, used for both. A prompt part larger than
// the whole is clipped to it. Never negative.
placement::StepObservation StepObservationOf(const v1::StepTiming& step);

}  // namespace tandem

#endif  // TANDEM_ROUTER_REGISTRY_WORKER_VIEW_H_
