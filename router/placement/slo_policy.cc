// The slo policy of placement.h: latency predictions from the workers' cost models, the decode
// worker with the most SLO headroom, and the prefill location with the best TTFT that keeps the
// decode worker's running streams within their TPOT objective. docs/slo.md has the formulas.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "router/placement/cost_model.h"
#include "router/placement/placement.h"
#include "router/placement/policy_base.h"

namespace tandem::placement {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// (objective - predicted) / objective. REQUIRES: objective > 0.
double Headroom(double objective, double predicted) { return (objective - predicted) / objective; }

class SloPolicy final : public PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  absl::string_view name() const override { return "slo"; }

 protected:
  Decision Decide(PlacementContext& ctx) override {
    const Request& request = ctx.request();
    const double ttft_slo =
        static_cast<double>(request.slo.ttft_ms > 0 ? request.slo.ttft_ms
                                                    : options().default_ttft_ms) /
        1000.0;
    const double tpot_slo =
        static_cast<double>(request.slo.tpot_ms > 0 ? request.slo.tpot_ms
                                                    : options().default_tpot_ms) /
        1000.0;

    const Hold hold = HoldFor(request.priority);
    // What each worker would take to prefill the prompt (as the prefilling worker), once.
    std::vector<PrefillPrediction> prefill(ctx.cluster().workers.size());
    for (int w : ctx.decode_workers()) prefill[w] = PredictPrefill(ctx, w);
    for (int w : ctx.prefill_workers()) prefill[w] = PredictPrefill(ctx, w);

    const std::vector<int>& decode = ctx.decode_workers();
    std::vector<Candidate> candidates;
    std::vector<double> headrooms;
    candidates.reserve(decode.size());
    headrooms.reserve(decode.size());
    // Decode workers with no prompt queued: where the next arrivals can start at once.
    int unqueued = 0;
    for (int d : decode) unqueued += PrefillQueue(ctx.worker(d)) == 0 ? 1 : 0;
    for (int d : decode) {
      const bool another_unqueued =
          decode.size() == 1 || unqueued - (PrefillQueue(ctx.worker(d)) == 0 ? 1 : 0) > 0;
      candidates.push_back(Evaluate(ctx, d, prefill, ttft_slo, tpot_slo, another_unqueued, hold));
      headrooms.push_back(candidates.back().headroom);
    }
    const int d = ArgMaxRandomTie(decode, headrooms);
    const Candidate& best = candidates[std::find(decode.begin(), decode.end(), d) - decode.begin()];

    Decision decision;
    decision.decode_worker = ctx.worker(d).id;
    decision.decode_cached_tokens = ctx.CachedTokens(d);
    decision.uncached_tokens = request.prompt_tokens - decision.decode_cached_tokens;
    decision.reason = best.reason;
    decision.local_prefill = best.reason != PrefillReason::kRemote;
    if (!decision.local_prefill) {
      // Every prefill worker, by the TTFT it predicts for this decode worker (best first).
      const std::vector<int> pool = ctx.PrefillPoolFor(d);
      std::vector<double> scores;
      scores.reserve(pool.size());
      for (int p : pool) {
        scores.push_back(-RemoteTtft(ctx, d, p, prefill[p], prefill[d].stall).ttft);
      }
      for (int p : RankDescending(pool, scores)) {
        decision.prefill.push_back(
            {.worker_id = ctx.worker(p).id, .cached_tokens = ctx.CachedTokens(p)});
      }
    }
    decision.predicted = true;
    decision.predicted_ttft_seconds = best.slot_wait + best.ttft;
    decision.predicted_tpot_seconds = best.tpot;
    decision.predicted_wait_seconds = best.slot_wait + best.queue_wait;
    decision.ttft_slo_seconds = ttft_slo;
    decision.tpot_slo_seconds = tpot_slo;
    decision.headroom = best.headroom;
    decision.ttft_correction =
        ctx.worker(best.prefill_worker >= 0 ? best.prefill_worker : d).slo.ttft_correction;
    decision.tpot_correction = ctx.worker(d).slo.tpot_correction;
    decision.meets_slo = best.headroom >= 0;
    if (!request.placed_before) {
      recent_.emplace_back(request.priority, ttft_slo);
      if (recent_.size() > kRecentRequests) recent_.pop_front();
    }
    return decision;
  }

