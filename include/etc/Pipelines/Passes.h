//===- Passes.h - ETC pass pipelines ----------------------------*- C++ -*-===//
//
// Part of ETC, the Event Tensor Compiler.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_PIPELINES_PASSES_H
#define ETC_PIPELINES_PASSES_H

#include "mlir/Pass/PassOptions.h"
#include <string>

namespace mlir {
class OpPassManager;
namespace etensor {

/// Options of the `etc-static-to-ptx` pipeline.
struct ETCToPTXPipelineOptions
    : public PassPipelineOptions<ETCToPTXPipelineOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("Target SM architecture (sm_90, sm_90a)."),
      llvm::cl::init("sm_90")};
  PassOptions::Option<std::string> features{
      *this, "features",
      llvm::cl::desc("PTX features; sm_90 needs PTX 7.8 or newer."),
      llvm::cl::init("+ptx80")};
  PassOptions::Option<int> optLevel{*this, "opt-level",
                                    llvm::cl::desc("NVVM optimization level."),
                                    llvm::cl::init(3)};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("gpu-module-to-binary format: isa (PTX), bin, fatbin."),
      llvm::cl::init("isa")};
  PassOptions::Option<int64_t> watchdogPolls{
      *this, "watchdog-polls",
      llvm::cl::desc("Polls of one wait before the watchdog fires."),
      llvm::cl::init(20000000)};
  PassOptions::Option<bool> earlyPush{
      *this, "early-push",
      llvm::cl::desc("Dynamic schedule: push consumers when their last "
                     "producer is dispatched, not when it completes."),
      llvm::cl::init(true)};
  PassOptions::Option<bool> checkTableCounts{
      *this, "check-table-counts",
      llvm::cl::desc("Check table-counted events' notifications as the launch "
                     "ends (see convert-etensor-to-gpu)."),
      llvm::cl::init(true)};
  PassOptions::Option<bool> trace{
      *this, "trace",
      llvm::cl::desc("Record per-instance start/end times and SMs."),
      llvm::cl::init(false)};
  PassOptions::Option<int64_t> blockSize{
      *this, "block-size",
      llvm::cl::desc("Threads per CTA when the graph does not set it."),
      llvm::cl::init(256)};
  PassOptions::Option<int64_t> maxPopChunk{
      *this, "max-pop-chunk",
      llvm::cl::desc("Dynamic schedule: most queue positions per head "
                     "request (see convert-etensor-to-gpu)."),
      llvm::cl::init(8)};
  PassOptions::Option<bool> popAhead{
      *this, "pop-ahead",
      llvm::cl::desc("Dynamic schedule: request the next queue positions "
                     "ahead of time (see convert-etensor-to-gpu)."),
      llvm::cl::init(true)};
  PassOptions::Option<bool> prefetchNext{
      *this, "prefetch-next",
      llvm::cl::desc("Static schedule: call the next instance's prefetch "
                     "function before running the current one."),
      llvm::cl::init(false)};
  PassOptions::Option<bool> smSlices{
      *this, "sm-slices",
      llvm::cl::desc("Static schedule: each CTA takes its queue slice by the "
                     "SM it runs on (see convert-etensor-to-gpu)."),
      llvm::cl::init(false)};
  PassOptions::Option<bool> recordSM{
      *this, "record-sm",
      llvm::cl::desc("Static schedule: each CTA records its SM in the queue "
                     "as it exits (see convert-etensor-to-gpu)."),
      llvm::cl::init(false)};
  PassOptions::Option<bool> queueAhead{
      *this, "queue-ahead",
      llvm::cl::desc("Static schedule: each CTA loads its next queue entry "
                     "as the current instance starts (see "
                     "convert-etensor-to-gpu)."),
      llvm::cl::init(false)};
  PassOptions::Option<bool> waitMemo{
      *this, "wait-memo",
      llvm::cl::desc("Static schedule: each CTA skips a wait on the "
                     "coordinate its last completed wait saw (see "
                     "convert-etensor-to-gpu)."),
      llvm::cl::init(false)};
  PassOptions::Option<bool> convergentReductions{
      *this, "convergent-reductions",
      llvm::cl::desc("The scheduler's CTA reductions as nvvm.barrier with a "
                     "reduction instead of inline bar.red (see "
                     "convert-etensor-to-gpu)."),
      llvm::cl::init(false)};
  PassOptions::ListOption<std::string> outline{
      *this, "outline",
      llvm::cl::desc("Device functions called, not inlined (`*`: all; see "
                     "convert-etensor-to-gpu).")};
  PassOptions::Option<int64_t> minCtasPerSM{
      *this, "min-ctas-per-sm",
      llvm::cl::desc("Resident CTAs per SM to ask ptxas for (0: its choice)."),
      llvm::cl::init(0)};
};

/// verify-graph, static schedule, convert-etensor-to-gpu, then the NVVM
/// lowering and serialization of the kernel module to `format`.
void buildETCStaticToPTXPipeline(OpPassManager &pm,
                                 const ETCToPTXPipelineOptions &options);

/// The same with the dynamic schedule (on-GPU ready queue).
void buildETCDynamicToPTXPipeline(OpPassManager &pm,
                                  const ETCToPTXPipelineOptions &options);

/// Registers `etc-static-to-ptx` and `etc-dynamic-to-ptx`.
void registerETCPipelines();

} // namespace etensor
} // namespace mlir

#endif // ETC_PIPELINES_PASSES_H
