#include "psctl/compute_probe.h"

#include <sys/prctl.h>

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "handlers/handler.h"
#include "models/batcher.h"
#include "models/dataset.h"
#include "models/model.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

using Mat =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Times each call of `op` (worth `work` units) for about `seconds`, after
// one warm-up call, appending each call's units per second to `rates`.
void CallRates(const std::function<void()>& op, double work, double seconds,
               std::vector<double>* rates) {
  op();
  const absl::Time stop = absl::Now() + absl::Seconds(seconds);
  absl::Time now;
  do {
    const absl::Time a = absl::Now();
    op();
    now = absl::Now();
    rates->push_back(work / std::max(1e-9, absl::ToDoubleSeconds(now - a)));
  } while (now < stop);
}

std::vector<double> Scaled(std::vector<double> v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}

Mat Random(int64_t rows, int64_t cols) { return Mat::Random(rows, cols); }

// Rows of a weight gradient computed together, as the MLP streams it
// (models/internal/dense_net.h: about 128 KB of gradient per product).
int64_t StreamRows(int64_t width) {
  return std::max<int64_t>(1, (int64_t{32} << 10) / width);
}

// One layer's three products on fixed operands.
struct LayerOps {
  LayerOps(int64_t batch, int64_t in, int64_t out)
      : x(Random(batch, in)),
        w(Random(in, out)),
        delta(Random(batch, out)),
        z(batch, out),
        gw(in, out),
        back(batch, in),
        rows(StreamRows(out)) {}
  void Forward() { z.noalias() = x * w; }
  void WeightGradient() {
    for (int64_t r = 0; r < x.cols(); r += rows) {
      const int64_t k = std::min(rows, static_cast<int64_t>(x.cols()) - r);
      gw.middleRows(r, k).noalias() = x.middleCols(r, k).transpose() * delta;
    }
  }
  void InputGradient() { back.noalias() = delta * w.transpose(); }

  Mat x, w, delta, z, gw, back;
  const int64_t rows;
};

}  // namespace

planner::Spread GemmPeakGflops(const ProbeOptions& o) {
  LayerOps ops(512, 512, 512);
  std::vector<double> rates;
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    CallRates([&] { ops.Forward(); }, 2.0 * 512 * 512 * 512, o.seconds, &rates);
  }
  return planner::SpreadOf(Scaled(rates, 1e-9));
}

planner::Spread MemoryGbs(const ProbeOptions& o) {
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  std::vector<double> rates;
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    CallRates([&] { std::memcpy(b.data(), a.data(), kBytes); }, 2.0 * kBytes,
              o.seconds, &rates);
  }
  return planner::SpreadOf(Scaled(rates, 1e-9));
}

planner::LayerRate MeasureLayer(int64_t batch, int64_t in, int64_t out,
                                const ProbeOptions& o) {
  planner::LayerRate r;
  r.batch = batch;
  r.in = in;
  r.out = out;
  LayerOps ops(batch, in, out);
  const double flops = 2.0 * batch * in * out;
  // A third of each round for each product, interleaved, so that load on
  // the host falls on all three alike.
  const double s = o.seconds / 3;
  std::vector<double> fwd, wgrad, dgrad;
  for (int i = 0; i < std::max(1, o.rounds); ++i) {
    CallRates([&] { ops.Forward(); }, flops, s, &fwd);
    CallRates([&] { ops.WeightGradient(); }, flops, s, &wgrad);
    CallRates([&] { ops.InputGradient(); }, flops, s, &dgrad);
  }
  r.fwd_gflops = planner::SpreadOf(Scaled(fwd, 1e-9));
  r.wgrad_gflops = planner::SpreadOf(Scaled(wgrad, 1e-9));
  r.dgrad_gflops = planner::SpreadOf(Scaled(dgrad, 1e-9));
  return r;
}

namespace {

// The cores probe's product: 256 x 256 x 256, about 1 ms on one core.
constexpr int64_t kCoreProbeSize = 256;
constexpr double kCoreProbeFlops =
    2.0 * kCoreProbeSize * kCoreProbeSize * kCoreProbeSize;

// k busy threads of the probe's product for `seconds`: their aggregate
// rate, FLOP/s.
double BusyRate(int k, double seconds) {
  std::atomic<bool> go{false};
  std::vector<double> rates(k, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    threads.emplace_back([&, i] {
      LayerOps ops(kCoreProbeSize, kCoreProbeSize, kCoreProbeSize);
      // The kernel's default timer slack (50 us) would stretch every short
      // sleep below past its end: with products of about 1 ms that read as
      // a tenth of a core lost on an idle host (one thread gave 0.77 cores
      // on 16 idle ones). Job threads block on sockets, not timers, so no
      // slack belongs in this figure.
      prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
      while (!go.load()) std::this_thread::yield();
      // A short sleep after each product, as a job's threads block on the
      // network every step: the kernel favours threads that wake up over
      // ones that never sleep, and a pure spinner would get less of a busy
      // host than the job will. The sleeps asked for are not time the
      // thread wanted a core, so they are left out of its rate; a wake-up
      // that waits for a core is, and stays in.
      constexpr absl::Duration kNap = absl::Microseconds(20);
      ops.Forward();
      int64_t iters = 0;
      const absl::Time start = absl::Now();
      const absl::Time stop = start + absl::Seconds(seconds);
      absl::Time now = start;
      do {
        ops.Forward();
        absl::SleepFor(kNap);
        ++iters;
        now = absl::Now();
      } while (now < stop);
      const double wanted =
          std::max(1e-9, absl::ToDoubleSeconds(now - start - iters * kNap));
      rates[i] = kCoreProbeFlops * static_cast<double>(iters) / wanted;
    });
  }
  go.store(true);
  for (std::thread& th : threads) th.join();
  double total = 0;
  for (double r : rates) total += r;
  return total;
}

}  // namespace