 private:
  // The prompt prefilled on one worker, from the moment it could start.
  struct PrefillPrediction {
    // Until its first step starts (ScheduleOn): the step in progress, and the steps that the
    // prompts queued there that go first (reported + placed, its priority and above) fill alone.
    double queue_wait = 0;
    // Its steps: its uncached tokens, and the queued ones that share those steps.
    double compute = 0;
    // One step of its prompt: what a request of higher priority arriving meanwhile waits for.
    double first_step = 0;
    // Every prompt queued there, whatever its class, less what the step in progress has done:
    // what the streams decoding there sit through.
    double stall = 0;
    // The prompts queued there below its priority: computed after its first token, between the
    // steps of its stream when it decodes there.
    double after = 0;
  };

  // One decode worker with its best way to prefill.
  struct Candidate {
    double slot_wait = 0;   // for a batch slot on the decode worker
    double queue_wait = 0;  // behind queued prompt tokens on the prefilling worker
    double ttft = 0;        // queue_wait + prefill + transfer (slot_wait not included)
    double tpot = 0;
    double headroom = 0;
    PrefillReason reason = PrefillReason::kRemote;
    int prefill_worker = -1;  // remote: the best prefill worker
  };

  const StepProfile& ProfileOf(const WorkerCandidate& w) const {
    return w.slo.cost_model != nullptr ? w.slo.cost_model->profile()
                                       : options().default_step_profile;
  }

  int64_t BudgetOf(const WorkerCandidate& w) const {
    return w.slo.max_tokens_per_step > 0 ? w.slo.max_tokens_per_step
                                     : options().default_max_tokens_per_step;
  }

  // How long a local prefill may hold a decode worker's steps.
  struct Hold {
    // Longer than this, the requests reaching the worker meanwhile miss their TTFT objectives
    // (half of the default one, or of the tightest among recent higher-priority requests): it is
    // then allowed only while another decode worker has no prompt queued, where they can go
    // instead.
    double limit = 0;
    // Higher-priority requests were among the recent ones: the limit is on what one of them
    // arriving next would wait for because of this prompt, with no exception. The worker takes
    // prompts by priority, so that is one step of this prompt (of at most the worker's
    // SchedulerOptions::max_prefill_tokens), not the whole of it: a long prompt prefills in the
    // background of a higher class. A lower class must not cost a higher one its
    // objectives (admission serves higher classes first; so must placement).
    bool protects_higher = false;
  };
  Hold HoldFor(int32_t priority) const {
    Hold hold{.limit = static_cast<double>(options().default_ttft_ms) / 2000.0};
    for (const auto& [p, ttft] : recent_) {
      if (p <= priority) continue;
      hold.protects_higher = true;
      hold.limit = std::min(hold.limit, ttft / 2);
    }
    return hold;
  }

  static int64_t BatchSlots(const WorkerCandidate& w) {
    return std::max<int64_t>(w.max_running, 1);
  }

  // Sequences decoding in every step of the worker (running + placed, at most a batch), and their
  // context: what a prefill on it shares its steps with. A prefill-only worker decodes nothing.
  static int64_t DecodingSeqs(const WorkerCandidate& w) {
    if (w.role == Role::kPrefill) return 0;
    return std::min(w.running_seqs + w.placed_sequences, BatchSlots(w));
  }
  static int64_t DecodingContext(const WorkerCandidate& w) {
    if (w.role == Role::kPrefill) return 0;
    return w.slo.active_decode_tokens + w.slo.placed_decode_tokens;
  }

