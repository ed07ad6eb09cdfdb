#include "engine/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cpu {
namespace {

struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs Cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return CpuidRegs{};
  return r;
}

// XCR0: which register states the OS saves on context switch. Only valid when OSXSAVE is set.
uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool Bit(unsigned reg, int bit) { return ((reg >> bit) & 1u) != 0; }

CpuFeatures Detect() {
  CpuFeatures f;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  const CpuidRegs l1 = Cpuid(1, 0);
  const bool osxsave = Bit(l1.ecx, 27);
  const bool avx = Bit(l1.ecx, 28);
  const bool fma = Bit(l1.ecx, 12);
  const bool f16c = Bit(l1.ecx, 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state || max_leaf < 7) return f;
  const CpuidRegs l7 = Cpuid(7, 0);
  const CpuidRegs l7_1 = Cpuid(7, 1);
  f.avx2 = Bit(l7.ebx, 5) && fma && f16c;
  f.avx_vnni = f.avx2 && Bit(l7_1.eax, 4);
  if (zmm_state) {
    f.avx512 = Bit(l7.ebx, 16) && Bit(l7.ebx, 17) && Bit(l7.ebx, 30) && Bit(l7.ebx, 31) && f.avx2;
    f.avx512_vnni = f.avx512 && Bit(l7.ecx, 11);
    f.avx512_bf16 = f.avx512 && Bit(l7_1.eax, 5);
  }
  return f;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

std::string CpuFeaturesSummary(const CpuFeatures& features) {
  std::vector<absl::string_view> names;
  if (features.avx2) names.push_back("avx2");
  if (features.avx_vnni) names.push_back("avx_vnni");
  if (features.avx512) names.push_back("avx512");
  if (features.avx512_vnni) names.push_back("avx512_vnni");
  if (features.avx512_bf16) names.push_back("avx512_bf16");
  if (names.empty()) return "none";
  return absl::StrJoin(names, " ");
}

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (Isa isa : kAllIsas) {
    if (IsaName(isa) == lower) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU ISA '", name, "' (expected scalar, avx2 or avx512)"));
}

bool IsaSupported(Isa isa, const CpuFeatures& features) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return features.avx2;
    case Isa::kAvx512:
      return features.avx512 && features.avx512_vnni;
  }
  return false;
}

Isa BestIsa(const CpuFeatures& features) {
  if (IsaSupported(Isa::kAvx512, features)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2, features)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa SelectIsa(const CpuFeatures& features, const IsaOptions& options) {
  Isa isa = BestIsa(features);
  if (options.max_isa.has_value() && static_cast<int>(*options.max_isa) < static_cast<int>(isa)) {
    isa = *options.max_isa;
  }
  return isa;
}

Isa ActiveIsa() {
  static const Isa isa = [] {
    IsaOptions options;
    const char* env = std::getenv("TANDEM_CPU_ISA");
    if (env != nullptr && *env != '\0' && absl::AsciiStrToLower(env) != "auto") {
      if (absl::StatusOr<Isa> parsed = ParseIsa(env); parsed.ok()) options.max_isa = *parsed;
    }
    return SelectIsa(HostCpuFeatures(), options);
  }();
  return isa;
}

}  // namespace tandem::cpu
