//===- Dialects.h - C API for the etensor dialect -----------------*- C -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_C_DIALECTS_H
#define ETC_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(ETensor, etensor);

/// Registers the etensor passes, the ETC conversions and pipelines.
MLIR_CAPI_EXPORTED void etcRegisterAllPasses(void);

MLIR_CAPI_EXPORTED bool etcTypeIsAEventType(MlirType type);
/// `shape` entries are sizes or `INT64_MIN` (`ShapedType::kDynamic`) for `?`.
MLIR_CAPI_EXPORTED MlirType etcEventTypeGet(MlirContext ctx, intptr_t rank,
                                            const int64_t *shape);
MLIR_CAPI_EXPORTED intptr_t etcEventTypeGetRank(MlirType type);
MLIR_CAPI_EXPORTED int64_t etcEventTypeGetDimSize(MlirType type, intptr_t dim);
MLIR_CAPI_EXPORTED MlirTypeID etcEventTypeGetTypeID(void);

MLIR_CAPI_EXPORTED bool etcTypeIsAQueueType(MlirType type);
MLIR_CAPI_EXPORTED MlirType etcQueueTypeGet(MlirContext ctx);
MLIR_CAPI_EXPORTED MlirTypeID etcQueueTypeGetTypeID(void);

#ifdef __cplusplus
}
#endif

#endif // ETC_C_DIALECTS_H
