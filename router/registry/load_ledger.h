// What the router counts on one worker beside the worker's own reports (DESIGN.md §5): the load it
// placed there that the worker's load samples do not show yet, the requests decoding there, and
// the streams it saw end that the worker's last sample may still count. Placement reads the
// worker's reported load (WorkerView) corrected by this ledger (Apply).
//
//   LoadLedger ledger(report_lag);
//   ledger.Place(key, {.prefill_tokens = 300, .sequences = 1, ...}, {.priority = 0}, now);
//   ledger.StartRunning(serial, {.tpot_ms = 100, .max_tokens = 64});
//   ... on each load sample:  ledger.OnLoadSample(sample.prompt_tokens, sample.finished_seqs, now);
//   ... first token:          ledger.Uncount(key, /*prompt_only=*/true); ledger.Progress(serial, 1, now);
//   ... the stream ended:     ledger.Uncount(key, false); ledger.EndStream(serial, context, now);
//   ledger.Apply(now, &candidate);   // under the same lock, before placing
//
// Pure: no I/O, no clock (times are passed in), no lock. Thread-compatible: the caller serializes
// access (the registry's lock).
#ifndef TANDEM_ROUTER_REGISTRY_LOAD_LEDGER_H_
#define TANDEM_ROUTER_REGISTRY_LOAD_LEDGER_H_

#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "router/placement/placement.h"

namespace tandem {

// Load the router placed on a worker and has not seen reported yet.
struct PlacedLoad {
  // Prompt tokens the worker is to prefill.
  int64_t prefill_tokens = 0;
  // Sequences the worker is to run.
  int64_t sequences = 0;
  // Their context when they start decoding (prompt tokens), for the slo policy's TPOT.
  int64_t decode_tokens = 0;
  // Prompts that prefill_tokens belong to (the slo policy's attention estimate of a queue).
  int64_t prompts = 0;
};

class LoadLedger {
 public:
  // Placed load counts until a load sample received `report_lag` after the placement (by then
  // the worker's own numbers include it), and an ended stream is subtracted from the worker's
  // reported load for at most that long.
  explicit LoadLedger(absl::Duration report_lag) : report_lag_(report_lag) {}

  // How a placed entry leaves the ledger, besides Uncount.
  struct Receipt {
    // > 0: a prompt sent to a prefill worker, which gets it only once the decode worker's engine
    // has taken the request (up to seconds later): it counts until the worker's count of received
    // prompt tokens has grown by this much since the entries before it (oldest first). 0: until
    // report_lag has passed.
    int64_t receipt_tokens = 0;
    // The request's priority: its prompt tokens count in its class (Apply's queued_by_priority).
    int32_t priority = 0;
  };
  // Counts `load` under `key` (unique among the entries counted now), placed at `now`. Negative
  // amounts count as 0.
  void Place(uint64_t key, const PlacedLoad& load, const Receipt& receipt, absl::Time now);
  // Uncounts the prompt tokens and prompts (prompt_only: the prompt is computed) or all that
  // `key` still counts; nothing for an unknown key.
  void Uncount(uint64_t key, bool prompt_only);

  // A request decoding here (until EndStream), with its TPOT objective (ms; 0: the policy's
  // default) and max_tokens (0: not set): the slo policy weighs how far each one is
  // (placement::RunningGroup).
  struct Running {
    int64_t tpot_ms = 0;
    int64_t max_tokens = 0;
  };
  void StartRunning(uint64_t serial, const Running& running);
  // `tokens` more output tokens of `serial` came at `now` (the first one starts its decoding).
  void Progress(uint64_t serial, int64_t tokens, absl::Time now);
  // `serial`'s stream ended at `now`, `placed_context_tokens` (its prompt) plus its output long.
  // A stream that decoded runs on the worker until its end, which the worker's next sample shows
  // (LoadSample.finished_seqs); until then it is subtracted from the reported load, unless a
  // sample already showed it end. Nothing when the worker does not report finishes.
  void EndStream(uint64_t serial, int64_t placed_context_tokens, absl::Time now);

  // A load sample received at `now`: the worker's counts of prompt tokens received and of
  // sequences finished, since it started. Uncounts the placements it includes and the ended
  // streams it shows (oldest first; a counter that went back means a restarted worker).
  void OnLoadSample(int64_t received_prompt_tokens, int64_t finished_seqs, absl::Time now);
  // A snapshot restates the worker's load: nothing ended is left to subtract.
  void OnSnapshot(int64_t finished_seqs);
  // The worker was lost: its fresh view will count nothing placed. What decodes there and the
  // ended streams stay until they end, or the next snapshot.
  void ForgetPlaced();

  // Corrects `candidate` (placement::WorkerCandidate, as ToCandidate made it from the worker's
  // view) with the ledger: the placed load, the ended streams subtracted from the reported
  // running (then waiting: a sample may predate a stream's start too) sequences and their
  // context, the running groups, and the placed prompts by priority class.
  void Apply(absl::Time now, placement::WorkerCandidate* candidate) const;

  const PlacedLoad& placed() const { return placed_; }
  // Streams subtracted from the reported load now.
  int64_t ended_streams() const { return static_cast<int64_t>(ended_.size()); }
  int64_t running_requests() const { return static_cast<int64_t>(running_.size()); }

 private:
  struct Pending {
    absl::Time placed_at;
    PlacedLoad load;
    Receipt receipt;
  };
  struct RunningEntry {
    Running running;
    // When the first output token came (InfinitePast: not yet), and tokens since.
    absl::Time first_token_at = absl::InfinitePast();
    int64_t decoded_tokens = 0;
  };
  struct Ended {
    absl::Time at;
    int64_t context_tokens = 0;
  };
  void Remove(const PlacedLoad& load);
  void ExpireReported(int64_t received_prompt_tokens, absl::Time now);
  void MatchFinished(int64_t finished_seqs, absl::Time now);
  void PopEnded();

  const absl::Duration report_lag_;
  PlacedLoad placed_;
  absl::flat_hash_map<uint64_t, Pending> pending_;
  // LoadSample.prompt_tokens at the last sample; -1 before the first.
  int64_t received_prompt_tokens_ = -1;
  absl::flat_hash_map<uint64_t, RunningEntry> running_;
  // Streams that ended which the worker's last sample may still count. Finishes a sample showed
  // before the router saw the stream end wait in `unmatched_finishes_` for it (until report_lag
  // has passed). A closed-loop client sends its next request within a millisecond of the last
  // token, up to a sample interval before the worker reports the batch shrunk.
  std::deque<Ended> ended_;
  int64_t ended_context_tokens_ = 0;
  std::deque<absl::Time> unmatched_finishes_;
  // LoadSample.finished_seqs at the last sample; <= 0: not reported (an older worker), and
  // nothing is subtracted.
  int64_t reported_finished_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_REGISTRY_LOAD_LEDGER_H_
