//===- ETensorOps.h - Event tensor operations -------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSOROPS_H
#define ETC_DIALECT_ETENSOR_IR_ETENSOROPS_H

#include "etc/Dialect/ETensor/IR/ETensorDialect.h"
#include "etc/Dialect/ETensor/IR/ETensorTypes.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "etc/Dialect/ETensor/IR/ETensorEnums.h.inc"

#define GET_OP_CLASSES
#include "etc/Dialect/ETensor/IR/ETensorOps.h.inc"

namespace mlir::etensor {
/// Marks the schedule's call of a task's prefetch function, which the
/// kernel runs on every thread before the instance's waits.
inline constexpr llvm::StringLiteral kPrefetchAttrName = "etensor.prefetch";

/// Whether a task may pass `arg` for a device function parameter of type
/// `param`: the same type, or a memref that only fixes some of `param`'s
/// dynamic sizes (the call site casts it: `memref<128x64xf32>` for
/// `memref<?x64xf32>`), so one generic tile serves static tensors.
bool isGeneralisationOf(Type param, Type arg);
} // namespace mlir::etensor

#endif // ETC_DIALECT_ETENSOR_IR_ETENSOROPS_H
