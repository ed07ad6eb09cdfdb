// Conversions between the wire messages (tandem.v1) and the engine's sampling types, for the
// workers and the router (library tandem::proto_conversion; it sits above engine/sampling).
#ifndef TANDEM_PROTO_CONVERSION_H_
#define TANDEM_PROTO_CONVERSION_H_

#include <cstdint>

#include "absl/time/time.h"
#include "engine/sampling/sampling_options.h"
#include "engine/sampling/stop_checker.h"
#include "tandem/v1/inference.pb.h"

namespace tandem {

// Field by field; absent optional fields keep the engine's defaults. Range checks are
// sampling::ValidateSamplingOptions's (the engine runs them on Add).
sampling::SamplingOptions SamplingFromProto(const v1::SamplingParams& params);

// The two enums share their values.
v1::FinishReason FinishReasonToProto(sampling::FinishReason reason);

// A duration for the messages' `*_us` fields: whole microseconds, 0 for a negative one.
uint64_t MicrosForProto(absl::Duration d);

}  // namespace tandem

#endif  // TANDEM_PROTO_CONVERSION_H_
