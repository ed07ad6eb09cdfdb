// kv_peer: one side of a KV transfer over UCX, in its own process, driven by
// transfer_process_test.py through stdin/stdout lines. Every reply is one line; lines of several
// threads never interleave.
//
//   kv_peer --role=owner|writer --name=NAME [--tls=posix,self] [--layers=4] [--block_size=16]
//           [--blocks=64] [--kv_heads=2] [--head_dim=16] [--seed=1] [--canary=0]
//
// Pool content. The writer fills its pool from --seed: float i of block b is Value(seed, b, i)
// (an integer in [-2^23, 2^23), exact as a float). Every notification names the writer's seed and
// the block pairs, so the owner computes the bytes it must hold without seeing the writer's pool.
//
// Owner (registers a pool whose every byte is --canary, 0 by default, and prints `DESCRIPTOR <hex
// of the serialized tandem.v1.KvPoolDescriptor>`). On each notification `PART|DONE <req> <seed> <last> <pairs>` it
// checks, on the transport's thread, that layers [0, last] of every pair are in place and that
// the request's notifications come in order, and prints
//   NOTE PART|DONE <req> <last> OK | NOTE ... BAD <why>
// Commands:
//   WAIT_DONE <req> <timeout_ms> -> DONE_OK <req> | DONE_BAD <req> <why> | DONE_TIMEOUT <req> <ms>
//   UNTOUCHED <blocks: b,b... or -> -> UNTOUCHED_OK | UNTOUCHED_BAD <block>  (still all canary?)
//   CHANGED -> CHANGED <blocks: b,b... or ->  (every block with a byte that is not the canary)
//   HOLD -> HOLDING: from now on the handler, on each notification, prints `HELD <req> <last>`
//       and waits (on the transport's thread, at most 60 s) for RELEASE -> RELEASED
//   PING -> PONG;  QUIT -> BYE (then exits 0; so does end of input)
//
// Writer (registers its seeded pool, prints READY). Commands:
//   CONNECT <conn> <hex descriptor> <timeout_ms>
//       -> CONNECTED <conn> <describe> | CONNECT_ERROR <conn> <ms> <CODE> <message>
//   TRANSFER <conn> <req> <op_timeout_ms> <layers_per_step> <pace_ms> <pairs: s:d,s:d... or ->
//       On its own thread: for each step of layers, Write(those layers) then Notify(PART ...),
//       every operation with deadline = its issue time + op_timeout_ms, pausing pace_ms between
//       steps (the time a prefill worker computes the next layers); then Notify(DONE ...). When
//       every operation has ended:
//       -> TRANSFER_OK <req> <ms> | TRANSFER_ERROR <req> <ms> <CODE> <message>  (the first error)
//       -> TRANSFER_HUNG <req>   when an operation did not end 10 s after its deadline (a bug)
//   DROP <conn> -> DROPPED <conn>;  PING -> PONG;  QUIT -> BYE
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/kv/kv_storage.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::kvtransfer {
namespace {

absl::Mutex out_mu(absl::kConstInit);

// Prints one reply line, whole.
void Out(const std::string& line) {
  const std::string whole = line + "\n";  // one write: UCX may log to stdout too
  absl::MutexLock lock(&out_mu);
  std::fwrite(whole.data(), 1, whole.size(), stdout);
  std::fflush(stdout);
}

// Messages travel on one line.
std::string OneLine(absl::string_view text) {
  std::string s(text);
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

std::string StatusLine(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), " ", OneLine(s.message()));
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Float `i` of block `block` of a writer pool filled from `seed`.
float Value(uint64_t seed, int64_t block, int64_t i) {
  const uint64_t h = SplitMix64(seed * 0xD1B54A32D192ED03ull ^
                                (static_cast<uint64_t>(block) << 40) ^ static_cast<uint64_t>(i));
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23));
}

struct Options {
  std::string role;
  std::string name = "peer";
  std::string tls;
  KvLayout layout{.num_blocks = 64, .num_layers = 4, .block_size = 16, .num_kv_heads = 2,
                  .head_dim = 16};
  uint64_t seed = 1;
  int canary = 0;  // the owner's pool starts with every byte this
};

