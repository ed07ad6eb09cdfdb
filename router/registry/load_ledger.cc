#include "router/registry/load_ledger.h"

#include <algorithm>
#include <vector>

#include "common/by_priority.h"

namespace tandem {

void LoadLedger::Place(uint64_t key, const PlacedLoad& load, const Receipt& receipt,
                       absl::Time now) {
  const PlacedLoad counted{.prefill_tokens = std::max<int64_t>(load.prefill_tokens, 0),
                           .sequences = std::max<int64_t>(load.sequences, 0),
                           .decode_tokens = std::max<int64_t>(load.decode_tokens, 0),
                           .prompts = std::max<int64_t>(load.prompts, 0)};
  if (auto it = pending_.find(key); it != pending_.end()) Remove(it->second.load);
  placed_.prefill_tokens += counted.prefill_tokens;
  placed_.sequences += counted.sequences;
  placed_.decode_tokens += counted.decode_tokens;
  placed_.prompts += counted.prompts;
  pending_[key] = {.placed_at = now, .load = counted, .receipt = receipt};
}

void LoadLedger::Remove(const PlacedLoad& load) {
  auto less = [](int64_t total, int64_t amount) { return std::max<int64_t>(total - amount, 0); };
  placed_.prefill_tokens = less(placed_.prefill_tokens, load.prefill_tokens);
  placed_.sequences = less(placed_.sequences, load.sequences);
  placed_.decode_tokens = less(placed_.decode_tokens, load.decode_tokens);
  placed_.prompts = less(placed_.prompts, load.prompts);
}

void LoadLedger::Uncount(uint64_t key, bool prompt_only) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  PlacedLoad& l = it->second.load;
  if (prompt_only) {
    Remove({.prefill_tokens = l.prefill_tokens, .prompts = l.prompts});
    l.prefill_tokens = 0;
    l.prompts = 0;
  } else {
    Remove(l);
    pending_.erase(it);
  }
}

void LoadLedger::StartRunning(uint64_t serial, const Running& running) {
  running_[serial] = {.running = running};
}

void LoadLedger::Progress(uint64_t serial, int64_t tokens, absl::Time now) {
  if (tokens <= 0) return;
  auto it = running_.find(serial);
  if (it == running_.end()) return;
  RunningEntry& r = it->second;
  if (r.first_token_at == absl::InfinitePast()) {
    r.first_token_at = now;
    --tokens;
  }
  r.decoded_tokens += tokens;
}

void LoadLedger::EndStream(uint64_t serial, int64_t placed_context_tokens, absl::Time now) {
  auto it = running_.find(serial);
  if (it == running_.end()) return;
  if (it->second.first_token_at != absl::InfinitePast() && reported_finished_ > 0) {
    if (!unmatched_finishes_.empty()) {
      unmatched_finishes_.pop_front();  // a sample showed it end already
    } else {
      const int64_t context = placed_context_tokens + it->second.decoded_tokens + 1;
      ended_.push_back({.at = now, .context_tokens = context});
      ended_context_tokens_ += context;
    }
  }
  running_.erase(it);
}

void LoadLedger::OnLoadSample(int64_t received_prompt_tokens, int64_t finished_seqs,
                              absl::Time now) {
  ExpireReported(received_prompt_tokens, now);
  MatchFinished(finished_seqs, now);
}

