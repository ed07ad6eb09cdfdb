// Placement: which decode worker runs a request, and whether its prompt is prefilled there or on
// a prefill worker (DESIGN.md §1, §5). A pure library: no I/O, no clock, no threads, so the router
// and the simulator run the same code, and a policy's choices are a function of its seed and of
// the calls it has seen.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<placement::PlacementPolicy> policy,
//                    placement::CreatePolicy("kv_aware", {.seed = 42}));
//   placement::ClusterView cluster;  // one WorkerCandidate per known worker, built under the
//                                    // registry's lock (see WorkerView in router/registry)
//   ASSIGN_OR_RETURN(placement::Decision d,
//                    policy->Place({.prompt_tokens = 700, .block_hashes = hashes}, cluster));
//   // Open Decode.Generate on d.decode_worker with prefill_targets = d.prefill (empty: local).
//
// round_robin, least_loaded and kv_aware pick the decode worker each its own way, then apply the
// same conditional disaggregation: the prompt is prefilled on the decode worker itself when the
// part of it that the decode worker has not cached is at most
// Options::local_prefill_threshold_tokens, or when no healthy prefill worker (other than the
// decode worker) exists. Otherwise the policy ranks every healthy prefill worker, best first, so
// that the decode worker can fall back down the list. slo decides both from predicted latencies.
//
// Policies (CreatePolicy):
//   round_robin   decode workers in turn (by id), prefill workers in turn.
//   least_loaded  decode: fewest sequences (running + waiting + placed by the router) relative to
//                 max_running; prefill: fewest queued prompt tokens (reported + placed).
//   kv_aware      prefill: score = overlap_weight * tokens of the prompt cached on the worker
//                 - queued prompt tokens (reported + placed), highest first. Decode: lowest load
//                 as least_loaded, except that where the prompt would be prefilled locally the
//                 worker's cached share of the prompt earns overlap_weight * cached / prompt (a
//                 fully cached prompt is worth one full batch of load at weight 1). Equal scores
//                 are broken at random; with temperature > 0 the first choice is sampled instead
//                 (softmax over the scores scaled to [0, 1]).
//   slo           predicts, with each worker's step cost model (cost_model.h), the request's TTFT
//                 (wait for a batch slot + queued prompt tokens ahead + its own uncached prefill
//                 + KV transfer when remote) and TPOT (a decode step of the batch it joins), for
//                 every decode worker and every way to prefill (locally, or on each prefill
//                 worker). Per decode worker the prefill that predicts the best TTFT wins, except
//                 that a local prefill must not slow the worker's running streams past their
//                 TPOT objective; the decode worker with the most SLO headroom wins (ties at
//                 random). Ignores local_prefill_threshold_tokens, overlap_weight, temperature.
//                 Fills Decision's predictions; docs/slo.md has the formulas.
//
// Load the router has placed but the worker has not reported yet is part of every load number
// (WorkerCandidate::placed_*): the router counts it itself (DESIGN.md §5).
#ifndef TANDEM_ROUTER_PLACEMENT_PLACEMENT_H_
#define TANDEM_ROUTER_PLACEMENT_PLACEMENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kv/block_hash.h"
#include "router/placement/cost_model.h"

