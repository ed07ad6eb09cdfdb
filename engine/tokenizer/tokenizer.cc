#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/tokenizer/unicode.h"
#include "utf8proc.h"

namespace tandem {
namespace {

constexpr absl::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 '▁'

// "<0xAB>" -> 0xAB, or -1.
int ParseByteToken(absl::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + d;
  }
  return value;
}

// Undoes GPT-2's byte-to-unicode mapping; code points outside it are kept as UTF-8.
std::string ByteLevelToBytes(absl::string_view token) {
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp;
    const int len = DecodeUtf8(token, pos, &cp);
    const int byte = cp == kInvalidCodepoint ? -1 : UnicodeToByte(cp);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
    } else {
      out.append(token.data() + pos, len);
    }
    pos += len;
  }
  return out;
}

std::string SpmToBytes(absl::string_view token) {
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    if (token.substr(pos, kSpmSpace.size()) == kSpmSpace) {
      out.push_back(' ');
      pos += kSpmSpace.size();
    } else {
      out.push_back(token[pos++]);
    }
  }
  return out;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool IsSpecialType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

}  // namespace

Tokenizer::Tokenizer(TokenizerData data) : data_(std::move(data)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerData data) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer(std::move(data)));
  RETURN_IF_ERROR(tokenizer->Init());
  return tokenizer;
}

TokenType Tokenizer::type(int32_t id) const {
  return data_.token_types.empty() ? TokenType::kNormal : data_.token_types[id];
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && type(id) == TokenType::kControl;
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

absl::Status Tokenizer::InitMerges() {
  const auto& d = data_;
  merges_.reserve(d.merges.size());
  for (size_t rank = 0; rank < d.merges.size(); ++rank) {
    const std::string& m = d.merges[rank];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: merge ", rank, " '", m, "' is not 'left right'"));
    }
    const std::string left = m.substr(0, sp);
    const std::string right = m.substr(sp + 1);
    const int32_t l = TokenToId(left);
    const int32_t r = TokenToId(right);
    const int32_t result = TokenToId(left + right);
    if (l < 0 || r < 0 || result < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: merge ", rank, " '", m, "' names a token not in the vocabulary ('",
          l < 0 ? left : r < 0 ? right : left + right, "')"));
    }
    merges_.try_emplace(PairKey(l, r), Merge{static_cast<int32_t>(rank), result});
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Init() {
  const auto& d = data_;
  const int64_t n = static_cast<int64_t>(d.tokens.size());
  if (n == 0) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (n > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: vocabulary too large: ", n));
  }
  if (!d.scores.empty() && static_cast<int64_t>(d.scores.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", d.scores.size(),
                                                   " scores for ", n, " tokens"));
  }
  if (!d.token_types.empty() && static_cast<int64_t>(d.token_types.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", d.token_types.size(),
                                                   " token types for ", n, " tokens"));
  }
  for (int64_t i = 0; i < static_cast<int64_t>(d.token_types.size()); ++i) {
    const auto t = static_cast<int32_t>(d.token_types[i]);
    if (t < 1 || t > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: token ", i, " has unknown token type ", t));
    }
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"bos", d.bos_id}, {"eos", d.eos_id}, {"unk", d.unk_id}, {"pad", d.pad_id}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", name, " id ", id,
                                                     " is outside the vocabulary [0, ", n, ")"));
    }
  }
  if (d.add_bos && d.bos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_bos is set but there is no bos id");
  }
  if (d.add_eos && d.eos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_eos is set but there is no eos id");
  }

  const bool byte_level = d.model == TokenizerModel::kByteLevelBpe;
  if (byte_level) {
    ASSIGN_OR_RETURN(pre_kind_, PreTokenizerKindFromName(d.pre_tokenizer));
    ignore_merges_ = d.ignore_merges.value_or(pre_kind_ == PreTokenizerKind::kLlama3);
  }

  token_bytes_.resize(n);
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::vector<Special> specials;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& tok = d.tokens[id];
    const TokenType t = type(id);
    if (tok.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", id, " is empty"));
    }
    token_to_id_.try_emplace(tok, id);
    if (IsSpecialType(t)) {
      token_bytes_[id] = tok;
      specials.push_back({tok, id, t != TokenType::kUserDefined});
      continue;
    }
    if (byte_level) {
      token_bytes_[id] = ByteLevelToBytes(tok);
      if (t == TokenType::kNormal || t == TokenType::kByte) {
        text_to_id_.try_emplace(token_bytes_[id], id);
      }
    } else if (t == TokenType::kByte) {
      const int b = ParseByteToken(tok);
      if (b < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer: byte token ", id, " is '", tok, "', expected the form <0xAB>"));
      }
      token_bytes_[id] = std::string(1, static_cast<char>(b));
      if (byte_ids_[b] < 0) byte_ids_[b] = id;
    } else {
      token_bytes_[id] = SpmToBytes(tok);
      if (t == TokenType::kNormal) text_to_id_.try_emplace(tok, id);
    }
  }

  if (!d.merges.empty() || byte_level) {
    RETURN_IF_ERROR(InitMerges());
  }
  if (byte_level) {
    // A byte without a token (SmolLM2 lacks 21 of them, e.g. 0x04 and 0xFF) is dropped when
    // encoding, as Hugging Face's BPE without an unknown token and llama.cpp do.
    for (int b = 0; b < 256; ++b) {
      std::string mapped;
      AppendUtf8(ByteToUnicode(static_cast<uint8_t>(b)), &mapped);
      byte_ids_[b] = TokenToId(mapped);
    }
  } else {
    bool all_bytes = true;
    for (int b = 0; b < 256; ++b) all_bytes = all_bytes && byte_ids_[b] >= 0;
    if (!all_bytes && d.unk_id < 0) {
      return absl::InvalidArgumentError(
          "tokenizer: SentencePiece vocabulary has neither all 256 <0xXX> byte tokens nor an "
          "unknown token, so some text could not be encoded");
    }
  }

  for (Special& s : specials) {
    s.lstrip = absl::c_linear_search(d.lstrip_ids, s.id);
    s.rstrip = absl::c_linear_search(d.rstrip_ids, s.id);
  }
  specials_by_first_byte_.assign(256, {});
  std::sort(specials.begin(), specials.end(), [](const Special& a, const Special& b) {
    return a.text.size() > b.text.size() || (a.text.size() == b.text.size() && a.id < b.id);
  });
  for (auto& s : specials) {
    specials_by_first_byte_[static_cast<uint8_t>(s.text[0])].push_back(std::move(s));
  }
  return absl::OkStatus();
}