void LoadLedger::ExpireReported(int64_t received_prompt_tokens, absl::Time now) {
  // Prompts the worker received since the last sample pay for the oldest waiting entries.
  int64_t received = received_prompt_tokens_ < 0
                         ? 0
                         : std::max<int64_t>(received_prompt_tokens - received_prompt_tokens_, 0);
  received_prompt_tokens_ = received_prompt_tokens;
  std::vector<uint64_t> waiting;
  for (const auto& [key, p] : pending_) {
    if (p.receipt.receipt_tokens > 0) waiting.push_back(key);
  }
  std::sort(waiting.begin(), waiting.end());
  for (uint64_t key : waiting) {
    Pending& p = pending_.at(key);
    if (received < p.receipt.receipt_tokens) break;
    received -= p.receipt.receipt_tokens;
    p.receipt.receipt_tokens = 0;
    p.placed_at = absl::InfinitePast();  // reported: uncounted below
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.receipt.receipt_tokens == 0 && it->second.placed_at + report_lag_ <= now) {
      Remove(it->second.load);
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
}

void LoadLedger::PopEnded() {
  ended_context_tokens_ -= ended_.front().context_tokens;
  ended_.pop_front();
}

void LoadLedger::MatchFinished(int64_t finished_seqs, absl::Time now) {
  const int64_t before = reported_finished_;
  reported_finished_ = finished_seqs;
  if (finished_seqs < before) {  // a restarted worker: its counter began again
    while (!ended_.empty()) PopEnded();
    unmatched_finishes_.clear();
  } else if (before > 0) {
    for (int64_t left = finished_seqs - before; left > 0; --left) {
      if (!ended_.empty()) {
        PopEnded();
      } else if (unmatched_finishes_.size() < 4096) {
        unmatched_finishes_.push_back(now);
      }
    }
  }
  while (!ended_.empty() && ended_.front().at + report_lag_ <= now) PopEnded();
  while (!unmatched_finishes_.empty() && unmatched_finishes_.front() + report_lag_ <= now) {
    unmatched_finishes_.pop_front();
  }
}

void LoadLedger::OnSnapshot(int64_t finished_seqs) {
  ended_.clear();
  ended_context_tokens_ = 0;
  unmatched_finishes_.clear();
  reported_finished_ = finished_seqs;
}

void LoadLedger::ForgetPlaced() {
  pending_.clear();
  placed_ = {};
  received_prompt_tokens_ = -1;
}

void LoadLedger::Apply(absl::Time now, placement::WorkerCandidate* candidate) const {
  placement::WorkerCandidate& c = *candidate;
  c.placed_sequences = placed_.sequences;
  c.placed_prefill_tokens = placed_.prefill_tokens;
  c.placed_prompts = placed_.prompts;
  c.slo.placed_decode_tokens = placed_.decode_tokens;
  // Streams that ended and that the last sample may still count: as running, or as waiting
  // when it was taken before they started (a burst's first sample shows one running and the
  // rest posted to the engine; the burst may end before the next sample comes).
  const int64_t ended = ended_streams();
  const int64_t ended_running = std::min(ended, c.running_seqs);
  c.running_seqs -= ended_running;
  c.waiting_seqs = std::max<int64_t>(c.waiting_seqs - (ended - ended_running), 0);
  c.slo.active_decode_tokens =
      std::max<int64_t>(c.slo.active_decode_tokens - ended_context_tokens_, 0);
  for (const auto& [serial, r] : running_) {
    const bool started = r.first_token_at != absl::InfinitePast();
    c.slo.running_groups.push_back(
        {.tpot_ms = r.running.tpot_ms,
         .max_tokens = r.running.max_tokens,
         .decoded_tokens = started ? r.decoded_tokens : 0,
         .decode_seconds = started ? std::max(absl::ToDoubleSeconds(now - r.first_token_at), 0.0)
                                   : 0.0});
  }
  // The queue by class: the worker's, and the prompts placed here that it does not show yet.
  // A worker that reports no classes while prompts are queued on it is not known by class.
  if (!c.slo.queued_by_priority.empty() || c.queued_prefill_tokens == 0) {
    for (const auto& [key, p] : pending_) {
      if (p.load.prefill_tokens <= 0 && p.load.prompts <= 0) continue;
      AddByPriority(placement::QueuedClass{.priority = p.receipt.priority,
                                           .tokens = p.load.prefill_tokens,
                                           .prompts = p.load.prompts},
                    &c.slo.queued_by_priority);
      for (placement::QueuedClass& q : c.slo.queued_by_priority) {
        if (q.priority == p.receipt.priority) q.placed_tokens += p.load.prefill_tokens;
      }
    }
  }
}

}  // namespace tandem
