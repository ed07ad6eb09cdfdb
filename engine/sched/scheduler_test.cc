#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "engine/kv/block_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int64_t kBlockSize = 4;

std::unique_ptr<BlockPool> MakePool(int64_t num_blocks, bool prefix_caching = true) {
  absl::StatusOr<std::unique_ptr<BlockPool>> pool = BlockPool::Create(
      KvLayout{.num_blocks = num_blocks,
               .num_layers = 1,
               .block_size = kBlockSize,
               .num_kv_heads = 1,
               .head_dim = 1},
      BlockPool::Options{.model_id = "sched-test", .enable_prefix_caching = prefix_caching});
  CHECK_OK(pool.status());
  return *std::move(pool);
}

// The fake model: the next token is a hash of the whole history, so a sequence's stream depends
// on its prompt only, never on how it was batched, chunked, preempted or recomputed.
int32_t NextToken(absl::Span<const int32_t> history) {
  uint64_t h = 14695981039346656037ULL;
  for (int32_t t : history) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ULL;
  }
  return static_cast<int32_t>(h % 50000);
}

// What a sequence becomes with an unlimited pool: the prompt and max_new_tokens sampled tokens.
std::vector<int32_t> Generate(std::vector<int32_t> prompt, int64_t max_new_tokens) {
  for (int64_t i = 0; i < max_new_tokens; ++i) prompt.push_back(NextToken(prompt));
  return prompt;
}

// first, first+1, ..., first+n-1.
std::vector<int32_t> Tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& t, int64_t n) {
  return std::vector<int32_t>(t.begin(), t.begin() + n);
}

int NumFailures() {
  const ::testing::TestResult* result =
      ::testing::UnitTest::GetInstance()->current_test_info()->result();
  int failures = 0;
  for (int i = 0; i < result->total_part_count(); ++i) {
    failures += result->GetTestPartResult(i).failed() ? 1 : 0;
  }
  return failures;
}

struct Request {
  SequenceId id = 0;
  std::vector<int32_t> prompt = {};
  int64_t max_new_tokens = 1;
  int priority = 0;
};

// A copy of one scheduled item (the item's spans die at the scheduler's next non-const call).
struct ItemRecord {
  SequenceId id = 0;
  int64_t start = 0;
  std::vector<int32_t> tokens = {};
  std::vector<int32_t> block_table = {};
  bool samples = false;
  bool is_decode = false;
  // The sequence was waiting before this step (first admission or re-admission).
  bool admitted = false;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

struct StepRecord {
  std::vector<ItemRecord> items = {};
  std::vector<SequenceId> preempted = {};
  int64_t num_tokens = 0;
  int64_t num_prefill_tokens = 0;
  int64_t num_decode_tokens = 0;

  const ItemRecord* Find(SequenceId id) const {
    for (const ItemRecord& item : items) {
      if (item.id == id) return &item;
    }
    return nullptr;
  }
  std::vector<SequenceId> ids() const {
    std::vector<SequenceId> ids;
    for (const ItemRecord& item : items) ids.push_back(item.id);
    return ids;
  }
};

// Drives a Scheduler the way the engine loop does: Schedule; "run the model"; Commit; sample
// where an item samples; AppendToken, or Finish a sequence on its last token (without appending
// it). Checks every step against its own model of the sequences, and CheckInvariants after every
// call that changes the scheduler's state outside a step.
class FakeEngine {
 public:
  FakeEngine(BlockPool* pool, const SchedulerOptions& options)
      : pool_(pool), sched_(pool, options) {}

  Scheduler& sched() { return sched_; }
  // Finished sequences' whole streams: prompt, then every sampled token (the last one included).
  const std::map<SequenceId, std::vector<int32_t>>& finished() const { return finished_; }
  int64_t num_live() const { return static_cast<int64_t>(live_.size()); }
  std::vector<SequenceId> live_ids() const {
    std::vector<SequenceId> ids;
    for (const auto& [id, s] : live_) ids.push_back(id);
    return ids;
  }
  bool running(SequenceId id) const { return live_.contains(id) && live_.at(id).running; }
  // The sequence's tokens as the test knows them.
  const std::vector<int32_t>& tokens(SequenceId id) const { return live_.at(id).tokens; }

  absl::Status Add(const Request& r) {
    absl::Status status = sched_.Add(r.id, r.prompt, r.max_new_tokens, r.priority);
    if (status.ok()) {
      live_.emplace(r.id, Live{.tokens = r.prompt,
                               .max_new_tokens = r.max_new_tokens,
                               .priority = r.priority,
                               .arrival = next_arrival_++});
    }
    sched_.CheckInvariants();
    CheckStats();
    return status;
  }

  // Finish on request of the client (a cancellation).
  bool Cancel(SequenceId id) {
    const int64_t used = pool_->num_used();
    const bool found = sched_.Finish(id);
    EXPECT_EQ(found, live_.erase(id) == 1) << "sequence " << id;
    EXPECT_LE(pool_->num_used(), used);
    sched_.CheckInvariants();
    CheckStats();
    return found;
  }

  // Cancel, keeping the blocks (Scheduler::FinishAndHold): none goes back to the pool.
  bool CancelAndHold(SequenceId id) {
    const int64_t used = pool_->num_used();
    const bool found = sched_.FinishAndHold(id);
    EXPECT_EQ(found, live_.erase(id) == 1) << "sequence " << id;
    EXPECT_EQ(pool_->num_used(), used);
    sched_.CheckInvariants();
    CheckStats();
    return found;
  }

  // One engine step; `mid_step` runs between Schedule and Commit (e.g. to cancel a sequence).
  StepRecord Step(const std::function<void()>& mid_step = nullptr) {
    // Every other step into the step object kept from the one before (its storage reused), and
    // with tokens appended through their items instead of by id: both ways must agree.
    const bool reuse = steps_ % 2 == 1;
    ScheduledStep fresh;
    ScheduledStep& step = reuse ? kept_ : fresh;
    if (reuse) {
      sched_.Schedule(&kept_);
    } else {
      fresh = sched_.Schedule();
    }
    sched_.CheckInvariants();
    StepRecord record = Record(step);
    Verify(step, record);
    Update(record);
    if (mid_step) mid_step();
    sched_.Commit(step);
    sched_.CheckInvariants();
    ++steps_;
    step_tokens_ += step.num_tokens;
    last_step_tokens_ = step.num_tokens;
    for (size_t k = 0; k < record.items.size(); ++k) {
      const ItemRecord& item = record.items[k];
      auto it = live_.find(item.id);
      if (it == live_.end()) continue;  // cancelled mid-step
      Live& s = it->second;
      s.computed = item.start + item.size();
      s.decoding = false;
      if (!item.samples) continue;
      if (s.max_new_tokens == 0) {  // nothing to generate: done once the prompt is computed
        Done(item.id);
        continue;
      }
      const int32_t token = NextToken(s.tokens);
      if (++s.generated == s.max_new_tokens) {
        s.tokens.push_back(token);
        Done(item.id);
        continue;
      }
      if (reuse) {
        sched_.AppendToken(step.items[k], token);
      } else {
        sched_.AppendToken(item.id, token);
      }
      s.tokens.push_back(token);
      s.decoding = true;
      EXPECT_THAT(sched_.tokens(item.id), ElementsAreArray(s.tokens));
      sched_.CheckInvariants();
    }
    CheckStats();
    return record;
  }

  // A finished sequence's stream; empty (and a failure) when it did not finish.
  std::vector<int32_t> Stream(SequenceId id) const {
    const auto it = finished_.find(id);
    if (it == finished_.end()) {
      ADD_FAILURE() << "sequence " << id << " did not finish";
      return {};
    }
    return it->second;
  }

  // Steps until nothing is left (or max_steps, or a new failure); returns the steps taken.
  int64_t RunUntilIdle(int64_t max_steps = 10000) {
    int64_t n = 0;
    const int failures = NumFailures();
    while (sched_.HasWork() && n < max_steps && NumFailures() == failures) {
      Step();
      ++n;
    }
    EXPECT_FALSE(sched_.HasWork()) << "still busy after " << n << " steps";
    return n;
  }

  int64_t preemptions() const { return preemptions_; }

  // Every FakeEngine checks on destruction that no step admitted a sequence that comes after one
  // it preempted in the scheduling order (the victim waits again, so they jumped its queue).
  ~FakeEngine() { EXPECT_EQ(queue_jumps_, 0) << first_queue_jump_; }

 private:
  struct Live {
    std::vector<int32_t> tokens = {};  // prompt, then appended tokens
    int64_t max_new_tokens = 0;
    int priority = 0;
    uint64_t arrival = 0;
    int64_t generated = 0;  // tokens sampled so far
    bool running = false;   // admitted and not preempted since
    bool decoding = false;  // running and its next item is one generated token
    int64_t computed = 0;   // leading tokens computed since the last admission
  };

  // The scheduler's order: higher priority, then earlier arrival.
  static bool Before(const Live* a, const Live* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->arrival < b->arrival;
  }

  void Done(SequenceId id) {
    auto it = live_.find(id);
    finished_[id] = std::move(it->second.tokens);
    live_.erase(it);
    const int64_t used = pool_->num_used();
    EXPECT_TRUE(sched_.Finish(id));
    EXPECT_LE(pool_->num_used(), used);
    EXPECT_FALSE(sched_.Contains(id));
    sched_.CheckInvariants();
  }

  StepRecord Record(const ScheduledStep& step) const {
    StepRecord r{.preempted = step.preempted,
                 .num_tokens = step.num_tokens,
                 .num_prefill_tokens = step.num_prefill_tokens,
                 .num_decode_tokens = step.num_decode_tokens};
    for (const ScheduledItem& item : step.items) {
      const auto it = live_.find(item.id);
      r.items.push_back(ItemRecord{
          .id = item.id,
          .start = item.start,
          .tokens = std::vector<int32_t>(item.tokens.begin(), item.tokens.end()),
          .block_table = std::vector<int32_t>(item.block_table.begin(), item.block_table.end()),
          .samples = item.samples,
          .is_decode = item.is_decode,
          .admitted = it != live_.end() && !it->second.running});
    }
    return r;
  }

