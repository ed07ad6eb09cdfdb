#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits in [-scale/2, scale/2) made from SplitMix64 bits with exact arithmetic only, so they are
// the same on every machine (the golden test below depends on that).
std::vector<float> TestLogits(uint64_t seed, int vocab, float scale) {
  SplitMix64SeedSource bits(seed);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) {
    const auto u = static_cast<float>(bits.NextSeed() >> 40) * 0x1.0p-24f;  // [0, 1), exact
    x = (u - 0.5f) * scale;
  }
  return logits;
}

Sampler MakeSampler(const SamplingOptions& options, int vocab,
                    absl::Span<const int32_t> prompt = {}, absl::Span<const int32_t> eos = {}) {
  absl::StatusOr<Sampler> s = Sampler::Create(
      options, {.vocab_size = vocab, .eos_token_ids = eos, .prompt_tokens = prompt});
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

int32_t SampleOnce(Sampler& sampler, absl::Span<const float> logits) {
  absl::StatusOr<SampledToken> t = sampler.Sample(logits);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->id : -1;
}

// The target distribution, computed independently in double: softmax(logits / T), then top-k,
// top-p (smallest most-likely-first prefix with renormalized mass >= p), min-p (relative to the
// most likely token), renormalized. Ties in likelihood: lower id first.
std::vector<double> ReferenceDistribution(const std::vector<float>& logits, const SamplingOptions& o) {
  const size_t v = logits.size();
  std::vector<int> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double mx = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(v, 0.0);
  for (size_t i = 0; i < v; ++i) p[i] = std::exp((logits[i] - mx) / o.temperature);
  size_t keep = v;
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < v) keep = static_cast<size_t>(o.top_k);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += p[static_cast<size_t>(order[i])];
  if (o.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[static_cast<size_t>(order[i])] / total;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double top = p[static_cast<size_t>(order[0])];
  std::vector<double> out(v, 0.0);
  double kept_total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const auto id = static_cast<size_t>(order[i]);
    if (p[id] >= o.min_p * top) {
      out[id] = p[id];
      kept_total += p[id];
    }
  }
  for (double& x : out) x /= kept_total;
  return out;
}

// The chi-square critical value for `df` degrees of freedom at significance 0.001, by the
// Wilson-Hilferty approximation (z_0.999 = 3.0902; within ~3% of the exact value for df >= 1).
double ChiSquareCritical001(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 3.0902 * std::sqrt(a), 3.0);
}

TEST(SamplerTest, GreedyIsArgmaxAndTheLowestIdWinsTies) {
  struct Case {
    std::vector<float> logits;
    int32_t want;
  };
  const Case cases[] = {
      {{1, 3, 3, 2}, 1},       {{5, 5, 5}, 0},         {{-kInf, -1, -1}, 1},
      {{0}, 0},                {{-7, -3, -3.5f}, 1},   {{-kInf, -kInf, 2}, 2},
      {{1e-30f, 0, 1e-30f}, 0}, {{-0.0f, 0.0f}, 0},
  };
  SamplingOptions options;
  options.temperature = 0.0f;
  for (const Case& c : cases) {
    Sampler s = MakeSampler(options, static_cast<int>(c.logits.size()));
    EXPECT_EQ(SampleOnce(s, c.logits), c.want) << testing::PrintToString(c.logits);
  }
  for (uint64_t trial = 0; trial < 200; ++trial) {
    // Coarse logits so that ties are common.
    std::vector<float> logits = TestLogits(trial, 300, 8.0f);
    for (float& x : logits) x = std::round(x * 2.0f);
    options.seed = trial;
    Sampler s = MakeSampler(options, 300);
    const auto want = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_EQ(SampleOnce(s, logits), want) << trial;
  }
}

TEST(SamplerTest, TinyTemperatureEqualsGreedy) {
  int compared = 0;
  for (uint64_t trial = 0; trial < 300; ++trial) {
    const std::vector<float> logits = TestLogits(1000 + trial, 200, 8.0f);
    std::vector<float> sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] < 0.01f) continue;  // exp(-0.01 / 1e-4) = 4e-44: never the runner-up
    ++compared;
    SamplingOptions greedy;
    greedy.temperature = 0.0f;
    SamplingOptions cold;
    cold.temperature = 1e-4f;
    cold.seed = trial;
    Sampler g = MakeSampler(greedy, 200);
    Sampler c = MakeSampler(cold, 200);
    ASSERT_EQ(SampleOnce(c, logits), SampleOnce(g, logits)) << trial;
  }
  EXPECT_GT(compared, 150);
}

