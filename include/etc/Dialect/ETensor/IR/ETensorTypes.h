//===- ETensorTypes.h - Event tensor types ----------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_H
#define ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "etc/Dialect/ETensor/IR/ETensorOpsTypes.h.inc"

#endif // ETC_DIALECT_ETENSOR_IR_ETENSORTYPES_H
