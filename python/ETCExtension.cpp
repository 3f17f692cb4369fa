//===- ETCExtension.cpp - Python bindings of the etensor dialect ----------===//
//
// Part of ETC, the Event Tensor Compiler.
//
// The event and queue types, dialect registration and pass registration.
// Ops need nothing here: their builders are generated from ODS.
//
//===----------------------------------------------------------------------===//

#include "etc-c/Dialects.h"
#include "mlir-c/IR.h"
#include "mlir/Bindings/Python/IRCore.h"
#include "mlir/Bindings/Python/Nanobind.h"
#include "mlir/Bindings/Python/NanobindAdaptors.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace nb = nanobind;
using namespace mlir::python::nanobind_adaptors;

namespace mlir::python::MLIR_BINDINGS_PYTHON_DOMAIN::etensor {

/// `!etensor.event<...>`: `shape` entries are ints or None for `?`.
struct PyEventType : PyConcreteType<PyEventType> {
  static constexpr IsAFunctionTy isaFunction = etcTypeIsAEventType;
  static constexpr GetTypeIDFunctionTy getTypeIdFunction =
      etcEventTypeGetTypeID;
  static constexpr const char *pyClassName = "EventType";
  using Base::Base;

  static void bindDerived(ClassTy &c) {
    c.def_static(
        "get",
        [](const std::vector<std::optional<int64_t>> &shape,
           DefaultingPyMlirContext context) {
          std::vector<int64_t> dims;
          for (const std::optional<int64_t> &dim : shape) {
            if (dim && *dim < 0)
              throw nb::value_error("event dimensions must be >= 0 or None");
            dims.push_back(dim ? *dim : INT64_MIN);
          }
          return PyEventType(
              context->getRef(),
              etcEventTypeGet(context.get()->get(), dims.size(), dims.data()));
        },
        nb::arg("shape"), nb::arg("context").none() = nb::none(),
        "An event tensor type; None marks a symbolic ('?') dimension.");
    c.def_prop_ro("rank",
                  [](PyEventType &self) { return etcEventTypeGetRank(self); });
    c.def_prop_ro("shape", [](PyEventType &self) {
      std::vector<std::optional<int64_t>> shape;
      for (intptr_t d = 0, e = etcEventTypeGetRank(self); d < e; ++d) {
        int64_t dim = etcEventTypeGetDimSize(self, d);
        shape.push_back(dim == INT64_MIN ? std::nullopt
                                         : std::optional<int64_t>(dim));
      }
      return shape;
    });
  }
};

/// `!etensor.queue`.
struct PyQueueType : PyConcreteType<PyQueueType> {
  static constexpr IsAFunctionTy isaFunction = etcTypeIsAQueueType;
  static constexpr GetTypeIDFunctionTy getTypeIdFunction =
      etcQueueTypeGetTypeID;
  static constexpr const char *pyClassName = "QueueType";
  using Base::Base;

  static void bindDerived(ClassTy &c) {
    c.def_static(
        "get",
        [](DefaultingPyMlirContext context) {
          return PyQueueType(context->getRef(),
                             etcQueueTypeGet(context.get()->get()));
        },
        nb::arg("context").none() = nb::none());
  }
};

} // namespace mlir::python::MLIR_BINDINGS_PYTHON_DOMAIN::etensor

NB_MODULE(_etcDialects, m) {
  m.doc() = "ETC: the etensor dialect's types and registration.";
  // Passes and pipelines are registered once per process, on import, so
  // PassManager.parse("builtin.module(etc-static-to-ptx)") works.
  etcRegisterAllPasses();

  m.def(
      "register_dialects",
      [](MlirDialectRegistry registry) {
        mlirDialectHandleInsertDialect(mlirGetDialectHandle__etensor__(),
                                       registry);
      },
      nb::arg("registry"));

  auto etensorM = m.def_submodule("etensor");
  using namespace mlir::python::MLIR_BINDINGS_PYTHON_DOMAIN::etensor;
  PyEventType::bind(etensorM);
  PyQueueType::bind(etensorM);
}