  // Checks a step against the test's model of the sequences as they were before it.
  void Verify(const ScheduledStep& step, const StepRecord& record) {
    const SchedulerOptions& o = sched_.options();
    EXPECT_LE(step.num_tokens, o.max_tokens_per_step);
    EXPECT_LE(static_cast<int64_t>(step.items.size()), o.max_running);
    std::set<SequenceId> preempted;
    for (SequenceId v : step.preempted) {
      ASSERT_TRUE(live_.contains(v)) << "preempted unknown sequence " << v;
      EXPECT_TRUE(live_.at(v).running) << "preempted sequence " << v << " was not running";
      EXPECT_TRUE(preempted.insert(v).second) << "sequence " << v << " preempted twice";
    }
    int64_t sum = 0, prefill = 0, decode = 0;
    std::set<SequenceId> scheduled;
    std::vector<const Live*> admitted;
    std::map<int32_t, SequenceId> writer;  // block -> the item that writes into it
    for (const ItemRecord& item : record.items) {
      ASSERT_TRUE(live_.contains(item.id)) << "scheduled unknown sequence " << item.id;
      const Live& s = live_.at(item.id);
      const int64_t n = item.size();
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      EXPECT_TRUE(scheduled.insert(item.id).second) << "sequence " << item.id << " twice in a step";
      EXPECT_FALSE(preempted.contains(item.id)) << "preempted sequence " << item.id << " scheduled";
      ASSERT_GE(n, 1) << "empty item for " << item.id;
      ASSERT_GE(item.start, 0);
      ASSERT_LE(item.start + n, len) << "item of " << item.id << " past its tokens";
      if (s.running) {
        EXPECT_EQ(item.start, s.computed) << "sequence " << item.id << " skips or repeats tokens";
      } else {
        admitted.push_back(&s);
        EXPECT_EQ(item.start % kBlockSize, 0) << "cached prefix of " << item.id;
        EXPECT_LE(item.start, (len - 1) / kBlockSize * kBlockSize)
            << "sequence " << item.id << " computes none of its last block";
        if (!pool_->prefix_caching()) {
          EXPECT_EQ(item.start, 0);
        }
        EXPECT_FALSE(item.is_decode) << "an admission of " << item.id << " is not a decode";
      }
      EXPECT_THAT(item.tokens, ElementsAreArray(s.tokens.begin() + item.start,
                                                s.tokens.begin() + item.start + n))
          << "sequence " << item.id;
      EXPECT_EQ(item.samples, item.start + n == len) << "sequence " << item.id;
      EXPECT_EQ(static_cast<int64_t>(item.block_table.size()),
                (item.start + n + kBlockSize - 1) / kBlockSize)
          << "block table of " << item.id << " does not cover exactly its positions";
      if (s.decoding) {
        EXPECT_TRUE(item.is_decode) << "sequence " << item.id;
      }
      if (item.is_decode) {
        EXPECT_EQ(n, 1) << "sequence " << item.id;
      }
      if (o.max_prefill_chunk > 0 && n > 1) {
        EXPECT_LE(n, o.max_prefill_chunk);
      }
      EXPECT_EQ(std::set<int32_t>(item.block_table.begin(), item.block_table.end()).size(),
                item.block_table.size())
          << "sequence " << item.id << " holds a block twice";
      for (int64_t pos = item.start; pos < item.start + n; ++pos) {
        if (static_cast<size_t>(pos / kBlockSize) >= item.block_table.size()) break;
        const int32_t b = item.block_table[static_cast<size_t>(pos / kBlockSize)];
        EXPECT_EQ(pool_->ref_count(b), 1)
            << "sequence " << item.id << " writes position " << pos << " into shared block " << b;
        const auto [w, fresh] = writer.emplace(b, item.id);
        EXPECT_EQ(w->second, item.id) << "two sequences write into block " << b;
      }
      sum += n;
      (item.is_decode ? decode : prefill) += n;
    }
    // No item reads a block that another one writes.
    for (const ItemRecord& item : record.items) {
      for (int32_t b : item.block_table) {
        const auto w = writer.find(b);
        if (w != writer.end()) {
          EXPECT_EQ(w->second, item.id) << "block " << b;
        }
      }
    }
    EXPECT_EQ(step.num_tokens, sum);
    EXPECT_EQ(step.num_prefill_tokens, prefill);
    EXPECT_EQ(step.num_decode_tokens, decode);
    if (o.max_prefill_tokens > 0) {
      EXPECT_LE(prefill, o.max_prefill_tokens);
    }

    // Admission: the head of the waiting queue, highest priority then oldest, in that order.
    std::vector<const Live*> waiting;
    for (const auto& [id, s] : live_) {
      if (!s.running) waiting.push_back(&s);
    }
    std::sort(waiting.begin(), waiting.end(), Before);
    ASSERT_LE(admitted.size(), waiting.size());
    for (size_t i = 0; i < admitted.size(); ++i) {
      EXPECT_EQ(admitted[i], waiting[i]) << "admission " << i << " skipped the queue's order";
    }
    // A victim is the last running sequence in the order: every survivor comes before it.
    for (SequenceId v : preempted) {
      const Live* victim = &live_.at(v);
      for (const auto& [id, s] : live_) {
        if (Before(&s, victim)) continue;
        std::ostringstream what;
        what << "step " << steps_ << ": preempted " << v << " (priority " << victim->priority
             << ", arrival " << victim->arrival << ") while " << id << " (priority " << s.priority
             << ", arrival " << s.arrival << ") ";
        if (s.running && !preempted.contains(id)) {
          ADD_FAILURE() << what.str() << "keeps running";
        } else if (std::find(admitted.begin(), admitted.end(), &s) != admitted.end()) {
          if (queue_jumps_++ == 0) first_queue_jump_ = what.str() + "is admitted";
        }
      }
      // Admission takes blocks only from strictly less important sequences.
      if (!admitted.empty()) {
        EXPECT_LT(victim->priority, admitted.front()->priority);
      }
    }
    // Decoding sequences come first: one is left out only when the budget is spent on others.
    if (preempted.empty()) {
      for (const auto& [id, s] : live_) {
        if (!s.decoding || scheduled.contains(id)) continue;
        EXPECT_EQ(step.num_tokens, o.max_tokens_per_step) << "decoding " << id << " left out";
        EXPECT_TRUE(admitted.empty()) << "admitted while decoding " << id << " waits";
        for (const ItemRecord& item : record.items) {
          EXPECT_EQ(item.size(), 1) << "prefill of " << item.id << " while " << id << " waits";
          EXPECT_TRUE(Before(&live_.at(item.id), &s));
        }
      }
    }
  }

  // The test's model of the sequences after the step was scheduled.
  void Update(const StepRecord& record) {
    for (SequenceId v : record.preempted) {
      Live& s = live_.at(v);
      s.running = false;
      s.decoding = false;
      s.computed = 0;
      ++preemptions_;
    }
    for (const ItemRecord& item : record.items) {
      auto it = live_.find(item.id);
      if (it == live_.end() || it->second.running) continue;
      it->second.running = true;
      admitted_tokens_ += static_cast<int64_t>(it->second.tokens.size());
      prefix_hit_tokens_ += item.start;
    }
  }

  void CheckStats() const {
    const SchedulerStats st = sched_.stats();
    EXPECT_EQ(st.total_blocks, pool_->num_blocks());
    EXPECT_GE(st.free_blocks, 0);
    EXPECT_GE(st.cached_blocks, 0);
    EXPECT_GE(st.used_blocks, 0);
    EXPECT_EQ(st.free_blocks + st.cached_blocks + st.used_blocks, st.total_blocks);
    if (!pool_->prefix_caching()) {
      EXPECT_EQ(st.cached_blocks, 0);
    }
    int64_t running = 0;
    for (const auto& [id, s] : live_) running += s.running ? 1 : 0;
    EXPECT_EQ(st.running, running);
    EXPECT_EQ(st.waiting, num_live() - running);
    EXPECT_GE(st.wasted_slots, 0);
    EXPECT_LE(st.wasted_slots, (kBlockSize - 1) * running);
    if (running == 0) {  // only blocks FinishAndHold keeps (some may be shared)
      EXPECT_LE(st.used_blocks, sched_.num_held_blocks());
    }
    EXPECT_EQ(st.admitted_tokens, admitted_tokens_);
    EXPECT_EQ(st.prefix_hit_tokens, prefix_hit_tokens_);
    EXPECT_EQ(st.preemptions, preemptions_);
    EXPECT_EQ(st.steps, steps_);
    EXPECT_EQ(st.step_tokens, step_tokens_);
    EXPECT_EQ(st.last_step_tokens, last_step_tokens_);
    EXPECT_GE(st.prefix_hit_rate(), 0.0);
    EXPECT_LE(st.prefix_hit_rate(), 1.0);
    // load() is stats()'s figures, computed apart.
    const SchedulerLoad load = sched_.load();
    EXPECT_EQ(load.running, st.running);
    EXPECT_EQ(load.waiting, st.waiting);
    EXPECT_EQ(load.remote_prefills, st.remote_prefills);
    EXPECT_EQ(load.queued_prefill_tokens, st.queued_prefill_tokens);
    EXPECT_EQ(load.active_decode_tokens, st.active_decode_tokens);
  }

  BlockPool* pool_;
  Scheduler sched_;
  ScheduledStep kept_;
  std::map<SequenceId, Live> live_;
  std::map<SequenceId, std::vector<int32_t>> finished_;
  uint64_t next_arrival_ = 0;
  int64_t admitted_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t preemptions_ = 0;
  int64_t steps_ = 0;
  int64_t step_tokens_ = 0;
  int64_t last_step_tokens_ = 0;
  int64_t queue_jumps_ = 0;
  std::string first_queue_jump_;
};

// ---------------------------------------------------------------------------------------------
// Add and Finish.

TEST(SchedulerTest, AddRejectsBadRequests) {
  auto pool = MakePool(8);  // 32 token slots
  Scheduler sched(pool.get(), {});
  EXPECT_EQ(sched.Add(1, {}, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.Add(1, Tokens(4, 0), -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.Add(1, Tokens(30, 0), 3).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sched.Add(1, Tokens(33, 0), 0).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(sched.HasWork());
  ASSERT_TRUE(sched.Add(1, Tokens(4, 0), 4).ok());
  EXPECT_EQ(sched.Add(1, Tokens(4, 0), 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.Add(1, Tokens(8, 100), 1, /*priority=*/3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sched.tokens(1), ElementsAreArray(Tokens(4, 0)));  // the duplicate changed nothing
  // A sequence exactly as large as the pool, and one that generates nothing, are accepted.
  EXPECT_TRUE(sched.Add(2, Tokens(28, 0), 4).ok());
  EXPECT_TRUE(sched.Add(3, Tokens(5, 0), 0).ok());
  EXPECT_EQ(sched.stats().waiting, 3);
  sched.CheckInvariants();
  // A finished id can be used again.
  EXPECT_TRUE(sched.Finish(1));
  EXPECT_TRUE(sched.Add(1, Tokens(4, 7), 1).ok());
  EXPECT_THAT(sched.tokens(1), ElementsAreArray(Tokens(4, 7)));
  sched.CheckInvariants();
}

TEST(SchedulerTest, SequencesAsLargeAsThePoolOrGeneratingNothingRun) {
  auto pool = MakePool(8);
  FakeEngine engine(pool.get(), {});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(28, 0), .max_new_tokens = 4}).ok());
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(28, 50), .max_new_tokens = 4}).ok());
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = Tokens(5, 9), .max_new_tokens = 0}).ok());
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(1), Generate(Tokens(28, 0), 4));
  EXPECT_EQ(engine.Stream(2), Generate(Tokens(28, 50), 4));
  EXPECT_EQ(engine.Stream(3), Tokens(5, 9));
}