std::vector<std::pair<int64_t, double>> EffectiveCores(int cores,
                                                       double seconds) {
  constexpr int kRounds = 3;
  std::vector<int> counts;
  const int most = std::min(64, std::max(8, 2 * cores));
  for (int t = 1; t < most; t *= 2) {
    if (t > cores && counts.back() < cores) counts.push_back(cores);
    counts.push_back(t);
  }
  if (counts.back() < cores) counts.push_back(cores);
  counts.push_back(most);
  // Each count is measured in every round, each time against one thread's
  // rate with a core to itself taken just before (the 90th percentile of
  // its calls' rates: the slower calls are the ones other processes cut
  // into), and the median of the rounds kept. One reference for the whole
  // curve, as before, let a single slow moment of the host scale every
  // count: seven readings within a minute on an idle 16-core host gave one
  // thread 0.68 to 1.59 cores and 16 threads 11.3 to 24.8.
  LayerOps solo(kCoreProbeSize, kCoreProbeSize, kCoreProbeSize);
  std::vector<std::vector<double>> readings(counts.size());
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < counts.size(); ++i) {
      std::vector<double> rates;
      CallRates([&] { solo.Forward(); }, kCoreProbeFlops, seconds / 2, &rates);
      const double one_core = planner::SpreadOf(rates).p90;
      readings[i].push_back(BusyRate(counts[i], seconds) / one_core);
    }
  }
  std::vector<std::pair<int64_t, double>> out;
  for (size_t i = 0; i < counts.size(); ++i) {
    std::vector<double>& r = readings[i];
    std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
    // No more cores than threads, or than the host has.
    out.emplace_back(
        counts[i],
        std::min<double>({r[r.size() / 2], static_cast<double>(counts[i]),
                          static_cast<double>(cores)}));
  }
  return out;
}

Dataset ProbeData(const planner::ModelSpec& spec) {
  Dataset data;
  data.dim = static_cast<int>(spec.layer_sizes.front());
  data.num_classes = static_cast<int>(spec.layer_sizes.back());
  data.num_examples = 4096;
  data.features.resize(size_t{4096} * data.dim);
  data.labels.resize(4096);
  for (size_t i = 0; i < data.features.size(); ++i) {
    data.features[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000;
  }
  for (int i = 0; i < 4096; ++i) data.labels[i] = i % data.num_classes;
  return data;
}

planner::StepTime MeasureStep(const planner::ModelSpec& spec,
                              const ProbeOptions& o) {
  planner::StepTime t;
  t.batch = spec.batch;
  t.layer_sizes = spec.layer_sizes;
  std::vector<int> sizes(spec.layer_sizes.begin(), spec.layer_sizes.end());
  std::unique_ptr<Model> model = MakeMlp(sizes);
  const Dataset data = ProbeData(spec);
  std::vector<float> params(model->NumParams()), grad(params.size());
  model->Init(1, params.data());
  Batcher batcher(data.num_examples, 1, 0);
  auto step = [&] {
    model->LossAndGradientStreamed(params.data(), data,
                                   batcher.Next(static_cast<int>(spec.batch)),
                                   grad.data(), [](size_t, size_t) {});
  };
  std::vector<double> rates;  // steps per second
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    CallRates(step, 1, o.seconds, &rates);
  }
  for (double& v : rates) v = 1e3 / v;  // ms per step
  t.ms = planner::SpreadOf(rates);
  return t;
}

double StepCv(const planner::ModelSpec& spec, int samples) {
  if (spec.num_layers() == 0) return 0;
  std::vector<LayerOps> layers;
  for (int l = 0; l < spec.num_layers(); ++l) {
    layers.emplace_back(spec.batch, spec.layer_sizes[l],
                        spec.layer_sizes[l + 1]);
  }
  auto step = [&] {
    for (LayerOps& l : layers) l.Forward();
    for (size_t l = layers.size(); l-- > 0;) {
      layers[l].WeightGradient();
      if (l > 0) layers[l].InputGradient();
    }
  };
  step();
  std::vector<double> t;
  for (int i = 0; i < std::max(10, samples); ++i) {
    const absl::Time a = absl::Now();
    step();
    t.push_back(absl::ToDoubleSeconds(absl::Now() - a));
  }
  // The faster half's spread, as a normal's sigma over its fast end:
  // median - p10 = 1.2816 sigma.
  const planner::Spread s = planner::SpreadOf(t);
  return s.p10 > 0 ? (s.median - s.p10) / 1.2816 / s.p10 : 0;
}

absl::StatusOr<planner::Spread> ApplyNsPerFloat(const std::string& handler,
                                                const ProbeOptions& o) {
  proto::HandlerSpec spec;
  spec.set_name(handler);
  auto h = CreateHandler(spec, nullptr);
  if (!h.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("handler '", handler, "': ", h.status().message()));
  }
  constexpr size_t kWidth = 256, kRows = 1024;  // 1 MiB of values
  const size_t n = kWidth * kRows;
  std::vector<float> values(n, 0.5f), grads(n, 1e-3f);
  std::vector<float> state(
      std::max<size_t>(1, kRows * (*h)->StateWidth(kWidth)));
  (*h)->InitState(state.data(), kRows, kWidth);
  std::vector<double> rates;  // floats per second
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    CallRates(
        [&] {
          (*h)->Apply(values.data(), state.data(), grads.data(), kRows, kWidth);
        },
        static_cast<double>(n), o.seconds, &rates);
  }
  for (double& v : rates) v = 1e9 / v;  // ns per float
  return planner::SpreadOf(rates);
}

}  // namespace downpour
