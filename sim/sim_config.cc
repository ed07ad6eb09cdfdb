#include "sim/sim_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::sim {
namespace {

using Json = nlohmann::json;

// Where a value sits, for errors: "cluster.json: pools[1].count" or "trace.jsonl:12: prompt_tokens".
struct Where {
  std::string prefix;  // "file" or "file:line"
  std::string Field(absl::string_view field) const { return absl::StrCat(prefix, ": ", field); }
};

absl::Status Bad(const Where& where, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where.Field(field), " ", what));
}

absl::StatusOr<Json> ParseJson(absl::string_view text, const Where& where) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(where.prefix, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where.prefix, ": not a JSON object"));
  }
  return j;
}

const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status ReadInt(const Json& object, const char* key, const Where& where,
                     absl::string_view field, int64_t min, int64_t* out) {
  const Json* v = Find(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!(std::floor(d) == d && std::abs(d) < 9e15)) {
      return Bad(where, field, "must be an integer");
    }
    *out = static_cast<int64_t>(d);
  } else if (v->is_number_integer()) {
    *out = v->get<int64_t>();
  } else {
    return Bad(where, field, "must be an integer");
  }
  if (*out < min) return Bad(where, field, absl::StrCat("must be >= ", min, ", not ", *out));
  return absl::OkStatus();
}