namespace tandem::placement {

// Which kind of work a worker does (tandem.v1.WorkerRole without the unset value: a worker whose
// role is unknown is not a candidate at all).
enum class Role {
  kPrefill,  // prefill only
  kDecode,   // decode, and local prefill of its own requests
  kBoth,     // either
};

// "prefill" | "decode" | "both".
absl::string_view RoleName(Role role);

// Latency objectives of a request, as the client set them (tandem.v1.Slo). Used by slo only
// (0: PolicyOptions::default_ttft_ms / default_tpot_ms).
struct Slo {
  // Time to first token, milliseconds; 0: no objective. Negative: INVALID_ARGUMENT.
  int64_t ttft_ms = 0;
  // Mean time per output token after the first, milliseconds; 0: no objective.
  int64_t tpot_ms = 0;
};

// What placement needs to know of one request.
struct Request {
  // Tokens of the prompt (after the chat template), >= 1.
  int64_t prompt_tokens = 0;
  // Hashes of the prompt's full blocks in order (engine/kv/block_hash.h; docs/block_hashing.md),
  // cut at `block_size`: at most prompt_tokens / block_size of them. May be empty (no prefix
  // credit anywhere).
  std::vector<BlockHash> block_hashes = {};
  // Tokens per block that `block_hashes` were cut by; must equal the block size of every
  // candidate worker (the router hashes per block size). >= 1.
  int64_t block_size = 16;
  // Scheduling priority (tandem.v1.GenerateRequest.priority): higher first. admission.h orders
  // and refuses by it; slo predicts a request's wait from the prompts of its class and above, and
  // lets a lower class's local prefill hold the decode workers that recent higher-priority
  // requests need for one step at most (docs/slo.md); the other policies ignore it.
  int32_t priority = 0;
  Slo slo = {};
  // Most tokens it may generate (tandem.v1.SamplingParams.max_tokens); 0: not set. The router
  // keeps it for each request running on a worker (WorkerCandidate::SloInputs::running_groups).
  int64_t max_tokens = 0;
  // True when the router places the request again (from its admission queue, or to move it off a
  // failed decode worker): slo counts a request's class in the recent traffic once, at its first
  // placement, so a request re-placed many times does not crowd the others out.
  bool placed_before = false;
};

// Requests decoding on a worker that share a TPOT objective, a max_tokens and their progress
// (INVALID_ARGUMENT for a field out of range). The router follows its streams one by one: an
// entry each.
struct RunningGroup {
  // Their TPOT objective, ms; 0: PolicyOptions::default_tpot_ms. >= 0.
  int64_t tpot_ms = 0;
  // Their max_tokens; 0: PolicyOptions::expected_output_tokens. >= 0.
  int64_t max_tokens = 0;
  // Output tokens they have received after their first, and seconds since their first (both 0
  // before it): the part of their mean TPOT that is past. decoded_tokens -1: not known (streams
  // taken as half done, at their objective so far). >= -1; decode_seconds finite, >= 0.
  int64_t decoded_tokens = -1;
  double decode_seconds = 0;
};

// Prompt work of one priority class queued on a worker (tandem.v1.QueuedClass, plus what the
// router placed there that the worker has not reported yet).
struct QueuedClass {
  int32_t priority = 0;
  int64_t tokens = 0;   // prompt tokens not computed yet; >= 0
  int64_t prompts = 0;  // prompts they belong to; >= 0
  // The part of `tokens` the router placed there that the worker's last load sample does not
  // show yet (WorkerCandidate::placed_prefill_tokens of this class): prompts that reached the
  // worker after the step it was then in had begun. In [0, tokens].
  int64_t placed_tokens = 0;
};

// One worker as placement sees it: plain numbers, so that tests and the simulator build them by
// hand. The router builds them from its WorkerViews (ToCandidate in router/registry).
struct WorkerCandidate {
  // Worker id (tandem.v1.Snapshot.worker_id): not empty, unique in a ClusterView.
  std::string id = "";
  // What it serves: kDecode and kBoth are decode candidates, kPrefill and kBoth prefill ones.
  Role role = Role::kDecode;
  // False: never chosen (connection down, stale state, draining). Set by the router.
  bool healthy = true;
  // Largest number of sequences the worker runs in one batch; 0 (unknown) counts as 1.
  int64_t max_running = 0;
  // Reported load (tandem.v1.LoadSample): sequences in the running batch, sequences waiting, and
  // prompt tokens admitted but not computed yet.
  int64_t running_seqs = 0;
  int64_t waiting_seqs = 0;
  int64_t queued_prefill_tokens = 0;
  // Load the router placed on the worker that the reported numbers do not show yet: sequences
  // (decode) and prompt tokens (prefill).
  int64_t placed_sequences = 0;
  int64_t placed_prefill_tokens = 0;
  // Prompts placed_prefill_tokens belong to.
  int64_t placed_prompts = 0;
  // Hashes of the full blocks the worker's prefix cache holds; nullptr: none. Not owned; must stay
  // valid and unchanged for the duration of a Place call.
  const absl::flat_hash_set<BlockHash>* cached_hashes = nullptr;