TEST(SchedulerTest, FinishReleasesBlocksOfRunningAndWaitingSequencesAtOnce) {
  auto pool = MakePool(16);
  FakeEngine engine(pool.get(), {.max_running = 2});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(10, 0), .max_new_tokens = 20}).ok());
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(6, 100), .max_new_tokens = 20}).ok());
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = Tokens(6, 200), .max_new_tokens = 20}).ok());
  engine.Step();
  engine.Step();
  ASSERT_TRUE(engine.running(1) && engine.running(2) && !engine.running(3));
  EXPECT_EQ(engine.sched().stats().used_blocks, 3 + 2);
  EXPECT_EQ(pool->num_used(), 5);

  EXPECT_FALSE(engine.sched().Finish(99));
  EXPECT_EQ(engine.sched().stats().finished_sequences, 0);  // an unknown id is no finish
  // Waiting: nothing held, it just leaves the queue.
  EXPECT_TRUE(engine.Cancel(3));
  EXPECT_EQ(engine.sched().stats().waiting, 0);
  EXPECT_EQ(engine.sched().stats().finished_sequences, 1);
  EXPECT_EQ(pool->num_used(), 5);
  // Running: its blocks go back before the next step.
  EXPECT_TRUE(engine.Cancel(1));
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_EQ(engine.sched().stats().running, 1);
  EXPECT_FALSE(engine.sched().Contains(1));
  EXPECT_FALSE(engine.sched().Finish(1));
  EXPECT_EQ(engine.sched().stats().finished_sequences, 2);  // counted with the running count
  const StepRecord step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(2));
  EXPECT_TRUE(engine.Cancel(2));
  EXPECT_EQ(engine.sched().stats().finished_sequences, 3);
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_FALSE(engine.sched().HasWork());
  EXPECT_EQ(pool->num_free() + pool->num_cached(), 16);
}

TEST(SchedulerTest, FinishAndHoldKeepsTheBlocksUntilReleased) {
  auto pool = MakePool(16);
  FakeEngine engine(pool.get(), {});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(10, 0), .max_new_tokens = 4}).ok());
  engine.Step();
  ASSERT_EQ(pool->num_used(), 3);

  EXPECT_FALSE(engine.CancelAndHold(99));
  ASSERT_TRUE(engine.CancelAndHold(1));
  EXPECT_FALSE(engine.sched().Contains(1));
  EXPECT_FALSE(engine.sched().HasWork());
  EXPECT_EQ(engine.sched().stats().finished_sequences, 1);
  // Still allocated, and neither cached nor evictable: nothing may overwrite them.
  EXPECT_EQ(pool->num_used(), 3);
  EXPECT_EQ(pool->num_available(), 13);
  EXPECT_EQ(engine.sched().num_held(), 1);
  EXPECT_EQ(engine.sched().num_held_blocks(), 3);
  engine.sched().CheckInvariants();
  // The id is in use until the blocks are released.
  EXPECT_EQ(engine.Add({.id = 1, .prompt = Tokens(4, 50), .max_new_tokens = 1}).code(),
            absl::StatusCode::kInvalidArgument);

  // A sequence that needs the whole rest of the pool runs beside them without taking one.
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(40, 100), .max_new_tokens = 12}).ok());
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(2), Generate(Tokens(40, 100), 12));
  EXPECT_EQ(engine.sched().num_held_blocks(), 3);
  engine.sched().CheckInvariants();

  EXPECT_TRUE(engine.sched().ReleaseHeld(1));
  EXPECT_FALSE(engine.sched().ReleaseHeld(1));
  EXPECT_EQ(engine.sched().num_held(), 0);
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(pool->num_available(), 16);
  engine.sched().CheckInvariants();
  EXPECT_TRUE(engine.Add({.id = 1, .prompt = Tokens(4, 50), .max_new_tokens = 1}).ok());
}

TEST(SchedulerTest, FinishOfASequenceSharingAPrefixKeepsTheSharedBlocks) {
  auto pool = MakePool(32);
  FakeEngine engine(pool.get(), {});
  const std::vector<int32_t> shared = Tokens(8, 0);
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Concat(shared, {50}), .max_new_tokens = 8}).ok());
  engine.Step();
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Concat(shared, {60}), .max_new_tokens = 8}).ok());
  const StepRecord step = engine.Step();
  const ItemRecord* two = step.Find(2);
  ASSERT_NE(two, nullptr);
  ASSERT_EQ(two->start, 8);
  const int32_t shared0 = two->block_table[0];
  const int32_t shared1 = two->block_table[1];
  EXPECT_EQ(step.Find(1)->block_table[0], shared0);
  EXPECT_EQ(pool->ref_count(shared0), 2);
  const int64_t used = pool->num_used();
  ASSERT_TRUE(engine.Cancel(1));
  EXPECT_EQ(pool->ref_count(shared0), 1);
  EXPECT_EQ(pool->ref_count(shared1), 1);
  EXPECT_EQ(pool->num_used(), used - 1);  // only sequence 1's own third block
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(2), Generate(Concat(shared, {60}), 8));
}

TEST(SchedulerTest, FinishBetweenScheduleAndCommitIsSkippedByCommit) {
  auto pool = MakePool(16);
  FakeEngine engine(pool.get(), {});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(9, 0), .max_new_tokens = 5}).ok());
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(7, 20), .max_new_tokens = 5}).ok());
  const StepRecord step = engine.Step([&] { EXPECT_TRUE(engine.Cancel(1)); });
  EXPECT_THAT(step.ids(), ElementsAre(1, 2));
  EXPECT_FALSE(engine.sched().Contains(1));
  EXPECT_EQ(pool->num_used(), 2);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.finished().size(), 1u);
  EXPECT_EQ(engine.Stream(2), Generate(Tokens(7, 20), 5));
}

// ---------------------------------------------------------------------------------------------
// Continuous batching.

TEST(SchedulerTest, NewSequencesJoinWhileOthersDecode) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(6, 0), .max_new_tokens = 10}).ok());
  StepRecord step = engine.Step();
  ASSERT_EQ(step.items.size(), 1u);
  EXPECT_TRUE(step.items[0].samples);
  EXPECT_FALSE(step.items[0].is_decode);
  step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(1));
  EXPECT_TRUE(step.items[0].is_decode);

  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(13, 100), .max_new_tokens = 3}).ok());
  step = engine.Step();
  ASSERT_THAT(step.ids(), ElementsAre(1, 2));
  EXPECT_TRUE(step.items[0].is_decode);
  EXPECT_EQ(step.items[0].start, 7);
  EXPECT_TRUE(step.items[1].admitted);
  EXPECT_EQ(step.items[1].start, 0);
  EXPECT_EQ(step.items[1].size(), 13);
  EXPECT_TRUE(step.items[1].samples);
  EXPECT_EQ(step.num_decode_tokens, 1);
  EXPECT_EQ(step.num_prefill_tokens, 13);
  EXPECT_EQ(step.num_tokens, 14);

  ASSERT_TRUE(engine.Add({.id = 3, .prompt = Tokens(2, 300), .max_new_tokens = 3}).ok());
  step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(1, 2, 3));
  EXPECT_EQ(step.num_decode_tokens, 2);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(1), Generate(Tokens(6, 0), 10));
  EXPECT_EQ(engine.Stream(2), Generate(Tokens(13, 100), 3));
  EXPECT_EQ(engine.Stream(3), Generate(Tokens(2, 300), 3));
}

TEST(SchedulerTest, LongPromptIsChunkedAndDoesNotStallDecoding) {
  auto pool = MakePool(600);
  FakeEngine engine(pool.get(), {.max_running = 16, .max_tokens_per_step = 64});
  constexpr int kDecoders = 5;
  for (SequenceId id = 1; id <= kDecoders; ++id) {
    ASSERT_TRUE(engine
                    .Add({.id = id,
                          .prompt = Tokens(8, static_cast<int32_t>(id) * 100),
                          .max_new_tokens = 200})
                    .ok());
  }
  EXPECT_EQ(engine.Step().num_tokens, kDecoders * 8);
  EXPECT_EQ(engine.Step().num_decode_tokens, kDecoders);

  const std::vector<int32_t> long_prompt = Tokens(1000, 5000);
  ASSERT_TRUE(engine.Add({.id = 100, .prompt = long_prompt, .max_new_tokens = 4}).ok());
  int64_t prefilled = 0;
  int steps = 0;
  while (prefilled < 1000 && steps < 100) {
    const StepRecord step = engine.Step();
    ++steps;
    ASSERT_EQ(step.items.size(), static_cast<size_t>(kDecoders + 1));
    // Every decoding sequence gets exactly one token, ahead of the chunk.
    for (int k = 0; k < kDecoders; ++k) {
      EXPECT_EQ(step.items[static_cast<size_t>(k)].id, static_cast<SequenceId>(k + 1));
      EXPECT_TRUE(step.items[static_cast<size_t>(k)].is_decode);
      EXPECT_EQ(step.items[static_cast<size_t>(k)].size(), 1);
    }
    const ItemRecord& chunk = step.items.back();
    ASSERT_EQ(chunk.id, 100u);
    EXPECT_EQ(chunk.start, prefilled);
    EXPECT_EQ(chunk.size(), std::min<int64_t>(64 - kDecoders, 1000 - prefilled));
    prefilled += chunk.size();
    EXPECT_EQ(chunk.samples, prefilled == 1000);
    EXPECT_FALSE(chunk.is_decode);
    EXPECT_LE(step.num_tokens, 64);
    EXPECT_EQ(step.num_decode_tokens, kDecoders);
  }
  EXPECT_EQ(steps, (1000 + 58) / 59);
  // Now the long one decodes too.
  const StepRecord step = engine.Step();
  EXPECT_EQ(step.num_decode_tokens, kDecoders + 1);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(100), Generate(long_prompt, 4));
  EXPECT_EQ(engine.Stream(3), Generate(Tokens(8, 300), 200));
}