bool ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    const std::string key = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    bool ok = true;
    if (key == "role") {
      o->role = value;
    } else if (key == "name") {
      o->name = value;
    } else if (key == "tls") {
      o->tls = value;
    } else if (key == "layers") {
      ok = absl::SimpleAtoi(value, &o->layout.num_layers);
    } else if (key == "block_size") {
      ok = absl::SimpleAtoi(value, &o->layout.block_size);
    } else if (key == "blocks") {
      ok = absl::SimpleAtoi(value, &o->layout.num_blocks);
    } else if (key == "kv_heads") {
      ok = absl::SimpleAtoi(value, &o->layout.num_kv_heads);
    } else if (key == "head_dim") {
      ok = absl::SimpleAtoi(value, &o->layout.head_dim);
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &o->seed);
    } else if (key == "canary") {
      ok = absl::SimpleAtoi(value, &o->canary) && o->canary >= 0 && o->canary <= 255;
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  return o->role == "owner" || o->role == "writer";
}

// absl::HexStringToBytes, refusing what is not hex.
bool HexToBytes(absl::string_view hex, std::string* bytes) {
  if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdefABCDEF") != hex.npos) {
    return false;
  }
  *bytes = absl::HexStringToBytes(hex);
  return true;
}

// "3:17,4:2" or "-" (no pairs).
bool ParsePairs(absl::string_view text, std::vector<BlockPair>* pairs) {
  if (text == "-") return true;
  for (absl::string_view p : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> sd = absl::StrSplit(p, ':');
    BlockPair pair;
    if (sd.size() != 2 || !absl::SimpleAtoi(sd[0], &pair.src) ||
        !absl::SimpleAtoi(sd[1], &pair.dst)) {
      return false;
    }
    pairs->push_back(pair);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Owner.
// ---------------------------------------------------------------------------------------------

class Owner {
 public:
  Owner(KvTransport* transport, KvStorage* pool, unsigned char canary)
      : transport_(transport), pool_(pool), canary_(canary) {
    std::memset(pool_->data<std::byte>(), canary_, static_cast<size_t>(pool_->layout().total_bytes()));
  }

  void Start() {
    transport_->SetNotificationHandler([this](Notification n) { OnNotification(n); });
  }

  // WAIT_DONE: the owner's own deadline for a request's final notification.
  void WaitDone(const std::string& req, absl::Duration timeout) {
    const absl::Time start = absl::Now();
    absl::MutexLock lock(&mu_);
    auto arrived_cond = [this, &req]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_.contains(req);
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&arrived_cond), timeout)) {
      Out(absl::StrCat("DONE_TIMEOUT ", req, " ",
                       absl::ToInt64Milliseconds(absl::Now() - start)));
      return;
    }
    const std::string& result = done_[req];
    Out(result.empty() ? absl::StrCat("DONE_OK ", req) : absl::StrCat("DONE_BAD ", req, " ", result));
  }

  void Stop() { transport_->SetNotificationHandler(nullptr); }

  // HOLD / RELEASE.
  void Hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
    Out(hold ? "HOLDING" : "RELEASED");
  }

  // UNTOUCHED: whether `blocks` still hold the canary the pool started with.
  void Untouched(const std::vector<int64_t>& blocks) {
    const KvLayout& l = pool_->layout();
    for (int64_t b : blocks) {
      if (b < 0 || b >= l.num_blocks) return Out(absl::StrCat("UNTOUCHED_BAD ", b, " (no such block)"));
      if (!BlockIsCanary(b)) return Out(absl::StrCat("UNTOUCHED_BAD ", b));
    }
    Out("UNTOUCHED_OK");
  }

  // CHANGED: every block that does not hold the canary any more.
  void Changed() {
    std::vector<int64_t> changed;
    for (int64_t b = 0; b < pool_->layout().num_blocks; ++b) {
      if (!BlockIsCanary(b)) changed.push_back(b);
    }
    Out(absl::StrCat("CHANGED ", changed.empty() ? "-" : absl::StrJoin(changed, ",")));
  }

 private:
  // Runs on the transport's thread.
  void OnNotification(const Notification& n) {
    {
      absl::MutexLock lock(&mu_);
      if (hold_) {
        const std::vector<std::string> f = absl::StrSplit(n.message, absl::MaxSplits(' ', 4));
        Out(absl::StrCat("HELD ", f.size() > 3 ? f[1] + " " + f[3] : "?"));
        auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_; };
        mu_.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(60));
      }
    }
    std::vector<std::string> f = absl::StrSplit(n.message, ' ');
    uint64_t seed = 0;
    int64_t last = 0;
    std::vector<BlockPair> pairs;
    if (f.size() != 5 || (f[0] != "PART" && f[0] != "DONE") || !absl::SimpleAtoi(f[2], &seed) ||
        !absl::SimpleAtoi(f[3], &last) || !ParsePairs(f[4], &pairs)) {
      Out(absl::StrCat("NOTE ? ? ? BAD malformed notification from ", n.peer, ": ",
                       OneLine(n.message.substr(0, 200))));
      return;
    }
    const std::string& kind = f[0];
    const std::string& req = f[1];
    std::string bad = Verify(seed, last, pairs);
    absl::MutexLock lock(&mu_);
    auto [it, first] = last_layer_.try_emplace(req, -1);
    if (done_.contains(req)) {
      bad = absl::StrCat("a notification after DONE. ", bad);
    } else if (last <= it->second) {
      bad = absl::StrCat("out of order: layers up to ", last, " after up to ", it->second, ". ",
                         bad);
    }
    it->second = last;
    if (kind == "DONE") done_[req] = bad;
    Out(absl::StrCat("NOTE ", kind, " ", req, " ", last, bad.empty() ? " OK" : " BAD " + bad));
  }

  // "" when layers [0, last] of every pair hold the writer's bytes.
  std::string Verify(uint64_t seed, int64_t last, const std::vector<BlockPair>& pairs) {
    const KvLayout& l = pool_->layout();
    if (last < 0 || last >= l.num_layers) return absl::StrCat("layer ", last, " out of range");
    std::vector<float> expected(static_cast<size_t>(l.layer_stride()));
    for (const BlockPair& p : pairs) {
      if (p.dst < 0 || p.dst >= l.num_blocks) return absl::StrCat("block ", p.dst, " out of range");
      for (int64_t layer = 0; layer <= last; ++layer) {
        for (int64_t i = 0; i < l.layer_stride(); ++i) {
          expected[static_cast<size_t>(i)] = Value(seed, p.src, layer * l.layer_stride() + i);
        }
        if (std::memcmp(pool_->KeyBlock(p.dst, layer), expected.data(),
                        expected.size() * sizeof(float)) != 0) {
          return absl::StrCat("block ", p.src, "->", p.dst, " layer ", layer,
                              " is not in place when layers 0..", last, " were announced");
        }
      }
    }
    return "";
  }

  bool BlockIsCanary(int64_t b) const {
    const auto* data = reinterpret_cast<const unsigned char*>(pool_->KeyBlock<std::byte>(b, 0));
    const int64_t n = pool_->layout().block_stride_bytes();
    for (int64_t i = 0; i < n; ++i) {
      if (data[i] != canary_) return false;
    }
    return true;
  }

  KvTransport* const transport_;
  KvStorage* const pool_;
  const unsigned char canary_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> last_layer_ ABSL_GUARDED_BY(mu_);
  // Requests whose DONE arrived: "" when it checked out, else what was wrong.
  absl::flat_hash_map<std::string, std::string> done_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
};