  // What the slo policy reads beyond the numbers above; the other policies ignore it. The router
  // fills it (ToCandidate and LoadLedger::Apply in router/registry; its Registry adds the models,
  // the corrections and the step in progress); a test may leave any field at its default.
  struct SloInputs {
    // How fast the worker computes.
    // Its step-time model, fitted from its StepTimings; nullptr:
    // PolicyOptions::default_step_profile. Not owned; valid and unchanged during a Place call.
    const StepCostModel* cost_model = nullptr;
    // Tokens per engine step (SchedulerOptions::max_tokens_per_step); 0:
    // PolicyOptions::default_max_tokens_per_step.
    int64_t max_tokens_per_step = 0;
    // Most prompt tokens per step, all prompts together (SchedulerOptions::max_prefill_tokens); 0:
    // no cap.
    int64_t max_prefill_tokens = 0;
    // Bytes of KV cache per token, all layers, K and V (what a remote prefill moves per token); 0:
    // PolicyOptions::default_kv_bytes_per_token.
    int64_t kv_bytes_per_token = 0;
    // Multiplicative corrections of its predictions (LatencyCorrection, learned from the latencies
    // of earlier requests): of the TTFT of the prompts it prefills, and of the TPOT of the streams
    // it decodes. 1: none. Finite, > 0.
    double ttft_correction = 1.0;
    double tpot_correction = 1.0;

    // What it decodes.
    // Sum of the context lengths of the sequences decoding (tandem.v1.LoadSample.
    // active_decode_tokens).
    int64_t active_decode_tokens = 0;
    // Prompt tokens of the requests the router placed here to decode that the reported numbers do
    // not show yet (their context when they start decoding).
    int64_t placed_decode_tokens = 0;
    // The requests decoding here that the router placed; the slo policy holds each to its
    // objective when it adds a request or a local prefill. Empty: the requests are unknown
    // (placed by an earlier router) and stand for one entry of the defaults.
    std::vector<RunningGroup> running_groups = {};

