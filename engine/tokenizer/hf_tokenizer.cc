#include "engine/tokenizer/hf_tokenizer.h"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

constexpr absl::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 '▁'

// The split regexes of the pre-tokenizers PreTokenize() implements, as tokenizer.json spells them.
constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Typed, non-throwing access to JSON members; errors name the file and the member.
class Reader {
 public:
  explicit Reader(std::string name) : name_(std::move(name)) {}

  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", what));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(name_, ": ", what, " is not supported"));
  }

  // The string member `key` of `obj`; `fallback` when absent or null.
  absl::StatusOr<std::string> String(const json& obj, const char* key,
                                     std::string fallback = "") const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_string()) return Invalid(absl::StrCat("'", key, "' is not a string"));
    return it->get<std::string>();
  }
  absl::StatusOr<bool> Bool(const json& obj, const char* key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Invalid(absl::StrCat("'", key, "' is not a boolean"));
    return it->get<bool>();
  }
  // "type" of a component object.
  absl::StatusOr<std::string> Type(const json& obj, absl::string_view what) const {
    if (!obj.is_object()) return Invalid(absl::StrCat(what, " is not an object"));
    ASSIGN_OR_RETURN(std::string type, String(obj, "type"));
    if (type.empty()) return Invalid(absl::StrCat(what, " has no 'type'"));
    return type;
  }

 private:
  std::string name_;
};

// A token given as "text" or {"content": "text"} (tokenizer_config.json's bos_token, ...).
std::string TokenText(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

// The SentencePiece-style settings, gathered from the normalizer and pre-tokenizer.
struct SpmSettings {
  bool metaspace = false;  // a Metaspace pre-tokenizer or Prepend+Replace normalizers seen
  bool prepend = false;
  bool replace = false;
  bool nfc = false;  // an NFC normalizer seen (applies to byte-level models as well)
};

absl::Status ReadNormalizer(const Reader& r, const json& norm, SpmSettings* spm) {
  if (norm.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string type, r.Type(norm, "normalizer"));
  if (type == "Sequence") {
    auto it = norm.find("normalizers");
    if (it == norm.end() || !it->is_array()) return r.Invalid("normalizer Sequence has no list");
    for (const json& n : *it) RETURN_IF_ERROR(ReadNormalizer(r, n, spm));
    return absl::OkStatus();
  }
  if (type == "NFC") {
    spm->nfc = true;
    return absl::OkStatus();
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string p, r.String(norm, "prepend"));
    if (p != kSpmSpace) return r.Unsupported(absl::StrCat("normalizer Prepend('", p, "')"));
    spm->prepend = true;
    return absl::OkStatus();
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(std::string content, r.String(norm, "content"));
    std::string pattern;
    auto it = norm.find("pattern");
    if (it != norm.end() && it->is_object()) {
      ASSIGN_OR_RETURN(pattern, r.String(*it, "String"));
    }
    if (pattern != " " || content != kSpmSpace) {
      return r.Unsupported(absl::StrCat("normalizer Replace('", pattern, "' -> '", content, "')"));
    }
    spm->replace = true;
    return absl::OkStatus();
  }
  return r.Unsupported(absl::StrCat("normalizer '", type, "'"));
}

