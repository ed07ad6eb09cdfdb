#include "router/registry/worker_view.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "router/placement/placement.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

// Counters beyond this are nonsense; capping them keeps every sum of them far from overflow.
constexpr uint64_t kMaxCount = uint64_t{1} << 48;

int64_t Capped(uint64_t value) { return static_cast<int64_t>(std::min(value, kMaxCount)); }

WorkerLoad ToWorkerLoad(const v1::LoadSample& sample) {
  WorkerLoad load = {
      .timestamp_us = sample.timestamp_us(),
      .running_seqs = sample.running_seqs(),
      .waiting_seqs = sample.waiting_seqs(),
      .free_blocks = sample.free_blocks(),
      .used_blocks = sample.used_blocks(),
      .cached_blocks = sample.cached_blocks(),
      .queued_prefill_tokens = Capped(sample.queued_prefill_tokens()),
      .active_decode_tokens = Capped(sample.active_decode_tokens()),
      .step_elapsed_us = Capped(sample.step_elapsed_us()),
  };
  // Kept in the worker's order (highest first) when it is one; a sample out of order, with a
  // class twice or whose classes do not add up to its queue is not known by class.
  int64_t tokens = 0;
  for (const v1::QueuedClass& q : sample.queued_by_priority()) {
    if (!load.queued_by_priority.empty() &&
        load.queued_by_priority.back().priority <= q.priority()) {
      load.queued_by_priority.clear();
      return load;
    }
    load.queued_by_priority.push_back(
        {.priority = q.priority(), .tokens = Capped(q.tokens()), .prompts = q.prompts()});
    tokens += load.queued_by_priority.back().tokens;
  }
  if (tokens != load.queued_prefill_tokens) load.queued_by_priority.clear();
  return load;
}

}  // namespace

absl::Status WorkerView::Apply(const v1::WorkerStateUpdate& update) {
  switch (update.update_case()) {
    case v1::WorkerStateUpdate::kSnapshot:
      return ApplySnapshot(update.snapshot());
    case v1::WorkerStateUpdate::kKvEvents:
    case v1::WorkerStateUpdate::kLoad:
      if (!has_snapshot_) {
        return absl::FailedPreconditionError(
            "worker state: an update came before the first snapshot");
      }
      if (stale_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker state of '", worker_id(), "' is stale (missed events, re-subscribe)"));
      }
      if (update.update_case() == v1::WorkerStateUpdate::kLoad) {
        ApplyLoad(update.load());
        return absl::OkStatus();
      }
      return ApplyEvents(update.kv_events());
    case v1::WorkerStateUpdate::UPDATE_NOT_SET:
      break;
  }
  // A case this build does not know (or none): ignored, as the protocol says.
  return absl::OkStatus();
}

absl::Status WorkerView::ApplySnapshot(const v1::Snapshot& snapshot) {
  if (snapshot.block_size() == 0) {
    if (!stale_) ++resyncs_needed_;
    stale_ = true;
    return absl::InvalidArgumentError(absl::StrCat("worker state: the snapshot of '",
                                                   snapshot.worker_id(), "' has block_size 0"));
  }
  snapshot_ = snapshot;
  snapshot_.clear_cached_block_hashes();  // kept in cached_
  snapshot_.clear_load();                 // kept in load_ / last_sample_
  cached_.clear();
  cached_.reserve(snapshot.cached_block_hashes_size());
  for (uint64_t h : snapshot.cached_block_hashes()) cached_.insert(h);
  last_event_id_ = snapshot.last_event_id();
  last_sample_ = snapshot.load();
  load_ = ToWorkerLoad(snapshot.load());
  load_.free_blocks = snapshot.free_blocks();
  has_snapshot_ = true;
  stale_ = false;
  ++snapshots_applied_;
  return absl::OkStatus();
}