int RunOwner(KvTransport* transport, KvStorage* pool, unsigned char canary) {
  Owner owner(transport, pool, canary);
  owner.Start();
  absl::StatusOr<PoolDescriptor> descriptor = transport->RegisterPool(pool);
  if (!descriptor.ok()) {
    Out(absl::StrCat("FATAL ", StatusLine(descriptor.status())));
    return 1;
  }
  v1::KvPoolDescriptor proto;
  ToProto(*descriptor, &proto);
  Out(absl::StrCat("DESCRIPTOR ", absl::BytesToHexString(proto.SerializeAsString())));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t ms = 0;
    if (f.size() == 3 && f[0] == "WAIT_DONE" && absl::SimpleAtoi(f[2], &ms)) {
      owner.WaitDone(f[1], absl::Milliseconds(ms));
    } else if (f.size() == 2 && f[0] == "UNTOUCHED") {
      std::vector<int64_t> blocks;
      bool ok = true;
      if (f[1] != "-") {
        for (absl::string_view b : absl::StrSplit(f[1], ',')) {
          ok = ok && absl::SimpleAtoi(b, &blocks.emplace_back());
        }
      }
      if (ok) {
        owner.Untouched(blocks);
      } else {
        Out(absl::StrCat("ERROR bad command: ", line));
      }
    } else if (f.size() == 1 && f[0] == "CHANGED") {
      owner.Changed();
    } else if (f.size() == 1 && (f[0] == "HOLD" || f[0] == "RELEASE")) {
      owner.Hold(f[0] == "HOLD");
    } else if (f.size() == 1 && f[0] == "PING") {
      Out("PONG");
    } else if (f.size() == 1 && f[0] == "QUIT") {
      break;
    } else {
      Out(absl::StrCat("ERROR bad command: ", line));
    }
  }
  owner.Hold(false);
  owner.Stop();  // no notification reaches `owner` once it is gone
  Out("BYE");
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Writer.
// ---------------------------------------------------------------------------------------------