  // How much of a stream of `own_tokens` output tokens the `others` sequences on `w` share: each
  // stream the router placed there counts for the part of its window that it still decodes,
  // min(1, its tokens left / own_tokens) (one not started yet: all of its tokens); the sequences
  // the router did not place, or whose progress it does not know, count whole. Returns the sum,
  // <= others.
  double SharedSequences(const WorkerCandidate& w, int64_t others, double own_tokens) const {
    const int64_t known =
        std::min<int64_t>(static_cast<int64_t>(w.slo.running_groups.size()), others);
    double shared = static_cast<double>(others - known);
    for (int64_t i = 0; i < known; ++i) {
      const RunningGroup& g = w.slo.running_groups[static_cast<size_t>(i)];
      if (g.decoded_tokens < 0) {
        shared += 1;
        continue;
      }
      const double tokens = static_cast<double>(
          g.max_tokens > 0 ? g.max_tokens : options().expected_output_tokens);
      const double left = std::max(0.0, tokens - static_cast<double>(g.decoded_tokens));
      shared += std::min(1.0, left / std::max(own_tokens, 1.0));
    }
    return shared;
  }

  // The prompts the worker's queued prefill tokens belong to: those waiting, those placed, and on
  // a prefill worker the ones it is computing now (a decode worker's running ones decode).
  static int64_t QueuedPrompts(const WorkerCandidate& w) {
    return w.waiting_seqs + w.placed_prompts + (w.role == Role::kPrefill ? w.running_seqs : 0);
  }

  // How a worker's steps are cut, with nothing in them yet.
  PrefillShape ShapeOf(const WorkerCandidate& w) const {
    return {.token_budget = BudgetOf(w),
            .max_prefill_tokens = w.slo.max_prefill_tokens,
            .decode_seqs = DecodingSeqs(w),
            .decode_context_tokens = DecodingContext(w)};
  }
  // Its queued prompt tokens (reported or placed, every class) as one prompt in those steps.
  PrefillShape QueueShape(const WorkerCandidate& w) const {
    PrefillShape shape = ShapeOf(w);
    shape.uncached_tokens = PrefillQueue(w);
    return shape;
  }

  // The prompts queued on a worker as a request of one priority sees them: those it waits for
  // (its class and above) and those below, which wait for it.
  struct Queue {
    PrefillShape ahead;
    PrefillShape below;
    // Of their tokens, those placed by the router that the worker's last sample did not show.
    int64_t ahead_placed = 0;
    int64_t below_placed = 0;
  };
  Queue QueueFor(const WorkerCandidate& w, int32_t priority) const {
    Queue q = {.ahead = ShapeOf(w), .below = ShapeOf(w)};
    if (w.slo.queued_by_priority.empty()) {  // not known by class: all of it goes first
      q.ahead.uncached_tokens = PrefillQueue(w);
      q.ahead.queued_prompts = QueuedPrompts(w);
      q.ahead_placed = std::min(w.placed_prefill_tokens, q.ahead.uncached_tokens);
      return q;
    }
    for (const QueuedClass& c : w.slo.queued_by_priority) {
      const bool ahead = c.priority >= priority;
      PrefillShape& shape = ahead ? q.ahead : q.below;
      shape.uncached_tokens += c.tokens;
      shape.queued_prompts += c.prompts;
      (ahead ? q.ahead_placed : q.below_placed) += c.placed_tokens;
    }
    return q;
  }