TEST(SchedulerTest, MaxPrefillChunkCapsEveryChunk) {
  struct Case {
    int64_t chunk;
    int64_t prompt;
    std::vector<int64_t> sizes;
  };
  for (const Case& c : {Case{8, 50, {8, 8, 8, 8, 8, 8, 2}}, Case{8, 48, {8, 8, 8, 8, 8, 8}},
                        Case{3, 11, {3, 3, 3, 2}}, Case{5, 5, {5}}, Case{64, 20, {20}}}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << c.chunk << ", prompt " << c.prompt);
    auto pool = MakePool(64);
    FakeEngine engine(pool.get(), {.max_prefill_chunk = c.chunk});
    const std::vector<int32_t> prompt = Tokens(c.prompt, 0);
    ASSERT_TRUE(engine.Add({.id = 7, .prompt = prompt, .max_new_tokens = 3}).ok());
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < c.sizes.size(); ++k) {
      const StepRecord step = engine.Step();
      ASSERT_EQ(step.items.size(), 1u);
      sizes.push_back(step.items[0].size());
      EXPECT_EQ(step.items[0].samples, k + 1 == c.sizes.size());
      EXPECT_FALSE(step.items[0].is_decode);
      EXPECT_EQ(step.num_prefill_tokens, step.items[0].size());
    }
    EXPECT_EQ(sizes, c.sizes);
    // Decode tokens are not chunks: one each.
    const StepRecord step = engine.Step();
    ASSERT_EQ(step.items.size(), 1u);
    EXPECT_TRUE(step.items[0].is_decode);
    engine.RunUntilIdle();
    EXPECT_EQ(engine.Stream(7), Generate(prompt, 3));
  }
}

TEST(SchedulerTest, RunningSequencesNeverExceedTheTokenBudget) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {.max_running = 8, .max_tokens_per_step = 3});
  for (SequenceId id = 1; id <= 6; ++id) {
    ASSERT_TRUE(
        engine
            .Add(
                {.id = id, .prompt = Tokens(5, static_cast<int32_t>(id) * 10), .max_new_tokens = 4})
            .ok());
  }
  int64_t steps = 0;
  while (engine.sched().HasWork() && steps < 200) {
    const StepRecord step = engine.Step();
    ++steps;
    EXPECT_LE(step.num_tokens, 3);
    EXPECT_GE(step.num_tokens, 1);
    EXPECT_LE(engine.sched().stats().running, 3);
  }
  EXPECT_FALSE(engine.sched().HasWork());
  for (SequenceId id = 1; id <= 6; ++id) {
    EXPECT_EQ(engine.Stream(id), Generate(Tokens(5, static_cast<int32_t>(id) * 10), 4));
  }
}

TEST(SchedulerTest, MaxRunningCapsTheBatch) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {.max_running = 2});
  for (SequenceId id = 1; id <= 4; ++id) {
    ASSERT_TRUE(engine
                    .Add({.id = id,
                          .prompt = Tokens(3, static_cast<int32_t>(id) * 10),
                          .max_new_tokens = static_cast<int64_t>(id) + 1})
                    .ok());
  }
  StepRecord step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(1, 2));
  EXPECT_EQ(engine.sched().stats().running, 2);
  EXPECT_EQ(engine.sched().stats().waiting, 2);
  step = engine.Step();  // sequence 1 samples its second and last token
  EXPECT_THAT(step.ids(), ElementsAre(1, 2));
  EXPECT_FALSE(engine.sched().Contains(1));
  step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(2, 3));
  EXPECT_TRUE(step.items[1].admitted);
  while (engine.sched().HasWork()) {
    EXPECT_LE(engine.Step().items.size(), 2u);
    EXPECT_LE(engine.sched().stats().running, 2);
  }
  EXPECT_EQ(engine.finished().size(), 4u);
}

// ---------------------------------------------------------------------------------------------
// Priorities and preemption.

TEST(SchedulerTest, HigherPriorityIsAdmittedFirstAndEqualPriorityIsFifo) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {.max_running = 1});
  const std::vector<std::pair<SequenceId, int>> arrivals = {{1, 0}, {2, 1},  {3, 0}, {4, 1},
                                                            {5, 2}, {6, -1}, {7, 2}};
  for (const auto& [id, priority] : arrivals) {
    ASSERT_TRUE(engine
                    .Add({.id = id,
                          .prompt = Tokens(5, static_cast<int32_t>(id)),
                          .max_new_tokens = 2,
                          .priority = priority})
                    .ok());
  }
  std::vector<SequenceId> order;
  while (engine.sched().HasWork() && order.size() < 20) {
    for (const ItemRecord& item : engine.Step().items) {
      if (item.admitted) order.push_back(item.id);
    }
  }
  EXPECT_THAT(order, ElementsAre(5, 7, 2, 4, 1, 3, 6));
  EXPECT_EQ(engine.sched().stats().preemptions, 0);
}

// A long priority-0 prompt is in progress when a priority-1 and another priority-0 prompt
// arrive: the priority-1 one is admitted ahead of the long one's next chunk (its first token does
// not wait for the whole long prompt), the priority-0 one waits behind it (equal priority: the
// prompt in progress first).
// max_prefill_tokens bounds the prompt tokens of a step, all prompts together (decode tokens
// are not counted): a step that computes long prompts stays short, and a prompt of a higher
// class arriving meanwhile takes its share first.
TEST(SchedulerTest, MaxPrefillTokensCapsThePromptTokensOfAStep) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {.max_tokens_per_step = 64, .max_prefill_tokens = 10});
  for (SequenceId id : {1, 2}) {
    ASSERT_TRUE(engine
                    .Add({.id = id,
                          .prompt = Tokens(4, static_cast<int32_t>(10 * id)),
                          .max_new_tokens = 20})
                    .ok());
  }
  EXPECT_EQ(engine.Step().num_prefill_tokens, 8);
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = Tokens(30, 300), .max_new_tokens = 2}).ok());
  ASSERT_TRUE(engine.Add({.id = 4, .prompt = Tokens(30, 400), .max_new_tokens = 2}).ok());
  StepRecord step = engine.Step();
  EXPECT_EQ(step.num_decode_tokens, 2);
  EXPECT_EQ(step.num_prefill_tokens, 10);
  ASSERT_NE(step.Find(3), nullptr);
  EXPECT_EQ(step.Find(3)->size(), 10);
  EXPECT_EQ(step.Find(4), nullptr);
  ASSERT_TRUE(
      engine.Add({.id = 5, .prompt = Tokens(6, 500), .max_new_tokens = 2, .priority = 1}).ok());
  step = engine.Step();
  ASSERT_EQ(step.items.size(), 4u);
  EXPECT_TRUE(step.items[0].is_decode);
  EXPECT_TRUE(step.items[1].is_decode);
  EXPECT_EQ(step.items[2].id, 5u);
  EXPECT_EQ(step.items[2].size(), 6);
  EXPECT_EQ(step.items[3].id, 3u);
  EXPECT_EQ(step.items[3].size(), 4);
  while (engine.sched().HasWork()) {
    EXPECT_LE(engine.Step().num_prefill_tokens, 10);
  }
  EXPECT_EQ(engine.Stream(3), Generate(Tokens(30, 300), 2));
  EXPECT_EQ(engine.Stream(4), Generate(Tokens(30, 400), 2));
  EXPECT_EQ(engine.Stream(5), Generate(Tokens(6, 500), 2));
}

TEST(SchedulerTest, AHigherPriorityPromptGoesBeforeTheNextChunkOfALowerOne) {
  for (const int64_t cap : {int64_t{0}, int64_t{8}}) {
    SCOPED_TRACE(::testing::Message() << "max_prefill_chunk " << cap);
    auto pool = MakePool(64);
    FakeEngine engine(pool.get(), {.max_tokens_per_step = 16, .max_prefill_chunk = cap});
    const std::vector<int32_t> long_prompt = Tokens(40, 0);
    ASSERT_TRUE(engine.Add({.id = 1, .prompt = long_prompt, .max_new_tokens = 2}).ok());
    const int64_t chunk = cap > 0 ? cap : 16;
    StepRecord step = engine.Step();
    ASSERT_EQ(step.items.size(), 1u);
    EXPECT_EQ(step.items[0].size(), chunk);

    ASSERT_TRUE(engine.Add({.id = 3, .prompt = Tokens(5, 300), .max_new_tokens = 2}).ok());
    ASSERT_TRUE(
        engine.Add({.id = 2, .prompt = Tokens(5, 200), .max_new_tokens = 2, .priority = 1}).ok());
    const std::vector<QueuedPrompts> queued = engine.sched().stats().queued_by_priority;
    ASSERT_EQ(queued.size(), 2u);
    EXPECT_EQ(queued[0].priority, 1);
    EXPECT_EQ(queued[0].tokens, 5);
    EXPECT_EQ(queued[0].prompts, 1);
    EXPECT_EQ(queued[1].priority, 0);
    EXPECT_EQ(queued[1].tokens, 40 - chunk + 5);
    EXPECT_EQ(queued[1].prompts, 2);

    step = engine.Step();
    ASSERT_GE(step.items.size(), 2u);
    EXPECT_EQ(step.items[0].id, 2u);
    EXPECT_TRUE(step.items[0].admitted);
    EXPECT_TRUE(step.items[0].samples);
    EXPECT_EQ(step.items[1].id, 1u);
    EXPECT_EQ(step.items[1].start, chunk);
    EXPECT_EQ(step.items[1].size(), std::min<int64_t>(chunk, 16 - 5));
    // Whatever the budget leaves goes to the equal-priority newcomer, after the long one.
    if (step.items.size() == 3) {
      EXPECT_EQ(step.items[2].id, 3u);
    }
    EXPECT_EQ(step.num_tokens, std::min<int64_t>(16, 5 + chunk + 5));
    engine.RunUntilIdle();
    EXPECT_EQ(engine.Stream(1), Generate(long_prompt, 2));
    EXPECT_EQ(engine.Stream(2), Generate(Tokens(5, 200), 2));
    EXPECT_TRUE(engine.sched().stats().queued_by_priority.empty());
  }
}

