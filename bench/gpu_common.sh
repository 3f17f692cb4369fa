# Sourced by bench/gpu_*.sh: what every device call sets up first (the
# repository's Python on the path, $OUT, the GPU and its clocks recorded).
export PYTHONPATH="$PWD/python:$PWD"
OUT=${OUT:-/tmp/etc-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# The GPU tests over the artifacts in .device/arts and .device/fuzz, into
# $OUT/tests.txt; arguments go to pytest (e.g. -x).
gpu_tests() {
  echo "== GPU tests" | tee "$OUT/tests.txt"
  ETC_ARTIFACTS=.device/arts ETC_FUZZ_ARTIFACTS=.device/fuzz timeout 300 \
    python -m pytest -q -rs "$@" test/gpu 2>&1 | tail -15 | tee -a "$OUT/tests.txt"
}

# Two passes of bench/moe.py's fused static kernels CFGS (the second in
# reverse order) at SIZES from DIR/moe, the first one traced when TRACE=1:
# moe_ab NAME CFGS SIZES DIR [TRACE]. Raw results NAME{1,2}.json and the
# trace tables NAME_trace.txt into $OUT (scratch in $AB_TMP); the lines
# matching $AB_GREP (default: the occupancy variants' GPU times) are shown.
moe_ab() {
  local name=$1 cfgs=$2 sizes=$3 dir=$4 trace=${5:-0} tmp=${AB_TMP:-/tmp/ab} pass order
  mkdir -p "$tmp"
  for pass in 1 2; do
    order=$cfgs; [ $pass = 2 ] && order=$(echo $cfgs | tr , '\n' | tac | paste -sd,)
    BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$order BENCH_MOE_SIZES=$sizes \
      timeout ${AB_TIMEOUT:-280} python bench/moe.py --artifacts $dir/moe --out "$tmp/$name$pass.json" \
      $([ $pass = 1 ] && [ $trace = 1 ] && echo --trace) 2>&1 | tee -a "$OUT/$name.txt" \
      | grep "${AB_GREP:-occ.*GPU}"
  done
  cp "$tmp/${name}1.json" "$tmp/${name}2.json" "$OUT/"
  if [ $trace = 1 ]; then
    cp "$tmp/moe_trace.txt" "$OUT/${name}_trace.txt" || echo "no trace (did pass 1 time out?)"
  fi
}

# bench/decode.py over the artifact DIR (python bench/decode.py --build DIR): its
# tables into $OUT (decode.txt, decode.json) and the log into $OUT/bench.txt;
# DECODE_PARTS picks the parts (default check,time), ARGS go to bench/decode.py
# (e.g. --compile-batches 1,8 --compile-contexts 1024), within $DECBENCH_TIMEOUT
# seconds (560): decode_bench DIR [ARGS...]
decode_bench() {
  local dir=$1; shift
  timeout ${DECBENCH_TIMEOUT:-560} python bench/decode.py --artifacts "$dir" --out "$OUT" \
    --reps 5 --parts "${DECODE_PARTS:-check,time}" "$@" 2>&1 \
    | grep -v -i "warn\|attention mask\|cudagraph" | tee "$OUT/bench.txt"
}

# The issue's table over the artifact DIR: decode_bench's check against Hugging
# Face and timings with torch.compile at COMPILE_BATCHES (1,8,32,64) and
# COMPILE_CONTEXTS (1024,4096): issue_bench DIR
issue_bench() {
  DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench "$1" \
    --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
}

# bench/torch_compile_probe.py at $PROBE_BATCHES (default BATCHES) within
# $PROBE_TIMEOUT seconds (200), into $OUT/compile_probe.txt; shows the last
# LINES lines without inductor's INFO logs: compile_probe BATCHES LINES
compile_probe() {
  timeout ${PROBE_TIMEOUT:-200} python bench/torch_compile_probe.py ${PROBE_BATCHES:-$1} 2>&1 \
    | tee "$OUT/compile_probe.txt" | grep -v "^\s*$\|template_heuristics\|^I1\|^W1" | tail -$2
}

# The GPU test files test/gpu/test_<f>_gpu.py for f in SUITE_FILES over the
# artifacts packed in ARCHIVE (a tar.xz of arts/ and fuzz/, unpacked into TMP
# once), within SUITE_BUDGET seconds (560) in all; each file's verbose log
# goes to $OUT/<name>_suite_<f>.txt as it runs (so a cut keeps what ran), and
# its count of passes and its failures to $OUT/<name>_suite.txt:
# gpu_suite NAME ARCHIVE TMP
gpu_suite() {
  local name=$1 archive=$2 tmp=$3 start=$SECONDS f left log
  mkdir -p "$tmp"
  [ -d "$tmp/arts" ] || python -c "import tarfile; tarfile.open('$archive').extractall('$tmp')"
  for f in ${SUITE_FILES:-gemm schedules runtime moe fuzz collective llama}; do
    left=$(( ${SUITE_BUDGET:-560} - (SECONDS - start) ))
    [ $left -lt 20 ] && { echo "== $f: no time left" | tee -a "$OUT/${name}_suite.txt"; continue; }
    echo "== $f (${left} s left)" | tee -a "$OUT/${name}_suite.txt"
    log="$OUT/${name}_suite_$f.txt"
    ETC_ARTIFACTS="$tmp/arts" ETC_FUZZ_ARTIFACTS="$tmp/fuzz" timeout $left \
      python -m pytest -v -rfE --durations=5 -p no:cacheprovider "test/gpu/test_${f}_gpu.py" \
      > "$log" 2>&1
    echo "rc=$? after $((SECONDS - start)) s" >> "$log"
    grep -cE " PASSED" "$log" | sed "s/^/passed: /" | tee -a "$OUT/${name}_suite.txt"
    grep -E " (FAILED|ERROR)|^(FAILED|ERROR) |rc=|passed|failed" "$log" | tail -12 \
      | tee -a "$OUT/${name}_suite.txt"
  done
}

# Two bench/decode_sweep.py passes (the second over the reversed variants):
# sweep_passes NAME VARIANTS BATCHES CONTEXTS DIR (SWEEP_PASSES="1" for one); rows into $OUT/NAME.txt,
# raw NAME_<pass>_<L>_<B>.json into $SWEEP_TMP/raw (scratch in $SWEEP_TMP,
# default /tmp/sweep; the session scripts tar it into $OUT at the end).
sweep_passes() {
  local name=$1 variants=$2 batches=$3 contexts=$4 dir=$5 tmp=${SWEEP_TMP:-/tmp/sweep} pass v L
  mkdir -p "$tmp/raw"
  for pass in ${SWEEP_PASSES:-1 2}; do
    v=$variants; [ $pass = 2 ] && v=$(echo "$variants" | tr , '\n' | tac | paste -sd,)
    for L in ${contexts//,/ }; do
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=$batches DECODE_SWEEP_CONTEXT=$L timeout 280 \
        python bench/decode_sweep.py --artifacts $dir --out $tmp/$name$pass$L --reps 7 \
        2>&1 | grep "B=" | sed "s/^/L=$L /" | tee -a "$OUT/$name.txt"
      cp $tmp/$name$pass$L/decode_sweep.json "$tmp/raw/${name}_${pass}_${L}_${batches//,/-}.json"
    done
  done
}

# bench/decode_trace.py's default artifact in DIR traced at B = 1, L = 1024 and
# B = 64, L = 4096: the tables into $OUT/trace_b1.txt and trace_b64.txt, the
# raw records (TMP/tr1, TMP/tr64) into $OUT/traces.tgz: decode_traces DIR TMP
decode_traces() {
  local dir=$1 tmp=$2
  DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=1 timeout 200 python bench/decode_trace.py \
    --artifacts "$dir" --out "$tmp/tr1" 2>&1 | tee "$OUT/trace_b1.txt" | grep -A9 "layer"
  DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 timeout 200 \
    python bench/decode_trace.py --artifacts "$dir" --out "$tmp/tr64" 2>&1 \
    | tee "$OUT/trace_b64.txt" | grep -A9 "layer"
  tar czf "$OUT/traces.tgz" -C "$tmp" tr1 tr64
}

# Two passes of bench/gemm_tma.py over CONFIGS x SHAPES from DIR (python
# bench/gemm_tma.py --build DIR): gemm_passes NAME CONFIGS SHAPES DIR; raw
# NAME{1,2}.json and NAME.txt into $OUT (scratch in $GEMM_TMP).
gemm_passes() {
  local name=$1 configs=$2 shapes=$3 dir=$4 tmp=${GEMM_TMP:-/tmp/gemm} pass
  for pass in 1 2; do
    BENCH_GEMM_CONFIGS=$configs BENCH_GEMM_SHAPES=$shapes timeout 250 \
      python bench/gemm_tma.py --artifacts $dir --out $tmp/$name$pass 2>&1 \
      | tee -a "$OUT/$name.txt" | grep -E "TFLOP|WRONG|FAILED"
    cp $tmp/$name$pass/gemm_tma.json "$OUT/$name$pass.json"
  done
}

# The MoE one-artifact family's GPU tests (ARTS: make_artifacts.py --only
# moe_small_family) and examples/moe.py --preset auto over the real-size
# artifact AUTO on both sides of every preset bound and on skewed routings,
# appended to $OUT/FILE: moe_checks ARTS AUTO FILE
moe_checks() {
  local arts=$1 auto=$2 file=$3
  ETC_ARTIFACTS=$arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
    -k one_artifact 2>&1 | tee -a "$OUT/$file" | tail -3
  ex() { timeout 150 python examples/moe.py --preset auto --artifact "$auto" "$@" 2>&1 \
    | tee -a "$OUT/$file"; }
  ex --tokens 1,9,1024,2048,2049,3000,4096 | tail -9
  ex --routing one-expert --tokens 2049,4095 | tail -4
  ex --routing few-experts --tokens 4095 | tail -3
}
