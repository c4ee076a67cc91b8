#include "python/src/clicklog_binding.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clicklog/auc.h"
#include "clicklog/click_batch.h"
#include "clicklog/feature_key.h"
#include "clicklog/generator.h"
#include "clicklog/tsv_reader.h"
#include "common/random.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"
#include "python/src/status.h"

namespace downpour {
namespace python {

namespace py = pybind11;
using py::arg;

namespace {

using clicklog::ClickBatchView;
using clicklog::ClickLogGenerator;
using clicklog::ClickLogStream;
using clicklog::CriteoTsvReader;
using clicklog::kNumCategorical;
using clicklog::kNumDense;

template <typename T>
using CArray = py::array_t<T, py::array::c_style>;

// NumPy arrays for `rows` rows and a view over them. The arrays are made
// with the GIL held; the view may be filled without it.
struct Batch {
  explicit Batch(size_t rows, bool counts = false, bool probabilities = false)
      : dense({static_cast<py::ssize_t>(rows),
               static_cast<py::ssize_t>(kNumDense)}),
        categorical({static_cast<py::ssize_t>(rows),
                     static_cast<py::ssize_t>(kNumCategorical)}),
        labels(static_cast<py::ssize_t>(rows)) {
    view.rows = rows;
    view.dense = absl::MakeSpan(dense.mutable_data(), rows * kNumDense);
    view.categorical =
        absl::MakeSpan(categorical.mutable_data(), rows * kNumCategorical);
    view.labels = absl::MakeSpan(labels.mutable_data(), rows);
    if (counts) {
      count_array = CArray<int64_t>({static_cast<py::ssize_t>(rows),
                                     static_cast<py::ssize_t>(kNumDense)});
      view.counts =
          absl::MakeSpan(count_array.mutable_data(), rows * kNumDense);
    }
    if (probabilities) {
      probability_array = CArray<double>(static_cast<py::ssize_t>(rows));
      view.probabilities =
          absl::MakeSpan(probability_array.mutable_data(), rows);
    }
  }

  // (dense, categorical, labels[, counts][, probabilities]), the first
  // `rows` rows.
  py::tuple ToTuple(size_t rows) {
    auto head = [rows](py::array a) -> py::object {
      if (static_cast<size_t>(a.shape(0)) == rows) return std::move(a);
      return a[py::slice(0, static_cast<py::ssize_t>(rows), 1)];
    };
    py::list out;
    out.append(head(dense));
    out.append(head(categorical));
    out.append(head(labels));
    if (!view.counts.empty()) out.append(head(count_array));
    if (!view.probabilities.empty()) out.append(head(probability_array));
    return py::tuple(out);
  }

