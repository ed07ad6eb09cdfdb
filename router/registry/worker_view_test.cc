#include "router/registry/worker_view.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/logging.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/block_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/placement/placement.h"
#include "router/registry/load_ledger.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

constexpr int32_t kBlockSize = 16;

// ----------------------------------------------------------------------------------------------
// Messages as a worker sends them.

v1::Snapshot MakeSnapshot(const std::vector<BlockHash>& cached, uint64_t last_event_id,
                          v1::WorkerRole role = v1::ROLE_DECODE) {
  v1::Snapshot s;
  s.set_worker_id("decode-0");
  s.set_role(role);
  s.set_model_id("SmolLM2-135M-Instruct");
  s.set_block_size(kBlockSize);
  s.set_total_blocks(1000);
  s.set_free_blocks(900);
  s.set_max_context(8192);
  s.set_max_running(32);
  s.set_max_tokens_per_step(256);
  for (BlockHash h : cached) s.add_cached_block_hashes(h);
  s.set_last_event_id(last_event_id);
  v1::KvPoolDescriptor* pool = s.mutable_kv_pool();
  pool->set_transport("inproc");
  pool->set_transport_address("addr-0");
  pool->set_pool_epoch(3);
  v1::MemoryRegion* region = pool->add_regions();
  region->set_base_address(0x1000);
  region->set_length(1 << 20);
  region->set_memory_type(v1::MEMORY_TYPE_HOST);
  pool->mutable_layout()->set_num_layers(30);
  pool->mutable_layout()->set_block_size(kBlockSize);
  v1::LoadSample* load = s.mutable_load();
  load->set_timestamp_us(111);
  load->set_running_seqs(3);
  load->set_waiting_seqs(1);
  load->set_free_blocks(900);
  load->set_used_blocks(100);
  load->set_cached_blocks(40);
  load->set_queued_prefill_tokens(512);
  load->set_active_decode_tokens(2048);
  s.set_engine("cpu-avx2");
  s.set_version("0.1.0");
  return s;
}

v1::WorkerStateUpdate SnapshotUpdate(const v1::Snapshot& snapshot) {
  v1::WorkerStateUpdate u;
  *u.mutable_snapshot() = snapshot;
  return u;
}

v1::KvEvent Stored(uint64_t id, const std::vector<BlockHash>& hashes,
                   std::optional<BlockHash> parent = std::nullopt) {
  v1::KvEvent e;
  e.set_event_id(id);
  v1::BlocksStored* stored = e.mutable_stored();
  if (parent) stored->set_parent_hash(*parent);
  for (BlockHash h : hashes) stored->add_block_hashes(h);
  return e;
}

v1::KvEvent Removed(uint64_t id, const std::vector<BlockHash>& hashes) {
  v1::KvEvent e;
  e.set_event_id(id);
  for (BlockHash h : hashes) e.mutable_removed()->add_block_hashes(h);
  return e;
}

v1::KvEvent Cleared(uint64_t id) {
  v1::KvEvent e;
  e.set_event_id(id);
  e.mutable_cleared();
  return e;
}

v1::WorkerStateUpdate Events(const std::vector<v1::KvEvent>& events) {
  v1::WorkerStateUpdate u;
  for (const v1::KvEvent& e : events) *u.mutable_kv_events()->add_events() = e;
  return u;
}

v1::WorkerStateUpdate Load(uint32_t running, uint32_t waiting, uint64_t queued_tokens) {
  v1::WorkerStateUpdate u;
  v1::LoadSample* load = u.mutable_load();
  load->set_timestamp_us(222);
  load->set_running_seqs(running);
  load->set_waiting_seqs(waiting);
  load->set_free_blocks(700);
  load->set_used_blocks(300);
  load->set_cached_blocks(10);
  load->set_queued_prefill_tokens(queued_tokens);
  load->set_active_decode_tokens(4096);
  v1::StepTiming* step = load->add_recent_steps();
  step->set_batch_size(4);
  step->set_duration_us(1500);
  load->set_prefix_hit_tokens(77);
  load->set_prompt_tokens(1000);
  load->set_step_elapsed_us(250000);
  return u;
}

