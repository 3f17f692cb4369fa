// RUN: etc-opt %s -split-input-file -verify-diagnostics --etensor-verify-graph

// expected-error @+1 {{invalid dimension}}
func.func private @malformed_event_type(%e: !etensor.event<4xf32>)

// -----

// expected-error @+1 {{argument #1 must be an index symbol or a memref buffer, got 'f32'}}
etensor.graph @bad_argument(%n: index, %x: f32) {
}

// -----

etensor.graph @size_operand_count(%n: index) {
  // expected-error @+1 {{expects one size operand per '?' dimension of '!etensor.event<?x?>' (2), got 1}}
  %e = etensor.event(%n) count 1 : !etensor.event<?x?>
}

// -----

etensor.graph @negative_count() {
  // expected-error @+1 {{wait count must be non-negative, got -1}}
  %e = etensor.event() count -1 : !etensor.event<4>
}

// -----

etensor.graph @table_element_type(%t: memref<4xf32>) {
  // expected-error @+1 {{wait count table must hold signless integers, got 'memref<4xf32>'}}
  %e = etensor.event() count from %t : memref<4xf32> : !etensor.event<4>
}

// -----

etensor.graph @table_rank(%t: memref<4x2xi32>) {
  // expected-error @+1 {{wait count table 'memref<4x2xi32>' must have the event's rank 1}}
  %e = etensor.event() count from %t : memref<4x2xi32> : !etensor.event<4>
}

// -----

etensor.graph @table_shape(%t: memref<5xi32>) {
  // expected-error @+1 {{does not match '!etensor.event<4>' in dimension 0}}
  %e = etensor.event() count from %t : memref<5xi32> : !etensor.event<4>
}

// -----