  // When the prompt's first step starts and how long its steps take, step by step as the
  // worker's scheduler takes prompts (engine/sched: by priority, first come first served within
  // a class, several prompts in one step up to its chunk of prompt tokens). The step in progress
  // goes on with what the last sample showed queued, highest class first (a prompt placed since
  // reached the worker after it began); the sample's elapsed time may be steps past it, which
  // follow one another while that queue lasts. Of the prompts of the request's class and above
  // left after it, the steps they fill alone go first; the prompt shares the next with the rest
  // of them, and lower prompts fill what its last step leaves. Each step costs its fixed part
  // (base, the sequences decoding) and its prompt tokens, each of those with the attention of a
  // token of its queue's average prompt (the request's own: exactly). Counting the queue ahead
  // as steps of its own before the prompt's predicted a step too many whenever it was waiting
  // rather than in progress, and none of the step in progress.
  struct Schedule {
    double wait = 0;     // until the prompt's first step starts
    double compute = 0;  // its steps
  };
  Schedule ScheduleOn(const WorkerCandidate& w, const Queue& q, const PrefillShape& own) const {
    const StepProfile& profile = ProfileOf(w);
    const double correction = w.slo.ttft_correction;
    const int64_t chunk = PrefillChunkTokens(own);
    const double decoding = static_cast<double>(
        std::clamp<int64_t>(own.decode_seqs, 0, std::max<int64_t>(own.token_budget, 1)));
    const double fixed =
        profile.StepSeconds(0, decoding, static_cast<double>(own.decode_context_tokens));
    // Context a queued prompt token attends to, on average: (L + 1) / 2 for prompts of the
    // queue's average length L.
    auto per_token = [](const PrefillShape& queue) {
      if (queue.uncached_tokens <= 0) return 0.0;
      const double prompts = static_cast<double>(
          std::clamp<int64_t>(queue.queued_prompts, 1, queue.uncached_tokens));
      return (static_cast<double>(queue.uncached_tokens) / prompts + 1) / 2;
    };
    const double ahead_context = per_token(q.ahead);
    const double below_context = per_token(q.below);
    // Seconds of steps holding `ahead` and `below` tokens of the queues, and `attended` more
    // context, uncorrected.
    auto steps_seconds = [&](int64_t steps, int64_t ahead, int64_t below, double attended) {
      return static_cast<double>(steps) * fixed +
             profile.prefill_token_seconds * static_cast<double>(ahead + below) +
             profile.prompt_context_token_seconds *
                 (static_cast<double>(ahead) * ahead_context +
                  static_cast<double>(below) * below_context + attended);
    };

    int64_t ahead = q.ahead.uncached_tokens;
    int64_t below = q.below.uncached_tokens;
    Schedule out;
    {
      int64_t shown_ahead = std::max<int64_t>(ahead - q.ahead_placed, 0);
      int64_t shown_below = std::max<int64_t>(below - q.below_placed, 0);
      // 0 between two steps: with prompts shown queued, one is about to start (the request
      // reaches the worker after it has).
      double elapsed = w.slo.step_elapsed_seconds;
      // (Bounded: past this many steps the worker is taken as done with what it showed.)
      for (int i = 0; i < kMaxStepsBehind && shown_ahead + shown_below > 0; ++i) {
        const int64_t from_ahead = std::min(chunk, shown_ahead);
        const int64_t from_below = std::min(chunk - from_ahead, shown_below);
        shown_ahead -= from_ahead;
        shown_below -= from_below;
        ahead -= from_ahead;
        below -= from_below;
        const double step = steps_seconds(1, from_ahead, from_below, 0) * correction;
        if (elapsed < step) {
          out.wait = step - elapsed;
          break;
        }
        elapsed -= step;
      }
    }
    const int64_t own_tokens = std::max<int64_t>(own.uncached_tokens, 1);
    const int64_t alone = ahead / chunk;
    const int64_t with_own = ahead - alone * chunk;
    out.wait += steps_seconds(alone, alone * chunk, 0, 0) * correction;
    const int64_t own_steps = 1 + CeilDiv(std::max<int64_t>(own_tokens - (chunk - with_own), 0),
                                          chunk);
    const int64_t fill = std::min(below, own_steps * chunk - with_own - own_tokens);
    const double cached = static_cast<double>(std::max<int64_t>(own.cached_tokens, 0));
    const double end = cached + static_cast<double>(own_tokens);
    const double own_attended = (end * (end + 1) - cached * (cached + 1)) / 2;
    out.compute = (steps_seconds(own_steps, with_own, fill, own_attended) +
                   profile.prefill_token_seconds * static_cast<double>(own_tokens)) *
                  correction;
    return out;
  }
  static constexpr int kMaxStepsBehind = 4096;
  static int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

