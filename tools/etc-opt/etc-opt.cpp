//===- etc-opt.cpp - ETC optimizer driver ---------------------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
// Parses etensor plus every upstream dialect, because the GPU path goes
// through gpu, nvvm, llvm and their extensions down to PTX.
//
//===----------------------------------------------------------------------===//

#include "etc/Dialect/ETensor/IR/ETensorDialect.h"
#include "etc/InitAllPasses.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::registerAllPasses();
  etc::registerAllPasses();

  mlir::DialectRegistry registry;
  registry.insert<mlir::etensor::ETensorDialect>();
  mlir::registerAllDialects(registry);
  // Without the extensions the NVVM target attribute cannot serialize and
  // gpu-module-to-binary aborts.
  mlir::registerAllExtensions(registry);
  mlir::registerAllToLLVMIRTranslations(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "ETC (Event Tensor Compiler) optimizer driver\n", registry));
}