TEST(SamplerTest, TopKOnlyEverReturnsTheKBest) {
  const std::vector<float> logits = TestLogits(77, 64, 3.0f);
  std::vector<int> order(64);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int k : {1, 3, 10, 63}) {
    const std::set<int> best(order.begin(), order.begin() + k);
    std::set<int> seen;
    for (uint64_t seed = 0; seed < 3000; ++seed) {
      SamplingOptions o;
      o.temperature = 1.5f;
      o.top_k = k;
      o.seed = seed;
      Sampler s = MakeSampler(o, 64);
      const int id = SampleOnce(s, logits);
      ASSERT_TRUE(best.contains(id)) << "k=" << k << " seed=" << seed << " id=" << id;
      seen.insert(id);
    }
    if (k <= 10) {
      EXPECT_EQ(seen, best) << "k=" << k;  // every one of the k best is drawn at T=1.5
    } else {
      EXPECT_GT(seen.size(), 10u) << "k=" << k;
    }
  }
}

// Probabilities 0.05, 0.40, 0.10, 0.25, 0.20 for ids 0..4 (most likely first: 1, 3, 4, 2, 0).
std::vector<float> FiveTokenLogits() {
  return {std::log(0.05f), std::log(0.40f), std::log(0.10f), std::log(0.25f), std::log(0.20f)};
}

std::set<int> SampledSet(const SamplingOptions& base, const std::vector<float>& logits, int seeds) {
  std::set<int> seen;
  for (int seed = 0; seed < seeds; ++seed) {
    SamplingOptions o = base;
    o.seed = static_cast<uint64_t>(seed);
    Sampler s = MakeSampler(o, static_cast<int>(logits.size()));
    seen.insert(SampleOnce(s, logits));
  }
  return seen;
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixWithMassAtLeastP) {
  struct Case {
    float top_p;
    int32_t top_k;
    std::set<int> want;
  };
  const Case cases[] = {
      {0.3f, 0, {1}},
      {0.6f, 0, {1, 3}},           // 0.40 + 0.25 = 0.65 >= 0.6
      {0.7f, 0, {1, 3, 4}},        // 0.65 < 0.7 <= 0.85
      {0.9f, 0, {1, 3, 4, 2}},     // 0.85 < 0.9 <= 0.95
      {0.97f, 0, {1, 3, 4, 2, 0}},
      // After top-k 3 the renormalized masses are 0.47, 0.29, 0.24: 0.47 + 0.29 >= 0.7.
      {0.7f, 3, {1, 3}},
      {0.45f, 3, {1}},
  };
  for (const Case& c : cases) {
    SamplingOptions o;
    o.top_p = c.top_p;
    o.top_k = c.top_k;
    EXPECT_EQ(SampledSet(o, FiveTokenLogits(), 4000), c.want) << "top_p=" << c.top_p;
  }
}

TEST(SamplerTest, MinPDropsTokensBelowMinPTimesTheBest) {
  struct Case {
    float min_p;
    float top_p;
    std::set<int> want;
  };
  const Case cases[] = {
      {0.1f, 1.0f, {1, 3, 4, 2, 0}},  // threshold 0.04
      {0.2f, 1.0f, {1, 3, 4, 2}},     // threshold 0.08 drops 0.05
      {0.55f, 1.0f, {1, 3}},          // threshold 0.22 drops 0.20
      {1.0f, 1.0f, {1}},
      {0.2f, 0.7f, {1, 3, 4}},        // top-p first, then min-p
  };
  for (const Case& c : cases) {
    SamplingOptions o;
    o.min_p = c.min_p;
    o.top_p = c.top_p;
    EXPECT_EQ(SampledSet(o, FiveTokenLogits(), 4000), c.want) << "min_p=" << c.min_p;
  }
}