// A finite number >= min (strictly above when `exclusive`).
absl::Status ReadDouble(const Json& object, const char* key, const Where& where,
                        absl::string_view field, double min, bool exclusive, double* out) {
  const Json* v = Find(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Bad(where, field, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < min || (exclusive && d == min)) {
    return Bad(where, field, absl::StrCat("must be ", exclusive ? "> " : ">= ", min, ", not ", d));
  }
  *out = d;
  return absl::OkStatus();
}

absl::Status ReadString(const Json& object, const char* key, const Where& where,
                        absl::string_view field, std::string* out) {
  const Json* v = Find(object, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return Bad(where, field, "must be a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

// Keys of `object` that `known` does not list: nothing is silently ignored.
absl::Status RefuseUnknown(const Json& object, std::initializer_list<const char*> known,
                           const Where& where, absl::string_view parent) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      return Bad(where, absl::StrCat(parent, it.key()),
                 absl::StrCat("is not a known field (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status ParseProfileJson(const Json& j, const Where& where, absl::string_view parent,
                              PoolConfig* pool) {
  RETURN_IF_ERROR(RefuseUnknown(j,
                                {"format", "model", "engine", "source", "step", "kv_bytes_per_token",
                                 "block_size", "kv_blocks", "max_running", "token_budget",
                                 "max_prefill_tokens", "notes"},
                                where, parent));
  std::string format;
  RETURN_IF_ERROR(ReadString(j, "format", where, absl::StrCat(parent, "format"), &format));
  if (format != "tandem-profile-v1") {
    return Bad(where, absl::StrCat(parent, "format"),
               absl::StrCat("must be \"tandem-profile-v1\", not \"", format, "\""));
  }
  for (const char* key : {"model", "engine", "source", "notes"}) {
    std::string ignored;
    RETURN_IF_ERROR(ReadString(j, key, where, absl::StrCat(parent, key), &ignored));
  }
  const Json* step = Find(j, "step");
  if (step == nullptr || !step->is_object()) {
    return Bad(where, absl::StrCat(parent, "step"), "must be an object of step coefficients");
  }
  const std::string sp = absl::StrCat(parent, "step.");
  RETURN_IF_ERROR(RefuseUnknown(*step,
                                {"base_seconds", "prefill_token_seconds", "decode_token_seconds",
                                 "context_token_seconds", "prompt_context_token_seconds"},
                                where, sp));
  placement::StepProfile& p = pool->step;
  struct Coefficient {
    const char* key;
    double* value;
  };
  for (const Coefficient& c : {Coefficient{"base_seconds", &p.base_seconds},
                               Coefficient{"prefill_token_seconds", &p.prefill_token_seconds},
                               Coefficient{"decode_token_seconds", &p.decode_token_seconds},
                               Coefficient{"context_token_seconds", &p.context_token_seconds},
                               Coefficient{"prompt_context_token_seconds",
                                           &p.prompt_context_token_seconds}}) {
    if (Find(*step, c.key) == nullptr) {
      return Bad(where, absl::StrCat(sp, c.key), "is missing");
    }
    RETURN_IF_ERROR(ReadDouble(*step, c.key, where, absl::StrCat(sp, c.key), 0, false, c.value));
  }
  RETURN_IF_ERROR(ReadInt(j, "kv_bytes_per_token", where,
                          absl::StrCat(parent, "kv_bytes_per_token"), 0, &pool->kv_bytes_per_token));
  RETURN_IF_ERROR(
      ReadInt(j, "block_size", where, absl::StrCat(parent, "block_size"), 1, &pool->block_size));
  RETURN_IF_ERROR(
      ReadInt(j, "kv_blocks", where, absl::StrCat(parent, "kv_blocks"), 1, &pool->kv_blocks));
  RETURN_IF_ERROR(
      ReadInt(j, "max_running", where, absl::StrCat(parent, "max_running"), 1, &pool->max_running));
  RETURN_IF_ERROR(ReadInt(j, "token_budget", where, absl::StrCat(parent, "token_budget"), 1,
                          &pool->token_budget));
  RETURN_IF_ERROR(ReadInt(j, "max_prefill_tokens", where,
                          absl::StrCat(parent, "max_prefill_tokens"), 0, &pool->max_prefill_tokens));
  return absl::OkStatus();
}

absl::Status ParsePolicyOptions(const Json& j, const Where& where, placement::PolicyOptions* o) {
  const std::string parent = "policy_options.";
  RETURN_IF_ERROR(RefuseUnknown(j,
                                {"local_prefill_threshold_tokens", "overlap_weight", "temperature",
                                 "default_ttft_ms", "default_tpot_ms", "expected_output_tokens",
                                 "remote_prefill_headroom"},
                                where, parent));
  RETURN_IF_ERROR(ReadInt(j, "local_prefill_threshold_tokens", where,
                          parent + "local_prefill_threshold_tokens", 0,
                          &o->local_prefill_threshold_tokens));
  RETURN_IF_ERROR(
      ReadDouble(j, "overlap_weight", where, parent + "overlap_weight", 0, false, &o->overlap_weight));
  RETURN_IF_ERROR(
      ReadDouble(j, "temperature", where, parent + "temperature", 0, false, &o->temperature));
  RETURN_IF_ERROR(
      ReadInt(j, "default_ttft_ms", where, parent + "default_ttft_ms", 1, &o->default_ttft_ms));
  RETURN_IF_ERROR(
      ReadInt(j, "default_tpot_ms", where, parent + "default_tpot_ms", 1, &o->default_tpot_ms));
  RETURN_IF_ERROR(ReadInt(j, "expected_output_tokens", where, parent + "expected_output_tokens", 1,
                          &o->expected_output_tokens));
  RETURN_IF_ERROR(ReadDouble(j, "remote_prefill_headroom", where,
                             parent + "remote_prefill_headroom", 0, false,
                             &o->remote_prefill_headroom));
  if (o->remote_prefill_headroom >= 1) {
    return Bad(where, parent + "remote_prefill_headroom", "must be < 1");
  }
  return absl::OkStatus();
}

absl::Status ParseAdmission(const Json& j, const Where& where, placement::AdmissionOptions* o) {
  const std::string parent = "admission.";
  RETURN_IF_ERROR(
      RefuseUnknown(j, {"classes", "max_queued", "max_queue_time_s"}, where, parent));
  std::string classes;
  RETURN_IF_ERROR(ReadString(j, "classes", where, parent + "classes", &classes));
  if (!classes.empty()) {
    absl::StatusOr<std::vector<placement::PriorityClass>> parsed =
        placement::ParsePriorityClasses(classes);
    if (!parsed.ok()) return Bad(where, parent + "classes", parsed.status().message());
    o->classes = *std::move(parsed);
  }
  RETURN_IF_ERROR(ReadInt(j, "max_queued", where, parent + "max_queued", 0, &o->max_queued));
  double queue_time = absl::ToDoubleSeconds(o->max_queue_time);
  RETURN_IF_ERROR(ReadDouble(j, "max_queue_time_s", where, parent + "max_queue_time_s", 0, true,
                             &queue_time));
  o->max_queue_time = absl::Seconds(queue_time);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseProfile(absl::string_view text, absl::string_view where, PoolConfig* pool) {
  const Where w{std::string(where)};
  ASSIGN_OR_RETURN(Json j, ParseJson(text, w));
  return ParseProfileJson(j, w, "", pool);
}

absl::StatusOr<ClusterConfig> ParseCluster(absl::string_view text, absl::string_view path,
                                           absl::string_view base_dir) {
  const Where where{std::string(path)};
  ASSIGN_OR_RETURN(Json j, ParseJson(text, where));
  RETURN_IF_ERROR(RefuseUnknown(j,
                                {"policy", "policy_options", "admission", "pools", "links",
                                 "failures", "step_noise", "step_factors", "router_cell_size",
                                 "prefill_timeout_s"},
                                where, ""));
  ClusterConfig c;
  RETURN_IF_ERROR(ReadString(j, "policy", where, "policy", &c.policy));
  if (c.policy == "prefix") c.policy = "kv_aware";
  {
    const std::vector<std::string> known = placement::KnownPolicies();
    if (std::find(known.begin(), known.end(), c.policy) == known.end()) {
      return Bad(where, "policy",
                 absl::StrCat("\"", c.policy, "\" is not a policy (known: ",
                              absl::StrJoin(known, ", "), ", and prefix for kv_aware)"));
    }
  }
  if (const Json* o = Find(j, "policy_options")) {
    if (!o->is_object()) return Bad(where, "policy_options", "must be an object");
    RETURN_IF_ERROR(ParsePolicyOptions(*o, where, &c.policy_options));
  }
  if (const Json* a = Find(j, "admission")) {
    if (!a->is_object()) return Bad(where, "admission", "must be an object");
    RETURN_IF_ERROR(ParseAdmission(*a, where, &c.admission));
  }
  const Json* pools = Find(j, "pools");
  if (pools == nullptr || !pools->is_array() || pools->empty()) {
    return Bad(where, "pools", "must be a non-empty array");
  }
  bool can_decode = false;
  for (size_t i = 0; i < pools->size(); ++i) {
    const Json& p = (*pools)[i];
    const std::string parent = absl::StrCat("pools[", i, "].");
    if (!p.is_object()) return Bad(where, absl::StrCat("pools[", i, "]"), "must be an object");
    RETURN_IF_ERROR(RefuseUnknown(p,
                                  {"role", "count", "profile", "max_running", "token_budget",
                                   "max_prefill_tokens", "max_prefill_chunk", "kv_blocks",
                                   "block_size", "kv_bytes_per_token"},
                                  where, parent));
    PoolConfig pool;
    std::string role;
    RETURN_IF_ERROR(ReadString(p, "role", where, parent + "role", &role));
    if (role == "prefill") {
      pool.role = placement::Role::kPrefill;
    } else if (role == "decode") {
      pool.role = placement::Role::kDecode;
    } else if (role == "both") {
      pool.role = placement::Role::kBoth;
    } else {
      return Bad(where, parent + "role",
                 absl::StrCat("must be \"prefill\", \"decode\" or \"both\", not \"", role, "\""));
    }
    can_decode = can_decode || pool.role != placement::Role::kPrefill;
    if (const Json* profile = Find(p, "profile")) {
      if (profile->is_string()) {
        std::filesystem::path file(profile->get<std::string>());
        if (file.is_relative() && !base_dir.empty()) file = std::filesystem::path(std::string(base_dir)) / file;
        absl::StatusOr<std::string> text = ReadWholeFile(file.string());
        if (!text.ok()) {
          return Bad(where, parent + "profile", absl::StrCat("names a file that cannot be read (",
                                                             file.string(), ")"));
        }
        RETURN_IF_ERROR(ParseProfile(*text, file.string(), &pool));
      } else if (profile->is_object()) {
        RETURN_IF_ERROR(ParseProfileJson(*profile, where, parent + "profile.", &pool));
      } else {
        return Bad(where, parent + "profile", "must be a file name or an object");
      }
    } else {
      return Bad(where, parent + "profile", "is missing");
    }
    RETURN_IF_ERROR(ReadInt(p, "count", where, parent + "count", 1, &pool.count));
    RETURN_IF_ERROR(ReadInt(p, "max_running", where, parent + "max_running", 1, &pool.max_running));
    RETURN_IF_ERROR(
        ReadInt(p, "token_budget", where, parent + "token_budget", 1, &pool.token_budget));
    RETURN_IF_ERROR(ReadInt(p, "max_prefill_tokens", where, parent + "max_prefill_tokens", 0,
                            &pool.max_prefill_tokens));
    RETURN_IF_ERROR(ReadInt(p, "max_prefill_chunk", where, parent + "max_prefill_chunk", 0,
                            &pool.max_prefill_chunk));
    RETURN_IF_ERROR(ReadInt(p, "kv_blocks", where, parent + "kv_blocks", 1, &pool.kv_blocks));
    RETURN_IF_ERROR(ReadInt(p, "block_size", where, parent + "block_size", 1, &pool.block_size));
    RETURN_IF_ERROR(ReadInt(p, "kv_bytes_per_token", where, parent + "kv_bytes_per_token", 0,
                            &pool.kv_bytes_per_token));
    if (!c.pools.empty() && pool.block_size != c.pools.front().block_size) {
      return Bad(where, parent + "block_size",
                 absl::StrCat("is ", pool.block_size, "; every pool must have the same (pools[0]: ",
                              c.pools.front().block_size, "), as the router hashes by one"));
    }
    c.pools.push_back(pool);
  }
  if (!can_decode) return Bad(where, "pools", "has no decode or both pool");
  if (const Json* links = Find(j, "links")) {
    if (!links->is_object()) return Bad(where, "links", "must be an object");
    RETURN_IF_ERROR(RefuseUnknown(*links, {"bandwidth_gbps", "latency_us"}, where, "links."));
    RETURN_IF_ERROR(ReadDouble(*links, "bandwidth_gbps", where, "links.bandwidth_gbps", 0, true,
                               &c.links.bandwidth_gbps));
    RETURN_IF_ERROR(ReadDouble(*links, "latency_us", where, "links.latency_us", 0, false,
                               &c.links.latency_us));
  }
  if (const Json* failures = Find(j, "failures")) {
    if (!failures->is_array()) return Bad(where, "failures", "must be an array");
    for (size_t i = 0; i < failures->size(); ++i) {
      const Json& f = (*failures)[i];
      const std::string parent = absl::StrCat("failures[", i, "].");
      if (!f.is_object()) return Bad(where, absl::StrCat("failures[", i, "]"), "must be an object");
      RETURN_IF_ERROR(RefuseUnknown(f, {"at_s", "worker"}, where, parent));
      FailureConfig failure;
      if (Find(f, "at_s") == nullptr) return Bad(where, parent + "at_s", "is missing");
      RETURN_IF_ERROR(ReadDouble(f, "at_s", where, parent + "at_s", 0, false, &failure.at_s));
      RETURN_IF_ERROR(ReadString(f, "worker", where, parent + "worker", &failure.worker));
      if (failure.worker.empty()) return Bad(where, parent + "worker", "must name a worker");
      c.failures.push_back(failure);
    }
  }
  RETURN_IF_ERROR(ReadDouble(j, "step_noise", where, "step_noise", 0, false, &c.step_noise));
  if (c.step_noise >= 1) return Bad(where, "step_noise", "must be < 1");
  if (const Json* factors = Find(j, "step_factors")) {
    if (!factors->is_array()) return Bad(where, "step_factors", "must be an array of numbers");
    for (size_t i = 0; i < factors->size(); ++i) {
      const Json& f = (*factors)[i];
      const std::string field = absl::StrCat("step_factors[", i, "]");
      if (!f.is_number()) return Bad(where, field, "must be a number");
      const double d = f.get<double>();
      if (!std::isfinite(d) || d <= 0) return Bad(where, field, absl::StrCat("must be > 0, not ", d));
      c.step_factors.push_back(d);
    }
    if (!c.step_factors.empty() && c.step_noise > 0) {
      return Bad(where, "step_factors", "cannot be given with step_noise > 0 (both jitter the steps)");
    }
  }
  RETURN_IF_ERROR(
      ReadInt(j, "router_cell_size", where, "router_cell_size", 0, &c.router_cell_size));
  RETURN_IF_ERROR(ReadDouble(j, "prefill_timeout_s", where, "prefill_timeout_s", 0, true,
                             &c.prefill_timeout_s));
  return c;
}

absl::StatusOr<ClusterConfig> ReadClusterFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return ParseCluster(text, path, std::filesystem::path(path).parent_path().string());
}

absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view text, absl::string_view path,
                                            int64_t line) {
  const Where where{absl::StrCat(path, ":", line)};
  ASSIGN_OR_RETURN(Json j, ParseJson(text, where));
  RETURN_IF_ERROR(RefuseUnknown(j,
                                {"id", "arrival_s", "prompt_tokens", "output_tokens", "prefix_group",
                                 "prefix_tokens", "slo_class", "priority", "tenant", "ttft_slo_ms",
                                 "tpot_slo_ms"},
                                where, ""));
  TraceRequest r;
  const Json* id = Find(j, "id");
  if (id == nullptr) return Bad(where, "id", "is missing");
  if (id->is_string()) {
    r.id = id->get<std::string>();
  } else if (id->is_number_integer()) {
    r.id = absl::StrCat(id->get<int64_t>());
  } else {
    return Bad(where, "id", "must be a string");
  }
  for (const char* key : {"arrival_s", "prompt_tokens", "output_tokens"}) {
    if (Find(j, key) == nullptr) return Bad(where, key, "is missing");
  }
  RETURN_IF_ERROR(ReadDouble(j, "arrival_s", where, "arrival_s", 0, false, &r.arrival_s));
  RETURN_IF_ERROR(ReadInt(j, "prompt_tokens", where, "prompt_tokens", 1, &r.prompt_tokens));
  RETURN_IF_ERROR(ReadInt(j, "output_tokens", where, "output_tokens", 1, &r.output_tokens));
  RETURN_IF_ERROR(ReadString(j, "prefix_group", where, "prefix_group", &r.prefix_group));
  RETURN_IF_ERROR(ReadInt(j, "prefix_tokens", where, "prefix_tokens", 0, &r.prefix_tokens));
  if (r.prefix_tokens > r.prompt_tokens) {
    return Bad(where, "prefix_tokens",
               absl::StrCat("is ", r.prefix_tokens, ", more than prompt_tokens ", r.prompt_tokens));
  }
  if (r.prefix_tokens > 0 && r.prefix_group.empty()) {
    return Bad(where, "prefix_tokens", "is set without a prefix_group");
  }
  RETURN_IF_ERROR(ReadString(j, "slo_class", where, "slo_class", &r.slo_class));
  RETURN_IF_ERROR(ReadString(j, "tenant", where, "tenant", &r.tenant));
  int64_t priority = 0;
  RETURN_IF_ERROR(ReadInt(j, "priority", where, "priority", std::numeric_limits<int32_t>::min(),
                          &priority));
  if (priority > std::numeric_limits<int32_t>::max()) {
    return Bad(where, "priority", "is out of the 32-bit range");
  }
  r.priority = static_cast<int32_t>(priority);
  for (const auto& [key, out] : {std::pair<const char*, std::optional<double>*>{"ttft_slo_ms",
                                                                               &r.ttft_slo_ms},
                                 {"tpot_slo_ms", &r.tpot_slo_ms}}) {
    if (Find(j, key) == nullptr) continue;
    double v = 0;
    RETURN_IF_ERROR(ReadDouble(j, key, where, key, 0, true, &v));
    *out = v;
  }
  return r;
}

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text,
                                                     absl::string_view path) {
  std::vector<TraceRequest> trace;
  int64_t line = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view row = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (row.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    ASSIGN_OR_RETURN(TraceRequest r, ParseTraceLine(row, path, line));
    if (!trace.empty() && r.arrival_s < trace.back().arrival_s) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": arrival_s ", r.arrival_s,
                       " is before the line above's (", trace.back().arrival_s,
                       "); the trace must be sorted by arrival"));
    }
    trace.push_back(std::move(r));
  }
  return trace;
}

absl::StatusOr<std::vector<TraceRequest>> ReadTraceFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return ParseTrace(text, path);
}

}  // namespace tandem::sim