  // One step of `shape`'s prompt tokens: the first chunk of them.
  static double FirstStepSeconds(const StepProfile& profile, PrefillShape shape) {
    shape.uncached_tokens = std::min(shape.uncached_tokens, PrefillChunkTokens(shape));
    shape.queued_prompts = 0;
    return PrefillSeconds(profile, shape);
  }

  // What is left of the step a worker is in, `elapsed` seconds into a queue of `steps` steps of
  // `step` seconds. Steps follow one another while the queue lasts, so a worker past its first
  // step (a sample's step_elapsed plus the sample's age can be) is that far into a later one,
  // not between two; past the last, it is done.
  static double StepLeft(double step, int64_t steps, double elapsed) {
    if (step <= 0) return 0;
    const double e = std::max(elapsed, 0.0);
    const double done = std::floor(e / step);
    if (done >= static_cast<double>(steps)) return 0;
    return step - (e - done * step);
  }

  PrefillPrediction PredictPrefill(PlacementContext& ctx, int w) const {
    const WorkerCandidate& worker = ctx.worker(w);
    const StepProfile& profile = ProfileOf(worker);
    const double correction = worker.slo.ttft_correction;
    const double elapsed = worker.slo.step_elapsed_seconds;
    const int64_t cached = ctx.CachedTokens(w);
    const Queue q = QueueFor(worker, ctx.request().priority);
    PrefillShape own = ShapeOf(worker);
    own.uncached_tokens = ctx.request().prompt_tokens - cached;
    own.cached_tokens = cached;
    PrefillShape all = q.ahead;
    all.uncached_tokens += q.below.uncached_tokens;
    all.queued_prompts += q.below.queued_prompts;

    PrefillPrediction p;
    const Schedule schedule = ScheduleOn(worker, q, own);
    p.queue_wait = schedule.wait;
    p.compute = schedule.compute;
    p.first_step = FirstStepSeconds(profile, own) * correction;
    p.stall = std::max(QueuedPrefillSeconds(profile, all) * correction - elapsed, 0.0);
    p.after = QueuedPrefillSeconds(profile, q.below) * correction;
    return p;
  }

  struct Remote {
    double ttft = 0;
    double wait = 0;  // the part of ttft spent waiting for other work
    int worker = -1;  // the prefill worker
  };

  // The step worker `w` runs while prompt tokens are queued on it (reported or placed): one chunk
  // of them, as a prompt of its own, beside its decoding sequences; corrected. Only asked while
  // PrefillQueue(w) > 0.
  double ChunkStepSeconds(const WorkerCandidate& w) const {
    return FirstStepSeconds(ProfileOf(w), QueueShape(w)) * w.slo.ttft_correction;
  }

  // How long until worker `w` is between two steps: with prompt tokens queued on it, what is left
  // of the chunk's step in progress (or of one about to start: a prompt placed or queued is
  // taken at the next step); with none, a decode step's few milliseconds, taken as 0.
  double StepRemaining(const WorkerCandidate& w) const {
    if (PrefillQueue(w) <= 0) return 0;
    return StepLeft(ChunkStepSeconds(w), PrefillSteps(QueueShape(w)), w.slo.step_elapsed_seconds);
  }

