//===- Dialects.cpp - C API for the etensor dialect -----------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc-c/Dialects.h"
#include "etc/Dialect/ETensor/IR/ETensorDialect.h"
#include "etc/Dialect/ETensor/IR/ETensorTypes.h"
#include "etc/InitAllPasses.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/CAPI/Support.h"

using namespace mlir;
using namespace mlir::etensor;

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(ETensor, etensor, ETensorDialect)

void etcRegisterAllPasses(void) { etc::registerAllPasses(); }

bool etcTypeIsAEventType(MlirType type) { return isa<EventType>(unwrap(type)); }

MlirType etcEventTypeGet(MlirContext ctx, intptr_t rank, const int64_t *shape) {
  return wrap(EventType::get(unwrap(ctx), ArrayRef<int64_t>(shape, rank)));
}

intptr_t etcEventTypeGetRank(MlirType type) {
  return cast<EventType>(unwrap(type)).getRank();
}

int64_t etcEventTypeGetDimSize(MlirType type, intptr_t dim) {
  return cast<EventType>(unwrap(type)).getShape()[dim];
}

MlirTypeID etcEventTypeGetTypeID(void) { return wrap(EventType::getTypeID()); }

bool etcTypeIsAQueueType(MlirType type) { return isa<QueueType>(unwrap(type)); }

MlirType etcQueueTypeGet(MlirContext ctx) {
  return wrap(QueueType::get(unwrap(ctx)));
}

MlirTypeID etcQueueTypeGetTypeID(void) { return wrap(QueueType::getTypeID()); }
