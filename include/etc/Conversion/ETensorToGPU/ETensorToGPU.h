//===- ETensorToGPU.h - Scheduled etensor to GPU dialect --------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_ETENSORTOGPU_ETENSORTOGPU_H
#define ETC_CONVERSION_ETENSORTOGPU_ETENSORTOGPU_H

#include "mlir/Pass/Pass.h"

namespace mlir {
class ModuleOp;
namespace etensor {

#define GEN_PASS_DECL_CONVERTETENSORTOGPU
#include "etc/Conversion/Passes.h.inc"

} // namespace etensor
} // namespace mlir

#endif // ETC_CONVERSION_ETENSORTOGPU_ETENSORTOGPU_H