  // The decode worker `d` reserves the prompt's blocks between two of its steps and only then
  // asks the prefill worker `p`: its step in progress, then queue + prefill on `p`, then moving
  // the KV that `d` lacks. `d` takes the first token between two of its steps as well: while it
  // is still computing queued prompts then (of any class: `decode_busy`, PrefillPrediction::
  // stall), half such a step on average.
  Remote RemoteTtft(PlacementContext& ctx, int d, int p, const PrefillPrediction& on_p,
                    double decode_busy) const {
    const WorkerCandidate& decode = ctx.worker(d);
    const WorkerCandidate& prefill = ctx.worker(p);
    const int64_t bytes_per_token = prefill.slo.kv_bytes_per_token > 0
                                        ? prefill.slo.kv_bytes_per_token
                                    : decode.slo.kv_bytes_per_token > 0
                                        ? decode.slo.kv_bytes_per_token
                                        : options().default_kv_bytes_per_token;
    const double bytes = static_cast<double>(ctx.request().prompt_tokens - ctx.CachedTokens(d)) *
                         static_cast<double>(bytes_per_token);
    const double transfer =
        bytes * (ctx.cluster().transfers != nullptr
                     ? ctx.cluster().transfers->SecondsPerByte(prefill.id, decode.id)
                     : options().default_transfer_seconds_per_byte);
    const double arrival = StepRemaining(decode) + on_p.queue_wait + on_p.compute + transfer;
    const double boundary = decode_busy > arrival ? ChunkStepSeconds(decode) / 2 : 0.0;
    const double ttft = arrival + boundary;
    // (Clamped: the subtraction may round a wait of 0 to a tiny negative number.)
    return {.ttft = ttft, .wait = std::max(ttft - on_p.compute - transfer, 0.0), .worker = p};
  }

