#include "planner/model_spec.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/object_reader.h"

namespace downpour {
namespace planner {

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kBsp:
      return "bsp";
    case Mode::kSsp:
      return "ssp";
    case Mode::kAsp:
      return "asp";
  }
  return "?";
}

std::vector<DenseBlock> ModelSpec::DenseBlocks() const {
  std::vector<DenseBlock> out;
  for (int l = 0; l < num_layers(); ++l) {
    out.push_back({absl::StrCat("W", l), layer_sizes[l], layer_sizes[l + 1]});
    out.push_back({absl::StrCat("b", l), 1, layer_sizes[l + 1]});
  }
  return out;
}

int64_t ModelSpec::DenseFloats() const {
  int64_t n = 0;
  for (const DenseBlock& b : DenseBlocks()) n += b.floats();
  return n;
}

double ModelSpec::DistinctIds(const EmbeddingTable& e) const {
  const double ids = batch * e.ids_per_example * e.unique_fraction;
  double distinct = std::max(ids > 0 ? 1.0 : 0.0, ids);
  if (e.rows > 0) distinct = std::min<double>(distinct, e.rows);
  return distinct;
}

namespace {

constexpr const char* kHandlers[] = {"sgd",  "momentum", "adagrad", "adam",
                                     "ftrl", "sum",      "assign"};

bool KnownHandler(const std::string& h) {
  for (const char* k : kHandlers) {
    if (h == k) return true;
  }
  return false;
}

std::string HandlerList() {
  std::string out;
  for (const char* k : kHandlers)
    absl::StrAppend(&out, out.empty() ? "" : ", ", k);
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         absl::string_view what) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(what, " '", path, "': cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(absl::StrCat(what, " '", path, "': read error"));
  }
  return ss.str();
}

absl::StatusOr<ModelSpec> ReadModelSpec(const std::string& path) {
  DP_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "model file"));
  return ParseModelSpec(text, absl::StrCat("model file '", path, "'"));
}

absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text,
                                         const std::string& where) {
  DP_ASSIGN_OR_RETURN(const Json doc, ParseJson(text), where);
  ModelSpec spec;
  ObjectReader r(doc, where);
  spec.name = r.OptionalString("name", "model");
  spec.batch = r.Int("batch", 1, int64_t{1} << 24);
  if (const Json* layers = r.OptionalValue("dense_layers")) {
    if (!layers->is_array()) {
      r.Fail("dense_layers", layers,
             "must be an array of layer sizes, e.g. [784, 256, 10]");
    } else if (layers->items().size() == 1) {
      r.Fail("dense_layers", layers,
             "needs at least two sizes (input and output)");
    } else {
      for (size_t i = 0; i < layers->items().size(); ++i) {
        const Json& v = layers->items()[i];
        if (!v.is_number() || v.number() != std::floor(v.number()) ||
            v.number() < 1 || v.number() > (1 << 24)) {
          r.Merge(FieldError(where, r.Item("dense_layers", i), &v,
                             "must be an integer in [1, 16777216]"));
          break;
        }
        spec.layer_sizes.push_back(static_cast<int64_t>(v.number()));
      }
    }
  }
  if (const Json* emb = r.OptionalValue("embeddings")) {
    if (!emb->is_array()) {
      r.Fail("embeddings", emb, "must be an array of tables");
    } else {
      for (size_t i = 0; i < emb->items().size(); ++i) {
        ObjectReader t(emb->items()[i], where, r.Item("embeddings", i));
        EmbeddingTable e;
        e.name = t.OptionalString("name", absl::StrCat("emb", i));
        e.rows = t.OptionalInt("rows", 0, 0);
        e.width = t.Int("width", 1, 1 << 20);
        e.ids_per_example = t.Number("ids_per_example", 0, 1e6);
        e.unique_fraction = t.OptionalNumber("unique_fraction", 1, 0, 1);
        r.Merge(t.Finish());
        spec.embeddings.push_back(e);
      }
    }
  }
  const Json* handler = r.Value("handler");
  if (handler != nullptr) {
    if (handler->is_string()) {
      for (std::string& h : spec.handler) h = handler->string();
      if (!KnownHandler(handler->string())) {
        r.Fail("handler", handler,
               absl::StrCat("unknown handler '", handler->string(),
                            "' (known: ", HandlerList(), ")"));
      }
    } else if (handler->is_object()) {
      ObjectReader h(*handler, where, r.Path("handler"));
      for (Mode m : kAllModes) {
        std::string& name = spec.handler[static_cast<int>(m)];
        name = h.String(ModeName(m));
        if (h.status().ok() && !KnownHandler(name)) {
          h.Fail(ModeName(m), handler->Find(ModeName(m)),
                 absl::StrCat("unknown handler '", name,
                              "' (known: ", HandlerList(), ")"));
        }
      }
      r.Merge(h.Finish());
    } else {
      r.Fail("handler", handler,
             "must be a handler name or {\"bsp\": ..., \"ssp\": ..., "
             "\"asp\": ...}");
    }
  }
  DP_RETURN_IF_ERROR(r.Finish());
  if (spec.layer_sizes.empty() && spec.embeddings.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": needs 'dense_layers' or 'embeddings' (a model with no "
                     "parameters)"));
  }
  return spec;
}

Json ModelSpecToJson(const ModelSpec& spec) {
  Json j = Json::Object();
  j.Set("name", Json::String(spec.name));
  j.Set("batch", Json::Number(spec.batch));
  if (!spec.layer_sizes.empty()) {
    Json layers = Json::Array();
    for (int64_t s : spec.layer_sizes) layers.Append(Json::Number(s));
    j.Set("dense_layers", std::move(layers));
  }
  if (!spec.embeddings.empty()) {
    Json emb = Json::Array();
    for (const EmbeddingTable& e : spec.embeddings) {
      Json t = Json::Object();
      t.Set("name", Json::String(e.name));
      t.Set("rows", Json::Number(e.rows));
      t.Set("width", Json::Number(e.width));
      t.Set("ids_per_example", Json::Number(e.ids_per_example));
      t.Set("unique_fraction", Json::Number(e.unique_fraction));
      emb.Append(std::move(t));
    }
    j.Set("embeddings", std::move(emb));
  }
  Json h = Json::Object();
  for (Mode m : kAllModes) h.Set(ModeName(m), Json::String(spec.HandlerFor(m)));
  j.Set("handler", std::move(h));
  return j;
}

}  // namespace planner
}  // namespace downpour