absl::Status WorkerView::ApplyEvents(const v1::KvEventBatch& batch) {
  for (const v1::KvEvent& event : batch.events()) {
    if (event.event_id() != last_event_id_ + 1) {
      return MarkStale(absl::StrCat("event ", event.event_id(), " after ", last_event_id_));
    }
    switch (event.kind_case()) {
      case v1::KvEvent::kStored:
        for (uint64_t h : event.stored().block_hashes()) cached_.insert(h);
        break;
      case v1::KvEvent::kRemoved:
        for (uint64_t h : event.removed().block_hashes()) cached_.erase(h);
        break;
      case v1::KvEvent::kCleared:
        cached_.clear();
        break;
      case v1::KvEvent::KIND_NOT_SET:
        // A kind this build does not know: what it changed is unknown.
        return MarkStale(absl::StrCat("event ", event.event_id(), " is of an unknown kind"));
    }
    last_event_id_ = event.event_id();
    ++events_applied_;
  }
  return absl::OkStatus();
}

void WorkerView::ApplyLoad(const v1::LoadSample& sample) {
  last_sample_ = sample;
  load_ = ToWorkerLoad(sample);
}

absl::Status WorkerView::MarkStale(absl::string_view why) {
  if (!stale_) ++resyncs_needed_;
  stale_ = true;
  return absl::FailedPreconditionError(
      absl::StrCat("worker state of '", worker_id(), "': ", why, ": missed events, re-subscribe"));
}

int64_t WorkerView::CachedPrefixLength(absl::Span<const BlockHash> hashes) const {
  return placement::CachedPrefixBlocks(hashes, &cached_);
}

int64_t WorkerView::CachedPrefixTokens(absl::Span<const BlockHash> hashes) const {
  return CachedPrefixLength(hashes) * block_size();
}

int64_t KvBytesPerToken(const v1::KvLayout& layout) {
  int64_t element = 0;
  switch (layout.dtype()) {
    case v1::DTYPE_F32:
      element = 4;
      break;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      element = 2;
      break;
    case v1::DTYPE_FP8_E4M3:
    case v1::DTYPE_FP8_E5M2:
      element = 1;
      break;
    default:
      return 0;
  }
  return 2 * int64_t{layout.num_layers()} * layout.num_kv_heads() * layout.head_dim() * element;
}

placement::StepObservation StepObservationOf(const v1::StepTiming& step) {
  const int64_t prefill = step.prefill_tokens();
  const uint64_t attended =
      step.attended_tokens() > 0 ? step.attended_tokens() : step.context_tokens();
  uint64_t prompt = step.prompt_attended_tokens();
  if (prompt == 0 && prefill > 0) prompt = static_cast<uint64_t>(prefill * (prefill + 1) / 2);
  prompt = std::min(prompt, attended);
  return {.batch_size = step.batch_size(),
          .prefill_tokens = prefill,
          .decode_tokens = step.decode_tokens(),
          .context_tokens = static_cast<int64_t>(attended - prompt),
          .prompt_context_tokens = static_cast<int64_t>(prompt),
          .duration_us = static_cast<int64_t>(step.duration_us())};
}

std::optional<placement::WorkerCandidate> ToCandidate(const WorkerView& view) {
  if (!view.has_snapshot()) return std::nullopt;
  placement::Role role;
  switch (view.role()) {
    case v1::ROLE_PREFILL:
      role = placement::Role::kPrefill;
      break;
    case v1::ROLE_DECODE:
      role = placement::Role::kDecode;
      break;
    case v1::ROLE_BOTH:
      role = placement::Role::kBoth;
      break;
    default:
      return std::nullopt;
  }
  const WorkerLoad& load = view.load();
  return placement::WorkerCandidate{
      .id = view.worker_id(),
      .role = role,
      .healthy = view.ready() && !view.draining(),
      .max_running = view.max_running(),
      .running_seqs = load.running_seqs,
      .waiting_seqs = load.waiting_seqs,
      .queued_prefill_tokens = load.queued_prefill_tokens,
      .cached_hashes = &view.cached_hashes(),
      .slo = {.max_tokens_per_step = view.max_tokens_per_step(),
              .max_prefill_tokens = view.max_prefill_tokens(),
              .kv_bytes_per_token = KvBytesPerToken(view.kv_pool().layout()),
              .active_decode_tokens = load.active_decode_tokens,
              .queued_by_priority = load.queued_by_priority},
  };
}

}  // namespace tandem