// The operations of one TRANSFER.
struct Transfer {
  absl::Mutex mu;
  int outstanding ABSL_GUARDED_BY(mu) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mu);

  void Failed(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  DoneCallback Callback(std::shared_ptr<Transfer> self) {
    absl::MutexLock lock(&mu);
    ++outstanding;
    return [self = std::move(self)](absl::Status s) {
      absl::MutexLock lock(&self->mu);
      self->Failed(s);
      --self->outstanding;
    };
  }
  // A call that could not start never runs its callback.
  void NotStarted(const absl::Status& s) {
    absl::MutexLock lock(&mu);
    --outstanding;
    Failed(s);
  }
};

struct TransferArgs {
  std::shared_ptr<Connection> conn;
  std::string req;
  absl::Duration op_timeout;
  int64_t layers_per_step = 1;
  absl::Duration pace;
  std::vector<BlockPair> pairs;
  std::string pairs_text;
};

void RunTransfer(const TransferArgs& a, uint64_t seed, int64_t num_layers) {
  const absl::Time start = absl::Now();
  auto t = std::make_shared<Transfer>();
  absl::Time last_deadline = start;
  auto failed = [&] {
    absl::MutexLock lock(&t->mu);
    return !t->first_error.ok();
  };
  for (int64_t first = 0; first < num_layers && !failed(); first += a.layers_per_step) {
    const int64_t n = std::min(a.layers_per_step, num_layers - first);
    last_deadline = absl::Now() + a.op_timeout;
    const WriteOp op{.blocks = a.pairs, .first_layer = static_cast<int32_t>(first),
                     .num_layers = static_cast<int32_t>(n)};
    if (absl::Status s = a.conn->Write(op, last_deadline, t->Callback(t)); !s.ok()) {
      t->NotStarted(s);
      break;
    }
    const bool final_step = first + n == num_layers;
    const std::string message = absl::StrCat(final_step ? "DONE " : "PART ", a.req, " ", seed, " ",
                                             first + n - 1, " ", a.pairs_text);
    last_deadline = absl::Now() + a.op_timeout;
    if (absl::Status s = a.conn->Notify(message, last_deadline, t->Callback(t)); !s.ok()) {
      t->NotStarted(s);
      break;
    }
    if (!final_step && a.pace > absl::ZeroDuration()) absl::SleepFor(a.pace);
  }
  absl::MutexLock lock(&t->mu);
  // Every operation ends by its deadline; waiting 10 s longer only keeps a bug from hanging here.
  const bool ended = t->mu.AwaitWithTimeout(
      absl::Condition(+[](int* n) { return *n == 0; }, &t->outstanding),
      last_deadline - absl::Now() + absl::Seconds(10));
  const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - start);
  if (!ended) {
    Out(absl::StrCat("TRANSFER_HUNG ", a.req, " ", t->outstanding, " operations never ended"));
  } else if (t->first_error.ok()) {
    Out(absl::StrCat("TRANSFER_OK ", a.req, " ", ms));
  } else {
    Out(absl::StrCat("TRANSFER_ERROR ", a.req, " ", ms, " ", StatusLine(t->first_error)));
  }
}