TEST(SamplerTest, PenaltiesChangeLogitsExactlyAsTheFormulas) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {3, 3, 1, 4};
  struct Case {
    const char* name;
    float repetition, frequency, presence;
    std::vector<float> want;
  };
  const Case cases[] = {
      {"none", 1.0f, 0.0f, 0.0f, {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f}},
      // Repetition over prompt + output {0, 1, 3, 4}: positive / 2, negative * 2.
      {"repetition 2", 2.0f, 0.0f, 0.0f, {1.0f, -2.0f, 0.5f, 1.5f, -4.0f, 1.0f}},
      {"repetition 0.5", 0.5f, 0.0f, 0.0f, {4.0f, -0.5f, 0.5f, 6.0f, -1.0f, 1.0f}},
      // Frequency over output counts {3: 2, 1: 1, 4: 1}; the prompt does not count.
      {"frequency 0.5", 1.0f, 0.5f, 0.0f, {2.0f, -1.5f, 0.5f, 2.0f, -2.5f, 1.0f}},
      {"frequency -1", 1.0f, -1.0f, 0.0f, {2.0f, 0.0f, 0.5f, 5.0f, -1.0f, 1.0f}},
      {"presence 0.25", 1.0f, 0.0f, 0.25f, {2.0f, -1.25f, 0.5f, 2.75f, -2.25f, 1.0f}},
      // Repetition first, then frequency and presence.
      {"all", 2.0f, 0.5f, 0.25f, {1.0f, -2.75f, 0.5f, 0.25f, -4.75f, 1.0f}},
  };
  for (const Case& c : cases) {
    SamplingOptions o;
    o.repetition_penalty = c.repetition;
    o.frequency_penalty = c.frequency;
    o.presence_penalty = c.presence;
    Sampler s = MakeSampler(o, 6, prompt);
    for (int32_t t : output) ASSERT_TRUE(s.Accept(t).ok());
    absl::StatusOr<std::vector<float>> got = s.PenalizedLogits(logits);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, testing::Pointwise(testing::FloatEq(), c.want)) << c.name;
  }
}

TEST(SamplerTest, PenaltiesApplyToGreedyToo) {
  SamplingOptions o;
  o.temperature = 0.0f;
  o.presence_penalty = 2.0f;
  Sampler s = MakeSampler(o, 3);
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f};
  EXPECT_EQ(SampleOnce(s, logits), 1);
  ASSERT_TRUE(s.Accept(1).ok());
  EXPECT_EQ(SampleOnce(s, logits), 0);  // 2 - 2 = 0 < 1
}

TEST(SamplerTest, MinTokensMasksEosAndStopTokens) {
  const std::vector<float> logits = {0.0f, 1.0f, 5.0f, 4.0f, 3.0f};  // eos = 2, stop token = 3
  const std::vector<int32_t> eos = {2};
  for (bool ignore_eos : {false, true}) {
    SamplingOptions o;
    o.temperature = 0.0f;
    o.min_tokens = 2;
    o.stop_token_ids = {3};
    o.ignore_eos = ignore_eos;
    Sampler s = MakeSampler(o, 5, {}, eos);
    for (int step = 0; step < 3; ++step) {
      absl::StatusOr<std::vector<float>> p = s.PenalizedLogits(logits);
      ASSERT_TRUE(p.ok());
      const bool masked = step < 2;
      EXPECT_EQ((*p)[3], masked ? -kInf : 4.0f) << step;
      EXPECT_EQ((*p)[2], masked && !ignore_eos ? -kInf : 5.0f) << step;
      EXPECT_EQ(SampleOnce(s, logits), masked ? (ignore_eos ? 2 : 4) : 2) << step;
      ASSERT_TRUE(s.Accept(0).ok());
    }
  }
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedsDiffer) {
  auto generate = [](uint64_t seed, const SamplingOptions& base) {
    SamplingOptions o = base;
    o.seed = seed;
    Sampler s = MakeSampler(o, 2000);
    std::vector<int32_t> tokens;
    for (uint64_t step = 0; step < 40; ++step) {
      const int32_t t = SampleOnce(s, TestLogits(500 + step, 2000, 6.0f));
      EXPECT_TRUE(s.Accept(t).ok());
      tokens.push_back(t);
    }
    return tokens;
  };
  SamplingOptions plain;
  SamplingOptions filtered;
  filtered.temperature = 0.8f;
  filtered.top_k = 200;
  filtered.top_p = 0.9f;
  filtered.min_p = 0.01f;
  filtered.repetition_penalty = 1.1f;
  for (const SamplingOptions& o : {plain, filtered}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      EXPECT_EQ(generate(seed, o), generate(seed, o));
      EXPECT_NE(generate(seed, o), generate(seed + 1000, o));
    }
  }
}

