//===- ETensorDialect.cpp - Event tensor dialect --------------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/IR/ETensorDialect.h"
#include "etc/Dialect/ETensor/IR/ETensorOps.h"
#include "etc/Dialect/ETensor/IR/ETensorTypes.h"

using namespace mlir;
using namespace mlir::etensor;

#include "etc/Dialect/ETensor/IR/ETensorOpsDialect.cpp.inc"

void ETensorDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "etc/Dialect/ETensor/IR/ETensorOps.cpp.inc"
      >();
  registerTypes();
}
