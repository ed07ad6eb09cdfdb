// Work broken down by priority class: a vector with one entry per class, highest priority first.
// The entry type has `priority`, `tokens` and `prompts` (the scheduler's QueuedPrompts, the
// router's placement::QueuedClass).
//
//   std::vector<QueuedPrompts> queued;
//   AddByPriority(QueuedPrompts{.priority = 1, .tokens = 40, .prompts = 1}, &queued);
#ifndef TANDEM_COMMON_BY_PRIORITY_H_
#define TANDEM_COMMON_BY_PRIORITY_H_

#include <algorithm>
#include <vector>

namespace tandem {

// Adds `add` to the entry of its class in `classes`, inserting one in order when there is none.
template <typename Entry>
void AddByPriority(const Entry& add, std::vector<Entry>* classes) {
  auto it = std::find_if(classes->begin(), classes->end(),
                         [&](const Entry& e) { return e.priority <= add.priority; });
  if (it == classes->end() || it->priority != add.priority) {
    Entry empty{};
    empty.priority = add.priority;
    it = classes->insert(it, empty);
  }
  it->tokens += add.tokens;
  it->prompts += add.prompts;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BY_PRIORITY_H_