    // What it prefills.
    // The prompt tokens queued here (queued_prefill_tokens + placed_prefill_tokens) by priority
    // class, highest first. The worker takes prompts by priority: a request waits for the classes
    // at or above its own and for the step in progress. Empty: not known by class (a worker that
    // does not report it); every queued token then counts for every class.
    std::vector<QueuedClass> queued_by_priority = {};
    // How long the worker's engine step in progress has run, seconds (0 between steps): the
    // prompt tokens it computes still count in queued_prefill_tokens, but that much of them is
    // done. Finite, >= 0.
    double step_elapsed_seconds = 0;
  };
  SloInputs slo = {};
};

// The workers a request may go to. Workers that serve another model must not be in it.
struct ClusterView {
  std::vector<WorkerCandidate> workers = {};
  // slo: transfer times between workers; nullptr: PolicyOptions::default_transfer_seconds_per_byte.
  // Not owned; valid and unchanged during a Place call.
  const TransferModel* transfers = nullptr;
  // The caller checked `workers` with ValidateCandidates and every candidate it changed since
  // with ValidateCandidate: Place then skips that check, which reads every candidate (a caller
  // that places many requests on one view and changes a few candidates between them, as the
  // simulator does, checks each change once instead). The request is checked either way.
  bool candidates_checked = false;
};

// What Place checks of each candidate (non-empty id, a valid role, counts >= 0, finite SLO inputs)
// and of all of them (unique ids). INVALID_ARGUMENT with a message naming the worker.
absl::Status ValidateCandidate(const WorkerCandidate& worker);
absl::Status ValidateCandidates(absl::Span<const WorkerCandidate> workers);

// Why the prompt is prefilled where it is.
enum class PrefillReason {
  // The uncached part is above the threshold: prefilled by Decision::prefill[0] (then the next).
  kRemote,
  // The uncached part is at most local_prefill_threshold_tokens: local.
  kShortUncached,
  // The uncached part is above the threshold (slo: any prompt), but no healthy prefill worker
  // other than the decode worker exists: local.
  kNoPrefillWorker,
  // slo: the best prefill worker would not keep the TTFT PolicyOptions::remote_prefill_headroom
  // under its objective, prefilling on the decode worker predicts a TTFT at least as good, and
  // it does not slow the worker's running streams past their TPOT objective.
  kPredictedLocal,
};

// "remote" | "short_uncached" | "no_prefill_worker" | "predicted_local" (for logs and metric
// labels).
absl::string_view PrefillReasonName(PrefillReason reason);

// A prefill worker in a decision's ranked list.
struct PrefillChoice {
  std::string worker_id = "";
  // Leading prompt tokens that the worker's prefix cache holds (whole blocks).
  int64_t cached_tokens = 0;
};

// Where one request goes.
struct Decision {
  // The decode worker (a WorkerCandidate::id): it runs the request and, when `prefill` is empty,
  // prefills the prompt too.
  std::string decode_worker = "";
  // Leading prompt tokens cached on the decode worker (whole blocks); the decode worker never
  // receives or recomputes them.
  int64_t decode_cached_tokens = 0;
  // Prompt tokens the decode worker lacks: prompt_tokens - decode_cached_tokens.
  int64_t uncached_tokens = 0;
  // True: the decode worker prefills the prompt itself, and `prefill` is empty.
  bool local_prefill = true;
  PrefillReason reason = PrefillReason::kShortUncached;
  // Every healthy prefill-capable worker but the decode worker, best first (to try in order);
  // empty when local_prefill.
  std::vector<PrefillChoice> prefill = {};

  // Latency predictions (slo; docs/slo.md). The other policies predict nothing: predicted false,
  // the numbers 0, meets_slo true.
  bool predicted = false;
  // Time to first token, seconds: the waiting part (predicted_wait_seconds) + the prompt's own
  // prefill + the KV transfer when remote.
  double predicted_ttft_seconds = 0;
  // Mean time per output token, seconds: a decode step of the batch the request joins.
  double predicted_tpot_seconds = 0;
  // The part of predicted_ttft_seconds spent behind other work: for a batch slot on the decode
  // worker, and behind the prompt tokens queued on the worker that prefills.
  double predicted_wait_seconds = 0;
  // The objectives the predictions were held against (the request's, or the defaults), seconds.
  double ttft_slo_seconds = 0;
  double tpot_slo_seconds = 0;
  // Whether the predictions keep this request's TTFT and TPOT and the decode worker's running
  // streams' TPOT within their objectives, i.e. headroom >= 0. False: no worker could; the
  // decision is the least bad one.
  bool meets_slo = true;
  // min over the objectives of (objective - predicted) / objective: 0.25 means every prediction
  // is at least 25% under its objective, negative that one is over.
  double headroom = 0;
  // The corrections the predictions include (WorkerCandidate::SloInputs::ttft_correction of the
  // worker that prefills, tpot_correction of the decode worker): a prediction over its correction
  // is the step model's own figure, against which observed latencies teach the corrections.
  double ttft_correction = 1.0;
  double tpot_correction = 1.0;
};

// Options of every policy. CreatePolicy validates them.
struct PolicyOptions {
  // Prefill on the decode worker when the prompt tokens it has not cached are at most this many.
  // >= 0; 0 keeps only fully cached prompts local.
  int64_t local_prefill_threshold_tokens = 256;
  // kv_aware: credit per cached prompt token against one queued prompt token (prefill), and the
  // weight of the cached share of the prompt against decode load (decode, local prefill). >= 0.
  // Ignored by the other policies.
  double overlap_weight = 1.0;
  // kv_aware: 0 takes the best score (random among equals); > 0 samples the decode worker and the
  // first prefill worker with probability proportional to exp(s / temperature), s the scores
  // scaled to [0, 1] (best 1, worst 0; all equal: uniform); the other prefill workers follow by
  // score. >= 0, finite. Ignored by the other policies.
  double temperature = 0.0;
  // Seed of the policy's random source (tie-breaks and sampling). Two policies made with the same
  // name, options and seed make the same choices for the same calls.
  uint64_t seed = 0;

