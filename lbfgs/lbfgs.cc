#include "lbfgs/lbfgs.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "handlers/vector_kernel.h"

namespace downpour {
namespace {

using proto::VectorCommand;
using V = LbfgsVectors;

VectorCommand Update(VectorCommand::Update kind, uint32_t dst, uint32_t a = 0,
                     double alpha = 0, uint32_t b = 0, double beta = 0) {
  VectorCommand c;
  c.set_update(kind);
  c.set_dst(dst);
  c.set_a(a);
  c.set_alpha(alpha);
  c.set_b(b);
  c.set_beta(beta);
  return c;
}
// dst := alpha a + beta b
VectorCommand Lincomb(uint32_t dst, double alpha, uint32_t a, double beta,
                      uint32_t b) {
  return Update(VectorCommand::LINCOMB, dst, a, alpha, b, beta);
}
// dst += alpha a
VectorCommand Axpy(uint32_t dst, double alpha, uint32_t a) {
  return Update(VectorCommand::AXPY, dst, a, alpha);
}
VectorCommand Copy(uint32_t dst, uint32_t a) {
  return Update(VectorCommand::COPY, dst, a);
}
VectorCommand Scale(uint32_t dst, double alpha) {
  return Update(VectorCommand::SCALE, dst, 0, alpha);
}
VectorCommand& Dot(VectorCommand& c, uint32_t x, uint32_t y) {
  c.add_dot_x(x);
  c.add_dot_y(y);
  return c;
}

// A point on the search line: phi(t) = f(x0 + t d), dphi = g(x0 + t d) . d.
struct Point {
  double t = 0, f = 0, dphi = 0, gg = 0;
};

// The minimizer of the cubic through (lo, hi) with their slopes, kept inside
// the middle 80% of the interval (else the midpoint).
double CubicStep(const Point& lo, const Point& hi) {
  const double width = hi.t - lo.t;
  const double d1 = lo.dphi + hi.dphi - 3 * (lo.f - hi.f) / (lo.t - hi.t);
  const double disc = d1 * d1 - lo.dphi * hi.dphi;
  double t = lo.t + 0.5 * width;
  if (disc >= 0) {
    const double d2 = (width > 0 ? 1 : -1) * std::sqrt(disc);
    const double denom = hi.dphi - lo.dphi + 2 * d2;
    if (denom != 0) t = hi.t - width * (hi.dphi + d2 - d1) / denom;
  }
  const double a = std::min(lo.t, hi.t), b = std::max(lo.t, hi.t);
  const double margin = 0.1 * (b - a);
  if (!std::isfinite(t) || t < a + margin || t > b - margin) {
    t = lo.t + 0.5 * width;
  }
  return t;
}

class Driver {
 public:
  Driver(VectorSpace* space, Objective* objective, const LbfgsOptions& o)
      : space_(space), objective_(objective), o_(o) {}

  absl::StatusOr<LbfgsResult> Run(const LbfgsRunControl& control);

 private:
  absl::StatusOr<std::vector<double>> Exec(const VectorCommand& c) {
    return space_->Run(c);
  }
  // Evaluates at x0 + t d (into x and g).
  absl::StatusOr<Point> EvalAt(double t);
  // d := -H g0 by the two-loop recursion; returns g0 . d.
  absl::StatusOr<double> Direction();
  // A step satisfying the strong Wolfe conditions along d; x and g hold it
  // on success. nullopt-like: found = false when the search gave up.
  absl::StatusOr<Point> LineSearch(const Point& p0, double t_init, bool* found);
  absl::StatusOr<Point> Zoom(const Point& p0, Point lo, Point hi, int budget,
                             bool* found);
  // The scalars at the boundary after iteration k (cur at x0, xx = |x0|^2).
  proto::LbfgsState Save(int k, const Point& cur, double xx,
                         double seconds) const;
  // The inverse of Save; returns the iteration.
  absl::StatusOr<int> Load(const proto::LbfgsState& s, Point* cur, double* xx);