func.func private @tile(%i: index, %j: index)
etensor.graph @map_grid_rank(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{out map #0 affine_map<(d0) -> (d0)> has 1 dimensions but the task has 2 (its grid rank)}}
  etensor.task @tile grid [%n, 4] outs(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index, %j: index)
etensor.graph @map_event_rank(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{in map #0 affine_map<(d0, d1) -> (d0, d1)> has 2 results but event '!etensor.event<?>' has rank 1}}
  etensor.task @tile grid [%n, 4] ins(%e[(i, j) -> (i, j)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @map_symbols(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{must not use symbols}}
  etensor.task @tile grid [%n] outs(%e[(i)[s] -> (i + s)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @map_constant_out_of_bounds() {
  %e = etensor.event() count 1 : !etensor.event<4>
  // expected-error @+1 {{out map #0 affine_map<(d0) -> (7)> addresses coordinate 7 outside dimension 0 of '!etensor.event<4>'}}
  etensor.task @tile grid [4] outs(%e[(i) -> (7)] : !etensor.event<4>)
}

// -----

// Found by fuzzing: the schedules could not expand the map and crashed.
func.func private @tile(%i: index)
etensor.graph @map_negative_divisor(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{out map #0 affine_map<(d0) -> (d0 floordiv -1)> must divide only by positive constants}}
  etensor.task @tile grid [%n] outs(%e[(i) -> (i floordiv -1)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @map_zero_modulus(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{in map #0 affine_map<(d0) -> (d0 mod 0)> must divide only by positive constants}}
  etensor.task @tile grid [%n] ins(%e[(i) -> (i mod 0)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @negative_extent() {
  // expected-error @+1 {{grid extents must be non-negative, got -3}}
  etensor.task @tile grid [-3]
}

// -----

etensor.graph @missing_callee(%n: index) {
  // expected-error @+1 {{callee 'nowhere' does not name a func.func device function}}
  etensor.task @nowhere grid [%n]
}

// -----

func.func private @tile(%i: index, %a: memref<?xf32>)
etensor.graph @callee_arity(%n: index) {
  // expected-error @+1 {{device function 'tile' takes 2 arguments, but a task with a rank-1 grid and 0 arguments passes 1}}
  etensor.task @tile grid [%n]
}

// -----

func.func private @tile(%i: f32)
etensor.graph @coordinate_type(%n: index) {
  // expected-error @+1 {{argument #0 of device function 'tile' is a grid coordinate and must be index, got 'f32'}}
  etensor.task @tile grid [%n]
}

// -----

func.func private @tile(%i: index, %a: memref<?xf32>)
etensor.graph @buffer_type(%n: index, %a: memref<?xi32>) {
  // expected-error @+1 {{argument #0 has type 'memref<?xi32>' but device function 'tile' expects 'memref<?xf32>'}}
  etensor.task @tile grid [%n] args(%a : memref<?xi32>)
}

// -----

func.func private @tile(%i: index, %j: index, %k: index)
etensor.graph @trigger_grid_rank(%n: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{a data-dependent trigger needs a 1-D task grid, got rank 2}}
  etensor.task @tile grid [%n, 2] triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

etensor.graph @wait_rank(%n: index) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  etensor.worker static {
    etensor.dispatch 0 grid [%n] {
    ^bb0(%i: index):
      // expected-error @+1 {{expects 1 coordinates for '!etensor.event<?>', got 2}}
      etensor.wait %e[%i, %i] : !etensor.event<?>
    }
  }
}

// -----

etensor.graph @notify_out_of_bounds() {
  %e = etensor.event() count 1 : !etensor.event<4>
  etensor.worker static {
    etensor.dispatch 0 grid [1] {
    ^bb0(%i: index):
      %c9 = arith.constant 9 : index
      // expected-error @+1 {{coordinate 9 is out of bounds for dimension 0 of '!etensor.event<4>'}}
      etensor.notify %e[%c9] : !etensor.event<4>
    }
  }
}

// -----

etensor.graph @push_task_index(%cap: index, %i: index) {
  %q = etensor.queue capacity %cap : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    etensor.dispatch 0 grid [1] {
    ^bb0(%k: index):
      // expected-error @+1 {{task index must be non-negative, got -1}}
      etensor.push %q[-1, %i] : !etensor.queue
    }
  }
}

// -----

etensor.graph @dynamic_worker_without_queue() {
  // expected-error @+1 {{a dynamic worker needs a queue}}
  etensor.worker dynamic {
  }
}

// -----

etensor.graph @worker_body() {
  // expected-error @+2 {{is not allowed in a worker body; expected etensor.dispatch}}
  etensor.worker static {
    %c = arith.constant 0 : index
  }
}

// -----

etensor.graph @duplicate_dispatch() {
  etensor.worker static {
    etensor.dispatch 0 grid [1] {
    ^bb0(%i: index):
    }
    // expected-error @+1 {{task 0 is dispatched twice}}
    etensor.dispatch 0 grid [1] {
    ^bb0(%i: index):
    }
  }
}

// -----

// Found by fuzzing: INT64_MAX is the empty key of a DenseSet<int64_t>.
etensor.graph @dispatch_max_task() {
  etensor.worker static {
    etensor.dispatch 9223372036854775807 grid [1] {
    ^bb0(%i: index):
    }
    // expected-error @+1 {{task 9223372036854775807 is dispatched twice}}
    etensor.dispatch 9223372036854775807 grid [1] {
    ^bb0(%i: index):
    }
  }
}

// -----

etensor.graph @dispatch_negative_task() {
  etensor.worker static {
    // expected-error @+1 {{task index must be non-negative, got -9223372036854775808}}
    etensor.dispatch -9223372036854775808 grid [1] {
    ^bb0(%i: index):
    }
  }
}

// -----

etensor.graph @dispatch_arguments() {
  etensor.worker static {
    // expected-error @+1 {{expects one block argument per grid dimension (2), got 1}}
    etensor.dispatch 0 grid [1, 2] {
    ^bb0(%i: index):
    }
  }
}

// -----

// Found by fuzzing: the graph analysis cast every edge's event to
// etensor.event.
func.func private @tile(%i: index)
etensor.graph @event_from_cast(%n: index) {
  %e0 = etensor.event(%n) count 1 : !etensor.event<?>
  %e = builtin.unrealized_conversion_cast %e0 : !etensor.event<?> to !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e0[(i) -> (i)] : !etensor.event<?>)
  // expected-error @+1 {{events must be declared by etensor.event in the same graph}}
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index, %c: index)
etensor.graph @trigger_from_cast(%n: index, %indptr: memref<?xi32>) {
  %e0 = etensor.event(%n) count 1 : !etensor.event<?>
  %e = builtin.unrealized_conversion_cast %e0 : !etensor.event<?> to !etensor.event<?>
  // expected-error @+1 {{events must be declared by etensor.event in the same graph}}
  etensor.task @tile grid [%n] triggered_by(%e, %indptr : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @pool_dim_without_pool() {
  // expected-error @+1 {{pool_dim needs a pooled deal}}
  etensor.task @tile grid [4] {pool_dim = 0 : i64}
}

// -----

func.func private @tile(%i: index, %j: index)
etensor.graph @pool_dim_out_of_grid() {
  // expected-error @+1 {{pool_dim 2 is not a dimension of the rank-2 grid}}
  etensor.task @tile grid [4, 8] {pooled, pool_dim = 2 : i64}
}

// -----

func.func private @tile(%i: index)
etensor.graph @pooled_and_ticketed() {
  // expected-error @+1 {{is dealt by tickets or by pools, not both}}
  etensor.task @tile grid [4] {pooled, ticketed}
}

// -----

func.func private @tile(%i: index, %c: index)
etensor.graph @pooled_trigger(%n: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{with a data-dependent trigger cannot be pooled}}
  etensor.task @tile grid [%n] triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>) {pooled}
}

// -----

func.func private @tile(%i: index, %j: index)
etensor.graph @dispatch_pool_of_rank_two() {
  %pools = etensor.event() count 1 : !etensor.event<4x2>
  etensor.worker static {
    // expected-error @+1 {{a pool needs a 1-D event, got '!etensor.event<4x2>'}}
    etensor.dispatch 0 grid [4, 8] pool(%pools : !etensor.event<4x2>) attributes {pool_dim = 0 : i64} {
    ^bb0(%i: index, %j: index):
      func.call @tile(%i, %j) : (index, index) -> ()
    }
  }
}

//===----------------------------------------------------------------------===//
// Whole-graph rules (etensor-verify-graph)
//===----------------------------------------------------------------------===//

// -----

func.func private @tile(%i: index)
etensor.graph @trigger_callee_arity(%n: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{device function 'tile' takes 1 arguments, but a task with a data-dependent trigger (coordinates i, c) and 0 arguments passes 2}}
  etensor.task @tile grid [%n] triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index, %c: index)
etensor.graph @trigger_out_map_dims(%n: index, %p: memref<?xi32>, %t: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  %f = etensor.event(%n) count from %t : memref<?xi32> : !etensor.event<?>
  // expected-error @+1 {{out map #0 affine_map<(d0) -> (d0)> has 1 dimensions but the task has 2 (the instance and its trigger coordinate)}}
  etensor.task @tile grid [%n] outs(%f[(i) -> (i)] : !etensor.event<?>) triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index, %c: index)
etensor.graph @trigger_in_map_uses_coordinate(%n: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  %f = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{in map #0 affine_map<(d0, d1) -> (d1)> uses the trigger coordinate (dimension 1); only out-edges may}}
  etensor.task @tile grid [%n] ins(%f[(i, c) -> (c)] : !etensor.event<?>) triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @dispatch_trigger_arguments(%n: index, %cap: index, %p: memref<?xi32>) {
  %e = etensor.event(%n) count 1 : !etensor.event<?>
  %q = etensor.queue capacity %cap : !etensor.queue
  etensor.worker dynamic(%q : !etensor.queue) {
    // expected-error @+1 {{with a data-dependent trigger expects two block arguments (the instance and its trigger coordinate), got 1}}
    etensor.dispatch 0 grid [%n] triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>) {
    ^bb0(%i: index):
      func.call @tile(%i) : (index) -> ()
    }
  }
}

// -----

etensor.graph @ranked_scalar(%ranks: index) {
  // expected-error @+1 {{a ranked event needs dimension 0 for the rank, got '!etensor.event<>'}}
  %e = etensor.event() count %ranks ranked : !etensor.event<>
}

// -----

etensor.graph @ranked_table(%ranks: index, %t: memref<?xi32>) {
  // expected-error @+1 {{a ranked event cannot read its wait counts from a table: its notifications come from every rank}}
  %e = etensor.event(%ranks) count from %t : memref<?xi32> ranked : !etensor.event<?>
}

// -----

func.func private @tile(%i: index)
etensor.graph @rank_symbol_without_rank(%ranks: index, %n: index) {
  %e = etensor.event(%ranks, %n) count 1 ranked : !etensor.event<?x?>
  // expected-error @+1 {{in map #0 affine_map<(d0)[s0] -> (s0, d0)> must not use symbols (a task with `rank(%r)` may use one: the rank)}}
  etensor.task @tile grid [%n] ins(%e[(i)[r] -> (r, i)] : !etensor.event<?x?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @two_symbols(%ranks: index, %rank: index, %n: index) {
  %e = etensor.event(%ranks, %n) count 1 ranked : !etensor.event<?x?>
  // expected-error @+1 {{out map #0 affine_map<(d0)[s0, s1] -> (s0, s1)> may use one symbol (the rank)}}
  etensor.task @tile grid [%n] rank(%rank) outs(%e[(i)[r, s] -> (r, s)] : !etensor.event<?x?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @ranked_in_edge_not_own_rank(%ranks: index, %rank: index, %n: index) {
  %e = etensor.event(%n, %n) count 1 ranked {name = "rs"} : !etensor.event<?x?>
  // expected-error @+1 {{in map #0 affine_map<(d0)[s0] -> (d0, s0)> on ranked event 'rs' must address dimension 0 with the rank symbol: a rank waits on its own copy of the counters}}
  etensor.task @tile grid [%n] rank(%rank) ins(%e[(i)[r] -> (i, r)] : !etensor.event<?x?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @ranked_in_edge_constant_rank(%rank: index) {
  %e = etensor.event() count 1 ranked {name = "rs"} : !etensor.event<4x8>
  // expected-error @+1 {{in map #0 affine_map<(d0) -> (0, d0)> on ranked event 'rs' must address dimension 0 with the rank symbol}}
  etensor.task @tile grid [8] rank(%rank) ins(%e[(i) -> (0, i)] : !etensor.event<4x8>)
}

// -----

func.func private @tile(%i: index, %c: index)
etensor.graph @ranked_trigger(%ranks: index, %rank: index, %n: index, %p: memref<?xi32>) {
  %e = etensor.event(%ranks) count 1 ranked : !etensor.event<?>
  // expected-error @+1 {{a data-dependent trigger cannot be a ranked event}}
  etensor.task @tile grid [%n] rank(%rank) triggered_by(%e, %p : !etensor.event<?>, memref<?xi32>)
}

// -----

func.func private @tile(%i: index, %a: memref<?xf32>)
etensor.graph @index_argument_type(%n: index, %rank: index) {
  // expected-error @+1 {{argument #0 has type 'index' but device function 'tile' expects 'memref<?xf32>'}}
  etensor.task @tile grid [%n] rank(%rank) args(%rank : index)
}

// -----

func.func private @tile(%i: index)
etensor.graph @cycle(%n: index) {
  %a = etensor.event(%n) count 1 {name = "a"} : !etensor.event<?>
  %b = etensor.event(%n) count 1 {name = "b"} : !etensor.event<?>
  // expected-error @+1 {{task 'first' is part of a dependency cycle: 'first' -> 'second' -> 'first'}}
  etensor.task @tile grid [%n] ins(%b[(i) -> (i)] : !etensor.event<?>) outs(%a[(i) -> (i)] : !etensor.event<?>) {name = "first"}
  // expected-note @+1 {{task 'second' in the cycle}}
  etensor.task @tile grid [%n] ins(%a[(i) -> (i)] : !etensor.event<?>) outs(%b[(i) -> (i)] : !etensor.event<?>) {name = "second"}
}

// -----

func.func private @tile(%i: index)
etensor.graph @self_loop(%n: index) {
  %a = etensor.event(%n) count 1 : !etensor.event<?>
  // expected-error @+1 {{task 'tile' is part of a dependency cycle: 'tile' -> 'tile'}}
  etensor.task @tile grid [%n] ins(%a[(i) -> (i)] : !etensor.event<?>) outs(%a[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile2(%i: index, %j: index)
func.func private @tile(%i: index)
etensor.graph @constant_count_mismatch(%n: index) {
  // expected-error @+1 {{wait count 3 of event 'e' differs from its fan-in 4}}
  %e = etensor.event(%n) count 3 {name = "e"} : !etensor.event<?>
  // expected-note @+1 {{notified by task 'tile2' through affine_map<(d0, d1) -> (d0)>}}
  etensor.task @tile2 grid [%n, 4] outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile2(%i: index, %j: index)
func.func private @tile(%i: index)
etensor.graph @symbolic_count_mismatch(%n: index, %k: index) {
  // expected-error @+1 {{wait count 4 of event 'e' differs from its fan-in %arg1 (e.g. with %arg1 = 1: 4 vs 1)}}
  %e = etensor.event(%n) count 4 {name = "e"} : !etensor.event<?>
  // expected-note @+1 {{notified by task}}
  etensor.task @tile2 grid [%n, %k] outs(%e[(i, j) -> (i)] : !etensor.event<?>)
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @awaited_never_notified(%n: index) {
  // expected-error @+1 {{event 'orphan' is awaited but never notified}}
  %e = etensor.event(%n) count 1 {name = "orphan"} : !etensor.event<?>
  // expected-note @+1 {{awaited by task 'tile'}}
  etensor.task @tile grid [%n] ins(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @notified_never_awaited(%n: index) {
  // expected-error @+1 {{event 'dangling' is notified but never awaited}}
  %e = etensor.event(%n) count 1 {name = "dangling"} : !etensor.event<?>
  etensor.task @tile grid [%n] outs(%e[(i) -> (i)] : !etensor.event<?>)
}

// -----

func.func private @tile(%i: index)
etensor.graph @unused_event(%n: index) {
  // expected-error @+1 {{event '<unnamed>' is neither notified nor awaited}}
  %e = etensor.event(%n) count 1 : !etensor.event<?>
}

// -----

func.func private @tile(%i: index)
etensor.graph @never_runs() {
  %e = etensor.event() count 0 {name = "e"} : !etensor.event<4>
  // expected-error @+1 {{task 'empty' can never run: its grid dimension 0 is empty}}
  etensor.task @tile grid [0] outs(%e[(i) -> (i)] : !etensor.event<4>) {name = "empty"}
  // expected-error @+1 {{task 'downstream' can never run: it waits on event 'e' whose producers can never run}}
  etensor.task @tile grid [4] ins(%e[(i) -> (i)] : !etensor.event<4>) {name = "downstream"}
}

// -----

func.func private @tile(%i: index)
etensor.graph @partial_coverage(%n: index, %m: index) {
  // expected-error @+1 {{coordinate #3 of event 'e' receives 0 notifications but its wait count is 1}}
  %e = etensor.event() count 1 {name = "e"} : !etensor.event<4>
  etensor.task @tile grid [3] outs(%e[(i) -> (i)] : !etensor.event<4>)
  etensor.task @tile grid [4] ins(%e[(i) -> (i)] : !etensor.event<4>)
}

// -----

func.func private @tile(%i: index, %a: memref<?x4xf32>)

etensor.graph @static_size_differs(%a: memref<8x5xf32>) {
  // expected-error @+1 {{argument #0 has type 'memref<8x5xf32>' but device function 'tile' expects 'memref<?x4xf32>'}}
  etensor.task @tile grid [1] args(%a : memref<8x5xf32>)
}

// -----

func.func private @tile(%i: index, %a: memref<?xf32>)
func.func private @tile__prefetch(%i: index)

etensor.graph @prefetch_signature(%a: memref<?xf32>) {
  // expected-error @+1 {{prefetch function 'tile__prefetch' has type '(index) -> ()', but the device function 'tile' has '(index, memref<?xf32>) -> ()': a prefetch takes the same arguments}}
  etensor.task @tile grid [1] args(%a : memref<?xf32>) {prefetch = @tile__prefetch}
}

// -----

func.func private @tile(%i: index)

etensor.graph @prefetch_missing() {
  // expected-error @+1 {{prefetch 'nowhere' does not name a func.func}}
  etensor.task @tile grid [1] {prefetch = @nowhere}
}

// -----

func.func private @tile(%i: index)

etensor.graph @prefetch_after_without_prefetch() {
  %e = etensor.event() count 1 : !etensor.event<1>
  // expected-error @+1 {{prefetch_after needs a prefetch function}}
  etensor.task @tile grid [1] ins(%e[(i) -> (0)] : !etensor.event<1>) {prefetch_after = 1}
}

// -----

func.func private @tile(%i: index)
func.func private @tile__prefetch(%i: index)

etensor.graph @prefetch_after_too_many() {
  %e = etensor.event() count 1 : !etensor.event<1>
  // expected-error @+1 {{prefetch_after = 2 exceeds the task's 1 in-edges}}
  etensor.task @tile grid [1] ins(%e[(i) -> (0)] : !etensor.event<1>) {prefetch = @tile__prefetch, prefetch_after = 2}
}

// -----

func.func private @tile(%i: index)

etensor.graph @negative_region() {
  // expected-error @+1 {{attribute 'shared_region' failed to satisfy constraint: 64-bit signless integer attribute whose value is non-negative}}
  etensor.task @tile grid [1] {shared_region = -1}
}

// -----

func.func @tile(%i: index) { return }
etensor.graph @guarded_without_trigger() {
  // expected-error @+1 {{guarded_indptr needs a data-dependent trigger (triggered_by)}}
  etensor.task @tile grid [1] {guarded_indptr}
}
