#include "worker/worker_state_service.h"

#include <algorithm>

#include "common/version.h"
#include "kvtransfer/kv_grant.h"
#include "proto/conversion.h"

namespace tandem {

v1::KvEvent WorkerStateService::ToProto(const KvEvent& event) {
  v1::KvEvent out;
  out.set_event_id(event.event_id);
  switch (event.kind) {
    case KvEvent::Kind::kStored: {
      v1::BlocksStored* stored = out.mutable_stored();
      if (event.parent.has_value()) stored->set_parent_hash(*event.parent);
      for (BlockHash h : event.hashes) stored->add_block_hashes(h);
      break;
    }
    case KvEvent::Kind::kRemoved:
      for (BlockHash h : event.hashes) out.mutable_removed()->add_block_hashes(h);
      break;
    case KvEvent::Kind::kCleared:
      out.mutable_cleared();
      break;
  }
  return out;
}

v1::LoadSample WorkerStateService::MakeLoad(const SchedulerStats& s,
                                            const std::vector<StepInfo>& steps,
                                            absl::Duration step_elapsed, absl::Time now) {
  v1::LoadSample load;
  load.set_timestamp_us(static_cast<uint64_t>(absl::ToUnixMicros(now)));
  load.set_running_seqs(static_cast<uint32_t>(s.running + s.remote_prefills));
  load.set_waiting_seqs(static_cast<uint32_t>(s.waiting));
  load.set_free_blocks(static_cast<uint32_t>(s.free_blocks + s.cached_blocks));
  load.set_used_blocks(static_cast<uint32_t>(s.used_blocks));
  load.set_cached_blocks(static_cast<uint32_t>(s.cached_blocks));
  load.set_queued_prefill_tokens(static_cast<uint64_t>(s.queued_prefill_tokens));
  load.set_active_decode_tokens(static_cast<uint64_t>(s.active_decode_tokens));
  load.set_prefix_hit_tokens(static_cast<uint64_t>(s.prefix_hit_tokens));
  load.set_prompt_tokens(static_cast<uint64_t>(s.prompt_tokens));
  load.set_finished_seqs(static_cast<uint64_t>(s.finished_sequences));
  load.set_step_elapsed_us(MicrosForProto(step_elapsed));
  for (const QueuedPrompts& q : s.queued_by_priority) {
    v1::QueuedClass* c = load.add_queued_by_priority();
    c->set_priority(q.priority);
    c->set_tokens(static_cast<uint64_t>(q.tokens));
    c->set_prompts(static_cast<uint32_t>(q.prompts));
  }
  const size_t first = steps.size() > 64 ? steps.size() - 64 : 0;
  for (size_t i = first; i < steps.size(); ++i) {
    const StepInfo& st = steps[i];
    v1::StepTiming* t = load.add_recent_steps();
    t->set_batch_size(static_cast<uint32_t>(st.batch_size));
    t->set_prefill_tokens(static_cast<uint32_t>(st.prefill_tokens));
    t->set_decode_tokens(static_cast<uint32_t>(st.decode_tokens));
    t->set_context_tokens(static_cast<uint64_t>(st.context_tokens));
    t->set_attended_tokens(static_cast<uint64_t>(st.attended_tokens));
    t->set_prompt_attended_tokens(static_cast<uint64_t>(st.prompt_attended_tokens));
    t->set_duration_us(static_cast<uint64_t>(st.total_seconds * 1e6));
  }
  return load;
}

v1::Snapshot WorkerStateService::MakeSnapshot(const EngineLoop::State& state) const {
  v1::Snapshot s;
  s.set_worker_id(info_.worker_id);
  s.set_role(info_.role);
  s.set_model_id(loop_->model_id());
  s.set_block_size(static_cast<uint32_t>(loop_->kv_layout().block_size));
  s.set_total_blocks(static_cast<uint32_t>(state.stats.total_blocks));
  s.set_free_blocks(static_cast<uint32_t>(state.stats.free_blocks + state.stats.cached_blocks));
  s.set_max_context(static_cast<uint32_t>(loop_->config().max_context));
  s.set_max_running(static_cast<uint32_t>(loop_->max_running()));
  s.set_max_tokens_per_step(static_cast<uint32_t>(loop_->max_tokens_per_step()));
  s.set_max_prefill_tokens(static_cast<uint32_t>(loop_->max_prefill_tokens()));
  for (BlockHash h : state.cache.hashes) s.add_cached_block_hashes(h);
  s.set_last_event_id(state.cache.last_event_id);
  // Only what others need to know of the pool: its keys go to the prefill worker of a request,
  // in that request, never to every WatchState client (docs/security.md, "The KV path").
  *s.mutable_kv_pool() = kvtransfer::PublicPart(info_.kv_pool);
  // Taken on the engine thread between two steps: none is in progress.
  *s.mutable_load() = MakeLoad(state.stats, state.recent_steps, absl::ZeroDuration(),
                               loop_->clock()->Now());
  s.mutable_load()->set_draining(draining_);
  s.set_engine(info_.engine);
  s.set_version(kVersion);
  return s;
}

grpc::Status WorkerStateService::WatchState(grpc::ServerContext* context,
                                            const v1::WatchStateRequest* request,
                                            grpc::ServerWriter<v1::WorkerStateUpdate>* writer) {
  const absl::Duration interval =
      absl::Milliseconds(request->load_interval_ms() > 0 ? request->load_interval_ms() : 100);
  uint64_t last_event = 0;
  uint64_t last_step = 0;
  auto send_snapshot = [&]() {
    const EngineLoop::State state = loop_->Snapshot();
    last_event = state.cache.last_event_id;
    last_step = state.steps_total;
    v1::WorkerStateUpdate update;
    *update.mutable_snapshot() = MakeSnapshot(state);
    return writer->Write(update);
  };
  if (!send_snapshot()) return grpc::Status::OK;
  absl::Time next_load = absl::Now() + interval;
  bool said_draining = draining_;
  while (!context->IsCancelled() && !stopped_) {
    const absl::Duration wait =
        std::clamp(next_load - absl::Now(), absl::ZeroDuration(), absl::Milliseconds(100));
    absl::StatusOr<std::vector<KvEvent>> events = loop_->EventsAfter(last_event, wait);
    if (!events.ok()) {
      // Fell behind the kept history: start over from a snapshot.
      if (!send_snapshot()) break;
      continue;
    }
    if (!events->empty()) {
      v1::WorkerStateUpdate update;
      for (const KvEvent& e : *events) *update.mutable_kv_events()->add_events() = ToProto(e);
      last_event = events->back().event_id;
      if (!writer->Write(update)) break;
    }
    // A drain that began is told at once, not at the next interval.
    const bool draining = draining_;
    if (absl::Now() >= next_load || draining != said_draining) {
      said_draining = draining;
      uint64_t newest = 0;
      std::vector<StepInfo> steps = loop_->StepsAfter(last_step, &newest);
      last_step = newest;
      v1::WorkerStateUpdate update;
      *update.mutable_load() = MakeLoad(loop_->stats(), steps, loop_->StepElapsed(),
                                     loop_->clock()->Now());
      update.mutable_load()->set_draining(draining);
      if (!writer->Write(update)) break;
      next_load = absl::Now() + interval;
    }
  }
  return grpc::Status::OK;
}

}  // namespace tandem