// Pool of 7 blocks, no admission reserve. B (oldest) and C have priority 0, A (newest) 1. When A
// and B both need a new block, the victim is C: lowest priority, and of those the newest.
TEST(SchedulerTest, RunningOutOfBlocksPreemptsTheLowestPriorityNewest) {
  auto pool = MakePool(7);
  FakeEngine engine(pool.get(), {.admission_reserve_blocks = 0});
  constexpr SequenceId kB = 1, kC = 2, kA = 3;
  const std::vector<int32_t> prompt_b = Tokens(4, 0), prompt_c = Tokens(6, 100),
                             prompt_a = Tokens(4, 200);
  ASSERT_TRUE(engine.Add({.id = kB, .prompt = prompt_b, .max_new_tokens = 8}).ok());
  ASSERT_TRUE(engine.Add({.id = kC, .prompt = prompt_c, .max_new_tokens = 8}).ok());
  ASSERT_TRUE(engine.Add({.id = kA, .prompt = prompt_a, .max_new_tokens = 8, .priority = 1}).ok());
  StepRecord step = engine.Step();
  EXPECT_THAT(step.ids(), ElementsAre(kA, kB, kC));  // admitted in priority order
  std::vector<int32_t> c_tokens_at_preemption;
  int guard = 0;
  do {
    c_tokens_at_preemption = engine.tokens(kC);
    step = engine.Step();
  } while (step.preempted.empty() && ++guard < 20);
  ASSERT_THAT(step.preempted, ElementsAre(kC));
  EXPECT_THAT(step.ids(), ElementsAre(kA, kB));
  EXPECT_EQ(engine.sched().stats().preemptions, 1);
  EXPECT_EQ(engine.sched().stats().waiting, 1);
  EXPECT_EQ(c_tokens_at_preemption.size(), 11u);  // 10 computed, one waiting for its decode
  // C's partly filled last block went back free; of its two full blocks, one survived the
  // allocations that followed and stays cached.
  EXPECT_EQ(pool->num_cached(), 1);

  // C is re-admitted once A and B are done, reusing its cached first block, and recomputes the
  // rest of its tokens (prompt and generated) from there.
  const ItemRecord* readmission = nullptr;
  StepRecord later;
  while (readmission == nullptr && engine.sched().HasWork() && ++guard < 100) {
    later = engine.Step();
    readmission = later.Find(kC);
  }
  ASSERT_NE(readmission, nullptr);
  EXPECT_TRUE(readmission->admitted);
  EXPECT_EQ(readmission->start, 4);
  EXPECT_THAT(readmission->tokens,
              ElementsAreArray(c_tokens_at_preemption.begin() + 4, c_tokens_at_preemption.end()));
  EXPECT_TRUE(readmission->samples);
  EXPECT_FALSE(readmission->is_decode);
  EXPECT_EQ(engine.sched().stats().prefix_hit_tokens, 4);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(kA), Generate(prompt_a, 8));
  EXPECT_EQ(engine.Stream(kB), Generate(prompt_b, 8));
  EXPECT_EQ(engine.Stream(kC), Generate(prompt_c, 8));
  EXPECT_EQ(engine.sched().stats().preemptions, 1);
}

// Same, but nothing of the victim stays cached: it is recomputed from position 0.
TEST(SchedulerTest, PreemptedSequenceWithNothingCachedRecomputesFromTheStart) {
  for (const bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    auto pool = MakePool(6, caching);
    FakeEngine engine(pool.get(), {.admission_reserve_blocks = 0});
    const std::vector<int32_t> prompts[] = {Tokens(4, 0), Tokens(4, 100), Tokens(4, 200)};
    ASSERT_TRUE(engine.Add({.id = 1, .prompt = prompts[0], .max_new_tokens = 8}).ok());
    ASSERT_TRUE(engine.Add({.id = 2, .prompt = prompts[1], .max_new_tokens = 8}).ok());
    ASSERT_TRUE(engine.Add({.id = 3, .prompt = prompts[2], .max_new_tokens = 8}).ok());
    StepRecord step;
    std::vector<int32_t> before;
    int guard = 0;
    do {
      before = engine.tokens(3);
      step = engine.Step();
    } while (step.preempted.empty() && ++guard < 20);
    ASSERT_THAT(step.preempted, ElementsAre(3));
    const ItemRecord* readmission = nullptr;
    while (readmission == nullptr && engine.sched().HasWork() && ++guard < 100) {
      step = engine.Step();
      readmission = step.Find(3);
    }
    ASSERT_NE(readmission, nullptr);
    EXPECT_EQ(readmission->start, 0);
    EXPECT_EQ(readmission->tokens, before);
    engine.RunUntilIdle();
    for (SequenceId id = 1; id <= 3; ++id) {
      EXPECT_EQ(engine.Stream(id), Generate(prompts[id - 1], 8));
    }
  }
}

// L (priority 0) runs in a pool of 4 blocks with none left; H arrives.
TEST(SchedulerTest, MoreImportantWaitingSequencePreemptsAndEqualOneWaits) {
  for (const int h_priority : {1, 0}) {
    SCOPED_TRACE(::testing::Message() << "H priority " << h_priority);
    auto pool = MakePool(4);
    FakeEngine engine(pool.get(), {});
    constexpr SequenceId kL = 1, kH = 2;
    ASSERT_TRUE(engine.Add({.id = kL, .prompt = Tokens(12, 0), .max_new_tokens = 4}).ok());
    engine.Step();
    ASSERT_TRUE(
        engine
            .Add({.id = kH, .prompt = Tokens(8, 100), .max_new_tokens = 1, .priority = h_priority})
            .ok());
    const StepRecord step = engine.Step();
    if (h_priority > 0) {
      EXPECT_THAT(step.preempted, ElementsAre(kL));
      // L's decode token, already placed in the step, was taken back out with its budget.
      EXPECT_THAT(step.ids(), ElementsAre(kH));
      EXPECT_EQ(step.num_tokens, 8);
      EXPECT_EQ(step.num_decode_tokens, 0);
      EXPECT_EQ(engine.sched().stats().preemptions, 1);
      EXPECT_FALSE(engine.running(kL));
    } else {
      EXPECT_THAT(step.preempted, IsEmpty());
      EXPECT_THAT(step.ids(), ElementsAre(kL));
      EXPECT_EQ(engine.sched().stats().waiting, 1);
      EXPECT_FALSE(engine.running(kH));
    }
    engine.RunUntilIdle();
    EXPECT_EQ(engine.Stream(kL), Generate(Tokens(12, 0), 4));
    EXPECT_EQ(engine.Stream(kH), Generate(Tokens(8, 100), 1));
    EXPECT_EQ(engine.sched().stats().preemptions, h_priority > 0 ? 1 : 0);
  }
}

// Admission preempts only when preempting every less important sequence would free enough;
// otherwise nobody loses work for nothing. Here H (priority
// 2) holds 5 of 8 blocks, L (priority 0) 2, one is free; M (priority 1) needs 4. Preempting L
// frees only 2, so M cannot be admitted either way, and L should keep running.
TEST(SchedulerTest, AdmissionThatFailsAnywayPreemptsNobody) {
  auto pool = MakePool(8);
  FakeEngine engine(pool.get(), {.admission_reserve_blocks = 0});
  constexpr SequenceId kH = 1, kL = 2, kM = 3;
  ASSERT_TRUE(
      engine.Add({.id = kH, .prompt = Tokens(18, 0), .max_new_tokens = 2, .priority = 2}).ok());
  ASSERT_TRUE(engine.Add({.id = kL, .prompt = Tokens(6, 100), .max_new_tokens = 2}).ok());
  engine.Step();
  ASSERT_EQ(pool->num_used(), 7);
  ASSERT_TRUE(
      engine.Add({.id = kM, .prompt = Tokens(16, 200), .max_new_tokens = 1, .priority = 1}).ok());
  const StepRecord step = engine.Step();
  EXPECT_THAT(step.preempted, IsEmpty()) << "L was preempted, yet M was not admitted";
  EXPECT_THAT(step.ids(), ElementsAre(kH, kL));
  EXPECT_EQ(engine.sched().stats().preemptions, 0);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(kL), Generate(Tokens(6, 100), 2));
  EXPECT_EQ(engine.Stream(kM), Generate(Tokens(16, 200), 1));
}

// After an admission preempts a victim, nothing ranked after the victim is admitted in the same
// step (it would take the blocks the victim needs next). V (priority 1) holds 3 of 8
// blocks; X (priority 2) needs 7, so V is preempted; Y (priority 0) needs 1 and must wait behind
// V, which needs 2 more than the one left.
TEST(SchedulerTest, SequencesBehindAVictimAreNotAdmittedInTheSameStep) {
  auto pool = MakePool(8);
  FakeEngine engine(pool.get(), {.admission_reserve_blocks = 0});
  constexpr SequenceId kV = 1, kX = 2, kY = 3;
  ASSERT_TRUE(
      engine.Add({.id = kV, .prompt = Tokens(10, 0), .max_new_tokens = 4, .priority = 1}).ok());
  engine.Step();
  ASSERT_TRUE(
      engine.Add({.id = kX, .prompt = Tokens(28, 100), .max_new_tokens = 1, .priority = 2}).ok());
  ASSERT_TRUE(engine.Add({.id = kY, .prompt = Tokens(3, 200), .max_new_tokens = 1}).ok());
  const StepRecord step = engine.Step();
  EXPECT_THAT(step.preempted, ElementsAre(kV));
  EXPECT_THAT(step.ids(), ElementsAre(kX)) << "Y jumped the queue ahead of V";
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(kV), Generate(Tokens(10, 0), 4));
  EXPECT_EQ(engine.Stream(kX), Generate(Tokens(28, 100), 1));
  EXPECT_EQ(engine.Stream(kY), Generate(Tokens(3, 200), 1));
}

// ---------------------------------------------------------------------------------------------
// Prefix reuse.