  // The options below are read by slo only (every policy validates them).
  // Objectives of a request that sets none (Slo fields 0), milliseconds; the TPOT one also stands
  // for a worker's running streams when running_groups is empty or a group has none. > 0.
  int64_t default_ttft_ms = 2000;
  int64_t default_tpot_ms = 100;
  // Step-time coefficients of a worker without a cost model. ValidateProfile.
  StepProfile default_step_profile = {};
  // Tokens per step of a worker whose max_tokens_per_step is 0. >= 1.
  int64_t default_max_tokens_per_step = 512;
  // KV bytes per token of a worker whose kv_bytes_per_token is 0 (docs/slo.md, "Defaults"). >= 0.
  int64_t default_kv_bytes_per_token = 131072;
  // Seconds per KV byte moved when ClusterView::transfers is nullptr (1e-10: 10 GB/s). Finite,
  // >= 0.
  double default_transfer_seconds_per_byte = 1e-10;
  // Output tokens a request is expected to generate: how long a sequence holds a batch slot, which
  // sets the wait for a slot on a full worker, and over how many tokens running requests without
  // a known max_tokens spread a stall. >= 1.
  int64_t expected_output_tokens = 256;
  // slo: a prompt goes to a prefill worker that decodes nothing whenever that predicts a TTFT at
  // least this fraction of its objective under it (0.5: within half of it), and to the decode
  // worker only when the prefill workers cannot and it does better there. A local prefill longer
  // than half of default_ttft_ms also needs another decode worker with no prompt queued; after
  // higher-priority requests, one whose single step is longer than half of their tightest TTFT
  // objective is not taken at all. Why disaggregation is the default: docs/slo.md, section 4.
  // In [0, 1).
  double remote_prefill_headroom = 0.5;
};

// Chooses workers for requests. Thread-compatible, not thread-safe: a policy may keep state
// between calls (round_robin's position, the random source), so the caller serializes calls (the
// router under its registry lock).
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;

  // The name CreatePolicy knows it by.
  virtual absl::string_view name() const = 0;

  // Places `request` on `cluster`. Errors: INVALID_ARGUMENT for a request or view that makes no
  // sense (prompt_tokens < 1, block_size < 1, more block hashes than full blocks, negative SLOs or
  // load numbers, empty or duplicate worker ids); UNAVAILABLE when no healthy decode-capable
  // worker exists. A failed call changes no state.
  virtual absl::StatusOr<Decision> Place(const Request& request, const ClusterView& cluster) = 0;
};

// The names CreatePolicy knows: "round_robin", "least_loaded", "kv_aware", "slo".
std::vector<std::string> KnownPolicies();

// The policy called `name`. INVALID_ARGUMENT for an unknown name (the message lists the known
// ones) or invalid options.
absl::StatusOr<std::unique_ptr<PlacementPolicy>> CreatePolicy(absl::string_view name,
                                                              const PolicyOptions& options);

// Leading entries of `hashes` that `cached` holds (a block counts only when every block before it
// does). nullptr holds nothing.
int64_t CachedPrefixBlocks(absl::Span<const BlockHash> hashes,
                           const absl::flat_hash_set<BlockHash>* cached);

}  // namespace tandem::placement

#endif  // TANDEM_ROUTER_PLACEMENT_PLACEMENT_H_