namespace {

// `text` in Unicode NFC, or nullopt when it already is (ASCII, the common case, is checked without
// a copy) or is not valid UTF-8 (then split as it is).
std::optional<std::string> ToNfc(absl::string_view text) {
  if (absl::c_all_of(text, [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
    return std::nullopt;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE |
                                                                         UTF8PROC_COMPOSE));
  if (n < 0) return std::nullopt;  // invalid UTF-8: nothing allocated
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

}  // namespace

std::vector<int32_t> Tokenizer::Encode(absl::string_view text,
                                       const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_special && data_.add_bos) out.push_back(data_.bos_id);
  const bool byte_level = data_.model == TokenizerModel::kByteLevelBpe;
  auto encode_fragment = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    absl::string_view fragment = text.substr(begin, end - begin);
    std::optional<std::string> normalized;
    if (data_.normalize_nfc && (normalized = ToNfc(fragment))) fragment = *normalized;
    if (byte_level) {
      EncodeByteLevel(fragment, &out);
    } else if (data_.add_space_prefix && (begin == 0 || data_.space_prefix_every_fragment) &&
               !(data_.space_prefix_unless_space && fragment[0] == ' ')) {
      EncodeSentencePiece(absl::StrCat(" ", fragment), &out);
    } else {
      EncodeSentencePiece(fragment, &out);
    }
  };
  size_t start = 0, pos = 0;
  while (pos < text.size()) {
    const Special* match = nullptr;
    for (const Special& s : specials_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      if (s.control && !options.parse_special) continue;
      if (text.substr(pos, s.text.size()) == s.text) {
        match = &s;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t fragment_end = pos;
    if (match->lstrip) {
      while (fragment_end > start && IsAsciiSpace(text[fragment_end - 1])) --fragment_end;
    }
    encode_fragment(start, fragment_end);
    out.push_back(match->id);
    pos += match->text.size();
    if (match->rstrip) {
      while (pos < text.size() && IsAsciiSpace(text[pos])) ++pos;
    }
    start = pos;
  }
  encode_fragment(start, text.size());
  if (options.add_special && data_.add_eos) out.push_back(data_.eos_id);
  return out;
}

void Tokenizer::EncodeByteLevel(absl::string_view text, std::vector<int32_t>* out) const {
  for (absl::string_view word : PreTokenize(pre_kind_, text)) BpeWord(word, out);
}

void Tokenizer::BpeWord(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = text_to_id_.find(word);
    if (it != text_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out->push_back(id);
    return;
  }
  std::vector<int32_t> ids(word.size());
  for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  MergeRanked(std::move(ids), out);
}

// Ranked BPE over one word: a doubly linked list of symbols and a min-heap of candidate merges
// (rank, position), stale entries skipped when popped. O(n log n) in the word length.
void Tokenizer::MergeRanked(std::vector<int32_t> ids, std::vector<int32_t>* out) const {
  if (ids.empty()) return;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    const int32_t l = sym[pos].id, r = sym[sym[pos].next].id;
    auto it = merges_.find(PairKey(l, r));
    if (it != merges_.end()) heap.push({it->second.rank, pos, l, r});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    // Stale when the left symbol was merged away or changed, or its right neighbour changed.
    if (left.id != c.left || left.next < 0 || sym[left.next].id != c.right) continue;
    const int32_t right_pos = left.next;
    left.id = merges_.find(PairKey(c.left, c.right))->second.result;
    left.next = sym[right_pos].next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    sym[right_pos].id = -2;  // merged away
    push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) out->push_back(sym[i].id);  // -1: a byte without a token
  }
}

