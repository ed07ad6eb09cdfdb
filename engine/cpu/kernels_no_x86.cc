// Builds for other architectures have only the scalar kernel table.
#include "engine/cpu/kernel_table.h"

namespace tandem::cpu {

const KernelTable* Avx2KernelTable() { return nullptr; }
const KernelTable* Avx512KernelTable() { return nullptr; }

}  // namespace tandem::cpu