TEST(SchedulerTest, SharedPrefixIsReusedAfterCommit) {
  const std::vector<int32_t> first = Concat(Tokens(40, 0), Tokens(5, 1000));
  struct Case {
    const char* name;
    std::vector<int32_t> prompt;
    int64_t cached;
  };
  const std::vector<Case> cases = {
      {"same 40, own suffix", Concat(Tokens(40, 0), Tokens(3, 2000)), 40},
      {"exactly the 40 (last block recomputed)", Tokens(40, 0), 36},
      {"first 41 (last token computed)", Prefix(first, 41), 40},
      {"first 43", Prefix(first, 43), 40},
      {"whole prompt", first, 44},
      {"same 38", Concat(Tokens(38, 0), Tokens(5, 3000)), 36},
      {"differs in token 0", Concat({-1}, Prefix(first, 44)), 0},
      {"shorter than a block", Prefix(first, 3), 0},
      {"exactly one block", Prefix(first, 4), 0},
      {"one block and a token", Prefix(first, 5), 4},
  };
  for (const bool first_finished : {false, true}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << c.name << (first_finished ? ", first finished" : ""));
      auto pool = MakePool(64);
      FakeEngine engine(pool.get(), {});
      ASSERT_TRUE(engine.Add({.id = 1, .prompt = first, .max_new_tokens = 3}).ok());
      engine.Step();  // the whole prompt, committed
      if (first_finished) engine.RunUntilIdle();
      const SchedulerStats before = engine.sched().stats();
      EXPECT_EQ(before.prefix_hit_tokens, 0);
      EXPECT_EQ(before.admitted_tokens, 45);
      ASSERT_TRUE(engine.Add({.id = 2, .prompt = c.prompt, .max_new_tokens = 3}).ok());
      const StepRecord step = engine.Step();
      const ItemRecord* item = step.Find(2);
      ASSERT_NE(item, nullptr);
      EXPECT_EQ(item->start, c.cached);
      EXPECT_EQ(item->start + item->size(), static_cast<int64_t>(c.prompt.size()));
      EXPECT_TRUE(item->samples);
      const SchedulerStats after = engine.sched().stats();
      EXPECT_EQ(after.prefix_hit_tokens, c.cached);
      EXPECT_EQ(after.admitted_tokens, 45 + static_cast<int64_t>(c.prompt.size()));
      EXPECT_DOUBLE_EQ(after.prefix_hit_rate(), static_cast<double>(c.cached) /
                                                    (45.0 + static_cast<double>(c.prompt.size())));
      // The shared blocks are the first sequence's.
      if (!first_finished && c.cached > 0) {
        EXPECT_EQ(pool->ref_count(item->block_table[0]), 2);
      }
      engine.RunUntilIdle();
      EXPECT_EQ(engine.Stream(1), Generate(first, 3));
      EXPECT_EQ(engine.Stream(2), Generate(c.prompt, 3));
    }
  }
}

TEST(SchedulerTest, GeneratedTokensAreCachedToo) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {});
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(6, 0), .max_new_tokens = 10}).ok());
  engine.RunUntilIdle();
  // 15 of its 16 tokens were computed (the last sampled one never is): 3 full blocks.
  const std::vector<int32_t> stream = engine.Stream(1);
  ASSERT_EQ(stream.size(), 16u);
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Prefix(stream, 14), .max_new_tokens = 2}).ok());
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = stream, .max_new_tokens = 2}).ok());
  const StepRecord step = engine.Step();
  ASSERT_EQ(step.items.size(), 2u);
  EXPECT_EQ(step.Find(2)->start, 12);
  EXPECT_EQ(step.Find(3)->start, 12);
  engine.RunUntilIdle();
  EXPECT_EQ(engine.Stream(3), Generate(stream, 2));
}

TEST(SchedulerTest, PrefixIsReusableOnceItsBlocksAreCommitted) {
  auto pool = MakePool(64);
  FakeEngine engine(pool.get(), {.max_prefill_chunk = 8});
  const std::vector<int32_t> prompt = Tokens(30, 0);
  // Two identical prompts in the same step: nothing is cached yet.
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = prompt, .max_new_tokens = 2}).ok());
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = prompt, .max_new_tokens = 2}).ok());
  StepRecord step = engine.Step();
  ASSERT_EQ(step.items.size(), 2u);
  EXPECT_EQ(step.items[0].start, 0);
  EXPECT_EQ(step.items[1].start, 0);
  EXPECT_NE(step.items[0].block_table[0], step.items[1].block_table[0]);
  engine.Step();
  // 16 tokens of each are committed now: a third copy starts at 16.
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = prompt, .max_new_tokens = 2}).ok());
  step = engine.Step();
  ASSERT_NE(step.Find(3), nullptr);
  EXPECT_EQ(step.Find(3)->start, 16);
  EXPECT_EQ(step.Find(1)->start, 16);
  EXPECT_EQ(engine.sched().stats().prefix_hit_tokens, 16);
  engine.RunUntilIdle();
  for (SequenceId id = 1; id <= 3; ++id) EXPECT_EQ(engine.Stream(id), Generate(prompt, 2));
}

TEST(SchedulerTest, PrefixCachingDisabledReusesNothing) {
  auto pool = MakePool(64, /*prefix_caching=*/false);
  FakeEngine engine(pool.get(), {});
  const std::vector<int32_t> prompt = Tokens(41, 0);
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = prompt, .max_new_tokens = 3}).ok());
  engine.Step();
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = prompt, .max_new_tokens = 3}).ok());
  StepRecord step = engine.Step();
  ASSERT_NE(step.Find(2), nullptr);
  EXPECT_EQ(step.Find(2)->start, 0);
  EXPECT_EQ(step.Find(2)->size(), 41);
  engine.RunUntilIdle();
  EXPECT_EQ(pool->num_cached(), 0);
  ASSERT_TRUE(engine.Add({.id = 3, .prompt = prompt, .max_new_tokens = 3}).ok());
  step = engine.Step();
  EXPECT_EQ(step.Find(3)->start, 0);
  engine.RunUntilIdle();
  const SchedulerStats st = engine.sched().stats();
  EXPECT_EQ(st.prefix_hit_tokens, 0);
  EXPECT_EQ(st.admitted_tokens, 3 * 41);
  EXPECT_EQ(st.prefix_hit_rate(), 0.0);
  EXPECT_EQ(st.cached_blocks, 0);
  EXPECT_EQ(st.free_blocks, 64);
  EXPECT_EQ(engine.Stream(3), Generate(prompt, 3));
}

// ---------------------------------------------------------------------------------------------
// Stats.

TEST(SchedulerTest, StatsAddUp) {
  auto pool = MakePool(16);
  FakeEngine engine(pool.get(), {.max_running = 1});
  SchedulerStats st = engine.sched().stats();
  EXPECT_EQ(st.total_blocks, 16);
  EXPECT_EQ(st.free_blocks, 16);
  EXPECT_EQ(st.prefix_hit_rate(), 0.0);
  ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(5, 0), .max_new_tokens = 3}).ok());
  ASSERT_TRUE(engine.Add({.id = 2, .prompt = Tokens(9, 0), .max_new_tokens = 1}).ok());
  st = engine.sched().stats();
  EXPECT_EQ(st.waiting, 2);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.used_blocks, 0);

  engine.Step();  // 1 computes 5 tokens: 2 blocks, 3 slots unused
  st = engine.sched().stats();
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.waiting, 1);
  EXPECT_EQ(st.used_blocks, 2);
  EXPECT_EQ(st.free_blocks, 14);
  EXPECT_EQ(st.cached_blocks, 0);  // its full block is cached, but in use
  EXPECT_EQ(st.wasted_slots, 3);
  EXPECT_EQ(st.steps, 1);
  EXPECT_EQ(st.step_tokens, 5);
  EXPECT_EQ(st.last_step_tokens, 5);
  EXPECT_EQ(st.admitted_tokens, 5);

  engine.Step();
  engine.Step();  // 1 samples its third token and finishes: 7 tokens computed
  st = engine.sched().stats();
  EXPECT_FALSE(engine.sched().Contains(1));
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.cached_blocks, 1);
  EXPECT_EQ(st.free_blocks, 15);
  EXPECT_EQ(st.wasted_slots, 0);
  EXPECT_EQ(st.steps, 3);
  EXPECT_EQ(st.step_tokens, 7);
  EXPECT_EQ(st.last_step_tokens, 1);

  engine.Step();  // 2 reuses the first block of 1 (same first 4 tokens)
  st = engine.sched().stats();
  EXPECT_EQ(st.admitted_tokens, 14);
  EXPECT_EQ(st.prefix_hit_tokens, 4);
  EXPECT_DOUBLE_EQ(st.prefix_hit_rate(), 4.0 / 14.0);
  EXPECT_EQ(st.last_step_tokens, 5);
  EXPECT_FALSE(engine.sched().HasWork());  // max_new_tokens 1: done at once
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.free_blocks + st.cached_blocks, 16);
  EXPECT_EQ(st.cached_blocks, 2);  // blocks 0 and 1 of sequence 2 (tokens 0-7)
}

// ---------------------------------------------------------------------------------------------
// Contract details that are not met today.

// The last token of a chunked prompt is a prompt token, not a decode: is_decode and the step's
// prefill / decode counts say so.
TEST(SchedulerTest, LastTokenOfAChunkedPromptIsNotADecode) {
  for (const SchedulerOptions& options :
       {SchedulerOptions{.max_prefill_chunk = 8}, SchedulerOptions{.max_tokens_per_step = 8}}) {
    auto pool = MakePool(16);
    FakeEngine engine(pool.get(), options);
    ASSERT_TRUE(engine.Add({.id = 1, .prompt = Tokens(9, 0), .max_new_tokens = 2}).ok());
    EXPECT_EQ(engine.Step().num_prefill_tokens, 8);
    const StepRecord step = engine.Step();
    ASSERT_EQ(step.items.size(), 1u);
    EXPECT_EQ(step.items[0].start, 8);
    EXPECT_TRUE(step.items[0].samples);
    EXPECT_FALSE(step.items[0].is_decode) << "a prompt token marked as a decode";
    EXPECT_EQ(step.num_prefill_tokens, 1);
    EXPECT_EQ(step.num_decode_tokens, 0);
  }
}