  CArray<float> dense;
  CArray<int64_t> categorical;
  CArray<float> labels;
  CArray<int64_t> count_array;
  CArray<double> probability_array;
  ClickBatchView view;
};

std::shared_ptr<ClickLogGenerator> MakeGenerator(uint64_t seed, double scale,
                                                 double zipf_exponent,
                                                 double id_weight_stddev,
                                                 double dense_weight_stddev,
                                                 double bias) {
  clicklog::GeneratorOptions o;
  o.seed = seed;
  o.scale = scale;
  o.zipf_exponent = zipf_exponent;
  o.id_weight_stddev = id_weight_stddev;
  o.dense_weight_stddev = dense_weight_stddev;
  o.bias = bias;
  return ValueOrThrow(ClickLogGenerator::Create(o));
}

// A stream keeps its generator alive.
struct PyStream {
  std::shared_ptr<ClickLogGenerator> generator;
  ClickLogStream stream;
};

// The scores and labels of Auc and LogLoss as float32 1-D arrays of equal
// length.
std::pair<CArray<float>, CArray<float>> ScoresAndLabels(
    const py::handle& scores, const py::handle& labels) {
  auto s = CArray<float>::ensure(scores);
  auto l = CArray<float>::ensure(labels);
  if (!s || !l) throw py::error_already_set();
  if (s.ndim() != 1 || l.ndim() != 1 || s.shape(0) != l.shape(0)) {
    throw py::value_error(
        absl::StrCat("scores and labels must be 1-D of the same length, got ",
                     s.size(), " and ", l.size()));
  }
  return {s, l};
}

CArray<uint64_t> FeatureKeys(const py::array& ids, const py::object& feature) {
  auto in = CArray<int64_t>::ensure(ids);
  if (!in) throw py::error_already_set();
  std::vector<py::ssize_t> shape(in.shape(), in.shape() + in.ndim());
  CArray<uint64_t> out(shape);
  const size_t n = static_cast<size_t>(in.size());
  const int64_t* src = in.data();
  uint64_t* dst = out.mutable_data();
  std::vector<uint64_t> salts;
  if (py::isinstance<py::int_>(feature)) {
    salts.push_back(clicklog::FeatureSalt(feature.cast<uint64_t>()));
  } else {
    for (uint64_t f : feature.cast<std::vector<uint64_t>>()) {
      salts.push_back(clicklog::FeatureSalt(f));
    }
    const py::ssize_t last = in.ndim() ? in.shape(in.ndim() - 1) : 1;
    if (static_cast<py::ssize_t>(salts.size()) != last) {
      throw py::value_error(
          absl::StrCat("feature: ", salts.size(),
                       " features for ids whose last dimension is ", last));
    }
  }
  {
    py::gil_scoped_release release;
    const size_t m = salts.size();
    for (size_t i = 0; i < n; ++i) {
      // FeatureKey with the salt precomputed.
      const uint64_t k =
          SplitMix64(static_cast<uint64_t>(src[i]) ^ salts[m == 1 ? 0 : i % m]);
      dst[i] = k == ~uint64_t{0} ? 0 : k;
    }
  }
  return out;
}

}  // namespace

void RegisterClickLog(py::module_& m) {
  m.attr("CLICKLOG_NUM_DENSE") = kNumDense;
  m.attr("CLICKLOG_NUM_CATEGORICAL") = kNumCategorical;
  m.attr("CLICKLOG_CRITEO_CARDINALITIES") =
      std::vector<uint64_t>(clicklog::kCriteoCardinalities.begin(),
                            clicklog::kCriteoCardinalities.end());
  m.attr("CLICKLOG_HELD_OUT_FIRST_ROW") = clicklog::kHeldOutFirstRow;
  m.attr("CLICKLOG_MISSING_ID") = clicklog::kMissingId;

  py::class_<ClickLogGenerator, std::shared_ptr<ClickLogGenerator>>(
      m, "ClickLogGenerator",
      "Synthetic Criteo-shaped click logs with a planted model "
      "(clicklog/generator.h). Immutable; thread-safe.")
      .def(py::init(&MakeGenerator), py::kw_only(), arg("seed") = 1,
           arg("scale") = 1.0, arg("zipf_exponent") = 1.1,
           arg("id_weight_stddev") =
               clicklog::GeneratorOptions().id_weight_stddev,
           arg("dense_weight_stddev") =
               clicklog::GeneratorOptions().dense_weight_stddev,
           arg("bias") = clicklog::GeneratorOptions().bias)
      .def_property_readonly("cardinalities",
                             [](const ClickLogGenerator& g) {
                               return std::vector<uint64_t>(
                                   g.cardinalities().begin(),
                                   g.cardinalities().end());
                             })
      .def_property_readonly(
          "seed", [](const ClickLogGenerator& g) { return g.options().seed; })
      .def_property_readonly(
          "scale", [](const ClickLogGenerator& g) { return g.options().scale; })
      .def(
          "fill",
          [](const ClickLogGenerator& g, uint64_t first_row, size_t rows,
             uint64_t stride, bool counts, bool probabilities) {
            if (stride < 1) throw py::value_error("stride must be >= 1");
            Batch b(rows, counts, probabilities);
            {
              py::gil_scoped_release release;
              g.Fill(first_row, stride, b.view);
            }
            return b.ToTuple(rows);
          },
          arg("first_row"), arg("rows"), arg("stride") = 1, py::kw_only(),
          arg("counts") = false, arg("probabilities") = false)
      .def("id_weight", &ClickLogGenerator::IdWeight, arg("field"), arg("id"))
      .def("dense_weight", &ClickLogGenerator::DenseWeight, arg("field"))
      .def(
          "planted",
          [](const ClickLogGenerator& g, size_t rows) {
            clicklog::PlantedStats s;
            {
              py::gil_scoped_release release;
              s = g.Planted(rows);
            }
            py::dict d;
            d["auc"] = s.auc;
            d["log_loss"] = s.log_loss;
            d["click_rate"] = s.click_rate;
            return d;
          },
          arg("rows"));

  py::class_<PyStream>(m, "ClickLogStream",
                       "One rank's share of a generator's training rows. "
                       "Not thread-safe.")
      .def(py::init([](std::shared_ptr<ClickLogGenerator> g, int rank,
                       int num_shards, uint64_t start) {
             if (num_shards < 1 || rank < 0 || rank >= num_shards) {
               throw py::value_error(
                   absl::StrCat("rank ", rank, " of ", num_shards, " shards"));
             }
             ClickLogStream s(g.get(), rank, num_shards, start);
             return std::make_unique<PyStream>(PyStream{std::move(g), s});
           }),
           arg("generator"), arg("rank") = 0, arg("num_shards") = 1,
           arg("start") = 0)
      .def(
          "next",
          [](PyStream& s, size_t rows) {
            Batch b(rows);
            {
              py::gil_scoped_release release;
              s.stream.Next(b.view);
            }
            return b.ToTuple(rows);
          },
          arg("rows"))
      .def_property_readonly(
          "position", [](const PyStream& s) { return s.stream.position(); });

  py::class_<CriteoTsvReader>(m, "CriteoTsvReader",
                              "Criteo TSV click logs (clicklog/tsv_reader.h). "
                              "Not thread-safe.")
      .def(py::init([](const std::string& path, int rank, int num_shards) {
             clicklog::TsvReaderOptions o;
             o.rank = rank;
             o.num_shards = num_shards;
             return ValueOrThrow(CriteoTsvReader::Open(path, o));
           }),
           arg("path"), py::kw_only(), arg("rank") = 0, arg("num_shards") = 1)
      .def(
          "read",
          [](CriteoTsvReader& r, size_t rows, bool counts) {
            Batch b(rows, counts);
            absl::StatusOr<size_t> n;
            {
              py::gil_scoped_release release;
              n = r.Read(b.view);
            }
            return b.ToTuple(ValueOrThrow(std::move(n)));
          },
          arg("rows"), py::kw_only(), arg("counts") = false)
      .def_property_readonly("lines", &CriteoTsvReader::lines);

  m.def(
      "clicklog_auc",
      [](const py::handle& scores, const py::handle& labels) {
        auto [s, l] = ScoresAndLabels(scores, labels);
        py::gil_scoped_release release;
        return clicklog::Auc(absl::MakeConstSpan(s.data(), s.size()),
                             absl::MakeConstSpan(l.data(), l.size()));
      },
      arg("scores"), arg("labels"));
  m.def(
      "clicklog_log_loss",
      [](const py::handle& p, const py::handle& labels) {
        auto [s, l] = ScoresAndLabels(p, labels);
        py::gil_scoped_release release;
        return clicklog::LogLoss(absl::MakeConstSpan(s.data(), s.size()),
                                 absl::MakeConstSpan(l.data(), l.size()));
      },
      arg("probabilities"), arg("labels"));
  m.def(
      "clicklog_expected_auc",
      [](const CArray<double>& p) {
        py::gil_scoped_release release;
        return clicklog::ExpectedAuc(absl::MakeConstSpan(p.data(), p.size()));
      },
      arg("probabilities"));
  m.def("feature_keys", &FeatureKeys, arg("ids"), arg("feature") = 0);
}

}  // namespace python
}  // namespace downpour
