// Fuzzes the router's WatchState event applier (router/registry/worker_view.h): the input is a
// stream of tandem.v1.WorkerStateUpdate messages as a worker sends them, each framed as a 2-byte
// little-endian length and the serialized message. Each is applied in order to one WorkerView,
// which is read after every step as the registry does (candidate, cached prefix, step timings).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/kv/block_hash.h"
#include "router/registry/worker_view.h"
#include "tandem/v1/worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::WorkerView view;
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t length = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    if (length > size - at) break;
    tandem::v1::WorkerStateUpdate update;
    const bool parsed = update.ParseFromArray(data + at, static_cast<int>(length));
    at += length;
    if (!parsed) continue;
    (void)view.Apply(update);
    (void)tandem::ToCandidate(view);
    std::vector<tandem::BlockHash> prefix(view.cached_hashes().begin(), view.cached_hashes().end());
    if (prefix.size() > 8) prefix.resize(8);
    (void)view.CachedPrefixTokens(prefix);
    for (const tandem::v1::StepTiming& step : view.last_load_sample().recent_steps()) {
      (void)tandem::StepObservationOf(step);
    }
  }
  return 0;
}
