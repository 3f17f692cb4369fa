//===- ETensorDialect.h - Event tensor dialect ------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_H
#define ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dialect.h"

#include "etc/Dialect/ETensor/IR/ETensorOpsDialect.h.inc"

#endif // ETC_DIALECT_ETENSOR_IR_ETENSORDIALECT_H
