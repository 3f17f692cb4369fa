//===- Passes.h - Event tensor passes ---------------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_H
#define ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_H

#include "etc/Dialect/ETensor/IR/ETensorOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::etensor {

#define GEN_PASS_DECL
#include "etc/Dialect/ETensor/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "etc/Dialect/ETensor/Transforms/Passes.h.inc"

} // namespace mlir::etensor

#endif // ETC_DIALECT_ETENSOR_TRANSFORMS_PASSES_H