// CheckInvariants holds between Schedule and Commit too, when the step's slots are appended but
// not yet computed.
TEST(SchedulerDeathTest, CheckInvariantsHoldsBetweenScheduleAndCommit) {
  EXPECT_EXIT(
      {
        auto pool = MakePool(8);
        Scheduler sched(pool.get(), {});
        CHECK_OK(sched.Add(1, Tokens(6, 0), 2));
        const ScheduledStep step = sched.Schedule();
        sched.CheckInvariants();
        sched.Commit(step);
        sched.CheckInvariants();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// An id finished after Schedule and added again before Commit (legal: the id is no longer in use)
// does not get the old item committed into the new sequence.
TEST(SchedulerDeathTest, IdReusedBetweenScheduleAndCommit) {
  EXPECT_EXIT(
      {
        auto pool = MakePool(8);
        Scheduler sched(pool.get(), {});
        CHECK_OK(sched.Add(1, Tokens(6, 0), 2));
        const ScheduledStep step = sched.Schedule();
        CHECK(sched.Finish(1));
        CHECK_OK(sched.Add(1, Tokens(3, 50), 2));
        sched.Commit(step);
        sched.CheckInvariants();
        const ScheduledStep next = sched.Schedule();
        CHECK(next.items.size() == 1 && next.items[0].start == 0 &&
              next.items[0].tokens.size() == 3);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(SchedulerDeathTest, MisuseIsCaught) {
  auto pool = MakePool(8);
  EXPECT_DEATH(Scheduler(pool.get(), {.max_running = 0}), "invalid scheduler options");
  EXPECT_DEATH(Scheduler(pool.get(), {.max_tokens_per_step = 0}), "invalid scheduler options");
  Scheduler sched(pool.get(), {});
  ASSERT_TRUE(sched.Add(1, Tokens(4, 0), 1).ok());
  EXPECT_DEATH(sched.AppendToken(1, 5), "before its last one was computed");
  EXPECT_DEATH(sched.AppendToken(2, 5), "unknown sequence");
  ScheduledStep step = sched.Schedule();
  EXPECT_DEATH(sched.AppendToken(1, 5), "before its last one was computed");
  sched.Commit(step);
  sched.AppendToken(1, 5);  // prompt + max_new_tokens: the most it may hold
  step = sched.Schedule();
  sched.Commit(step);
  EXPECT_DEATH(sched.AppendToken(1, 6), "grows past");
  EXPECT_THAT(sched.tokens(1), ElementsAre(0, 1, 2, 3, 5));
  // An item's sequence that finished since Schedule takes no token (and Commit skips it).
  ASSERT_TRUE(sched.Add(2, Tokens(4, 0), 3).ok());
  step = sched.Schedule();
  ASSERT_EQ(step.items.size(), 1u);
  ASSERT_TRUE(sched.Finish(2));
  sched.Commit(step);
  EXPECT_DEATH(sched.AppendToken(step.items[0], 5), "sequence 2 finished");
}

// ---------------------------------------------------------------------------------------------
// Randomized: arrivals with random priorities and shared prefixes, cancellations, a small pool.
// Every step is checked by FakeEngine; every finished stream must equal the one of a run with an
// unbounded pool and no cancellations, and everything must finish within a bounded number of
// steps.

class SchedulerStressTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SchedulerStressTest, EveryStreamMatchesAnUnboundedRun) {
  std::mt19937 rng(GetParam());
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t num_blocks = uniform(20, 40);
  const bool caching = GetParam() % 4 != 3;
  const int64_t chunks[] = {0, 0, 3, 8};
  const int64_t prefill_caps[] = {0, 0, 5, 12};
  const SchedulerOptions options{.max_running = uniform(2, 8),
                                 .max_tokens_per_step = uniform(4, 48),
                                 .max_prefill_chunk = chunks[uniform(0, 3)],
                                 .max_prefill_tokens = prefill_caps[uniform(0, 3)],
                                 .admission_reserve_blocks = uniform(0, 2)};
  SCOPED_TRACE(::testing::Message()
               << "blocks " << num_blocks << ", caching " << caching << ", max_running "
               << options.max_running << ", max_tokens_per_step " << options.max_tokens_per_step
               << ", max_prefill_chunk " << options.max_prefill_chunk << ", max_prefill_tokens "
               << options.max_prefill_tokens << ", reserve "
               << options.admission_reserve_blocks);

  std::vector<std::vector<int32_t>> templates;
  for (int t = 0; t < 3; ++t) {
    std::vector<int32_t> tokens;
    for (int64_t i = uniform(4, 24); i > 0; --i)
      tokens.push_back(static_cast<int32_t>(uniform(0, 9)));
    templates.push_back(tokens);
  }
  std::vector<Request> requests;
  for (SequenceId id = 1; id <= 120; ++id) {
    std::vector<int32_t> prompt;
    if (uniform(0, 3) > 0) prompt = templates[static_cast<size_t>(uniform(0, 2))];
    for (int64_t i = uniform(1, 12); i > 0; --i)
      prompt.push_back(static_cast<int32_t>(uniform(0, 9)));
    requests.push_back({.id = id,
                        .prompt = prompt,
                        .max_new_tokens = uniform(1, 16),
                        .priority = static_cast<int>(uniform(0, 3))});
  }
  // One that needs the whole pool, one that never fits.
  requests.insert(requests.begin() + 20, {.id = 1000,
                                          .prompt = Tokens(num_blocks * kBlockSize - 6, 0),
                                          .max_new_tokens = 6,
                                          .priority = static_cast<int>(uniform(0, 3))});
  requests.insert(
      requests.begin() + 40,
      {.id = 1001, .prompt = Tokens(num_blocks * kBlockSize - 2, 0), .max_new_tokens = 3});

  auto pool = MakePool(num_blocks, caching);
  FakeEngine engine(pool.get(), options);
  std::set<SequenceId> accepted, cancelled;
  size_t next = 0;
  int64_t steps = 0;
  constexpr int64_t kMaxSteps = 5000;
  while ((next < requests.size() || engine.sched().HasWork()) && steps < kMaxSteps) {
    // Arrivals and cancellations, each either before the step or while it runs.
    std::vector<std::function<void()>> before, during;
    for (int64_t k = uniform(0, 9) < 4 ? uniform(1, 2) : 0; k > 0 && next < requests.size(); --k) {
      const Request* r = &requests[next++];
      (uniform(0, 1) == 0 ? before : during).push_back([&engine, &accepted, r] {
        const absl::Status status = engine.Add(*r);
        if (r->id == 1001) {
          EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
        } else {
          EXPECT_TRUE(status.ok()) << status;
          accepted.insert(r->id);
        }
      });
    }
    if (engine.num_live() > 0 && uniform(0, 99) < 4) {
      const std::vector<SequenceId> ids = engine.live_ids();
      const SequenceId victim =
          ids[static_cast<size_t>(uniform(0, static_cast<int64_t>(ids.size()) - 1))];
      cancelled.insert(victim);
      (uniform(0, 1) == 0 ? before : during).push_back([&engine, victim] {
        EXPECT_TRUE(engine.Cancel(victim));
      });
    }
    for (const auto& f : before) f();
    engine.Step([&during] {
      for (const auto& f : during) f();
    });
    ++steps;
    if (HasFailure()) return;
  }
  ASSERT_FALSE(engine.sched().HasWork()) << "livelock: work left after " << steps << " steps";
  EXPECT_EQ(engine.finished().size() + cancelled.size(), accepted.size());

  // The reference: everything at once in a pool that never runs out, nothing cancelled.
  auto big_pool = MakePool(4096, caching);
  FakeEngine reference(big_pool.get(), {});
  for (const Request& r : requests) {
    if (accepted.contains(r.id)) {
      ASSERT_TRUE(reference.Add(r).ok());
    }
  }
  reference.RunUntilIdle();
  EXPECT_EQ(reference.preemptions(), 0);
  for (const Request& r : requests) {
    if (!accepted.contains(r.id)) continue;
    ASSERT_TRUE(reference.finished().contains(r.id));
    EXPECT_EQ(reference.Stream(r.id), Generate(r.prompt, r.max_new_tokens));
    if (cancelled.contains(r.id)) continue;
    ASSERT_TRUE(engine.finished().contains(r.id)) << "sequence " << r.id << " never finished";
    EXPECT_EQ(engine.Stream(r.id), reference.Stream(r.id)) << "sequence " << r.id;
  }
  const SchedulerStats st = engine.sched().stats();
  RecordProperty("steps", static_cast<int>(steps));
  RecordProperty("preemptions", static_cast<int>(st.preemptions));
  RecordProperty("prefix_hit_tokens", static_cast<int>(st.prefix_hit_tokens));
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerStressTest, ::testing::Range<uint32_t>(1, 9));

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + i;
  return v;
}

// Runs `sched` (no remote sequences left) until every sequence finished, generating with
// NextToken, finishing a sequence when it reaches `total[id]` tokens.
void RunToEnd(Scheduler& sched, std::map<SequenceId, size_t> total) {
  for (int steps = 0; sched.HasWork(); ++steps) {
    ASSERT_LT(steps, 1000);
    ScheduledStep step = sched.Schedule();
    sched.CheckInvariants();
    sched.Commit(step);
    for (const ScheduledItem& item : step.items) {
      if (!item.samples) continue;
      const auto tokens = sched.tokens(item.id);
      if (tokens.size() + 1 >= total[item.id]) {
        sched.Finish(item.id);
      } else {
        sched.AppendToken(item.id, NextToken(tokens));
      }
    }
    sched.CheckInvariants();
  }
}

// A remote prefill takes the cached prefix and blocks for the rest of the prompt at once, sits out
// the steps while a peer writes, and then decodes from the end of its prompt.
TEST(SchedulerRemotePrefillTest, ReservesThenJoinsTheBatchDecoding) {
  auto pool = MakePool(32);
  Scheduler sched(pool.get(), {.max_running = 4, .max_tokens_per_step = 64});
  // A first sequence computes and caches the shared prefix (3 full blocks).
  ASSERT_TRUE(sched.Add(1, Range(100, 14), 3).ok());
  RunToEnd(sched, {{1, 17}});
  ASSERT_GE(pool->num_cached(), 3);

  std::vector<int32_t> prompt = Range(100, 12);  // the cached 3 blocks
  for (int32_t t : Range(500, 9)) prompt.push_back(t);  // + 9 new tokens
  auto plan = sched.AddRemotePrefill(2, prompt, 5);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cached_tokens, 12);
  ASSERT_EQ(plan->blocks.size(), 6u);  // 21 tokens
  EXPECT_EQ(sched.stats().remote_prefills, 1);
  EXPECT_EQ(sched.load().remote_prefills, 1);
  sched.CheckInvariants();
  // While the peer writes, nothing of it is scheduled.
  EXPECT_THAT(sched.Schedule().items, IsEmpty());

  sched.CompleteRemotePrefill(2);
  sched.AppendToken(2, NextToken(prompt));  // the peer's first token
  sched.CheckInvariants();
  ScheduledStep step = sched.Schedule();
  ASSERT_EQ(step.items.size(), 1u);
  EXPECT_EQ(step.items[0].start, 21);
  EXPECT_TRUE(step.items[0].is_decode);
  EXPECT_THAT(step.items[0].block_table.first(6), ElementsAreArray(plan->blocks));
  sched.Commit(step);
  // Its prompt's full blocks are now in the prefix cache too.
  std::vector<BlockHash> hashes = HashFullBlocks(pool->model_hash(), prompt, kBlockSize);
  EXPECT_EQ(pool->CachedPrefixLength(hashes), 5);
  sched.Finish(2);
  sched.CheckInvariants();
  EXPECT_EQ(pool->num_used(), 0);
}

TEST(SchedulerRemotePrefillTest, RefusedWhenTheBatchOrThePoolIsFull) {
  auto pool = MakePool(6);  // 24 slots
  Scheduler sched(pool.get(), {.max_running = 1, .max_tokens_per_step = 64});
  ASSERT_TRUE(sched.AddRemotePrefill(1, Range(0, 8), 4).ok());
  auto full_batch = sched.AddRemotePrefill(2, Range(50, 4), 4);
  EXPECT_EQ(full_batch.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(sched.Contains(2));
  Scheduler other(pool.get(), {.max_running = 4, .max_tokens_per_step = 64});
  auto no_blocks = other.AddRemotePrefill(3, Range(70, 20), 2);  // 5 blocks; 4 are free
  EXPECT_EQ(no_blocks.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(other.Contains(3));
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_TRUE(sched.Finish(1));
  EXPECT_EQ(pool->num_used(), 0);
}

// When the peer fails, the sequence is prefilled here and ends as it would have anyway.
TEST(SchedulerRemotePrefillTest, FallBackPrefillsLocally) {
  auto pool = MakePool(16);
  Scheduler sched(pool.get(), {.max_running = 4, .max_tokens_per_step = 64});
  const std::vector<int32_t> prompt = Range(7, 10);
  ASSERT_TRUE(sched.AddRemotePrefill(1, prompt, 6).ok());
  sched.FallBackToLocalPrefill(1);
  sched.CheckInvariants();
  EXPECT_EQ(pool->num_used(), 0);
  EXPECT_EQ(sched.stats().waiting, 1);
  ScheduledStep step = sched.Schedule();
  ASSERT_EQ(step.items.size(), 1u);
  EXPECT_EQ(step.items[0].start, 0);
  EXPECT_EQ(step.items[0].tokens.size(), 10u);
  sched.Commit(step);
  sched.AppendToken(1, NextToken(prompt));
  RunToEnd(sched, {{1, 16}});
}

// Blocks a peer is writing into are never taken by a preemption: a running sequence that cannot
// grow preempts itself instead.
TEST(SchedulerRemotePrefillTest, RemoteBlocksAreNeverPreempted) {
  auto pool = MakePool(4);  // 16 slots
  Scheduler sched(pool.get(),
                  {.max_running = 4, .max_tokens_per_step = 64, .admission_reserve_blocks = 0});
  ASSERT_TRUE(sched.Add(1, Range(0, 4), 8).ok());
  ScheduledStep step = sched.Schedule();
  sched.Commit(step);
  auto plan = sched.AddRemotePrefill(2, Range(40, 12), 2);  // the other 3 blocks
  ASSERT_TRUE(plan.ok()) << plan.status();
  sched.AppendToken(1, 9);  // sequence 1 now needs a second block: none is free
  step = sched.Schedule();
  EXPECT_THAT(step.preempted, ElementsAre(1));
  EXPECT_THAT(step.items, IsEmpty());
  sched.CheckInvariants();
  EXPECT_EQ(pool->num_used(), 3);
  sched.Finish(2);
  step = sched.Schedule();
  // Sequence 1 is recomputed: its full first block comes from the prefix cache, its token anew.
  ASSERT_EQ(step.items.size(), 1u);
  EXPECT_EQ(step.items[0].id, 1u);
  EXPECT_EQ(step.items[0].start, 4);
  EXPECT_EQ(step.items[0].tokens.size(), 1u);
}

// The load numbers a worker reports: prefill work ahead and decode context.
TEST(SchedulerStatsTest, QueuedPrefillAndActiveDecodeTokens) {
  auto pool = MakePool(32);
  Scheduler sched(pool.get(), {.max_running = 4, .max_tokens_per_step = 8});
  ASSERT_TRUE(sched.Add(1, Range(0, 6), 4).ok());
  ASSERT_TRUE(sched.Add(2, Range(100, 10), 4).ok());
  EXPECT_EQ(sched.stats().queued_prefill_tokens, 16);
  EXPECT_EQ(sched.stats().prompt_tokens, 16);
  EXPECT_EQ(sched.stats().active_decode_tokens, 0);
  ScheduledStep step = sched.Schedule();  // 1's 6 tokens and 2 of 2's
  sched.Commit(step);
  sched.AppendToken(1, 7);
  EXPECT_EQ(sched.stats().queued_prefill_tokens, 8);
  EXPECT_EQ(sched.stats().active_decode_tokens, 7);
  EXPECT_EQ(sched.load().queued_prefill_tokens, 8);
  EXPECT_EQ(sched.load().active_decode_tokens, 7);
  EXPECT_EQ(sched.load().running, 2);
}

// AdvanceDecode (for the simulator) against the steps it stands for: after `k` rounds of
// Schedule, Commit and AppendToken, two schedulers that started alike hold the same tokens,
// counters, block counts and cached hashes, whichever way they got there.
TEST(SchedulerAdvanceDecodeTest, EqualsThatManyDecodeSteps) {
  auto token = [](SequenceId id, int64_t position) {
    return static_cast<int32_t>((id * 7919 + static_cast<uint64_t>(position) * 104729) % 50000);
  };
  for (int64_t k : {1, 3, 4, 9, 37}) {
    auto pool_a = MakePool(200);
    auto pool_b = MakePool(200);
    Scheduler a(pool_a.get(), {.max_running = 8, .max_tokens_per_step = 64});
    Scheduler b(pool_b.get(), {.max_running = 8, .max_tokens_per_step = 64});
    for (Scheduler* s : {&a, &b}) {
      // Two share their first 8 tokens (2 blocks); lengths straddle block boundaries.
      std::vector<int32_t> shared = Range(0, 8);
      std::vector<int32_t> p2 = shared;
      for (int32_t t : Range(500, 5)) p2.push_back(t);
      ASSERT_TRUE(s->Add(1, Range(0, 11), 100).ok());
      ASSERT_TRUE(s->Add(2, p2, 100).ok());
      ASSERT_TRUE(s->Add(3, Range(900, 4), 100, /*priority=*/1).ok());
      // Prefill all (one step fits them) and give each its first token.
      ScheduledStep step = s->Schedule();
      s->Commit(step);
      for (const ScheduledItem& item : step.items) {
        ASSERT_TRUE(item.samples);
        s->AppendToken(item.id, token(item.id, static_cast<int64_t>(s->tokens(item.id).size())));
      }
    }
    for (int64_t r = 0; r < k; ++r) {
      ScheduledStep step = a.Schedule();
      ASSERT_EQ(step.items.size(), 3u);
      ASSERT_EQ(step.num_decode_tokens, 3);
      a.Commit(step);
      for (const ScheduledItem& item : step.items) {
        a.AppendToken(item.id, token(item.id, static_cast<int64_t>(a.tokens(item.id).size())));
      }
    }
    ASSERT_TRUE(b.AdvanceDecode(k, token).ok());
    a.CheckInvariants();
    b.CheckInvariants();
    for (SequenceId id : {1, 2, 3}) {
      EXPECT_THAT(b.tokens(id), ElementsAreArray(a.tokens(id))) << "k " << k << " id " << id;
    }
    const SchedulerStats sa = a.stats(), sb = b.stats();
    EXPECT_EQ(sb.steps, sa.steps);
    EXPECT_EQ(sb.step_tokens, sa.step_tokens);
    EXPECT_EQ(sb.last_step_tokens, sa.last_step_tokens);
    EXPECT_EQ(sb.free_blocks, sa.free_blocks);
    EXPECT_EQ(sb.cached_blocks, sa.cached_blocks);
    EXPECT_EQ(sb.used_blocks, sa.used_blocks);
    EXPECT_EQ(sb.active_decode_tokens, sa.active_decode_tokens);
    EXPECT_EQ(sb.wasted_slots, sa.wasted_slots);
    EXPECT_EQ(pool_b->Snapshot().hashes, pool_a->Snapshot().hashes) << "k " << k;
    // And the next ordinary step is the same on both.
    const ScheduledStep na = a.Schedule(), nb = b.Schedule();
    ASSERT_EQ(na.items.size(), nb.items.size());
    for (size_t i = 0; i < na.items.size(); ++i) {
      EXPECT_EQ(nb.items[i].id, na.items[i].id);
      EXPECT_EQ(nb.items[i].start, na.items[i].start);
      EXPECT_THAT(nb.items[i].tokens, ElementsAreArray(na.items[i].tokens));
    }
  }
}

TEST(SchedulerAdvanceDecodeTest, RefusesWhatAStepWouldDoDifferently) {
  auto token = [](SequenceId, int64_t) { return 7; };
  auto pool = MakePool(8);  // 32 slots
  Scheduler sched(pool.get(), {.max_running = 4, .max_tokens_per_step = 16});
  ASSERT_TRUE(sched.Add(1, Range(0, 6), 20).ok());
  // Waiting (and then prefilling) sequences: a step would compute their prompts.
  EXPECT_EQ(sched.AdvanceDecode(2, token).code(), absl::StatusCode::kFailedPrecondition);
  ScheduledStep step = sched.Schedule();
  EXPECT_EQ(sched.AdvanceDecode(2, token).code(), absl::StatusCode::kFailedPrecondition);
  sched.Commit(step);
  sched.AppendToken(1, 7);
  // 7 tokens in 2 blocks; 21 more would need 5 more blocks of the 6 free, but the sequence may
  // grow to 26 tokens only.
  EXPECT_EQ(sched.AdvanceDecode(20, token).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sched.Add(2, Range(100, 12), 20).ok());
  step = sched.Schedule();
  sched.Commit(step);
  sched.AppendToken(1, 7);
  sched.AppendToken(2, 7);
  // 1 has 8 tokens in 2 blocks, 2 has 13 in 3; 3 are free. 10 steps need 3 + 3 more blocks, 4
  // steps 1 + 1.
  const SchedulerStats before = sched.stats();
  EXPECT_EQ(sched.AdvanceDecode(10, token).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sched.stats().steps, before.steps);  // nothing changed
  EXPECT_EQ(sched.tokens(1).size(), 8u);
  EXPECT_TRUE(sched.AdvanceDecode(4, token).ok());
  EXPECT_EQ(sched.tokens(1).size(), 12u);
  EXPECT_EQ(sched.tokens(2).size(), 17u);
  EXPECT_EQ(sched.AdvanceDecode(-1, token).code(), absl::StatusCode::kInvalidArgument);
  sched.CheckInvariants();
}

}  // namespace
}  // namespace tandem