  Candidate Evaluate(PlacementContext& ctx, int d, const std::vector<PrefillPrediction>& prefill,
                     double ttft_slo, double tpot_slo, bool another_unqueued,
                     const Hold& hold) const {
    const WorkerCandidate& w = ctx.worker(d);
    const int64_t slots = BatchSlots(w);
    const int64_t budget = BudgetOf(w);
    // A decode step of `batch` sequences over `context` tokens. Sequences beyond the token budget
    // skip steps, so a batch above it decodes batch / budget times slower.
    const StepProfile& profile = ProfileOf(w);
    auto decode_step = [&](double batch, double context) {
      batch = std::min(batch, static_cast<double>(slots));
      return profile.StepSeconds(0, std::min(batch, static_cast<double>(budget)), context) *
             std::max(1.0, batch / static_cast<double>(budget)) * w.slo.tpot_correction;
    };
    // The step of everything on the worker and this request: what the streams decoding now see.
    const int64_t sequences = w.running_seqs + w.waiting_seqs + w.placed_sequences + 1;
    const int64_t others_context = w.slo.active_decode_tokens + w.slo.placed_decode_tokens;
    const double step =
        decode_step(static_cast<double>(sequences),
                    static_cast<double>(others_context + ctx.request().prompt_tokens));
    // TPOT: a step of the batch it decodes in, itself and the others for the part of its window
    // they share (a chat near its end leaves after a few of its steps), their context in the same
    // proportion. Counting them whole predicted a chat beside 2 running and 3 placed sequences at
    // 24.8 ms that decoded at 7.4 (docs/performance.md).
    const int64_t max_tokens = ctx.request().max_tokens > 0 ? ctx.request().max_tokens
                                                            : options().expected_output_tokens;
    const double shared = SharedSequences(w, sequences - 1, static_cast<double>(max_tokens));
    const double share = sequences > 1 ? shared / static_cast<double>(sequences - 1) : 0.0;
    const PrefillPrediction& local = prefill[d];
    Candidate c;
    c.tpot = decode_step(1.0 + shared, static_cast<double>(ctx.request().prompt_tokens) +
                                           share * static_cast<double>(others_context));
    // The lower prompts queued here are computed between its steps once it decodes: over its
    // output tokens, they lengthen its mean TPOT.
    if (local.after > 0) {
      c.tpot += local.after / std::max(1.0, static_cast<double>(max_tokens) - 1.0);
    }
    // Beyond max_running the request waits for a slot: a full batch frees one every
    // expected_output_tokens * tpot / slots seconds.
    const int64_t over = sequences - slots;
    if (over > 0) {
      c.slot_wait = static_cast<double>(over) *
                    static_cast<double>(options().expected_output_tokens) * step /
                    static_cast<double>(slots);
    }

    // The streams decoding now must keep their TPOT objectives: with the batch grown by one, and
    // through the prompts queued here and a local prefill of this prompt, which stall them for
    // their compute time (a burst of arrivals is prefilled between the earlier ones' steps). An
    // objective bounds a stream's mean TPOT: what it has seen so far (the stalls of the prompts
    // admitted before this one among it), then the stall and the grown batch's steps over the
    // tokens it has left. The worst stream sets the margin. (One that misses its objective even
    // without this request still holds back more work: passing it over let a burst admit stream
    // after stream, each lost soon after it was admitted.)
    double grown_headroom = kInf;
    double local_headroom = kInf;
    if (DecodingSeqs(w) > 0) {
      auto check = [&](const RunningGroup& g) {
        const double slo =
            static_cast<double>(g.tpot_ms > 0 ? g.tpot_ms : options().default_tpot_ms) / 1000.0;
        const double max_tokens = static_cast<double>(
            g.max_tokens > 0 ? g.max_tokens : options().expected_output_tokens);
        // Gaps between output tokens: decoded so far, and left (an unknown stream is half done,
        // at its objective so far).
        double past = 0;
        double past_seconds = 0;
        double left = std::max(1.0, max_tokens / 2.0);
        if (g.decoded_tokens >= 0) {
          const double gaps = std::max(1.0, max_tokens - 1.0);
          past = std::min(static_cast<double>(g.decoded_tokens), gaps - 1.0);
          past_seconds = g.decode_seconds;
          left = gaps - past;
        }
        auto mean = [&](double step, double stall) {
          return (past_seconds + stall + left * step) / (past + left);
        };
        // The prompts already queued here, of every class, will stall them too, whatever this
        // request does.
        grown_headroom = std::min(grown_headroom, Headroom(slo, mean(step, local.stall)));
        local_headroom =
            std::min(local_headroom, Headroom(slo, mean(step, local.stall + local.compute)));
      };
      if (w.slo.running_groups.empty()) check({});
      for (const RunningGroup& g : w.slo.running_groups) check(g);
    }

    Remote best_remote = {.ttft = kInf};
    const std::vector<int> pool = ctx.PrefillPoolFor(d);
    for (int p : pool) {
      const Remote r = RemoteTtft(ctx, d, p, prefill[p], local.stall);
      if (r.ttft < best_remote.ttft) best_remote = r;
    }
    const double local_ttft = local.queue_wait + local.compute;
    // Disaggregation first: a prefill worker that decodes nothing and keeps the TTFT takes it.
    const bool remote_keeps_ttft =
        best_remote.worker >= 0 && DecodingSeqs(ctx.worker(best_remote.worker)) == 0 &&
        Headroom(ttft_slo, c.slot_wait + best_remote.ttft) >= options().remote_prefill_headroom;
    if (pool.empty()) {
      c.reason = PrefillReason::kNoPrefillWorker;
    } else if (!remote_keeps_ttft && local_headroom >= 0 && local_ttft <= best_remote.ttft &&
               (hold.protects_higher ? local.first_step <= hold.limit
                                     : another_unqueued || local.compute <= hold.limit)) {
      c.reason = PrefillReason::kPredictedLocal;
    } else {
      c.reason = PrefillReason::kRemote;
    }
    if (c.reason == PrefillReason::kRemote) {
      c.queue_wait = best_remote.wait;
      c.ttft = best_remote.ttft;
      c.prefill_worker = best_remote.worker;
    } else {
      c.queue_wait = local.queue_wait;
      c.ttft = local_ttft;
    }
    c.headroom = std::min({Headroom(ttft_slo, c.slot_wait + c.ttft), Headroom(tpot_slo, c.tpot),
                           c.reason == PrefillReason::kRemote ? grown_headroom : local_headroom});
    return c;
  }

  // Priority and TTFT objective (seconds) of the last kRecentRequests requests placed for the
  // first time (Request::placed_before false), oldest first: the traffic a long local prefill
  // would delay.
  static constexpr size_t kRecentRequests = 64;
  std::deque<std::pair<int32_t, double>> recent_;
};

}  // namespace

std::unique_ptr<PlacementPolicy> NewSloPolicy(const PolicyOptions& options) {
  return std::make_unique<SloPolicy>(options);
}

}  // namespace tandem::placement
