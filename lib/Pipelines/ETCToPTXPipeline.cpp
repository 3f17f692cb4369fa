//===- ETCToPTXPipeline.cpp - etensor graph to PTX ------------------------===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#include "etc/Conversion/Passes.h"
#include "etc/Dialect/ETensor/Transforms/Passes.h"
#include "etc/Pipelines/Passes.h"
#include "mlir/Dialect/GPU/Pipelines/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::etensor;

namespace {
/// Fails on the module with a message: the pipeline's options that upstream
/// passes would abort on instead of reporting (`#nvvm.target` is built with
/// an `O` outside 0..3 or an empty chip unchecked; an unknown `format` is
/// reported and then read anyway; LLVM asserts on a feature without sign).
struct RejectPipelineOptionsPass
    : public PassWrapper<RejectPipelineOptionsPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RejectPipelineOptionsPass)

  explicit RejectPipelineOptionsPass(std::string message)
      : message(std::move(message)) {}
  StringRef getArgument() const final { return "etc-reject-pipeline-options"; }
  void runOnOperation() final {
    getOperation().emitError(message);
    signalPassFailure();
  }

  std::string message;
};

/// Whether `chip` names an SM architecture: `sm_` then digits, then maybe
/// `a` or `f` (`sm_90`, `sm_90a`, `sm_100f`). LLVM takes any other name
/// with a warning and emits PTX for no particular target.
bool isSMChip(StringRef chip) {
  if (!chip.consume_front("sm_"))
    return false;
  StringRef digits = chip.take_while(llvm::isDigit);
  StringRef rest = chip.drop_front(digits.size());
  return !digits.empty() && (rest.empty() || rest == "a" || rest == "f");
}

/// Why `options` cannot build the NVVM half of the pipeline, or "".
std::string invalidNVVMOptions(const ETCToPTXPipelineOptions &options) {
  if (!isSMChip(options.chip))
    return "etc-to-ptx: chip='" + options.chip +
           "' is not an SM architecture such as sm_90 or sm_90a";
  // LLVM asserts that each feature starts with '+' or '-'.
  SmallVector<StringRef> features;
  StringRef(options.features).split(features, ',', -1, /*KeepEmpty=*/false);
  for (StringRef feature : features)
    if (!feature.starts_with("+") && !feature.starts_with("-"))
      return "etc-to-ptx: features='" + options.features +
             "': each comma-separated feature starts with '+' or '-' (+ptx80)";
  if (options.optLevel < 0 || options.optLevel > 3)
    return "etc-to-ptx: opt-level=" + std::to_string(options.optLevel) +
           " is outside 0..3";
  StringRef format = options.format;
  if (!llvm::is_contained({"isa", "assembly", "bin", "binary", "fatbin",
                           "fatbinary", "llvm", "offloading"},
                          format))
    return "etc-to-ptx: format='" + format.str() +
           "' is not one of isa, bin, fatbin, llvm (or assembly, binary, "
           "fatbinary, offloading)";
  return "";
}
/// Adds the pass that rejects `options` when they cannot build the pipeline,
/// first, before any pass works on the module; whether it did.
bool rejectInvalidOptions(OpPassManager &pm,
                          const ETCToPTXPipelineOptions &options) {
  std::string invalid = invalidNVVMOptions(options);
  if (invalid.empty())
    return false;
  pm.addPass(std::make_unique<RejectPipelineOptionsPass>(invalid));
  return true;
}
} // namespace

/// Everything after scheduling: one persistent kernel, then PTX.
static void buildKernelToPTX(OpPassManager &pm,
                             const ETCToPTXPipelineOptions &options) {
  ConvertETensorToGPUOptions convertOptions;
  convertOptions.watchdogPolls = options.watchdogPolls;
  convertOptions.blockSize = options.blockSize;
  convertOptions.minCtasPerSM = options.minCtasPerSM;
  convertOptions.maxPopChunk = options.maxPopChunk;
  convertOptions.prefetchNext = options.prefetchNext;
  convertOptions.smSlices = options.smSlices;
  convertOptions.recordSM = options.recordSM;
  convertOptions.queueAhead = options.queueAhead;
  convertOptions.waitMemo = options.waitMemo;
  convertOptions.convergentReductions = options.convergentReductions;
  convertOptions.popAhead = options.popAhead;
  convertOptions.trace = options.trace;
  convertOptions.checkTableCounts = options.checkTableCounts;
  convertOptions.outline = llvm::to_vector(options.outline);
  pm.addPass(createConvertETensorToGPU(convertOptions));
  // Device functions are called once per dispatch: inline them into the
  // kernel so the task body is optimised together with its waits (except
  // the calls the conversion marked `no_inline`, option `outline`).
  pm.addPass(createInlinerPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  gpu::GPUToNVVMPipelineOptions nvvm;
  nvvm.cubinChip = options.chip;
  nvvm.cubinFeatures = options.features;
  nvvm.cubinFormat = options.format;
  nvvm.optLevel = options.optLevel;
  gpu::buildLowerToNVVMPassPipeline(pm, nvvm);
}

void mlir::etensor::buildETCStaticToPTXPipeline(
    OpPassManager &pm, const ETCToPTXPipelineOptions &options) {
  if (rejectInvalidOptions(pm, options))
    return;
  pm.addPass(createETensorVerifyGraph());
  pm.addPass(createETensorStaticSchedule());
  buildKernelToPTX(pm, options);
}

void mlir::etensor::buildETCDynamicToPTXPipeline(
    OpPassManager &pm, const ETCToPTXPipelineOptions &options) {
  if (rejectInvalidOptions(pm, options))
    return;
  pm.addPass(createETensorVerifyGraph());
  ETensorDynamicScheduleOptions scheduleOptions;
  scheduleOptions.earlyPush = options.earlyPush;
  pm.addPass(createETensorDynamicSchedule(scheduleOptions));
  buildKernelToPTX(pm, options);
}

void mlir::etensor::registerETCPipelines() {
  PassPipelineRegistration<ETCToPTXPipelineOptions>(
      "etc-static-to-ptx",
      "Verify, statically schedule and lower etensor graphs to a gpu.binary "
      "holding PTX (format=isa) for the chosen chip.",
      buildETCStaticToPTXPipeline);
  PassPipelineRegistration<ETCToPTXPipelineOptions>(
      "etc-dynamic-to-ptx",
      "Verify, dynamically schedule (on-GPU ready queue, early push by "
      "default) and lower etensor graphs to a gpu.binary holding PTX.",
      buildETCDynamicToPTXPipeline);
}