// SentencePiece BPE (as llama.cpp and sentencepiece do it): start from UTF-8 characters, merge
// the adjacent pair whose concatenation is the highest-scoring token (leftmost on ties), then
// emit each final piece, splitting pieces that are not tokens back along their merges, and
// finally into <0xXX> byte tokens (or the unknown token).
void Tokenizer::EncodeSentencePiece(absl::string_view raw, std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 2);
  for (char c : raw) {
    if (c == ' ') {
      text.append(kSpmSpace.data(), kSpmSpace.size());
    } else {
      text.push_back(c);
    }
  }
  if (!merges_.empty()) {
    EncodeSentencePieceRanked(text, out);
    return;
  }
  struct Symbol {
    int32_t prev;
    int32_t next;
    size_t start;
    size_t len;  // 0 once merged into its left neighbour
  };
  std::vector<Symbol> sym;
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp;
    const int len = DecodeUtf8(text, pos, &cp);
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({i - 1, -1, pos, static_cast<size_t>(len)});
    if (i > 0) sym[i - 1].next = i;
    pos += len;
  }
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    size_t len;
    bool operator<(const Bigram& o) const {  // max-heap: higher score, then lower left first
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> heap;
  absl::flat_hash_map<absl::string_view, std::pair<int32_t, int32_t>> rev_merge;
  const absl::string_view view(text);
  auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const absl::string_view s = view.substr(sym[l].start, sym[l].len + sym[r].len);
    auto it = text_to_id_.find(s);
    if (it == text_to_id_.end()) return;
    const float score = data_.scores.empty() ? 0.0f : data_.scores[it->second];
    heap.push({score, l, r, s.size()});
    rev_merge.try_emplace(s, std::make_pair(l, r));
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) add(i - 1, i);
  while (!heap.empty()) {
    const Bigram b = heap.top();
    heap.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    add(l.prev, b.left);
    add(b.left, l.next);
  }
  std::function<void(absl::string_view)> emit = [&](absl::string_view piece) {
    auto it = text_to_id_.find(piece);
    if (it != text_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
    auto m = rev_merge.find(piece);
    if (m != rev_merge.end()) {
      const Symbol& l = sym[m->second.first];
      const Symbol& r = sym[m->second.second];
      // The original split: the left symbol's start up to the right symbol's start.
      const size_t left_len = r.start - l.start;
      emit(piece.substr(0, left_len));
      emit(piece.substr(left_len));
      return;
    }
    for (char c : piece) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      out->push_back(id >= 0 ? id : data_.unk_id);
    }
  };
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    emit(view.substr(sym[i].start, sym[i].len));
  }
}

// SentencePiece-style BPE as Hugging Face's BPE model runs it: within each word (the whole text,
// or pieces that begin at each U+2581 when split_at_spaces), start from UTF-8 characters that
// are tokens, others as their <0xXX> byte tokens (or the unknown token when a byte has none),
// then apply the merges by rank.
void Tokenizer::EncodeSentencePieceRanked(absl::string_view text,
                                          std::vector<int32_t>* out) const {
  auto encode_word = [&](absl::string_view word) {
    std::vector<int32_t> ids;
    ids.reserve(word.size());
    for (size_t pos = 0; pos < word.size();) {
      char32_t cp;
      const int len = DecodeUtf8(word, pos, &cp);
      const absl::string_view ch = word.substr(pos, len);
      pos += len;
      auto it = text_to_id_.find(ch);
      if (it != text_to_id_.end()) {
        ids.push_back(it->second);
        continue;
      }
      bool all_bytes = true;
      for (char c : ch) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      } else {
        ids.push_back(data_.unk_id);
      }
    }
    MergeRanked(std::move(ids), out);
  };
  if (!data_.split_at_spaces) {
    encode_word(text);
    return;
  }
  size_t start = 0;
  for (size_t pos = kSpmSpace.size(); pos <= text.size(); ++pos) {
    if (pos == text.size() || text.substr(pos, kSpmSpace.size()) == kSpmSpace) {
      encode_word(text.substr(start, pos - start));
      start = pos;
    }
  }
}

std::string Tokenizer::TokenBytes(int32_t id, const DecodeOptions& options) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (options.skip_special && type(id) == TokenType::kControl) return {};
  return token_bytes_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids,
                              const DecodeOptions& options) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = TokenBytes(ids[i], options);
    // Undo the SentencePiece dummy prefix on the text's first token (after a leading BOS).
    if (data_.model == TokenizerModel::kSentencePieceBpe && data_.add_space_prefix &&
        (i == 0 || (i == 1 && ids[0] == data_.bos_id)) && !piece.empty() && piece[0] == ' ' &&
        type(ids[i]) == TokenType::kNormal) {
      piece.erase(0, 1);
    }
    out += piece;
  }
  return out;
}

}  // namespace tandem