  VectorSpace* space_;
  Objective* objective_;
  const LbfgsOptions o_;
  int64_t round_ = 0;
  int evaluations_ = 0;
  struct Pair {
    int slot;
    double rho;  // 1 / s'y
  };
  std::vector<Pair> history_;  // oldest first
  int next_slot_ = 0;
  double gamma_ = 1;  // s'y / y'y of the newest pair
};

absl::StatusOr<Point> Driver::EvalAt(double t) {
  ++round_;
  ++evaluations_;
  DP_RETURN_IF_ERROR(Exec(Lincomb(V::kX, 1.0, V::kX0, t, V::kD)).status());
  VectorCommand zero = Update(VectorCommand::ZERO, V::kG);
  zero.set_open_round(round_);
  DP_RETURN_IF_ERROR(Exec(zero).status());
  DP_ASSIGN_OR_RETURN(double data, objective_->Evaluate(round_));
  double reg = 0;
  if (o_.lambda != 0 && o_.regularized_keys > 0) {
    VectorCommand c = Axpy(V::kG, o_.lambda, V::kX);
    c.set_begin(0);
    c.set_end(o_.regularized_keys);
    DP_ASSIGN_OR_RETURN(std::vector<double> xx, Exec(Dot(c, V::kX, V::kX)));
    reg = 0.5 * o_.lambda * xx[0];
  }
  VectorCommand dots;
  Dot(dots, V::kG, V::kD);
  Dot(dots, V::kG, V::kG);
  DP_ASSIGN_OR_RETURN(std::vector<double> r, Exec(dots));
  Point p;
  p.t = t;
  p.f = data + reg;
  p.dphi = r[0];
  p.gg = r[1];
  if (!std::isfinite(p.f)) {
    return absl::InternalError(
        absl::StrCat("objective is ", p.f, " at step ", t));
  }
  return p;
}

absl::StatusOr<double> Driver::Direction() {
  const int m = o_.history;
  const int n = static_cast<int>(history_.size());
  if (n == 0) {
    VectorCommand c = Lincomb(V::kD, -1.0, V::kG0, 0.0, V::kG0);
    DP_ASSIGN_OR_RETURN(std::vector<double> r, Exec(Dot(c, V::kG0, V::kD)));
    return r[0];
  }
  // q = -g0; newest to oldest: a_i = rho_i s_i . q; q -= a_i y_i. Each update
  // is fused with the next dot product the recursion needs.
  std::vector<double> alpha(n);
  VectorCommand c = Lincomb(V::kD, -1.0, V::kG0, 0.0, V::kG0);
  DP_ASSIGN_OR_RETURN(std::vector<double> r,
                      Exec(Dot(c, V::S(history_[n - 1].slot), V::kD)));
  for (int i = n - 1; i >= 0; --i) {
    alpha[i] = history_[i].rho * r[0];
    c = Axpy(V::kD, -alpha[i], V::Y(m, history_[i].slot));
    if (i > 0) Dot(c, V::S(history_[i - 1].slot), V::kD);
    DP_ASSIGN_OR_RETURN(r, Exec(c));
  }
  c = Scale(V::kD, gamma_);
  DP_ASSIGN_OR_RETURN(r, Exec(Dot(c, V::Y(m, history_[0].slot), V::kD)));
  // Oldest to newest: b = rho_i y_i . r; r += (a_i - b) s_i.
  for (int i = 0; i < n; ++i) {
    const double beta = history_[i].rho * r[0];
    c = Axpy(V::kD, alpha[i] - beta, V::S(history_[i].slot));
    if (i + 1 < n) {
      Dot(c, V::Y(m, history_[i + 1].slot), V::kD);
    } else {
      Dot(c, V::kG0, V::kD);
    }
    DP_ASSIGN_OR_RETURN(r, Exec(c));
  }
  return r[0];
}

absl::StatusOr<Point> Driver::Zoom(const Point& p0, Point lo, Point hi,
                                   int budget, bool* found) {
  const double c1 = 1e-4, c2 = 0.9;
  Point p;
  for (; budget > 0; --budget) {
    DP_ASSIGN_OR_RETURN(p, EvalAt(CubicStep(lo, hi)));
    if (p.f > p0.f + c1 * p.t * p0.dphi || p.f >= lo.f) {
      hi = p;
    } else {
      if (std::abs(p.dphi) <= -c2 * p0.dphi) {
        *found = true;
        return p;
      }
      if (p.dphi * (hi.t - lo.t) >= 0) hi = lo;
      lo = p;
    }
    if (std::abs(hi.t - lo.t) < 1e-14 * std::max(1.0, lo.t)) break;
  }
  *found = false;
  return p;
}

absl::StatusOr<Point> Driver::LineSearch(const Point& p0, double t_init,
                                         bool* found) {
  const double c1 = 1e-4, c2 = 0.9;
  Point prev = p0;
  double t = t_init;
  int budget = o_.max_evaluations_per_search;
  for (int i = 1; budget > 0; ++i) {
    --budget;
    DP_ASSIGN_OR_RETURN(Point p, EvalAt(t));
    if (p.f > p0.f + c1 * t * p0.dphi || (i > 1 && p.f >= prev.f)) {
      return Zoom(p0, prev, p, budget, found);
    }
    if (std::abs(p.dphi) <= -c2 * p0.dphi) {
      *found = true;
      return p;
    }
    if (p.dphi >= 0) return Zoom(p0, p, prev, budget, found);
    prev = p;
    t *= 2;
  }
  *found = false;
  return prev;
}

proto::LbfgsState Driver::Save(int k, const Point& cur, double xx,
                               double seconds) const {
  proto::LbfgsState s;
  s.set_history(o_.history);
  s.set_iteration(k);
  s.set_round(round_);
  s.set_evaluations(evaluations_);
  s.set_f(cur.f);
  s.set_gg(cur.gg);
  s.set_step(cur.t);
  s.set_xx(xx);
  s.set_gamma(gamma_);
  for (const Pair& p : history_) {
    proto::LbfgsState::Pair* out = s.add_pairs();
    out->set_slot(p.slot);
    out->set_rho(p.rho);
  }
  s.set_seconds(seconds);
  return s;
}

absl::StatusOr<int> Driver::Load(const proto::LbfgsState& s, Point* cur,
                                 double* xx) {
  if (s.history() != o_.history) {
    return absl::FailedPreconditionError(
        absl::StrCat("the saved L-BFGS state has history ", s.history(),
                     ", this run ", o_.history));
  }
  if (s.pairs_size() > o_.history || s.iteration() < 0) {
    return absl::InvalidArgumentError("malformed L-BFGS state");
  }
  history_.clear();
  for (const proto::LbfgsState::Pair& p : s.pairs()) {
    if (p.slot() < 0 || p.slot() >= o_.history) {
      return absl::InvalidArgumentError(
          absl::StrCat("L-BFGS state: history slot ", p.slot()));
    }
    history_.push_back({p.slot(), p.rho()});
  }
  round_ = std::max(round_, s.round());
  evaluations_ = s.evaluations();
  gamma_ = s.gamma();
  cur->t = s.step();
  cur->f = s.f();
  cur->gg = s.gg();
  *xx = s.xx();
  return s.iteration();
}

absl::StatusOr<LbfgsResult> Driver::Run(const LbfgsRunControl& control) {
  absl::Time start = absl::Now();
  LbfgsResult result;
  auto record = [&](int k, const Point& p) {
    IterationRecord rec;
    rec.iteration = k;
    rec.f = p.f;
    rec.gnorm = std::sqrt(p.gg);
    rec.step = p.t;
    rec.evaluations = evaluations_;
    rec.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    result.iterations.push_back(rec);
    if (control.on_iteration) control.on_iteration(rec);
  };
  round_ = std::max<int64_t>(round_, control.min_round);
  Point cur;
  double xx = 0;
  int first = 1;
  std::vector<double> r;
  VectorCommand c;
  if (control.resume.has_value()) {
    DP_ASSIGN_OR_RETURN(const int k, Load(*control.resume, &cur, &xx));
    start -= absl::Seconds(control.resume->seconds());
    record(k, cur);
    first = k + 1;
  } else {
    // Start at x: x0 := x, d := 0 so that EvalAt(0) evaluates x itself.
    DP_RETURN_IF_ERROR(Exec(Copy(V::kX0, V::kX)).status());
    DP_RETURN_IF_ERROR(Exec(Update(VectorCommand::ZERO, V::kD)).status());
    DP_ASSIGN_OR_RETURN(cur, EvalAt(0.0));
    c = Copy(V::kG0, V::kG);
    DP_ASSIGN_OR_RETURN(r, Exec(Dot(c, V::kX, V::kX)));
    xx = r[0];
    record(0, cur);
  }
  const int m = o_.history;
  for (int k = first;; ++k) {
    if (std::sqrt(cur.gg) <= o_.gtol * std::max(1.0, std::sqrt(xx))) {
      result.stop_reason = "gradient norm";
      break;
    }
    if (k > o_.max_iterations) {
      result.stop_reason = "iteration limit";
      break;
    }
    DP_ASSIGN_OR_RETURN(double dphi0, Direction());
    if (dphi0 >= 0) {
      // Not a descent direction (rounding in a flat region): restart from
      // steepest descent.
      history_.clear();
      DP_ASSIGN_OR_RETURN(dphi0, Direction());
    }
    Point p0 = cur;
    p0.t = 0;
    p0.dphi = dphi0;
    const double t_init = history_.empty() ? 1.0 / std::sqrt(cur.gg) : 1.0;
    bool found = false;
    DP_ASSIGN_OR_RETURN(Point next, LineSearch(p0, t_init, &found));
    if (!found) {
      // Keep the best point: x0.
      DP_RETURN_IF_ERROR(Exec(Copy(V::kX, V::kX0)).status());
      result.stop_reason = "line search failed";
      break;
    }
    // s = x - x0, y = g - g0 into the next history slot.
    // The oldest pair's slot when the history is full, else a free one.
    int slot = history_.empty() ? 0 : history_.front().slot;
    if (static_cast<int>(history_.size()) < m) {
      for (slot = 0; std::any_of(history_.begin(), history_.end(),
                                 [&](const Pair& p) { return p.slot == slot; });
           ++slot) {
      }
    }
    DP_RETURN_IF_ERROR(
        Exec(Lincomb(V::S(slot), 1.0, V::kX, -1.0, V::kX0)).status());
    c = Lincomb(V::Y(m, slot), 1.0, V::kG, -1.0, V::kG0);
    Dot(c, V::S(slot), V::Y(m, slot));
    DP_ASSIGN_OR_RETURN(r, Exec(Dot(c, V::Y(m, slot), V::Y(m, slot))));
    const double sy = r[0], yy = r[1];
    if (static_cast<int>(history_.size()) == m)
      history_.erase(history_.begin());
    if (sy > 1e-12 * yy && yy > 0) {
      history_.push_back({slot, 1.0 / sy});
      gamma_ = sy / yy;
    }
    c = Copy(V::kX0, V::kX);
    DP_ASSIGN_OR_RETURN(r, Exec(Dot(c, V::kX, V::kX)));
    xx = r[0];
    DP_RETURN_IF_ERROR(Exec(Copy(V::kG0, V::kG)).status());
    const double change = std::abs(cur.f - next.f);
    cur = next;
    record(k, cur);
    if (change <= o_.ftol * std::max(1.0, std::abs(cur.f))) {
      result.stop_reason = "objective change";
      break;
    }
    if (control.save_every > 0 && k % control.save_every == 0 && control.save) {
      DP_RETURN_IF_ERROR(
          control.save(
              Save(k, cur, xx, absl::ToDoubleSeconds(absl::Now() - start))),
          "save the L-BFGS state after iteration ", k);
    }
  }
  return result;
}

}  // namespace

std::vector<std::string> LbfgsVectors::Names(int history) {
  std::vector<std::string> names = {"x", "g", "x0", "g0", "d"};
  for (int i = 0; i < history; ++i) names.push_back(absl::StrCat("s", i));
  for (int i = 0; i < history; ++i) names.push_back(absl::StrCat("y", i));
  return names;
}

absl::StatusOr<LbfgsResult> MinimizeLbfgs(
    VectorSpace* space, Objective* objective, const LbfgsOptions& options,
    const std::function<void(const IterationRecord&)>& on_iteration) {
  LbfgsRunControl control;
  control.on_iteration = on_iteration;
  return MinimizeLbfgs(space, objective, options, control);
}

absl::StatusOr<LbfgsResult> MinimizeLbfgs(VectorSpace* space,
                                          Objective* objective,
                                          const LbfgsOptions& options,
                                          const LbfgsRunControl& control) {
  if (options.history < 1 || options.history > 29) {
    return absl::InvalidArgumentError(
        absl::StrCat("L-BFGS history ", options.history, " not in [1, 29]"));
  }
  Driver driver(space, objective, options);
  return driver.Run(control);
}

std::vector<std::pair<uint64_t, uint64_t>> SplitTasks(uint64_t n, int tasks) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const uint64_t parts = std::min<uint64_t>(std::max(tasks, 1), n);
  uint64_t begin = 0;
  for (uint64_t i = 0; i < parts; ++i) {
    const uint64_t end = n * (i + 1) / parts;
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

LocalVectorSpace::LocalVectorSpace(size_t num_vectors, uint64_t num_keys,
                                   uint32_t width)
    : num_keys_(num_keys),
      width_(width),
      vectors_(num_vectors, std::vector<float>(num_keys * width, 0.0f)) {}

absl::StatusOr<std::vector<double>> LocalVectorSpace::Run(
    const proto::VectorCommand& command) {
  DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                      VectorKernel::Create(command, vectors_.size()));
  const uint64_t lo = command.begin();
  const uint64_t hi = command.end() == 0 ? num_keys_ : command.end();
  if (lo >= hi || hi > num_keys_) {
    return absl::InvalidArgumentError(absl::StrCat("vector command range [", lo,
                                                   ", ", hi, ") outside [0, ",
                                                   num_keys_, ")"));
  }
  std::vector<float*> ptrs(vectors_.size());
  for (size_t v = 0; v < vectors_.size(); ++v) {
    ptrs[v] = vectors_[v].data() + lo * width_;
  }
  std::vector<double> dots(kernel.num_dots(), 0.0);
  kernel.Apply(ptrs.data(), (hi - lo) * width_, dots.data());
  return dots;
}

LocalObjective::LocalObjective(const TaskProblem* problem,
                               LocalVectorSpace* space, int tasks)
    : problem_(problem),
      space_(space),
      tasks_(SplitTasks(problem->num_examples(), tasks)) {}

absl::StatusOr<double> LocalObjective::Evaluate(int64_t) {
  const uint32_t w = problem_->width();
  const std::vector<float>& x = space_->vector(LbfgsVectors::kX);
  std::vector<float>& g = space_->vector(LbfgsVectors::kG);
  double loss = 0;
  std::vector<float> xs, grad;
  for (const auto& [begin, end] : tasks_) {
    const std::vector<Key> keys = problem_->TaskKeys(begin, end);
    if (keys.empty()) {
      grad.resize(x.size());
      loss += problem_->Compute(begin, end, x, absl::MakeSpan(grad));
      for (size_t i = 0; i < g.size(); ++i) g[i] += grad[i];
      continue;
    }
    xs.resize(keys.size() * w);
    grad.resize(keys.size() * w);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::copy_n(x.data() + keys[i] * w, w, xs.data() + i * w);
    }
    loss += problem_->Compute(begin, end, xs, absl::MakeSpan(grad));
    for (size_t i = 0; i < keys.size(); ++i) {
      for (uint32_t j = 0; j < w; ++j) g[keys[i] * w + j] += grad[i * w + j];
    }
  }
  return loss;
}

}  // namespace downpour
