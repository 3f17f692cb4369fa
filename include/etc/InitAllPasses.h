//===- InitAllPasses.h - Register every ETC pass ----------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_INITALLPASSES_H
#define ETC_INITALLPASSES_H

#include "etc/Conversion/Passes.h"
#include "etc/Dialect/ETensor/Transforms/Passes.h"
#include "etc/Pipelines/Passes.h"

namespace etc {

inline void registerAllPasses() {
  mlir::etensor::registerETensorPasses();
  mlir::etensor::registerETCConversionPasses();
  mlir::etensor::registerETCPipelines();
}

} // namespace etc

#endif // ETC_INITALLPASSES_H