// Byte-level pre-tokenizers: sets data->pre_tokenizer. Metaspace: sets the SentencePiece flags.
absl::Status ReadPreTokenizer(const Reader& r, const json& pre, TokenizerData* data,
                              SpmSettings* spm) {
  if (pre.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string type, r.Type(pre, "pre_tokenizer"));
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool prefix, r.Bool(pre, "add_prefix_space", false));
    ASSIGN_OR_RETURN(bool use_regex, r.Bool(pre, "use_regex", true));
    if (prefix) return r.Unsupported("pre_tokenizer ByteLevel with add_prefix_space");
    if (use_regex) data->pre_tokenizer = "gpt2";
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement, r.String(pre, "replacement", std::string(kSpmSpace)));
    if (replacement != kSpmSpace) {
      return r.Unsupported(absl::StrCat("pre_tokenizer Metaspace replacement '", replacement, "'"));
    }
    ASSIGN_OR_RETURN(bool legacy_prefix, r.Bool(pre, "add_prefix_space", true));
    ASSIGN_OR_RETURN(std::string scheme,
                     r.String(pre, "prepend_scheme", legacy_prefix ? "always" : "never"));
    ASSIGN_OR_RETURN(data->split_at_spaces, r.Bool(pre, "split", true));
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      return r.Unsupported(absl::StrCat("Metaspace prepend_scheme '", scheme, "'"));
    }
    spm->metaspace = true;
    data->add_space_prefix = scheme != "never";
    data->space_prefix_every_fragment = scheme == "always";
    data->space_prefix_unless_space = true;
    return absl::OkStatus();
  }
  if (type != "Sequence") return r.Unsupported(absl::StrCat("pre_tokenizer '", type, "'"));

  // Byte-level sequences: [Split(regex) | Digits(individual)], then ByteLevel(use_regex=false).
  auto it = pre.find("pretokenizers");
  if (it == pre.end() || !it->is_array() || it->empty()) {
    return r.Invalid("pre_tokenizer Sequence has no list");
  }
  const json& list = *it;
  std::string first;
  if (list.size() == 1) return ReadPreTokenizer(r, list[0], data, spm);
  ASSIGN_OR_RETURN(std::string last_type, r.Type(list.back(), "pre_tokenizer"));
  if (list.size() != 2 || last_type != "ByteLevel") {
    return r.Unsupported("pre_tokenizer Sequence other than [Split or Digits, ByteLevel]");
  }
  ASSIGN_OR_RETURN(bool prefix, r.Bool(list[1], "add_prefix_space", false));
  ASSIGN_OR_RETURN(bool use_regex, r.Bool(list[1], "use_regex", true));
  if (prefix) return r.Unsupported("pre_tokenizer ByteLevel with add_prefix_space");
  ASSIGN_OR_RETURN(first, r.Type(list[0], "pre_tokenizer"));
  if (first == "Digits") {
    ASSIGN_OR_RETURN(bool individual, r.Bool(list[0], "individual_digits", false));
    if (!individual || !use_regex) {
      return r.Unsupported("pre_tokenizer Digits without individual_digits, or without the "
                           "ByteLevel regex after it");
    }
    data->pre_tokenizer = "smollm";
    return absl::OkStatus();
  }
  if (first != "Split" || use_regex) {
    return r.Unsupported(absl::StrCat("pre_tokenizer Sequence [", first, ", ByteLevel",
                                      use_regex ? " with its regex" : "", "]"));
  }
  std::string regex;
  auto pattern = list[0].find("pattern");
  if (pattern != list[0].end() && pattern->is_object()) {
    ASSIGN_OR_RETURN(regex, r.String(*pattern, "Regex"));
  }
  ASSIGN_OR_RETURN(std::string behavior, r.String(list[0], "behavior"));
  ASSIGN_OR_RETURN(bool invert, r.Bool(list[0], "invert", false));
  if (behavior != "Isolated" || invert) {
    return r.Unsupported(absl::StrCat("pre_tokenizer Split with behavior '", behavior, "'",
                                      invert ? " inverted" : ""));
  }
  if (regex == kGpt2Regex) {
    data->pre_tokenizer = "gpt2";
  } else if (regex == kLlama3Regex) {
    data->pre_tokenizer = "llama3";
  } else if (regex == kQwen2Regex) {
    data->pre_tokenizer = "qwen2";
  } else {
    return r.Unsupported(absl::StrCat("pre_tokenizer Split regex '", regex,
                                      "' (supported: the GPT-2, Llama 3 and Qwen2 regexes)"));
  }
  return absl::OkStatus();
}

