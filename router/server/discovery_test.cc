#include "router/server/discovery.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A resolver that answers from a script the test sets, and a listener that records what it is
// told, in order ("+address" joined, "-address" left).
class DiscoveryTest : public ::testing::Test {
 protected:
  WorkerDiscovery::Options Options(std::vector<std::string> addresses) {
    return {.addresses = std::move(addresses),
            .dns_names = {"workers.tandem.svc:7100"},
            .resolve = [this](absl::string_view name) -> absl::StatusOr<std::vector<std::string>> {
              absl::MutexLock lock(&mu_);
              EXPECT_EQ(name, "workers.tandem.svc:7100");
              return answer_;
            }};
  }
  WorkerDiscovery::Listener Recorder() {
    return {.joined = [this](const std::string& a) { Record("+" + a); },
            .left = [this](const std::string& a) { Record("-" + a); }};
  }
  void Answer(absl::StatusOr<std::vector<std::string>> answer) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(answer);
  }
  // What the listener was told since the last call.
  std::vector<std::string> Told() {
    absl::MutexLock lock(&mu_);
    return std::exchange(told_, {});
  }
  // Blocks until the listener has been told something.
  void AwaitTold() {
    absl::MutexLock lock(&mu_);
    auto told = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !told_.empty(); };
    mu_.Await(absl::Condition(&told));
  }

 private:
  void Record(std::string what) {
    absl::MutexLock lock(&mu_);
    told_.push_back(std::move(what));
  }

  absl::Mutex mu_;
  absl::StatusOr<std::vector<std::string>> answer_ ABSL_GUARDED_BY(mu_) =
      std::vector<std::string>();
  std::vector<std::string> told_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DiscoveryTest, StaticAddressesJoinAtStartAndNothingIsResolvedWithoutAName) {
  WorkerDiscovery::Options options = Options({"10.0.0.5:7100", "10.0.0.6:7200", "10.0.0.5:7100"});
  options.dns_names = {};
  WorkerDiscovery discovery(options, Recorder());
  discovery.Start();
  EXPECT_THAT(Told(), ElementsAre("+10.0.0.5:7100", "+10.0.0.6:7200"));
  EXPECT_THAT(discovery.members(), ElementsAre("10.0.0.5:7100", "10.0.0.6:7200"));
}

TEST_F(DiscoveryTest, EachResolutionTellsWhoJoinedAndWhoLeft) {
  WorkerDiscovery discovery(Options({"10.0.0.5:7100"}), Recorder());
  Answer(std::vector<std::string>{"10.1.0.1:7100", "10.1.0.2:7100"});
  discovery.Refresh();
  EXPECT_THAT(Told(), ElementsAre("+10.1.0.1:7100", "+10.1.0.2:7100"));
  discovery.Refresh();
  EXPECT_THAT(Told(), IsEmpty());
  Answer(std::vector<std::string>{"10.1.0.2:7100", "10.1.0.3:7100"});
  discovery.Refresh();
  EXPECT_THAT(Told(), ElementsAre("+10.1.0.3:7100", "-10.1.0.1:7100"));
  EXPECT_THAT(discovery.members(), ElementsAre("10.0.0.5:7100", "10.1.0.2:7100", "10.1.0.3:7100"));
}

// A resolver failing for a moment must not drop the workers (each would be followed again from
// scratch): the last resolution stands until one succeeds.
TEST_F(DiscoveryTest, ANameThatFailsToResolveKeepsTheWorkersOfTheLastResolution) {
  WorkerDiscovery discovery(Options({"10.0.0.5:7100"}), Recorder());
  Answer(std::vector<std::string>{"10.1.0.1:7100"});
  discovery.Refresh();
  Told();
  Answer(absl::UnavailableError("cannot resolve"));
  discovery.Refresh();
  EXPECT_THAT(Told(), IsEmpty());
  EXPECT_THAT(discovery.members(), ElementsAre("10.0.0.5:7100", "10.1.0.1:7100"));
  // Resolving to nothing is an answer: the workers found through the name leave.
  Answer(std::vector<std::string>{});
  discovery.Refresh();
  EXPECT_THAT(Told(), ElementsAre("-10.1.0.1:7100"));
  EXPECT_THAT(discovery.members(), ElementsAre("10.0.0.5:7100"));
  Answer(std::vector<std::string>{"10.1.0.1:7100"});
  discovery.Refresh();
  EXPECT_THAT(Told(), ElementsAre("+10.1.0.1:7100"));  // back when it resolves again
}

