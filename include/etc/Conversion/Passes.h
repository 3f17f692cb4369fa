//===- Passes.h - ETC conversion passes -------------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_PASSES_H
#define ETC_CONVERSION_PASSES_H

#include "etc/Conversion/ETensorToGPU/ETensorToGPU.h"

namespace mlir::etensor {

#define GEN_PASS_REGISTRATION
#include "etc/Conversion/Passes.h.inc"

} // namespace mlir::etensor

#endif // ETC_CONVERSION_PASSES_H