// Pins the exact tokens for fixed seeds and machine-independent logits: a change here changes what
// users with a seed get, on every machine (update only on purpose, and say so in the release note).
TEST(SamplerTest, GoldenSeededTokens) {
  struct Case {
    const char* name;
    SamplingOptions options;
    std::vector<int32_t> want;
  };
  SamplingOptions plain;
  plain.seed = 2024;
  SamplingOptions filtered = plain;
  filtered.temperature = 0.7f;
  filtered.top_k = 100;
  filtered.top_p = 0.9f;
  SamplingOptions nucleus = plain;
  nucleus.top_p = 0.95f;
  nucleus.min_p = 0.001f;
  const Case cases[] = {
      {"plain", plain, {2429, 1426, 2304, 2732, 62, 2050, 4091, 1315, 279, 3498, 253, 1451}},
      {"top_k top_p", filtered, {150, 3571, 1756, 1575, 2743, 1735, 877, 3824, 1961, 1834, 3740, 3852}},
      {"top_p min_p", nucleus, {481, 1085, 2164, 1665, 2184, 2719, 4060, 535, 1283, 1830, 2344, 3571}},
  };
  for (const Case& c : cases) {
    Sampler s = MakeSampler(c.options, 4096);
    std::vector<int32_t> got;
    for (uint64_t step = 0; step < 12; ++step) {
      const int32_t t = SampleOnce(s, TestLogits(9000 + step, 4096, 10.0f));
      ASSERT_TRUE(s.Accept(t).ok());
      got.push_back(t);
    }
    EXPECT_EQ(got, c.want) << c.name << ": " << testing::PrintToString(got);
  }
}

TEST(SamplerTest, SampleDoesNotChangeStateAndAcceptAdvancesThePosition) {
  SamplingOptions o;
  o.seed = 5;
  Sampler s = MakeSampler(o, 1000);
  const std::vector<float> logits = TestLogits(3, 1000, 2.0f);
  const int32_t first = SampleOnce(s, logits);
  EXPECT_EQ(SampleOnce(s, logits), first);
  // A sampler resumed elsewhere with the same accepted tokens continues the same stream.
  Sampler a = MakeSampler(o, 1000);
  Sampler b = MakeSampler(o, 1000);
  for (int32_t t : {1, 2, 3}) {
    ASSERT_TRUE(a.Accept(t).ok());
    ASSERT_TRUE(b.Accept(t).ok());
  }
  EXPECT_EQ(SampleOnce(a, logits), SampleOnce(b, logits));
  EXPECT_EQ(a.num_accepted(), 3);
}

TEST(SamplerTest, UnseededRequestsDrawFromTheInjectedSource) {
  SplitMix64SeedSource source(42);
  SplitMix64SeedSource same(42);
  absl::StatusOr<Sampler> s = Sampler::Create({}, {.vocab_size = 10, .seed_source = &source});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->seed(), same.NextSeed());
  SamplingOptions seeded;
  seeded.seed = 7;
  s = Sampler::Create(seeded, {.vocab_size = 10, .seed_source = &source});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->seed(), 7u);
  // The process-wide source, replaced for the test.
  SplitMix64SeedSource process(99);
  SplitMix64SeedSource process_copy(99);
  SetProcessSeedSource(&process);
  s = Sampler::Create({}, {.vocab_size = 10});
  SetProcessSeedSource(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->seed(), process_copy.NextSeed());
}