// One name per pool (Kubernetes: a headless Service each): the members are every name's addresses,
// and a name that fails keeps its own last answer while the others' answers apply.
TEST(DiscoveryNamesTest, EveryNameCountsAndAFailingNameKeepsOnlyItsOwnWorkers) {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, absl::StatusOr<std::vector<std::string>>> answers;
  std::vector<std::string> told;
  auto answer = [&](const std::string& name, absl::StatusOr<std::vector<std::string>> a) {
    absl::MutexLock lock(&mu);
    answers.insert_or_assign(name, std::move(a));
  };
  WorkerDiscovery discovery(
      {.dns_names = {"prefill.tandem.svc:7100", "decode.tandem.svc:7200"},
       .resolve = [&](absl::string_view name) -> absl::StatusOr<std::vector<std::string>> {
         absl::MutexLock lock(&mu);
         auto it = answers.find(std::string(name));
         if (it == answers.end()) return absl::UnavailableError("unknown name");
         return it->second;
       }},
      {.joined = [&](const std::string& a) { told.push_back("+" + a); },
       .left = [&](const std::string& a) { told.push_back("-" + a); }});
  // The decode name does not resolve yet: the prefill workers join on their own.
  answer("prefill.tandem.svc:7100", std::vector<std::string>{"10.1.0.1:7100"});
  discovery.Refresh();
  EXPECT_THAT(std::exchange(told, {}), ElementsAre("+10.1.0.1:7100"));
  answer("decode.tandem.svc:7200", std::vector<std::string>{"10.2.0.1:7200", "10.2.0.2:7200"});
  discovery.Refresh();
  EXPECT_THAT(std::exchange(told, {}), ElementsAre("+10.2.0.1:7200", "+10.2.0.2:7200"));
  // The prefill name fails for a moment while a decode pod leaves: only the decode change applies.
  answer("prefill.tandem.svc:7100", absl::UnavailableError("cannot resolve"));
  answer("decode.tandem.svc:7200", std::vector<std::string>{"10.2.0.2:7200"});
  discovery.Refresh();
  EXPECT_THAT(std::exchange(told, {}), ElementsAre("-10.2.0.1:7200"));
  EXPECT_THAT(discovery.members(), ElementsAre("10.1.0.1:7100", "10.2.0.2:7200"));
  // Scaled to zero: the prefill name answers with nothing, and its workers leave.
  answer("prefill.tandem.svc:7100", std::vector<std::string>{});
  discovery.Refresh();
  EXPECT_THAT(std::exchange(told, {}), ElementsAre("-10.1.0.1:7100"));
  EXPECT_THAT(discovery.members(), ElementsAre("10.2.0.2:7200"));
}

TEST_F(DiscoveryTest, StartResolvesAtOnceOnItsThread) {
  Answer(std::vector<std::string>{"10.1.0.1:7100"});
  WorkerDiscovery discovery(Options({}), Recorder());
  discovery.Start();
  AwaitTold();  // the first resolution does not wait for the interval (5 s)
  EXPECT_THAT(Told(), ElementsAre("+10.1.0.1:7100"));
}

TEST(ResolveDnsTest, ANumericAddressResolvesToItselfWithThePort) {
  absl::StatusOr<std::vector<std::string>> found = ResolveDns("127.0.0.1:7100");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_THAT(*found, ElementsAre("127.0.0.1:7100"));
}

TEST(ResolveDnsTest, AnInvalidNameIsUnavailable) {
  // A name with a label longer than 63 characters is refused without asking any server.
  EXPECT_EQ(ResolveDns(std::string(300, 'x') + ".invalid:7100").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::router
