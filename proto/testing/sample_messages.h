// Fully populated sample messages of every tandem.v1 type, for tests.
//
// The samples use values that exercise the wire format: negative int32, the largest uint64 and
// fixed64 values, multi-byte UTF-8, bytes that are not UTF-8, `optional` scalars explicitly set to
// 0, non-zero enum values, and every case of every oneof across the set. Together they set every
// field of every message (proto_test checks this, so a new field must get a sample value here).
//
// The values are fixed: tests/proto_interop/interop_test.py builds the same messages in Python;
// change both together.
//
// Thread-safe (no shared state). Every function returns a new message owned by the caller.
#ifndef TANDEM_PROTO_TESTING_SAMPLE_MESSAGES_H_
#define TANDEM_PROTO_TESTING_SAMPLE_MESSAGES_H_

#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

#include "tandem/v1/inference.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::proto_testing {

// One sample: a stable label (used on the interop wire and in test names) and the message.
struct SampleMessage {
  std::string label;
  std::unique_ptr<google::protobuf::Message> message;
};

// Every sample, at least one per message type of tandem.v1 (each oneof case gets its own).
// Labels are unique, lower_snake_case.
std::vector<SampleMessage> AllSampleMessages();

// The labels of the samples that the Python interop test exchanges with proto_interop_tool.
std::vector<std::string> InteropSampleLabels();

// Builders of the samples, for tests that need one type. `input` must not be INPUT_NOT_SET.
v1::SamplingParams SampleSamplingParams();
v1::GenerateRequest SampleGenerateRequest(v1::GenerateRequest::InputCase input);
v1::GenerateResponse SampleGenerateResponse();
v1::TokenizeRequest SampleTokenizeRequest(v1::TokenizeRequest::InputCase input);
v1::TokenizeResponse SampleTokenizeResponse();
v1::ListModelsResponse SampleListModelsResponse();
v1::WatchStateRequest SampleWatchStateRequest();
v1::Snapshot SampleSnapshot();
v1::KvEventBatch SampleKvEventBatch();
v1::LoadSample SampleLoadSample();
v1::KvPoolDescriptor SampleKvPoolDescriptor();
v1::DecodeRequest SampleDecodeRequest();
v1::DecodeResponse SampleDecodeResponse();
v1::PrefillRequest SamplePrefillRequest();
v1::PrefillResponse SamplePrefillResponse();

}  // namespace tandem::proto_testing

#endif  // TANDEM_PROTO_TESTING_SAMPLE_MESSAGES_H_