// Hash chain of a prompt of `blocks` full blocks whose tokens start at `first_token`.
std::vector<BlockHash> Chain(int64_t blocks, int32_t first_token) {
  std::vector<int32_t> tokens(static_cast<size_t>(blocks * kBlockSize));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + static_cast<int32_t>(i);
  return HashFullBlocks(ModelIdHash("SmolLM2-135M-Instruct"), tokens, kBlockSize);
}

WorkerView ViewAfterSnapshot(const std::vector<BlockHash>& cached, uint64_t last_event_id) {
  WorkerView view;
  CHECK_OK(view.Apply(SnapshotUpdate(MakeSnapshot(cached, last_event_id))));
  return view;
}

// ----------------------------------------------------------------------------------------------

TEST(WorkerViewTest, UpdatesBeforeTheFirstSnapshotFail) {
  WorkerView view;
  EXPECT_FALSE(view.has_snapshot());
  EXPECT_FALSE(view.ready());
  EXPECT_EQ(view.Apply(Events({Stored(1, {1, 2})})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(view.Apply(Load(1, 0, 0)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(view.cached_hashes(), IsEmpty());
  EXPECT_EQ(view.load().running_seqs, 0);
  EXPECT_FALSE(ToCandidate(view).has_value());
  // An empty update (a case this build does not know) is ignored.
  EXPECT_TRUE(view.Apply(v1::WorkerStateUpdate()).ok());
}

TEST(WorkerViewTest, SnapshotGivesEverything) {
  const std::vector<BlockHash> cached = Chain(4, 0);
  const v1::Snapshot snapshot = MakeSnapshot(cached, 17);
  WorkerView view;
  ASSERT_TRUE(view.Apply(SnapshotUpdate(snapshot)).ok());
  EXPECT_TRUE(view.has_snapshot());
  EXPECT_FALSE(view.stale());
  EXPECT_TRUE(view.ready());
  EXPECT_EQ(view.worker_id(), "decode-0");
  EXPECT_EQ(view.role(), v1::ROLE_DECODE);
  EXPECT_EQ(view.model_id(), "SmolLM2-135M-Instruct");
  EXPECT_EQ(view.block_size(), kBlockSize);
  EXPECT_EQ(view.total_blocks(), 1000);
  EXPECT_EQ(view.free_blocks(), 900);
  EXPECT_EQ(view.max_context(), 8192);
  EXPECT_EQ(view.max_running(), 32);
  EXPECT_EQ(view.engine(), "cpu-avx2");
  EXPECT_EQ(view.version(), "0.1.0");
  EXPECT_EQ(view.last_event_id(), 17u);
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAreArray(cached));
  EXPECT_EQ(view.kv_pool().SerializeAsString(), snapshot.kv_pool().SerializeAsString());
  EXPECT_EQ(view.kv_pool().transport(), "inproc");
  EXPECT_EQ(view.kv_pool().pool_epoch(), 3u);
  const WorkerLoad& load = view.load();
  EXPECT_EQ(load.timestamp_us, 111u);
  EXPECT_EQ(load.running_seqs, 3);
  EXPECT_EQ(load.waiting_seqs, 1);
  EXPECT_EQ(load.used_blocks, 100);
  EXPECT_EQ(load.cached_blocks, 40);
  EXPECT_EQ(load.queued_prefill_tokens, 512);
  EXPECT_EQ(load.active_decode_tokens, 2048);
  EXPECT_EQ(view.snapshots_applied(), 1);
  EXPECT_EQ(view.events_applied(), 0);
}

TEST(WorkerViewTest, SnapshotFreeBlocksFieldWinsOverItsLoad) {
  v1::Snapshot snapshot = MakeSnapshot({}, 0);
  snapshot.set_free_blocks(123);
  snapshot.mutable_load()->set_free_blocks(456);
  WorkerView view;
  ASSERT_TRUE(view.Apply(SnapshotUpdate(snapshot)).ok());
  EXPECT_EQ(view.free_blocks(), 123);
}

TEST(WorkerViewTest, EventsReplayToTheExpectedCachedSet) {
  const std::vector<BlockHash> a = Chain(6, 0);
  const std::vector<BlockHash> b = Chain(3, 5000);
  WorkerView view = ViewAfterSnapshot({a[0], a[1]}, 5);
  ASSERT_TRUE(
      view.Apply(Events({Stored(6, {a[2], a[3]}, a[1]), Stored(7, {b[0], b[1], b[2]})})).ok());
  ASSERT_TRUE(
      view.Apply(Events({Removed(8, {a[3], b[2]}), Stored(9, {a[3], a[4], a[5]}, a[2])})).ok());
  EXPECT_TRUE(view.ready());
  EXPECT_EQ(view.last_event_id(), 9u);
  EXPECT_EQ(view.events_applied(), 4);
  EXPECT_THAT(view.cached_hashes(),
              UnorderedElementsAre(a[0], a[1], a[2], a[3], a[4], a[5], b[0], b[1]));
  EXPECT_EQ(view.CachedPrefixLength(a), 6);
  EXPECT_EQ(view.CachedPrefixTokens(a), 6 * kBlockSize);
  EXPECT_EQ(view.CachedPrefixLength(b), 2);
  // A longer prompt sharing a's first 3 blocks only.
  std::vector<BlockHash> c = {a[0], a[1], a[2]};
  for (BlockHash h : Chain(2, 9000)) c.push_back(h);
  EXPECT_EQ(view.CachedPrefixLength(c), 3);
  EXPECT_EQ(view.CachedPrefixLength({}), 0);
  // An empty batch changes nothing.
  ASSERT_TRUE(view.Apply(Events({})).ok());
  EXPECT_EQ(view.last_event_id(), 9u);
}

TEST(WorkerViewTest, ClearedForgetsEveryHash) {
  const std::vector<BlockHash> a = Chain(4, 0);
  WorkerView view = ViewAfterSnapshot(a, 0);
  ASSERT_TRUE(view.Apply(Events({Cleared(1)})).ok());
  EXPECT_THAT(view.cached_hashes(), IsEmpty());
  EXPECT_EQ(view.CachedPrefixLength(a), 0);
  ASSERT_TRUE(view.Apply(Events({Stored(2, {a[0]})})).ok());
  EXPECT_EQ(view.CachedPrefixLength(a), 1);
}

TEST(WorkerViewTest, RemovingUnknownHashesOrStoringKnownOnesIsHarmless) {
  const std::vector<BlockHash> a = Chain(3, 0);
  WorkerView view = ViewAfterSnapshot({a[0], a[1]}, 10);
  ASSERT_TRUE(view.Apply(Events({Removed(11, {0xDEAD, 0xBEEF}), Stored(12, {a[0], a[1]})})).ok());
  EXPECT_TRUE(view.ready());
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(a[0], a[1]));
  EXPECT_EQ(view.last_event_id(), 12u);
}

TEST(WorkerViewTest, GapMakesTheViewStaleUntilTheNextSnapshot) {
  const std::vector<BlockHash> a = Chain(4, 0);
  WorkerView view = ViewAfterSnapshot({a[0]}, 5);
  absl::Status s = view.Apply(Events({Stored(7, {a[1]})}));  // 6 is missing
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("missed events, re-subscribe"));
  EXPECT_TRUE(view.stale());
  EXPECT_FALSE(view.ready());
  EXPECT_EQ(view.resyncs_needed(), 1);
  EXPECT_EQ(view.last_event_id(), 5u);
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(a[0]));  // kept, approximate
  // While stale even the right next event and load samples are refused.
  EXPECT_EQ(view.Apply(Events({Stored(6, {a[1]})})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(view.Apply(Load(9, 9, 9)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(view.load().running_seqs, 3);
  EXPECT_EQ(view.resyncs_needed(), 1);
  std::optional<placement::WorkerCandidate> candidate = ToCandidate(view);
  ASSERT_TRUE(candidate.has_value());
  EXPECT_FALSE(candidate->healthy);
  // A new snapshot heals it and replaces the hashes.
  ASSERT_TRUE(view.Apply(SnapshotUpdate(MakeSnapshot({a[2], a[3]}, 40))).ok());
  EXPECT_TRUE(view.ready());
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(a[2], a[3]));
  EXPECT_EQ(view.last_event_id(), 40u);
  EXPECT_TRUE(view.Apply(Events({Removed(41, {a[2]})})).ok());
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(a[3]));
  EXPECT_TRUE(ToCandidate(view)->healthy);
}

TEST(WorkerViewTest, EveryKindOfOutOfOrderEventIsAGap) {
  for (uint64_t bad_id : {uint64_t{0}, uint64_t{4}, uint64_t{5}, uint64_t{7}, uint64_t{1000}}) {
    WorkerView view = ViewAfterSnapshot({}, 5);
    EXPECT_EQ(view.Apply(Events({Stored(bad_id, {1})})).code(),
              absl::StatusCode::kFailedPrecondition)
        << bad_id;
    EXPECT_TRUE(view.stale()) << bad_id;
    EXPECT_THAT(view.cached_hashes(), IsEmpty()) << bad_id;
  }
}

TEST(WorkerViewTest, EventsBeforeAGapInTheSameBatchAreApplied) {
  WorkerView view = ViewAfterSnapshot({}, 0);
  EXPECT_EQ(view.Apply(Events({Stored(1, {10}), Stored(2, {20}), Stored(4, {40})})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(view.stale());
  EXPECT_EQ(view.last_event_id(), 2u);
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(BlockHash{10}, BlockHash{20}));
}

TEST(WorkerViewTest, EventOfUnknownKindMakesTheViewStale) {
  WorkerView view = ViewAfterSnapshot({}, 3);
  // An event with no kind set.
  v1::KvEvent bare;
  bare.set_event_id(4);
  EXPECT_EQ(view.Apply(Events({bare})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(view.stale());

  // An event from a newer worker, with a kind (field 15) this build does not know.
  view = ViewAfterSnapshot({}, 3);
  const std::string wire = std::string("\x08\x04", 2) + std::string("\x7A\x00", 2);
  v1::KvEvent newer;
  ASSERT_TRUE(newer.ParseFromString(wire));
  EXPECT_EQ(newer.event_id(), 4u);
  EXPECT_EQ(newer.kind_case(), v1::KvEvent::KIND_NOT_SET);
  absl::Status s = view.Apply(Events({Stored(4, {1}), newer}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("re-subscribe"));
  EXPECT_TRUE(view.stale());
}

TEST(WorkerViewTest, UpdateOfUnknownCaseIsIgnored) {
  WorkerView view = ViewAfterSnapshot({1, 2}, 3);
  // Field 9 of WorkerStateUpdate, length-delimited and empty: a case this build does not know.
  v1::WorkerStateUpdate newer;
  ASSERT_TRUE(newer.ParseFromString(std::string("\x4A\x00", 2)));
  EXPECT_EQ(newer.update_case(), v1::WorkerStateUpdate::UPDATE_NOT_SET);
  EXPECT_TRUE(view.Apply(newer).ok());
  EXPECT_TRUE(view.ready());
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(BlockHash{1}, BlockHash{2}));
}

TEST(WorkerViewTest, InvalidSnapshotMakesTheViewStale) {
  WorkerView view = ViewAfterSnapshot({1}, 3);
  v1::Snapshot bad = MakeSnapshot({2}, 9);
  bad.set_block_size(0);
  EXPECT_EQ(view.Apply(SnapshotUpdate(bad)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(view.stale());
  EXPECT_THAT(view.cached_hashes(), UnorderedElementsAre(1));  // nothing replaced
  EXPECT_EQ(view.last_event_id(), 3u);
  EXPECT_TRUE(view.Apply(SnapshotUpdate(MakeSnapshot({2}, 9))).ok());
  EXPECT_TRUE(view.ready());
  // An invalid first snapshot: still no snapshot.
  WorkerView fresh;
  EXPECT_EQ(fresh.Apply(SnapshotUpdate(bad)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fresh.has_snapshot());
  EXPECT_FALSE(fresh.ready());
}

TEST(WorkerViewTest, WorkerRestartStartsEventIdsAgain) {
  WorkerView view = ViewAfterSnapshot({1, 2, 3}, 500);
  ASSERT_TRUE(view.Apply(SnapshotUpdate(MakeSnapshot({}, 0))).ok());
  EXPECT_THAT(view.cached_hashes(), IsEmpty());
  ASSERT_TRUE(view.Apply(Events({Stored(1, {7})})).ok());
  EXPECT_EQ(view.last_event_id(), 1u);
  EXPECT_EQ(view.snapshots_applied(), 2);
}

TEST(WorkerViewTest, LoadSampleReplacesTheLoad) {
  WorkerView view = ViewAfterSnapshot({}, 0);
  ASSERT_TRUE(view.Apply(Load(5, 2, 3000)).ok());
  const WorkerLoad& load = view.load();
  EXPECT_EQ(load.timestamp_us, 222u);
  EXPECT_EQ(load.running_seqs, 5);
  EXPECT_EQ(load.waiting_seqs, 2);
  EXPECT_EQ(load.free_blocks, 700);
  EXPECT_EQ(load.used_blocks, 300);
  EXPECT_EQ(load.cached_blocks, 10);
  EXPECT_EQ(load.queued_prefill_tokens, 3000);
  EXPECT_EQ(load.active_decode_tokens, 4096);
  EXPECT_EQ(load.step_elapsed_us, 250000);
  EXPECT_EQ(view.free_blocks(), 700);
  ASSERT_EQ(view.last_load_sample().recent_steps_size(), 1);
  EXPECT_EQ(view.last_load_sample().recent_steps(0).duration_us(), 1500u);
  EXPECT_EQ(view.last_load_sample().prefix_hit_tokens(), 77u);
  // Load samples leave the cache and event ids alone.
  EXPECT_EQ(view.last_event_id(), 0u);
  EXPECT_TRUE(view.Apply(Events({Stored(1, {1})})).ok());
  // Nonsense counters are capped, never negative.
  ASSERT_TRUE(view.Apply(Load(1, 1, ~uint64_t{0})).ok());
  EXPECT_GT(view.load().queued_prefill_tokens, int64_t{1} << 40);
}

TEST(WorkerViewTest, TheQueueByPriorityIsKeptWhenItAddsUpAndIsOrdered) {
  WorkerView view = ViewAfterSnapshot({}, 0);
  auto with_classes = [](std::vector<std::array<int64_t, 3>> classes, uint64_t queued) {
    v1::WorkerStateUpdate u = Load(1, 2, queued);
    for (const auto& [priority, tokens, prompts] : classes) {
      v1::QueuedClass* c = u.mutable_load()->add_queued_by_priority();
      c->set_priority(static_cast<int32_t>(priority));
      c->set_tokens(static_cast<uint64_t>(tokens));
      c->set_prompts(static_cast<uint32_t>(prompts));
    }
    return u;
  };
  ASSERT_TRUE(view.Apply(with_classes({{3, 100, 1}, {0, 2900, 2}}, 3000)).ok());
  ASSERT_EQ(view.load().queued_by_priority.size(), 2u);
  EXPECT_EQ(view.load().queued_by_priority[0].priority, 3);
  EXPECT_EQ(view.load().queued_by_priority[0].tokens, 100);
  EXPECT_EQ(view.load().queued_by_priority[0].prompts, 1);
  EXPECT_EQ(view.load().queued_by_priority[1].priority, 0);
  EXPECT_EQ(view.load().queued_by_priority[1].tokens, 2900);
  std::optional<placement::WorkerCandidate> candidate = ToCandidate(view);
  ASSERT_TRUE(candidate.has_value());
  ASSERT_EQ(candidate->slo.queued_by_priority.size(), 2u);
  EXPECT_EQ(candidate->slo.queued_by_priority[1].prompts, 2);
  // Out of order, a class twice, or not adding up to the queue: not known by class (every
  // queued token then counts for every class), never wrong by class.
  for (const auto& classes : std::vector<std::vector<std::array<int64_t, 3>>>{
           {{0, 2900, 2}, {3, 100, 1}}, {{3, 100, 1}, {3, 2900, 2}}, {{3, 100, 1}, {0, 2000, 2}}}) {
    ASSERT_TRUE(view.Apply(with_classes(classes, 3000)).ok());
    EXPECT_THAT(view.load().queued_by_priority, IsEmpty());
    EXPECT_EQ(view.load().queued_prefill_tokens, 3000);
  }
}

TEST(WorkerViewTest, MirrorsARealBlockPool) {
  const KvLayout layout = {.num_blocks = 24,
                           .num_layers = 1,
                           .block_size = kBlockSize,
                           .num_kv_heads = 1,
                           .head_dim = 2};
  absl::StatusOr<std::unique_ptr<BlockPool>> created =
      BlockPool::Create(layout, {.model_id = "SmolLM2-135M-Instruct"});
  ASSERT_TRUE(created.ok()) << created.status();
  BlockPool& pool = **created;
  std::vector<v1::KvEvent> pending;
  int removed = 0, cleared = 0;
  pool.set_event_listener([&](const KvEvent& e) {
    removed += e.kind == KvEvent::Kind::kRemoved;
    cleared += e.kind == KvEvent::Kind::kCleared;
    switch (e.kind) {
      case KvEvent::Kind::kStored:
        pending.push_back(Stored(e.event_id, e.hashes, e.parent));
        break;
      case KvEvent::Kind::kRemoved:
        pending.push_back(Removed(e.event_id, e.hashes));
        break;
      case KvEvent::Kind::kCleared:
        pending.push_back(Cleared(e.event_id));
        break;
    }
  });

  std::mt19937 rng(1234);
  // Warm up, then subscribe from a snapshot taken mid-way.
  auto random_work = [&](int steps) {
    for (int step = 0; step < steps; ++step) {
      const int choice = static_cast<int>(rng() % 10);
      if (choice == 0) {
        pool.ClearCache();
        continue;
      }
      // A prompt from one of 6 families, 1..5 blocks long: families share prefixes.
      const int64_t blocks = 1 + static_cast<int64_t>(rng() % 5);
      const std::vector<BlockHash> chain = Chain(blocks, 100000 * static_cast<int32_t>(rng() % 6));
      std::vector<int32_t> held = pool.AcquirePrefix(chain);
      const int64_t missing = blocks - static_cast<int64_t>(held.size());
      absl::StatusOr<std::vector<int32_t>> fresh = pool.Allocate(missing);
      if (fresh.ok()) {
        const size_t start = held.size();
        std::optional<BlockHash> parent =
            start == 0 ? std::nullopt : std::optional<BlockHash>(chain[start - 1]);
        pool.Register(*fresh, absl::MakeSpan(chain).subspan(start), parent);
        held.insert(held.end(), fresh->begin(), fresh->end());
      }
      std::reverse(held.begin(), held.end());
      pool.Release(held);
    }
  };
  random_work(50);
  const KvCacheSnapshot start = pool.Snapshot();
  pending.clear();
  WorkerView view;
  ASSERT_TRUE(view.Apply(SnapshotUpdate(MakeSnapshot(start.hashes, start.last_event_id))).ok());
  for (int round = 0; round < 40; ++round) {
    random_work(1 + static_cast<int>(rng() % 6));
    // Send what piled up in one batch.
    ASSERT_TRUE(view.Apply(Events(pending)).ok()) << "round " << round;
    pending.clear();
    const KvCacheSnapshot now = pool.Snapshot();
    ASSERT_EQ(view.last_event_id(), now.last_event_id);
    ASSERT_THAT(view.cached_hashes(), UnorderedElementsAreArray(now.hashes)) << "round " << round;
  }
  EXPECT_GT(view.events_applied(), 40);
  // The run covered every kind of event.
  EXPECT_GT(removed, 0);
  EXPECT_GT(cleared, 0);
}

// ----------------------------------------------------------------------------------------------
// ToCandidate, and placement over real views.

TEST(ToCandidateTest, MapsRoleLoadAndCache) {
  const struct {
    v1::WorkerRole role;
    std::optional<placement::Role> expected;
  } cases[] = {
      {v1::ROLE_PREFILL, placement::Role::kPrefill},   {v1::ROLE_DECODE, placement::Role::kDecode},
      {v1::ROLE_BOTH, placement::Role::kBoth},         {v1::ROLE_UNSPECIFIED, std::nullopt},
      {static_cast<v1::WorkerRole>(42), std::nullopt},  // a role from a newer worker
  };
  for (const auto& c : cases) {
    WorkerView view;
    ASSERT_TRUE(view.Apply(SnapshotUpdate(MakeSnapshot({1, 2}, 0, c.role))).ok());
    std::optional<placement::WorkerCandidate> candidate = ToCandidate(view);
    ASSERT_EQ(candidate.has_value(), c.expected.has_value()) << c.role;
    if (!candidate) continue;
    EXPECT_EQ(candidate->role, *c.expected);
    EXPECT_EQ(candidate->id, "decode-0");
    EXPECT_TRUE(candidate->healthy);
    EXPECT_EQ(candidate->max_running, 32);
    EXPECT_EQ(candidate->running_seqs, 3);
    EXPECT_EQ(candidate->waiting_seqs, 1);
    EXPECT_EQ(candidate->queued_prefill_tokens, 512);
    EXPECT_EQ(candidate->placed_sequences, 0);  // the router's own: LoadLedger::Apply
    EXPECT_EQ(candidate->slo.max_tokens_per_step, 256);
    EXPECT_EQ(candidate->cached_hashes, &view.cached_hashes());
  }
}

// A worker that says it is draining (in a sample, or in the snapshot of a new stream) is no
// candidate to place on until a sample says otherwise; its view stays current meanwhile.
TEST(ToCandidateTest, ADrainingWorkerIsNotHealthy) {
  WorkerView view = ViewAfterSnapshot({1, 2}, 0);
  EXPECT_FALSE(view.draining());
  v1::WorkerStateUpdate draining = Load(2, 0, 0);
  draining.mutable_load()->set_draining(true);
  ASSERT_TRUE(view.Apply(draining).ok());
  EXPECT_TRUE(view.draining());
  EXPECT_TRUE(view.ready());
  ASSERT_TRUE(ToCandidate(view).has_value());
  EXPECT_FALSE(ToCandidate(view)->healthy);
  EXPECT_EQ(ToCandidate(view)->running_seqs, 2);

  v1::Snapshot snapshot = MakeSnapshot({1, 2}, 0);
  snapshot.mutable_load()->set_draining(true);
  WorkerView fresh;
  ASSERT_TRUE(fresh.Apply(SnapshotUpdate(snapshot)).ok());
  EXPECT_TRUE(fresh.draining());
  EXPECT_FALSE(ToCandidate(fresh)->healthy);

  ASSERT_TRUE(view.Apply(Load(0, 0, 0)).ok());  // a later sample without the flag
  EXPECT_TRUE(ToCandidate(view)->healthy);
}

TEST(ToCandidateTest, KvAwarePlacementOverViews) {
  const std::vector<BlockHash> prompt = Chain(60, 0);  // 960 tokens of full blocks
  auto make_view = [&](const std::string& id, v1::WorkerRole role, int64_t cached_blocks) {
    v1::Snapshot s = MakeSnapshot(
        std::vector<BlockHash>(prompt.begin(), prompt.begin() + cached_blocks), 0, role);
    s.set_worker_id(id);
    s.mutable_load()->set_queued_prefill_tokens(0);
    auto view = std::make_unique<WorkerView>();
    CHECK_OK(view->Apply(SnapshotUpdate(s)));
    return view;
  };
  std::vector<std::unique_ptr<WorkerView>> views;
  views.push_back(make_view("d0", v1::ROLE_DECODE, 0));
  views.push_back(make_view("p0", v1::ROLE_PREFILL, 10));
  views.push_back(make_view("p1", v1::ROLE_PREFILL, 40));
  views.push_back(make_view("p2", v1::ROLE_PREFILL, 0));
  // The router's own placed load on each worker.
  std::vector<LoadLedger> ledgers(views.size(), LoadLedger(absl::Milliseconds(150)));
  const absl::Time now = absl::FromUnixSeconds(1767225600);
  auto cluster = [&] {
    placement::ClusterView c;
    for (size_t i = 0; i < views.size(); ++i) {
      placement::WorkerCandidate candidate = *ToCandidate(*views[i]);
      ledgers[i].Apply(now, &candidate);
      c.workers.push_back(std::move(candidate));
    }
    return c;
  };
  absl::StatusOr<std::unique_ptr<placement::PlacementPolicy>> policy =
      placement::CreatePolicy("kv_aware", {});
  ASSERT_TRUE(policy.ok());
  const placement::Request request = {
      .prompt_tokens = 1000, .block_hashes = prompt, .block_size = kBlockSize};
  absl::StatusOr<placement::Decision> d = (*policy)->Place(request, cluster());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->decode_worker, "d0");
  ASSERT_EQ(d->prefill.size(), 3u);
  EXPECT_EQ(d->prefill[0].worker_id, "p1");
  EXPECT_EQ(d->prefill[0].cached_tokens, 640);
  EXPECT_EQ(d->prefill[1].worker_id, "p0");
  // The router's own placements on p1 (800 tokens) outweigh its 480-token lead over p0.
  ledgers[2].Place(1, {.prefill_tokens = 800, .sequences = 1}, {}, now);
  d = (*policy)->Place(request, cluster());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->prefill[0].worker_id, "p0");
  // p1 evicts its blocks: its credit goes.
  ledgers[2].Uncount(1, /*prompt_only=*/false);
  std::vector<BlockHash> evicted(prompt.begin(), prompt.begin() + 40);
  ASSERT_TRUE(views[2]->Apply(Events({Removed(1, evicted)})).ok());
  d = (*policy)->Place(request, cluster());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->prefill[0].worker_id, "p0");
  EXPECT_EQ(d->prefill[0].cached_tokens, 160);
  // A stale prefill worker drops out of the list.
  EXPECT_FALSE(views[1]->Apply(Events({Stored(5, {1})})).ok());
  d = (*policy)->Place(request, cluster());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->prefill.size(), 2u);
  EXPECT_NE(d->prefill[0].worker_id, "p0");
  EXPECT_NE(d->prefill[1].worker_id, "p0");
}

TEST(StepObservationOfTest, SplitsTheAttentionByKind) {
  v1::StepTiming t;
  t.set_batch_size(5);
  t.set_prefill_tokens(100);
  t.set_decode_tokens(4);
  t.set_context_tokens(4150);
  t.set_duration_us(120000);
  // 4 decode tokens over 4000 tokens of context, and 100 prompt tokens after 50 cached:
  // (150 * 151 - 50 * 51) / 2 = 10050.
  t.set_attended_tokens(14050);
  t.set_prompt_attended_tokens(10050);
  placement::StepObservation o = StepObservationOf(t);
  EXPECT_EQ(o.batch_size, 5);
  EXPECT_EQ(o.prefill_tokens, 100);
  EXPECT_EQ(o.decode_tokens, 4);
  EXPECT_EQ(o.context_tokens, 4000);
  EXPECT_EQ(o.prompt_context_tokens, 10050);
  EXPECT_EQ(o.duration_us, 120000);

  // A worker before the split: the prompt tokens are taken from position 0, 100 * 101 / 2.
  t.clear_prompt_attended_tokens();
  o = StepObservationOf(t);
  EXPECT_EQ(o.prompt_context_tokens, 5050);
  EXPECT_EQ(o.context_tokens, 9000);
  // Before attended_tokens too: the per-sequence sum stands for both.
  t.clear_attended_tokens();
  o = StepObservationOf(t);
  EXPECT_EQ(o.prompt_context_tokens, 4150);
  EXPECT_EQ(o.context_tokens, 0);
  // A decode-only step has no prompt part.
  t.set_prefill_tokens(0);
  t.set_attended_tokens(4000);
  o = StepObservationOf(t);
  EXPECT_EQ(o.prompt_context_tokens, 0);
  EXPECT_EQ(o.context_tokens, 4000);
  // A malformed report (the prompt part above the whole) is clipped, never negative.
  t.set_prefill_tokens(10);
  t.set_prompt_attended_tokens(99999);
  o = StepObservationOf(t);
  EXPECT_EQ(o.prompt_context_tokens, 4000);
  EXPECT_EQ(o.context_tokens, 0);
}

}  // namespace
}  // namespace tandem
