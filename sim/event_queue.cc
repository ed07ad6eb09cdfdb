#include "sim/event_queue.h"

#include <algorithm>

#include "common/logging.h"

namespace tandem::sim {

void EventQueue::Push(double time, const Event& event) {
  CHECK(time >= now_) << "event at " << time << " s is before now (" << now_ << " s)";
  Entry entry{event, next_order_++};
  entry.event.time = time;
  heap_.push_back(entry);
  std::push_heap(heap_.begin(), heap_.end(), Later);
}

Event EventQueue::Pop() {
  CHECK(!heap_.empty());
  std::pop_heap(heap_.begin(), heap_.end(), Later);
  const Event e = heap_.back().event;
  heap_.pop_back();
  now_ = e.time;
  ++popped_;
  return e;
}

}  // namespace tandem::sim