int RunWriter(KvTransport* transport, KvStorage* pool, uint64_t seed) {
  const KvLayout& l = pool->layout();
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    float* block = pool->KeyBlock(b, 0);
    for (int64_t i = 0; i < l.block_stride(); ++i) block[i] = Value(seed, b, i);
  }
  if (absl::StatusOr<PoolDescriptor> d = transport->RegisterPool(pool); !d.ok()) {
    Out(absl::StrCat("FATAL ", StatusLine(d.status())));
    return 1;
  }
  Out("READY");
  std::map<std::string, std::shared_ptr<Connection>> conns;
  std::vector<std::thread> transfers;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    const std::string cmd = f.empty() ? "" : f[0];
    if (cmd == "CONNECT" && f.size() == 4) {
      const absl::Time start = absl::Now();
      int64_t ms = 0;
      std::string bytes;
      v1::KvPoolDescriptor proto;
      if (!absl::SimpleAtoi(f[3], &ms) || !HexToBytes(f[2], &bytes) ||
          !proto.ParseFromString(bytes)) {
        Out(absl::StrCat("ERROR bad command: ", line.substr(0, 200)));
        continue;
      }
      absl::StatusOr<std::shared_ptr<Connection>> conn = [&]() {
        absl::StatusOr<PoolDescriptor> d = FromProto(proto);
        if (!d.ok()) return absl::StatusOr<std::shared_ptr<Connection>>(d.status());
        return transport->Connect(*d, start + absl::Milliseconds(ms));
      }();
      if (conn.ok()) {
        conns[f[1]] = *conn;
        Out(absl::StrCat("CONNECTED ", f[1], " ", OneLine((*conn)->Describe())));
      } else {
        Out(absl::StrCat("CONNECT_ERROR ", f[1], " ",
                         absl::ToInt64Milliseconds(absl::Now() - start), " ",
                         StatusLine(conn.status())));
      }
    } else if (cmd == "TRANSFER" && f.size() == 7) {
      TransferArgs a;
      int64_t timeout_ms = 0, pace_ms = 0;
      auto it = conns.find(f[1]);
      if (it == conns.end() || !absl::SimpleAtoi(f[3], &timeout_ms) ||
          !absl::SimpleAtoi(f[4], &a.layers_per_step) || a.layers_per_step <= 0 ||
          !absl::SimpleAtoi(f[5], &pace_ms) || !ParsePairs(f[6], &a.pairs)) {
        Out(absl::StrCat("ERROR bad command: ", line));
        continue;
      }
      a.conn = it->second;
      a.req = f[2];
      a.op_timeout = absl::Milliseconds(timeout_ms);
      a.pace = absl::Milliseconds(pace_ms);
      a.pairs_text = f[6];
      transfers.emplace_back([a, seed, layers = l.num_layers] { RunTransfer(a, seed, layers); });
    } else if (cmd == "DROP" && f.size() == 2) {
      conns.erase(f[1]);
      Out(absl::StrCat("DROPPED ", f[1]));
    } else if (cmd == "PING") {
      Out("PONG");
    } else if (cmd == "QUIT") {
      break;
    } else {
      Out(absl::StrCat("ERROR bad command: ", line.substr(0, 200)));
    }
  }
  for (std::thread& t : transfers) t.join();
  conns.clear();
  Out("BYE");
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: kv_peer --role=owner|writer --name=NAME [--tls=...] [--layers=N] "
                 "[--block_size=N] [--blocks=N] [--kv_heads=N] [--head_dim=N] [--seed=N] "
                 "[--canary=0..255]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<KvStorage>> pool = KvStorage::Create(o.layout);
  if (!pool.ok()) {
    Out(absl::StrCat("FATAL ", StatusLine(pool.status())));
    return 1;
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> transport =
      CreateUcxTransport({.name = o.name, .transports = o.tls});
  if (!transport.ok()) {
    Out(absl::StrCat("FATAL ", StatusLine(transport.status())));
    return 1;
  }
  const int rc = o.role == "owner" ? RunOwner(transport->get(), pool->get(),
                                              static_cast<unsigned char>(o.canary))
                                   : RunWriter(transport->get(), pool->get(), o.seed);
  transport->reset();  // before the pool it registered
  return rc;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) { return tandem::kvtransfer::Main(argc, argv); }