TEST(SamplerTest, SampledFrequenciesMatchTheTargetDistribution) {
  struct Case {
    const char* name;
    int vocab;
    float scale;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    int draws;
  };
  const Case cases[] = {
      {"T=1", 10, 4.0f, 1.0f, 0, 1.0f, 0.0f, 100000},
      {"T=0.5", 10, 4.0f, 0.5f, 0, 1.0f, 0.0f, 100000},
      {"T=2 top_k=4", 12, 4.0f, 2.0f, 4, 1.0f, 0.0f, 100000},
      {"top_p=0.7", 12, 4.0f, 1.0f, 0, 0.7f, 0.0f, 100000},
      {"T=1.3 min_p=0.1", 12, 4.0f, 1.3f, 0, 1.0f, 0.1f, 100000},
      {"all", 16, 5.0f, 0.8f, 6, 0.9f, 0.05f, 100000},
      // Large enough that top-p selects its prefix in several growing chunks.
      {"V=1000 top_p=0.95", 1000, 6.0f, 1.0f, 0, 0.95f, 0.0f, 60000},
  };
  for (const Case& c : cases) {
    const std::vector<float> logits = TestLogits(4242 + static_cast<uint64_t>(c.vocab), c.vocab, c.scale);
    SamplingOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.top_p = c.top_p;
    o.min_p = c.min_p;
    o.seed = 31337;
    const std::vector<double> want = ReferenceDistribution(logits, o);
    Sampler s = MakeSampler(o, c.vocab);
    std::vector<int> counts(static_cast<size_t>(c.vocab), 0);
    for (int i = 0; i < c.draws; ++i) {
      const int32_t t = SampleOnce(s, logits);
      ASSERT_GE(t, 0);
      ++counts[static_cast<size_t>(t)];
      ASSERT_TRUE(s.Accept(t).ok());
    }
    // Tokens outside the target's support are never drawn; bins with an expected count below 5
    // are pooled into one.
    double chi2 = 0.0;
    int bins = 0;
    double pooled_expected = 0.0;
    int pooled_count = 0;
    for (size_t id = 0; id < counts.size(); ++id) {
      const double expected = want[id] * c.draws;
      if (want[id] == 0.0) {
        ASSERT_EQ(counts[id], 0) << c.name << " drew token " << id << " outside the support";
        continue;
      }
      if (expected < 5.0) {
        pooled_expected += expected;
        pooled_count += counts[id];
        continue;
      }
      chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
      ++bins;
    }
    if (pooled_expected > 0.0) {
      chi2 += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
      ++bins;
    }
    ASSERT_GE(bins, 2) << c.name;
    // Significance 0.001 (fixed seed: the test is deterministic).
    EXPECT_LT(chi2, ChiSquareCritical001(bins - 1))
        << c.name << ": chi2 " << chi2 << " with " << bins - 1 << " degrees of freedom";
  }
}

TEST(SamplerTest, LogprobsAreThoseOfTheRawLogits) {
  constexpr int kVocab = 3000;
  std::vector<float> logits = TestLogits(11, kVocab, 12.0f);
  logits[17] = logits[2000] = logits[2999] = 7.0f;  // ties among the top (max of the rest < 6)
  logits[5] = -kInf;
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double log_z = mx + std::log(sum);
  std::vector<int> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  SamplingOptions o;
  o.logprobs = 20;
  o.temperature = 0.7f;
  o.top_k = 40;
  o.repetition_penalty = 1.3f;
  o.frequency_penalty = 0.5f;
  Sampler s = MakeSampler(o, kVocab, std::vector<int32_t>{17, 18});
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<SampledToken> t = s.Sample(logits);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->logprob.has_value());
    EXPECT_NEAR(*t->logprob, logits[static_cast<size_t>(t->id)] - log_z, 1e-5);
    ASSERT_EQ(t->top_logprobs.size(), 20u);
    for (size_t i = 0; i < 20; ++i) {
      EXPECT_EQ(t->top_logprobs[i].id, order[i]) << i;
      EXPECT_NEAR(t->top_logprobs[i].logprob, logits[static_cast<size_t>(order[i])] - log_z, 1e-5);
    }
    ASSERT_TRUE(s.Accept(t->id).ok());
  }
  // logprobs == 0: none at all.
  Sampler plain = MakeSampler({}, kVocab);
  absl::StatusOr<SampledToken> t = plain.Sample(logits);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->logprob.has_value());
  EXPECT_TRUE(t->top_logprobs.empty());
}

