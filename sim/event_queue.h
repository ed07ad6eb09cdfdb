// The simulator's clock and agenda: events in simulated time (seconds from the start of the
// trace; no wall clock anywhere), popped earliest first and, at equal times, in the order they
// were pushed, so a run is a function of its inputs and seed alone.
//
//   EventQueue q;
//   q.Push(0.5, {.kind = EventKind::kStepDone, .worker = 3});
//   while (!q.empty()) { Event e = q.Pop(); ... q.now() == e.time ... }
//
// Not thread-safe.
#ifndef TANDEM_SIM_EVENT_QUEUE_H_
#define TANDEM_SIM_EVENT_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::sim {

enum class EventKind : uint8_t {
  kArrival,            // request `request` reaches the router
  kStepDone,           // worker `worker`'s engine step `serial` ends
  kTransferDone,       // request `request`'s KV (attempt `serial`) reached its decode worker
  kFailure,            // worker `worker` dies
  kPrefillTimeout,     // the earliest remote prefill deadline is due (the simulator keeps them)
  kAdmissionDeadline,  // router `worker` (a cell) has queued requests whose deadline may be due
};

struct Event {
  double time = 0;
  EventKind kind = EventKind::kArrival;
  uint32_t worker = 0;
  uint32_t request = 0;
  uint64_t serial = 0;  // the kind's own tag (a step's or an attempt's number)
};

class EventQueue {
 public:
  // REQUIRES: time >= now() (an event is never in the past).
  void Push(double time, const Event& event);
  // The earliest event (first pushed among equal times); now() becomes its time.
  // REQUIRES: !empty().
  Event Pop();
  const Event& Top() const { return heap_.front().event; }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  double now() const { return now_; }
  uint64_t popped() const { return popped_; }

 private:
  struct Entry {
    Event event;
    uint64_t order;  // push order: the tie-break
  };
  static bool Later(const Entry& a, const Entry& b) {
    if (a.event.time != b.event.time) return a.event.time > b.event.time;
    return a.order > b.order;
  }
  std::vector<Entry> heap_;
  uint64_t next_order_ = 0;
  uint64_t popped_ = 0;
  double now_ = 0;
};

}  // namespace tandem::sim

#endif  // TANDEM_SIM_EVENT_QUEUE_H_
