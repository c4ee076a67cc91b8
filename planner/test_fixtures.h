// A model and a calibration with round figures, so that the tests'
// expectations can be worked out by hand (perf_model_test.cc shows the
// arithmetic).
#ifndef DOWNPOUR_PLANNER_TEST_FIXTURES_H_
#define DOWNPOUR_PLANNER_TEST_FIXTURES_H_

namespace downpour {
namespace planner {

// 100 -> 10, batch 10: W0 is 100 x 10 (4000 bytes), b0 1 x 10 (40 bytes).
inline constexpr char kTinyModel[] = R"({
  "name": "tiny",
  "batch": 10,
  "dense_layers": [100, 10],
  "handler": {"bsp": "momentum", "ssp": "adagrad", "asp": "adagrad"}
})";

// (The model reads rates' p90 and costs' p10.) Layer (10, 100, 10) at
// 1 GFLOP/s for every product; peak 10 GFLOP/s, memory 10 GB/s; 2 cores,
// both free; a 100 us round trip;
// 1 GB/s with one request in flight, 2 GB/s with 4; 10 us of CPU per
// request and 0.1 ns per byte on either side, of which the calling thread
// spends 2 us and 0.01 ns; a BSP request of 1000 bytes held for
// aggregation costs the server 5 us more (5 ns per byte held); a clock report
// costs the worker 20 us and the scheduler 30 us; apply per float: sgd 1 ns,
// sum 0.5, momentum 1.5, adagrad 2.
inline constexpr char kRoundCalibration[] = R"({
  "format_version": 1,
  "created": "2026-11-26T00:00:00Z",
  "cluster": {"host": "testhost", "cpu_model": "Test CPU", "cores": 2,
              "scheduler": "local"},
  "compute": {
    "gemm_peak_gflops": {"median": 9.5, "p10": 9, "p90": 10, "samples": 5},
    "memory_gbs": {"median": 10, "p10": 10, "p90": 10, "samples": 5},
    "effective_cores": [{"threads": 1, "cores": 1}, {"threads": 2, "cores": 2}],
    "step_cv": 0.1,
    "layers": [
      {"batch": 10, "in": 100, "out": 10,
       "fwd_gflops": {"median": 1, "p10": 1, "p90": 1, "samples": 3},
       "wgrad_gflops": {"median": 1, "p10": 1, "p90": 1, "samples": 3},
       "dgrad_gflops": {"median": 1, "p10": 1, "p90": 1, "samples": 3}}
    ]
  },
  "network": {
    "latency_us": {"median": 105, "p10": 100, "p90": 120, "samples": 5},
    "message_bytes": 1000,
    "in_flight": 4,
    "push_gbs_1": {"median": 1, "p10": 1, "p90": 1, "samples": 5},
    "pull_gbs_1": {"median": 1, "p10": 1, "p90": 1, "samples": 5},
    "push_gbs_k": {"median": 2, "p10": 2, "p90": 2, "samples": 5},
    "pull_gbs_k": {"median": 2, "p10": 2, "p90": 2, "samples": 5},
    "small_pulls_per_s_k": 40000,
    "client_us_per_request": 10,
    "client_ns_per_push_byte": 0.1,
    "client_ns_per_pull_byte": 0.1,
    "server_us_per_request": 10,
    "server_ns_per_push_byte": 0.1,
    "server_ns_per_pull_byte": 0.1,
    "server_us_per_held_request": 5,
    "caller_us_per_request": 2,
    "caller_ns_per_byte": 0.01,
    "server_cpu_source": "measured",
    "control_client_us": 20,
    "control_scheduler_us": 30,
    "control_latency_us": 200
  },
  "apply_ns_per_float": {
    "sgd": {"median": 1, "p10": 1, "p90": 1, "samples": 3},
    "sum": {"median": 0.5, "p10": 0.5, "p90": 0.5, "samples": 3},
    "momentum": {"median": 1.5, "p10": 1.5, "p90": 1.5, "samples": 3},
    "adagrad": {"median": 2, "p10": 2, "p90": 2, "samples": 3}
  }
})";

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_TEST_FIXTURES_H_