TEST(SamplerTest, BadInputIsAnErrorNotACrash) {
  Sampler s = MakeSampler({}, 4);
  struct Case {
    const char* name;
    std::vector<float> logits;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"too few", {1, 2, 3}, absl::StatusCode::kInvalidArgument},
      {"too many", {1, 2, 3, 4, 5}, absl::StatusCode::kInvalidArgument},
      {"NaN", {1, std::nanf(""), 3, 4}, absl::StatusCode::kInvalidArgument},
      {"+inf", {1, kInf, 3, 4}, absl::StatusCode::kInvalidArgument},
      {"all -inf", {-kInf, -kInf, -kInf, -kInf}, absl::StatusCode::kFailedPrecondition},
  };
  for (const Case& c : cases) {
    for (float temperature : {0.0f, 1.0f}) {
      SamplingOptions o;
      o.temperature = temperature;
      o.top_p = 0.5f;
      Sampler t = MakeSampler(o, 4);
      EXPECT_EQ(t.Sample(c.logits).status().code(), c.code) << c.name << " T=" << temperature;
    }
  }
  EXPECT_EQ(s.Accept(4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Accept(-1).code(), absl::StatusCode::kInvalidArgument);
  SamplingOptions bad;
  bad.top_p = 0.0f;
  EXPECT_EQ(Sampler::Create(bad, {.vocab_size = 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_ids = {4};
  EXPECT_EQ(Sampler::Create({}, {.vocab_size = 4, .eos_token_ids = bad_ids}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sampler::Create({}, {.vocab_size = 4, .prompt_tokens = bad_ids}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sampler::Create({}, {.vocab_size = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, HugeRepetitionPenaltyKeepsLogitsFinite) {
  SamplingOptions o;
  o.repetition_penalty = 1e-30f;
  const std::vector<int32_t> prompt = {0};
  Sampler s = MakeSampler(o, 3, prompt);
  const std::vector<float> logits = {1e10f, 1.0f, 2.0f};
  absl::StatusOr<std::vector<float>> p = s.PenalizedLogits(logits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0], std::numeric_limits<float>::max());
  EXPECT_EQ(SampleOnce(s, logits), 0);
}

// A grammar's bitmask: greedy takes the best allowed token, random sampling never leaves the
// allowed set, and the log-probabilities stay those of the raw logits.
TEST(SamplerTest, AllowedTokenMaskRestrictsGreedyAndRandomSampling) {
  constexpr int kVocab = 77;  // not a multiple of 32: the last word is partial
  const std::vector<float> logits = TestLogits(5, kVocab, 8.0f);
  const std::set<int32_t> allowed_ids = {3, 31, 32, 40, 76};
  std::vector<uint32_t> mask((kVocab + 31) / 32, 0);
  for (int32_t t : allowed_ids) mask[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  int32_t best = *allowed_ids.begin();
  for (int32_t t : allowed_ids) best = logits[t] > logits[best] ? t : best;

  SamplingOptions greedy_options;
  greedy_options.temperature = 0.0f;
  greedy_options.logprobs = 1;
  Sampler greedy = MakeSampler(greedy_options, kVocab);
  absl::StatusOr<SampledToken> g = greedy.Sample(logits, mask);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->id, best);
  // Raw log-probability: log_softmax over the whole vocabulary, computed here in double.
  double z = 0;
  const float mx = *std::max_element(logits.begin(), logits.end());
  for (float x : logits) z += std::exp(static_cast<double>(x) - mx);
  EXPECT_NEAR(*g->logprob, logits[best] - mx - std::log(z), 1e-4);

  for (int variant = 0; variant < 3; ++variant) {
    SamplingOptions o;
    o.temperature = variant == 1 ? 2.0f : 1.0f;
    if (variant == 1) o.top_p = 0.9f;
    if (variant == 2) o.top_k = 3;
    o.seed = variant;
    Sampler random = MakeSampler(o, kVocab);
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<SampledToken> t = random.Sample(logits, mask);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_TRUE(allowed_ids.contains(t->id)) << t->id;
      ASSERT_TRUE(random.Accept(t->id).ok());
    }
  }
  // A mask of the wrong size is refused.
  const std::vector<uint32_t> short_mask(1, ~0u);
  EXPECT_EQ(greedy.Sample(logits, short_mask).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::sampling