// Reads TemplateProcessing's "single" template: a special token before $A is BOS, after it EOS.
absl::Status ReadPostProcessor(const Reader& r, const json& post,
                               const absl::flat_hash_map<std::string, int32_t>& ids,
                               TokenizerData* data) {
  if (post.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string type, r.Type(post, "post_processor"));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    auto it = post.find("processors");
    if (it == post.end() || !it->is_array()) return r.Invalid("post_processor Sequence has no list");
    for (const json& p : *it) RETURN_IF_ERROR(ReadPostProcessor(r, p, ids, data));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return r.Unsupported(absl::StrCat("post_processor '", type, "'"));
  }
  auto single = post.find("single");
  if (single == post.end() || !single->is_array()) {
    return r.Invalid("TemplateProcessing has no 'single' template");
  }
  bool seen_sequence = false;
  for (const json& piece : *single) {
    if (!piece.is_object()) return r.Invalid("TemplateProcessing piece is not an object");
    if (piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    auto special = piece.find("SpecialToken");
    if (special == piece.end() || !special->is_object()) {
      return r.Invalid("TemplateProcessing piece is neither Sequence nor SpecialToken");
    }
    ASSIGN_OR_RETURN(std::string token, r.String(*special, "id"));
    auto id = ids.find(token);
    if (id == ids.end()) {
      return r.Invalid(absl::StrCat("TemplateProcessing names unknown token '", token, "'"));
    }
    if (seen_sequence) {
      if (data->add_eos) return r.Unsupported("TemplateProcessing with two tokens after $A");
      data->add_eos = true;
      data->eos_id = id->second;
    } else {
      if (data->add_bos) return r.Unsupported("TemplateProcessing with two tokens before $A");
      data->add_bos = true;
      data->bos_id = id->second;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadConfig(const Reader& r, const json& config,
                        const absl::flat_hash_map<std::string, int32_t>& ids,
                        TokenizerData* data) {
  if (!config.is_object()) return r.Invalid("tokenizer_config.json is not an object");
  auto id_of = [&](const char* key, int32_t* out) -> absl::Status {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return absl::OkStatus();
    const std::string text = TokenText(*it);
    auto id = ids.find(text);
    if (id == ids.end()) {
      return r.Invalid(absl::StrCat("tokenizer_config.json ", key, " '", text,
                                    "' is not a token"));
    }
    *out = id->second;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(id_of("bos_token", &data->bos_id));
  RETURN_IF_ERROR(id_of("eos_token", &data->eos_id));
  RETURN_IF_ERROR(id_of("unk_token", &data->unk_id));
  RETURN_IF_ERROR(id_of("pad_token", &data->pad_id));
  ASSIGN_OR_RETURN(data->add_bos, r.Bool(config, "add_bos_token", data->add_bos));
  ASSIGN_OR_RETURN(data->add_eos, r.Bool(config, "add_eos_token", data->add_eos));
  auto tmpl = config.find("chat_template");
  if (tmpl != config.end() && !tmpl->is_null()) {
    if (tmpl->is_string()) {
      data->chat_template = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      for (const json& named : *tmpl) {
        if (!named.is_object()) return r.Invalid("chat_template list entry is not an object");
        ASSIGN_OR_RETURN(std::string name, r.String(named, "name"));
        if (name == "default") {
          ASSIGN_OR_RETURN(data->chat_template, r.String(named, "template"));
        }
      }
    } else {
      return r.Invalid("chat_template is neither a string nor a list");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist or is not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<TokenizerData> TokenizerDataFromHfJson(absl::string_view tokenizer_json,
                                                      absl::string_view config_json,
                                                      absl::string_view name) {
  const Reader r{std::string(name)};
  const json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return r.Invalid("tokenizer.json is not a JSON object");
  auto model_it = root.find("model");
  if (model_it == root.end()) return r.Invalid("tokenizer.json has no 'model'");
  const json& model = *model_it;
  ASSIGN_OR_RETURN(std::string model_type, r.Type(model, "model"));
  if (model_type != "BPE") {
    return r.Unsupported(absl::StrCat("tokenizer model '", model_type, "' (supported: BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    ASSIGN_OR_RETURN(std::string affix, r.String(model, key));
    if (!affix.empty()) return r.Unsupported(absl::StrCat("BPE ", key, " '", affix, "'"));
  }
  auto dropout = model.find("dropout");
  if (dropout != model.end() && dropout->is_number() && dropout->get<double>() > 0) {
    return r.Unsupported("BPE dropout");
  }

  TokenizerData data;
  // The vocabulary: model.vocab, then added_tokens (which may extend it). Ids must be dense.
  absl::flat_hash_map<std::string, int32_t> ids;
  std::vector<std::string> tokens;
  // Dense ids are below the number of entries (vocab + added_tokens), so a larger id is refused
  // before `tokens` grows to it.
  int64_t entries = 0;
  auto put = [&](const std::string& text, int64_t id) -> absl::Status {
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return r.Invalid(absl::StrCat("token '", text, "' has id ", id));
    }
    if (id >= entries) {
      return r.Invalid(absl::StrCat("token '", text, "' has id ", id, ", but there are only ",
                                    entries, " tokens (ids must be dense)"));
    }
    if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(id + 1);
    if (!tokens[id].empty() && tokens[id] != text) {
      return r.Invalid(absl::StrCat("id ", id, " is both '", tokens[id], "' and '", text, "'"));
    }
    tokens[id] = text;
    ids.try_emplace(text, static_cast<int32_t>(id));
    return absl::OkStatus();
  };
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) return r.Invalid("BPE model has no vocab object");
  auto added_it = root.find("added_tokens");
  entries = static_cast<int64_t>(vocab->size()) +
            (added_it != root.end() && added_it->is_array() ? static_cast<int64_t>(added_it->size())
                                                            : 0);
  for (const auto& [text, id] : vocab->items()) {
    if (!id.is_number_integer()) return r.Invalid(absl::StrCat("vocab id of '", text, "'"));
    RETURN_IF_ERROR(put(text, id.get<int64_t>()));
  }
  std::vector<std::pair<int32_t, bool>> added;  // id, special
  if (added_it != root.end() && !added_it->is_null()) {
    if (!added_it->is_array()) return r.Invalid("added_tokens is not a list");
    for (const json& t : *added_it) {
      if (!t.is_object()) return r.Invalid("added token is not an object");
      ASSIGN_OR_RETURN(std::string content, r.String(t, "content"));
      auto id = t.find("id");
      if (content.empty() || id == t.end() || !id->is_number_integer()) {
        return r.Invalid("added token without content or id");
      }
      RETURN_IF_ERROR(put(content, id->get<int64_t>()));
      ASSIGN_OR_RETURN(bool special, r.Bool(t, "special", false));
      ASSIGN_OR_RETURN(bool lstrip, r.Bool(t, "lstrip", false));
      ASSIGN_OR_RETURN(bool rstrip, r.Bool(t, "rstrip", false));
      ASSIGN_OR_RETURN(bool single_word, r.Bool(t, "single_word", false));
      if (single_word) return r.Unsupported(absl::StrCat("added token '", content, "' single_word"));
      const auto i = static_cast<int32_t>(id->get<int64_t>());
      added.emplace_back(i, special);
      if (lstrip) data.lstrip_ids.push_back(i);
      if (rstrip) data.rstrip_ids.push_back(i);
    }
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].empty()) return r.Invalid(absl::StrCat("no token has id ", i));
  }

  // Normalizer and pre-tokenizer decide byte-level vs SentencePiece-style.
  SpmSettings spm;
  data.pre_tokenizer.clear();
  data.add_space_prefix = false;
  RETURN_IF_ERROR(ReadNormalizer(r, root.value("normalizer", json()), &spm));
  RETURN_IF_ERROR(ReadPreTokenizer(r, root.value("pre_tokenizer", json()), &data, &spm));
  if (spm.prepend && !spm.replace) {
    return r.Unsupported("normalizer Prepend('▁') without Replace(' ', '▁')");
  }
  data.normalize_nfc = spm.nfc;
  const bool sentencepiece = spm.metaspace || spm.replace;
  if (sentencepiece) {
    if (!data.pre_tokenizer.empty()) return r.Unsupported("Metaspace mixed with ByteLevel");
    data.model = TokenizerModel::kSentencePieceBpe;
    if (!spm.metaspace) {
      // Replace normalizer, whole text one word; Prepend too (Llama 2 exports): a dummy prefix
      // on every fragment; Replace alone (Gemma): none.
      data.add_space_prefix = spm.prepend;
      data.space_prefix_every_fragment = spm.prepend;
      data.split_at_spaces = false;
    }
  } else {
    if (data.pre_tokenizer.empty()) {
      return r.Unsupported("a BPE tokenizer with neither a ByteLevel nor a Metaspace stage");
    }
    data.model = TokenizerModel::kByteLevelBpe;
  }

  ASSIGN_OR_RETURN(data.ignore_merges, r.Bool(model, "ignore_merges", false));
  ASSIGN_OR_RETURN(bool byte_fallback, r.Bool(model, "byte_fallback", false));
  ASSIGN_OR_RETURN(std::string unk, r.String(model, "unk_token"));
  if (!unk.empty()) {
    auto it = ids.find(unk);
    if (it == ids.end()) return r.Invalid(absl::StrCat("unk_token '", unk, "' is not a token"));
    data.unk_id = it->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) return r.Invalid("BPE model has no merges list");
  data.merges.reserve(merges->size());
  for (const json& m : *merges) {
    if (m.is_string()) {
      data.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const std::string left = m[0].get<std::string>(), right = m[1].get<std::string>();
      if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos) {
        return r.Unsupported(absl::StrCat("merge of tokens with spaces ('", left, "', '", right, "')"));
      }
      data.merges.push_back(absl::StrCat(left, " ", right));
    } else {
      return r.Invalid(absl::StrCat("merge ", data.merges.size(), " is neither 'a b' nor [a, b]"));
    }
  }

  data.token_types.assign(tokens.size(), TokenType::kNormal);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (sentencepiece && byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 &&
        t[5] == '>') {
      data.token_types[i] = TokenType::kByte;
    }
  }
  if (data.unk_id >= 0) data.token_types[data.unk_id] = TokenType::kUnknown;
  for (const auto& [id, special] : added) {
    data.token_types[id] = special ? TokenType::kControl : TokenType::kUserDefined;
  }
  RETURN_IF_ERROR(ReadPostProcessor(r, root.value("post_processor", json()), ids, &data));

  if (!config_json.empty()) {
    const json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return r.Invalid("tokenizer_config.json is not JSON");
    RETURN_IF_ERROR(ReadConfig(r, config, ids, &data));
  }
  data.tokens = std::move(tokens);
  return data;
}

absl::StatusOr<TokenizerData> TokenizerDataFromHfFolder(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/tokenizer.json");
  if (!FileExists(path)) {
    return absl::NotFoundError(absl::StrCat(dir, " has no tokenizer.json (a Hugging Face model "
                                            "folder needs it for the tokenizer)"));
  }
  ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(path));
  std::string config_json;
  const std::string config_path = absl::StrCat(dir, "/tokenizer_config.json");
  if (FileExists(config_path)) {
    ASSIGN_OR_RETURN(config_json, ReadFile(config_path));
  }
  ASSIGN_OR_RETURN(TokenizerData data, TokenizerDataFromHfJson(tokenizer_json, config_json, path));
  const std::string jinja_path = absl::StrCat(dir, "/chat_template.jinja");
  if (data.chat_template.empty() && FileExists(jinja_path)) {
    ASSIGN_OR_RETURN(data.chat_template, ReadFile(jinja_path));
  }
  return data;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromHfFolder(const std::string& dir) {
  ASSIGN_OR_RETURN(TokenizerData data, TokenizerDataFromHfFolder(dir));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(std::move(data));
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), absl::StrCat(dir, "/tokenizer.json"));
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerForModel(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return TokenizerFromHfFolder(path);
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return TokenizerFromGguf(*file);
}

}  // namespace tandem
