#include "router/registry/membership.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

TEST(WorkerMembershipTest, StaticAddressesAreMembersOnceInTheirOrder) {
  WorkerMembership membership({"b:1", "a:1", "b:1"});
  EXPECT_THAT(membership.fixed(), ElementsAre("b:1", "a:1"));
  EXPECT_THAT(membership.members(), ElementsAre("a:1", "b:1"));
}

// One resolution after another, each with what it must change.
TEST(WorkerMembershipTest, EachResolutionJoinsWhatAppearedAndDropsWhatIsGone) {
  struct Step {
    const char* what;
    std::vector<std::string> resolved;
    std::vector<std::string> joined;
    std::vector<std::string> left;
    std::vector<std::string> members;
  };
  const std::vector<Step> steps = {
      {"the first resolution", {"10.0.0.2:7100", "10.0.0.1:7100"},
       {"10.0.0.2:7100", "10.0.0.1:7100"}, {},
       {"10.0.0.1:7100", "10.0.0.2:7100", "static:7000"}},
      {"the same again changes nothing", {"10.0.0.1:7100", "10.0.0.2:7100"}, {}, {},
       {"10.0.0.1:7100", "10.0.0.2:7100", "static:7000"}},
      {"repeats count once", {"10.0.0.3:7100", "10.0.0.3:7100", "10.0.0.1:7100", "10.0.0.2:7100"},
       {"10.0.0.3:7100"}, {},
       {"10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100", "static:7000"}},
      {"a pod replaced", {"10.0.0.1:7100", "10.0.0.4:7100", "10.0.0.3:7100"},
       {"10.0.0.4:7100"}, {"10.0.0.2:7100"},
       {"10.0.0.1:7100", "10.0.0.3:7100", "10.0.0.4:7100", "static:7000"}},
      {"a static address resolved too joins nothing", {"static:7000", "10.0.0.1:7100"}, {},
       {"10.0.0.3:7100", "10.0.0.4:7100"}, {"10.0.0.1:7100", "static:7000"}},
      {"nothing resolved (or a failed resolution) leaves only the static ones", {}, {},
       {"10.0.0.1:7100"}, {"static:7000"}},
      {"one that left joins again when it is back", {"10.0.0.2:7100"}, {"10.0.0.2:7100"}, {},
       {"10.0.0.2:7100", "static:7000"}},
  };
  WorkerMembership membership({"static:7000"});
  for (const Step& step : steps) {
    SCOPED_TRACE(step.what);
    const MembershipChange change = membership.Resolved(step.resolved);
    EXPECT_THAT(change.joined, ElementsAreArray(step.joined));
    EXPECT_THAT(change.left, ElementsAreArray(step.left));
    EXPECT_THAT(membership.members(), ElementsAreArray(step.members));
    for (const std::string& a : step.members) EXPECT_TRUE(membership.contains(a)) << a;
    for (const std::string& a : step.left) EXPECT_FALSE(membership.contains(a)) << a;
  }
}

TEST(WorkerMembershipTest, WithoutStaticAddressesEveryoneCanLeave) {
  WorkerMembership membership({});
  EXPECT_THAT(membership.members(), IsEmpty());
  EXPECT_THAT(membership.Resolved({{"a:1"}}).joined, ElementsAre("a:1"));
  EXPECT_THAT(membership.Resolved({}).left, ElementsAre("a:1"));
  EXPECT_THAT(membership.members(), IsEmpty());
}

}  // namespace
}  // namespace tandem
