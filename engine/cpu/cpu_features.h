// What the host CPU can run, and which kernel instruction set the CPU backend dispatches to.
//
// Detection uses cpuid and xgetbv (so an ISA the OS does not save state for counts as absent). The
// kernels come in three flavours (see kernel_table.h):
//
//   kScalar  portable C++, always present; the reference the others are tested against
//   kAvx2    AVX2 + FMA + F16C                                  (Haswell / Zen 1 and later)
//   kAvx512  AVX-512 F + BW + VL + DQ + VNNI (integer dot via vpdpbusd)  (Ice Lake / Zen 4 and
//   later)
//
// Thread-safe: everything here is immutable after first use.
#ifndef TANDEM_ENGINE_CPU_CPU_FEATURES_H_
#define TANDEM_ENGINE_CPU_CPU_FEATURES_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::cpu {

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA + F16C, with OS support for YMM state
  bool avx512 = false;       // AVX-512 F + BW + VL + DQ, with OS support for ZMM/opmask state
  bool avx512_vnni = false;  // AVX512_VNNI (vpdpbusd on 128/256/512-bit registers)
  bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps); detected, not used by the kernels yet
  bool avx_vnni = false;     // AVX-VNNI (VEX-encoded vpdpbusd); detected, not used yet
};

// The running CPU's features (detected once).
const CpuFeatures& HostCpuFeatures();

// "avx2 avx512 avx512_vnni avx512_bf16" style summary; "none" when nothing is present.
std::string CpuFeaturesSummary(const CpuFeatures& features);

enum class Isa { kScalar, kAvx2, kAvx512 };
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// "scalar", "avx2", "avx512".
absl::string_view IsaName(Isa isa);
// Parses the names above (case-insensitive); INVALID_ARGUMENT otherwise.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);

// Whether `features` can run the kernels of `isa`.
bool IsaSupported(Isa isa, const CpuFeatures& features);
// The fastest ISA that `features` supports.
Isa BestIsa(const CpuFeatures& features);

struct IsaOptions {
  // Upper bound on the ISA to use ("force"): a request above what the CPU supports is lowered to
  // the best supported one. Empty: BestIsa.
  std::optional<Isa> max_isa;
};
Isa SelectIsa(const CpuFeatures& features, const IsaOptions& options);

// The ISA the process dispatches to: SelectIsa(HostCpuFeatures(), options) where options.max_isa
// comes from the environment variable TANDEM_CPU_ISA ("scalar", "avx2", "avx512"; unset, empty
// or "auto" for the best). Chosen once, at first use; an unparsable value is ignored (best ISA).
Isa ActiveIsa();

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_CPU_FEATURES_H_
