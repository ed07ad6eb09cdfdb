// kv_transfer_bench: how fast the UCX KvTransport moves a prompt's KV blocks between two processes
// on one host, next to ucx_perftest on the same UCX transports and message size.
//
//   build/release/bin/kv_transfer_bench [--tls=posix,self;tcp,self] [--sizes_mb=1,4,16,64]
//                                       [--repetitions=5] [--compute_us_per_layer=0 (auto)]
//                                       [--compute=sleep,spin] [--overlap_mb=16]
//                                       [--ucx_perftest=/usr/bin/ucx_perftest|none]
// Figures, the machine and what is below target: docs/performance.md.
//
// Two processes, like a prefill worker and a decode worker: this program (the writer) starts a
// copy of itself with --role=owner, which registers a KV pool and hands its descriptor back over a
// pipe (tandem.v1.KvPoolDescriptor, serialized). The pools have the default model's KV shape
// (SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, 16-token blocks; docs/kv_layout.md) in
// --kv_dtype (f16, the workers' default: one block's slice of one layer is 12 KiB and one block
// 360 KiB; f32: 24 and 720 KiB). A transfer of S bytes is round(S / block) blocks, written as a
// prefill worker writes them: one Write per layer covering every block (num_layers = 1, i.e. one
// slice-sized put per block), then one Notify.
//
// Columns, per UCX transport list (--tls; each with its own owner process, which has exited
// before ucx_perftest runs):
//   Tandem        after a few transfers of the largest size (a new connection is slower) and one
//                 warm-up transfer per size, --repetitions transfers; bytes / latency, where
//                 latency is the first Write issued -> the Notify acknowledged by the owner.
//                 Destination blocks are a random choice in a pool twice as large. After the
//                 timed ones, one transfer of fresh data is checked byte for byte (a hash
//                 computed by the owner over its destination blocks).
//   ucx_perftest  `ucx_perftest -t ucp_put_bw -s <slice> -n <puts> -w <puts>` (server and client on
//                 loopback, UCX_TLS = the same transports): the same message size as our puts and
//                 as many of them as the transfer issues. Its "overall" bandwidth, --repetitions
//                 runs; ratio = Tandem / ucx_perftest (medians). Target: >= 80% from 4 MiB up.
//                 ucx_perftest puts the same slice-sized buffer again and again (cache-resident) into
//                 memory UCX allocated itself; hence the next two columns.
//   perftest 1 put  ucx_perftest with one message of the whole transfer size (-n 2 -w 1): the
//                 same tool and transports with as many bytes in flight as the transfer touches.
//   memcpy        the same slices copied layer by layer by one thread of one process between
//                 pools of the same sizes: what a CPU-driven copy of this pattern can reach here.
//   overlap       --overlap_mb, layer by layer behind a simulated forward pass: the writer
//                 "computes" layer l (--compute: sleep, or spin on this thread), issues layer l's
//                 Write without waiting, and goes on with layer l + 1; the Notify follows the last
//                 layer. Per repetition: compute alone (C), transfer alone (X) and both (T), from
//                 the first layer's compute to the acknowledgement. Hidden = (C + X - T) / X: 1.0
//                 is a transfer entirely behind compute; at most 1 - 1/layers when compute per
//                 layer >= transfer per layer, since the last layer's write follows its compute.
//                 --compute_us_per_layer=0 picks the transfer time per layer of --overlap_mb.
// Every wait has a deadline (--timeout_s); a child that fails or hangs is an error, and child
// processes are killed when this program ends.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/kv/kv_storage.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "tandem/v1/worker.pb.h"

ABSL_FLAG(std::string, role, "writer", "writer (the benchmark) or owner (started by the writer)");
ABSL_FLAG(std::string, tls, "posix,self;tcp,self",
          "UCX transport lists to measure, ';'-separated; each as UCX_TLS takes it");
ABSL_FLAG(std::string, sizes_mb, "1,4,16,64", "Transfer sizes in MiB (rounded to whole blocks)");
ABSL_FLAG(int32_t, repetitions, 5, "Timed runs per row; the table shows medians");
ABSL_FLAG(int64_t, compute_us_per_layer, 0,
          "Simulated compute per layer in the overlap rows; 0: the measured transfer time per "
          "layer of --overlap_mb");
ABSL_FLAG(std::string, compute, "sleep,spin",
          "How the overlap rows compute: sleep (the CPU is free, as with a GPU forward pass), "
          "spin (this thread busy, as with a CPU forward pass); comma-separated");
ABSL_FLAG(int32_t, overlap_mb, 16, "Transfer size of the overlap rows in MiB; 0: no overlap rows");
ABSL_FLAG(std::string, ucx_perftest, "/usr/bin/ucx_perftest",
          "ucx_perftest binary (package ucx-utils); none: no peer figures");
ABSL_FLAG(int32_t, timeout_s, 60, "Deadline of every wait (a transfer, a child process)");
ABSL_FLAG(int64_t, pool_blocks, 0, "owner role: blocks in the owner's pool");
ABSL_FLAG(std::string, kv_dtype, "f16",
          "KV element type of both pools: f16 (the workers' default; 12 KiB slices) or f32");
ABSL_FLAG(bool, verbose, false, "Log at INFO (the transport's connection messages)");

namespace tandem {
namespace {

using kvtransfer::BlockPair;
using kvtransfer::Connection;
using kvtransfer::DoneCallback;
using kvtransfer::KvTransport;
using kvtransfer::PoolDescriptor;
using kvtransfer::WriteOp;

// The default model's KV shape (SmolLM2-135M; docs/kv_layout.md).
constexpr int64_t kLayers = 30;
constexpr int64_t kKvHeads = 3;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kMiB = 1 << 20;
constexpr double kTargetRatio = 0.80;
constexpr int64_t kTargetFromBytes = 4 * kMiB;
// How long past an operation's deadline the benchmark waits for the transport to end it.
constexpr absl::Duration kTransportGrace = absl::Seconds(2);
// ucx_perftest's iterations when one put carries the whole transfer (after one warm-up put).
constexpr int64_t kWholeIterations = 2;

// --kv_dtype, checked in main(); parsed once (SliceBytes() is asked inside timed loops).
DType KvDTypeFlag() {
  static const DType dtype =
      ParseKvDType(absl::GetFlag(FLAGS_kv_dtype)).value_or(DType::kF16);
  return dtype;
}

KvLayout ModelLayout(int64_t num_blocks) {
  return KvLayout{.num_blocks = num_blocks,
                  .num_layers = kLayers,
                  .block_size = kBlockSize,
                  .num_kv_heads = kKvHeads,
                  .head_dim = kHeadDim,
                  .dtype = KvDTypeFlag()};
}

// Bytes of one block's slice of one layer (K then V): the unit of a layer-by-layer write.
int64_t SliceBytes() { return ModelLayout(1).block_bytes(); }
int64_t BlockBytes() { return SliceBytes() * kLayers; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "median [min..max]" with `digits` decimals.
std::string Cell(const std::vector<double>& v, int digits = 0) {
  if (v.empty()) return "-";
  return absl::StrFormat("%.*f [%.*f..%.*f]", digits, Median(v), digits,
                         *std::min_element(v.begin(), v.end()), digits,
                         *std::max_element(v.begin(), v.end()));
}

// A checksum of byte runs, in order (both sides hash the same slices in the same order).
class RunHash {
 public:
  void Add(const char* data, size_t length) {
    size_t i = 0;
    for (; i + 8 <= length; i += 8) {
      uint64_t w;
      std::memcpy(&w, data + i, 8);
      Mix(w);
    }
    for (; i < length; ++i) Mix(static_cast<unsigned char>(data[i]));
  }
  uint64_t value() const { return h_; }

 private:
  void Mix(uint64_t w) {
    h_ ^= w;
    h_ *= 0x9E3779B97F4A7C15ull;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0x243F6A8885A308D3ull;
};

// Hash of layers [0, layers) of `blocks` of `pool`, layer-major (the order a transfer writes).
uint64_t HashSlices(const KvStorage& pool, const std::vector<int32_t>& blocks, int64_t layers) {
  RunHash hash;
  const KvLayout& l = pool.layout();
  const char* base = reinterpret_cast<const char*>(pool.data<std::byte>());
  const size_t slice = static_cast<size_t>(l.block_bytes());
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (int32_t b : blocks) {
      const int64_t offset = (b * l.block_stride() + layer * l.layer_stride()) * l.element_bytes();
      hash.Add(base + offset, slice);
    }
  }
  return hash.value();
}

// ---------------------------------------------------------------------------------------------
// Child processes.
// ---------------------------------------------------------------------------------------------

// A child process whose stdout (and stderr, unless `capture_stderr` is off) comes back on one pipe
// and whose stdin is a pipe from here. Killed (SIGKILL) and reaped when
// destroyed, unless it was reaped already; it also dies with this process (PR_SET_PDEATHSIG).
class Child {
 public:
  struct Options {
    std::vector<std::string> argv;  // argv[0] is the program (a path)
    std::vector<std::pair<std::string, std::string>> env;  // set on top of this environment
    bool capture_stderr = true;  // stderr into the pipe too; else this process's stderr
    std::string name;            // in error messages
  };

  static absl::StatusOr<std::unique_ptr<Child>> Start(const Options& options) {
    // Everything execve needs is built before fork: after it, only async-signal-safe calls.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const absl::string_view entry(*e);
      bool overridden = false;
      for (const auto& [name, value] : options.env) {
        overridden |= absl::StartsWith(entry, absl::StrCat(name, "="));
      }
      if (!overridden) env_strings.emplace_back(entry);
    }
    for (const auto& [name, value] : options.env) env_strings.push_back(absl::StrCat(name, "=", value));
    std::vector<char*> argv, envp;
    for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    int out[2] = {-1, -1}, in[2] = {-1, -1};
    const auto close_pipes = [&] {
      for (int fd : {out[0], out[1], in[0], in[1]}) {
        if (fd >= 0) close(fd);
      }
    };
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) {
      const int error = errno;
      close_pipes();
      return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(error)));
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      const int error = errno;
      close_pipes();
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(error)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      if (options.capture_stderr) dup2(out[1], STDERR_FILENO);
      execve(argv[0], argv.data(), envp.data());
      const char msg[] = "kv_transfer_bench: execve failed\n";
      (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
      _exit(127);
    }
    close(out[1]);
    close(in[0]);
    auto child = std::unique_ptr<Child>(new Child(pid, out[0], in[1]));
    child->name_ = options.name;
    return child;
  }

  ~Child() {
    if (!status_.has_value()) {
      kill(pid_, SIGKILL);
      int status;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (in_fd_ >= 0) close(in_fd_);
  }

  // One line of the child's output, without its '\n'. DEADLINE_EXCEEDED at `deadline`;
  // UNAVAILABLE when the child closed its output (exited) first, with what it printed.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline) {
    while (true) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      ASSIGN_OR_RETURN(const bool more, ReadSome(deadline));
      if (!more) {
        return absl::UnavailableError(absl::StrCat(name_, " ended (", ExitText(absl::Now() + absl::Seconds(5)),
                                                   ") after printing: ", Tail(buffer_)));
      }
    }
  }

  // Everything the child prints until it closes its output; DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<std::string> ReadAll(absl::Time deadline) {
    while (true) {
      ASSIGN_OR_RETURN(const bool more, ReadSome(deadline));
      if (!more) return std::exchange(buffer_, "");
    }
  }

  // Closes the child's stdin (an owner's signal to exit).
  void CloseStdin() {
    if (in_fd_ >= 0) close(in_fd_);
    in_fd_ = -1;
  }

  // The child's wait status once it exited; DEADLINE_EXCEEDED (after killing it) at `deadline`.
  absl::StatusOr<int> Wait(absl::Time deadline) {
    while (!status_.has_value()) {
      int status;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        status_ = status;
        break;
      }
      if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        status_ = status;
        return absl::DeadlineExceededError(absl::StrCat(name_, " did not exit in time; killed"));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return *status_;
  }

  // Whether the child is still running (reaps it when it exited).
  bool Running() {
    if (status_.has_value()) return false;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      status_ = status;
      return false;
    }
    return true;
  }

  // "exit status N" / "killed by signal N", waiting for the exit until `deadline`.
  std::string ExitText(absl::Time deadline) {
    absl::StatusOr<int> status = Wait(deadline);
    if (!status.ok()) return std::string(status.status().message());
    if (WIFEXITED(*status)) return absl::StrCat("exit status ", WEXITSTATUS(*status));
    if (WIFSIGNALED(*status)) return absl::StrCat("killed by signal ", WTERMSIG(*status));
    return absl::StrCat("wait status ", *status);
  }

  static std::string Tail(absl::string_view text) {
    constexpr size_t kMax = 2000;
    return std::string(text.size() > kMax ? text.substr(text.size() - kMax) : text);
  }

 private:
  Child(pid_t pid, int out_fd, int in_fd) : pid_(pid), out_fd_(out_fd), in_fd_(in_fd) {}

  // Appends what is readable to buffer_; false at end of output.
  absl::StatusOr<bool> ReadSome(absl::Time deadline) {
    while (true) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms < 0) {
        return absl::DeadlineExceededError(
            absl::StrCat(name_, " printed nothing more in time; so far: ", Tail(buffer_)));
      }
      pollfd fd{out_fd_, POLLIN, 0};
      const int r = poll(&fd, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1000)));
      if (r < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
      if (r <= 0) continue;
      char buf[65536];
      const ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return false;
      buffer_.append(buf, static_cast<size_t>(n));
      return true;
    }
  }

  const pid_t pid_;
  int out_fd_;
  int in_fd_;
  std::string name_;
  std::string buffer_;
  std::optional<int> status_;
};

// ---------------------------------------------------------------------------------------------
// The owner: a decode worker's side. Prints "descriptor <hex of KvPoolDescriptor>" on its stdout
// pipe, then for every notification "verify <layers> <b0,b1,...>" the line "hash <hex>" of those
// blocks; exits when its stdin closes.
// ---------------------------------------------------------------------------------------------

// The pipe to the writer: the owner's original stdout. UCX logs to stdout, so RunOwner points
// stdout at stderr and keeps the pipe for these lines only.
int protocol_fd = STDOUT_FILENO;

void WriteLine(const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(protocol_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the writer is gone; stdin's EOF ends this process
    done += static_cast<size_t>(n);
  }
}

absl::Status RunOwner() {
  const int64_t blocks = absl::GetFlag(FLAGS_pool_blocks);
  if (blocks <= 0) return absl::InvalidArgumentError("--pool_blocks must be > 0 for --role=owner");
  protocol_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (protocol_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    return absl::InternalError(absl::StrCat("redirecting stdout: ", std::strerror(errno)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> transport,
                   kvtransfer::CreateUcxTransport(
                       {.name = "owner", .transports = absl::GetFlag(FLAGS_tls)}));
  // As a decode worker does: the pool lives in memory the transport allocated (shared memory
  // that the writer maps, so a put is one copy).
  ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> pool,
                   KvStorage::Create(ModelLayout(blocks), transport->PoolAllocator()));
  ASSIGN_OR_RETURN(const PoolDescriptor descriptor, transport->RegisterPool(pool.get()));
  KvStorage* storage = pool.get();
  // On the transport's thread, after the data announced (notifications follow their writes).
  transport->SetNotificationHandler([storage](kvtransfer::Notification n) {
    std::vector<std::string> parts = absl::StrSplit(n.message, ' ');
    if (parts.size() != 3 || parts[0] != "verify") return;
    int64_t layers = 0;
    std::vector<int32_t> blocks;
    bool ok = absl::SimpleAtoi(parts[1], &layers);
    for (absl::string_view b : absl::StrSplit(parts[2], ',')) {
      int32_t id = 0;
      ok = ok && absl::SimpleAtoi(b, &id) && id >= 0 && id < storage->layout().num_blocks;
      blocks.push_back(id);
    }
    if (!ok || layers <= 0 || layers > storage->layout().num_layers) {
      WriteLine("error malformed verify message");
      return;
    }
    WriteLine(absl::StrCat("hash ", absl::Hex(HashSlices(*storage, blocks, layers))));
  });
  v1::KvPoolDescriptor proto;
  kvtransfer::ToProto(descriptor, &proto);
  WriteLine(absl::StrCat("descriptor ", absl::BytesToHexString(proto.SerializeAsString())));
  char buf[256];
  while (true) {
    const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  // The pool first (its memory may be the transport's), then the transport.
  pool.reset();
  transport.reset();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The writer: a prefill worker's side.
// ---------------------------------------------------------------------------------------------

// Counts a group of operations to their end. The callbacks share ownership, so a wait that timed
// out leaves them something valid to touch.
class Completions : public std::enable_shared_from_this<Completions> {
 public:
  DoneCallback Add() {
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    return [self = shared_from_this()](absl::Status s) {
      absl::MutexLock lock(&self->mu_);
      --self->pending_;
      if (!s.ok() && self->error_.ok()) self->error_ = std::move(s);
    };
  }
  // Forgets the last Add() (its operation failed to start and never runs the callback).
  void Abandon() {
    absl::MutexLock lock(&mu_);
    --pending_;
  }
  // OK when every operation ended OK; the first error otherwise; DEADLINE_EXCEEDED at `deadline`.
  absl::Status Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat(pending_, " transport operations had not ended ",
                       absl::FormatDuration(kTransportGrace), " after their deadline"));
    }
    return error_;
  }

 private:
  absl::Mutex mu_;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Simulated compute of one layer.
enum class ComputeMode { kSleep, kSpin };
void Compute(ComputeMode mode, int64_t us) {
  if (us <= 0) return;
  if (mode == ComputeMode::kSleep) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return;
  }
  const Clock::time_point end = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < end) {
  }
}

struct TransferPlan {
  std::vector<BlockPair> blocks;  // one put per pair per layer
  std::string message;            // the notification
};

struct TransferOptions {
  absl::Duration timeout;
  // Runs before each layer's Write (the simulated forward pass of that layer); none: back to back.
  std::function<void(int64_t)> before_layer;
};

// Writes every layer of `plan` (one Write per layer, not waiting for any), then the Notify;
// returns the seconds from the first Write (or the first `before_layer`) to the acknowledgement.
absl::StatusOr<double> Transfer(Connection& conn, const TransferPlan& plan,
                                const TransferOptions& options) {
  auto writes = std::make_shared<Completions>();
  auto notify = std::make_shared<Completions>();
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Status issued;
  const Clock::time_point start = Clock::now();
  for (int64_t layer = 0; layer < kLayers && issued.ok(); ++layer) {
    if (options.before_layer) options.before_layer(layer);
    issued = conn.Write(WriteOp{.blocks = plan.blocks,
                                .first_layer = static_cast<int32_t>(layer),
                                .num_layers = 1},
                        deadline, writes->Add());
  }
  if (!issued.ok()) writes->Abandon();
  if (issued.ok()) {
    issued = conn.Notify(plan.message, deadline, notify->Add());
    if (!issued.ok()) notify->Abandon();
  }
  // The transport ends every operation by its deadline; a little later, this gives up on it.
  const absl::Time give_up = deadline + kTransportGrace;
  if (!issued.ok()) {
    // What did start still ends (by its deadline at the latest); the connection is unusable.
    (void)writes->Wait(give_up);
    return Annotate(issued, "starting a transfer");
  }
  const absl::Status acked = notify->Wait(give_up);
  const double seconds = SecondsSince(start);
  const absl::Status written = writes->Wait(give_up);
  if (!written.ok()) return Annotate(written, "writes");
  if (!acked.ok()) return Annotate(acked, "notification");
  return seconds;
}

// The owner process and the writer's end of a connection to it.
struct Link {
  std::unique_ptr<Child> owner;
  std::unique_ptr<KvStorage> pool;  // the writer's
  std::unique_ptr<KvTransport> transport;
  std::shared_ptr<Connection> conn;
  int64_t owner_blocks = 0;

  ~Link() {
    conn.reset();
    transport.reset();
    if (owner != nullptr) {
      owner->CloseStdin();
      absl::StatusOr<int> status = owner->Wait(absl::Now() + absl::Seconds(10));
      if (!status.ok()) LOG(WARNING) << "owner process: " << status.status();
    }
  }
};

absl::StatusOr<std::unique_ptr<Link>> StartLink(const std::string& tls, int64_t writer_blocks,
                                                absl::Duration timeout) {
  auto link = std::make_unique<Link>();
  link->owner_blocks = 2 * writer_blocks;
  ASSIGN_OR_RETURN(link->owner,
                   Child::Start({.argv = {"/proc/self/exe", "--role=owner",
                                          absl::StrCat("--tls=", tls),
                                          absl::StrCat("--pool_blocks=", link->owner_blocks),
                                          absl::StrCat("--kv_dtype=", absl::GetFlag(FLAGS_kv_dtype)),
                                          absl::StrCat("--verbose=", absl::GetFlag(FLAGS_verbose))},
                                 .env = {},
                                 .capture_stderr = false,
                                 .name = "the owner process"}));
  ASSIGN_OR_RETURN(const std::string line, link->owner->ReadLine(absl::Now() + timeout));
  absl::string_view hex = line;
  if (!absl::ConsumePrefix(&hex, "descriptor ")) {
    return absl::InternalError(absl::StrCat("the owner printed '", Child::Tail(line),
                                            "' instead of its descriptor"));
  }
  v1::KvPoolDescriptor proto;
  if (!proto.ParseFromString(absl::HexStringToBytes(hex))) {
    return absl::InternalError("the owner's descriptor does not parse");
  }
  ASSIGN_OR_RETURN(const PoolDescriptor descriptor, kvtransfer::FromProto(proto));

  ASSIGN_OR_RETURN(link->pool, KvStorage::Create(ModelLayout(writer_blocks)));
  ASSIGN_OR_RETURN(link->transport,
                   kvtransfer::CreateUcxTransport({.name = "writer", .transports = tls}));
  RETURN_IF_ERROR(link->transport->RegisterPool(link->pool.get()).status());
  ASSIGN_OR_RETURN(link->conn, link->transport->Connect(descriptor, absl::Now() + timeout));
  return link;
}

// Fills the writer's blocks [0, n) with pseudo-random bytes derived from `seed`.
void FillBlocks(KvStorage& pool, int64_t n, uint64_t seed) {
  const int64_t words = n * BlockBytes() / 8;
  auto* p = reinterpret_cast<uint64_t*>(pool.data<std::byte>());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < words; ++i) {
    // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    p[i] = z ^ (z >> 31);
  }
}

// `n` blocks: writer blocks 0..n-1 onto a random choice of the owner's blocks.
TransferPlan MakePlan(int64_t n, int64_t owner_blocks, std::mt19937& rng, std::string message) {
  std::vector<int32_t> dst(static_cast<size_t>(owner_blocks));
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  TransferPlan plan;
  for (int64_t i = 0; i < n; ++i) {
    plan.blocks.push_back({.src = static_cast<int32_t>(i), .dst = dst[static_cast<size_t>(i)]});
  }
  plan.message = std::move(message);
  return plan;
}

// The ceiling of a CPU-driven copy of `plan`: the same slices, layer by layer, memcpy'd by this
// thread from `src` into `dst` (a pool as large as the owner's). Seconds.
double LocalCopySeconds(const KvStorage& src, KvStorage& dst, const TransferPlan& plan) {
  const KvLayout& l = src.layout();
  const int64_t f = l.element_bytes();
  const char* from = reinterpret_cast<const char*>(src.data<std::byte>());
  char* to = reinterpret_cast<char*>(dst.data<std::byte>());
  const size_t slice = static_cast<size_t>(l.block_bytes());
  const Clock::time_point start = Clock::now();
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (const BlockPair& b : plan.blocks) {
      std::memcpy(to + (b.dst * l.block_stride() + layer * l.layer_stride()) * f,
                  from + (b.src * l.block_stride() + layer * l.layer_stride()) * f, slice);
    }
  }
  return SecondsSince(start);
}

// One transfer of fresh data, then the owner's hash of its destination blocks against ours.
absl::Status VerifyTransfer(Link& link, int64_t n, std::mt19937& rng, absl::Duration timeout) {
  FillBlocks(*link.pool, n, rng());
  TransferPlan plan = MakePlan(n, link.owner_blocks, rng, "");
  std::vector<int32_t> src, dst;
  for (const BlockPair& p : plan.blocks) {
    src.push_back(p.src);
    dst.push_back(p.dst);
  }
  plan.message = absl::StrCat("verify ", kLayers, " ", absl::StrJoin(dst, ","));
  const uint64_t expected = HashSlices(*link.pool, src, kLayers);
  RETURN_IF_ERROR(Transfer(*link.conn, plan, {.timeout = timeout, .before_layer = {}}).status());
  ASSIGN_OR_RETURN(const std::string line, link.owner->ReadLine(absl::Now() + timeout));
  const std::string want = absl::StrCat("hash ", absl::Hex(expected));
  if (line != want) {
    return absl::DataLossError(absl::StrCat("the owner's blocks differ from what was written: ",
                                            line, " != ", want));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ucx_perftest, the peer.
// ---------------------------------------------------------------------------------------------

absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("finding a free port: ", std::strerror(errno)));
  return static_cast<int>(ntohs(addr.sin_port));
}

// Whether some socket listens on TCP `port` (from /proc/net/tcp{,6}; connecting to probe would
// take ucx_perftest's one accept).
bool Listening(int port) {
  const std::string want = absl::StrFormat(":%04X", port);
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local_address rem_address st ...; st 0A = LISTEN
      if (f.size() > 3 && absl::EndsWith(f[1], want) && f[3] == "0A") return true;
    }
  }
  return false;
}

// The "overall" bandwidth (MiB/s: ucx_perftest's "MB/s" are 2^20 bytes) of the "Final:" line of
// ucx_perftest's output: `Final: <iters> <lat 50%> <lat avg> <lat overall> <bw avg> <bw overall>
// <msgrate avg> <msgrate overall>`.
absl::StatusOr<double> ParsePerftestBandwidth(const std::string& output) {
  std::optional<absl::string_view> final_line;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(line, "Final:")) final_line = line;
  }
  if (!final_line.has_value()) {
    return absl::InternalError(absl::StrCat("ucx_perftest printed no 'Final:' line: ",
                                            Child::Tail(output)));
  }
  std::vector<double> numbers;
  for (absl::string_view word :
       absl::StrSplit(final_line->substr(6), absl::ByAnyChar(" \t|"), absl::SkipEmpty())) {
    double v;
    if (absl::SimpleAtod(word, &v)) numbers.push_back(v);
  }
  if (numbers.size() < 6 || numbers[5] <= 0) {
    return absl::InternalError(absl::StrCat("cannot read ucx_perftest's bandwidth from '",
                                            *final_line, "'"));
  }
  return numbers[5];
}

// One ucx_perftest ucp_put_bw run on loopback: `iterations` puts of `message_bytes` after
// `warmup` ones. Its overall bandwidth in MiB/s.
absl::StatusOr<double> RunPerftest(const std::string& tool, const std::string& tls,
                                   int64_t message_bytes, int64_t iterations, int64_t warmup,
                                   absl::Duration timeout) {
  ASSIGN_OR_RETURN(const int port, FreePort());
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", tls}};
  ASSIGN_OR_RETURN(auto server, Child::Start({.argv = {tool, "-p", absl::StrCat(port)},
                                              .env = env,
                                              .capture_stderr = true,
                                              .name = "the ucx_perftest server"}));
  const absl::Time deadline = absl::Now() + timeout;
  while (!Listening(port)) {
    if (!server->Running()) {
      absl::StatusOr<std::string> out = server->ReadAll(absl::Now() + absl::Seconds(1));
      return absl::InternalError(absl::StrCat("the ucx_perftest server ended: ",
                                              out.ok() ? Child::Tail(*out) : ""));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("the ucx_perftest server did not listen in time");
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSIGN_OR_RETURN(
      auto client,
      Child::Start({.argv = {tool, "127.0.0.1", "-p", absl::StrCat(port), "-t", "ucp_put_bw", "-s",
                             absl::StrCat(message_bytes), "-n", absl::StrCat(iterations), "-w",
                             absl::StrCat(warmup)},
                    .env = env,
                    .capture_stderr = true,
                    .name = "the ucx_perftest client"}));
  ASSIGN_OR_RETURN(const std::string out, client->ReadAll(deadline));
  ASSIGN_OR_RETURN(const int status, client->Wait(deadline));
  absl::StatusOr<std::string> server_out = server->ReadAll(deadline);
  ASSIGN_OR_RETURN(const int server_status, server->Wait(deadline));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !WIFEXITED(server_status) ||
      WEXITSTATUS(server_status) != 0) {
    return absl::InternalError(absl::StrCat(
        "ucx_perftest failed (client wait status ", status, ", server ", server_status,
        "): ", Child::Tail(out), server_out.ok() ? Child::Tail(*server_out) : ""));
  }
  return ParsePerftestBandwidth(out);
}

// ---------------------------------------------------------------------------------------------
// The benchmark.
// ---------------------------------------------------------------------------------------------

struct Row {
  int64_t blocks = 0;
  std::vector<double> tandem_mib_s;
  std::vector<double> latency_ms;
  std::vector<double> peer_mib_s;
  std::string peer_note;
  std::vector<double> whole_mib_s;   // ucx_perftest, one put of the whole transfer size
  std::vector<double> memcpy_mib_s;  // the same slices copied by one thread of this process
};

struct OverlapRow {
  std::string mode;
  int64_t compute_us = 0;
  std::vector<double> compute_ms, transfer_ms, overlap_ms, hidden;
};

struct TlsResult {
  std::string tls;
  std::string describe;
  std::vector<Row> rows;
  std::vector<OverlapRow> overlap;
};

int64_t BlocksFor(int64_t mib) {
  return std::max<int64_t>(1, (mib * kMiB + BlockBytes() / 2) / BlockBytes());
}

std::string MiBText(int64_t bytes) {
  return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / kMiB);
}

absl::StatusOr<TlsResult> MeasureTls(const std::string& tls, const std::vector<int64_t>& sizes_mb,
                                     int reps, absl::Duration timeout) {
  TlsResult result;
  result.tls = tls;
  const int64_t overlap_mb = absl::GetFlag(FLAGS_overlap_mb);
  int64_t max_blocks = BlocksFor(overlap_mb);
  for (int64_t mb : sizes_mb) max_blocks = std::max(max_blocks, BlocksFor(mb));
  ASSIGN_OR_RETURN(std::unique_ptr<Link> link, StartLink(tls, max_blocks, timeout));
  result.describe = link->conn->Describe();
  std::mt19937 rng(1234);
  FillBlocks(*link->pool, max_blocks, 42);
  ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> local,
                   KvStorage::Create(ModelLayout(link->owner_blocks)));
  int64_t request = 0;
  auto next_message = [&] { return absl::StrCat("request ", request++, ": layers 0..", kLayers - 1); };
  // The first transfers on a new connection are slower (UCX grows its request pools and FIFOs):
  // a few of the largest size first, besides the warm-up transfer of every row.
  for (int i = 0; i < 4; ++i) {
    const TransferPlan plan = MakePlan(max_blocks, link->owner_blocks, rng, next_message());
    RETURN_IF_ERROR(Transfer(*link->conn, plan, {.timeout = timeout, .before_layer = {}}).status());
  }

  for (int64_t mb : sizes_mb) {
    Row row;
    row.blocks = BlocksFor(mb);
    const double bytes = static_cast<double>(row.blocks * BlockBytes());
    for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
      const TransferPlan plan = MakePlan(row.blocks, link->owner_blocks, rng, next_message());
      ASSIGN_OR_RETURN(const double s,
                       Transfer(*link->conn, plan, {.timeout = timeout, .before_layer = {}}));
      if (r < 0) continue;
      row.tandem_mib_s.push_back(bytes / s / kMiB);
      row.latency_ms.push_back(s * 1e3);
    }
    for (int r = -1; r < reps; ++r) {
      const TransferPlan plan = MakePlan(row.blocks, link->owner_blocks, rng, "");
      const double s = LocalCopySeconds(*link->pool, *local, plan);
      if (r >= 0) row.memcpy_mib_s.push_back(bytes / s / kMiB);
    }
    if (absl::Status s = VerifyTransfer(*link, row.blocks, rng, timeout); !s.ok()) {
      return Annotate(s, absl::StrCat(tls, ", ", mb, " MiB"));
    }
    result.rows.push_back(std::move(row));
  }

  if (overlap_mb > 0) {
    const int64_t blocks = BlocksFor(overlap_mb);
    int64_t compute_us = absl::GetFlag(FLAGS_compute_us_per_layer);
    if (compute_us <= 0) {
      std::vector<double> seconds;
      for (int r = 0; r < 3; ++r) {
        const TransferPlan plan = MakePlan(blocks, link->owner_blocks, rng, next_message());
        ASSIGN_OR_RETURN(const double s,
                         Transfer(*link->conn, plan, {.timeout = timeout, .before_layer = {}}));
        seconds.push_back(s);
      }
      compute_us = std::max<int64_t>(1, static_cast<int64_t>(Median(seconds) * 1e6 / kLayers));
    }
    for (absl::string_view mode_name :
         absl::StrSplit(absl::GetFlag(FLAGS_compute), ',', absl::SkipEmpty())) {
      ComputeMode mode;
      if (mode_name == "sleep") {
        mode = ComputeMode::kSleep;
      } else if (mode_name == "spin") {
        mode = ComputeMode::kSpin;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--compute: unknown mode '", mode_name, "'"));
      }
      OverlapRow o;
      o.mode = std::string(mode_name);
      o.compute_us = compute_us;
      const auto compute = [mode, compute_us](int64_t) { Compute(mode, compute_us); };
      for (int r = 0; r < reps; ++r) {
        const Clock::time_point start = Clock::now();
        for (int64_t l = 0; l < kLayers; ++l) compute(l);
        const double c = SecondsSince(start);
        TransferPlan plan = MakePlan(blocks, link->owner_blocks, rng, next_message());
        ASSIGN_OR_RETURN(const double x,
                         Transfer(*link->conn, plan, {.timeout = timeout, .before_layer = {}}));
        plan = MakePlan(blocks, link->owner_blocks, rng, next_message());
        ASSIGN_OR_RETURN(const double t,
                         Transfer(*link->conn, plan, {.timeout = timeout, .before_layer = compute}));
        o.compute_ms.push_back(c * 1e3);
        o.transfer_ms.push_back(x * 1e3);
        o.overlap_ms.push_back(t * 1e3);
        o.hidden.push_back((c + x - t) / x);
      }
      result.overlap.push_back(std::move(o));
    }
  }
  return result;
}

absl::Status Main() {
  const int reps = std::max(1, absl::GetFlag(FLAGS_repetitions));
  const absl::Duration timeout = absl::Seconds(std::max(1, absl::GetFlag(FLAGS_timeout_s)));
  std::vector<int64_t> sizes_mb;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_mb), ',', absl::SkipEmpty())) {
    int64_t mb;
    if (!absl::SimpleAtoi(s, &mb) || mb <= 0 || mb > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("--sizes_mb: bad size '", s, "'"));
    }
    sizes_mb.push_back(mb);
  }
  const std::vector<std::string> tls_list =
      absl::StrSplit(absl::GetFlag(FLAGS_tls), ';', absl::SkipEmpty());
  if (sizes_mb.empty() || tls_list.empty()) {
    return absl::InvalidArgumentError("--sizes_mb and --tls must name something");
  }
  std::string perftest = absl::GetFlag(FLAGS_ucx_perftest);
  if (perftest != "none" && access(perftest.c_str(), X_OK) != 0) {
    LOG(WARNING) << perftest << " is not executable (install ucx-utils); no peer figures";
    perftest = "none";
  }

  std::vector<TlsResult> results;
  for (const std::string& tls : tls_list) {
    ASSIGN_OR_RETURN(TlsResult r, MeasureTls(tls, sizes_mb, reps, timeout));
    // The owner has exited: ucx_perftest gets the CPUs to itself as we had them.
    if (perftest != "none") {
      for (Row& row : r.rows) {
        const int64_t puts = row.blocks * kLayers;
        const int64_t bytes = row.blocks * BlockBytes();
        for (int i = 0; i < reps && row.peer_note.empty(); ++i) {
          absl::StatusOr<double> bw = RunPerftest(perftest, tls, SliceBytes(), puts, puts, timeout);
          absl::StatusOr<double> whole =
              bw.ok() ? RunPerftest(perftest, tls, bytes, kWholeIterations, 1, timeout) : bw;
          if (!bw.ok() || !whole.ok()) {
            const absl::Status& error = bw.ok() ? whole.status() : bw.status();
            row.peer_note = std::string(error.message());
            row.peer_mib_s.clear();
            row.whole_mib_s.clear();
            LOG(WARNING) << "ucx_perftest (" << tls << "): " << error;
            break;
          }
          row.peer_mib_s.push_back(*bw);
          row.whole_mib_s.push_back(*whole);
        }
      }
    }
    results.push_back(std::move(r));
  }

  std::printf("\nkv_transfer_bench: KV shape of SmolLM2-135M (%lld layers, %lld KV heads, "
              "head_dim %lld, %lld-token blocks, %s): %lld KiB per block and layer, %lld KiB "
              "per block\nrepetitions=%d after one warm-up (medians; min..max in brackets); "
              "latency = first Write issued -> Notify acknowledged\npeer: %s\n",
              static_cast<long long>(kLayers), static_cast<long long>(kKvHeads),
              static_cast<long long>(kHeadDim), static_cast<long long>(kBlockSize),
              std::string(DTypeName(KvDTypeFlag())).c_str(),
              static_cast<long long>(SliceBytes() / 1024),
              static_cast<long long>(BlockBytes() / 1024), reps,
              perftest == "none"
                  ? "none"
                  : absl::StrCat(perftest, " -t ucp_put_bw -s ", SliceBytes(),
                                 " -n <puts> -w <puts>, UCX_TLS as the row (MiB/s 'overall')")
                        .c_str());
  std::printf("puts: blocks x layers puts of %lld KiB; perftest 1 put: ucx_perftest with one "
              "message of the transfer's size (-n %lld -w 1); memcpy: the same slices copied by one "
              "thread of one process (a CPU-driven copy's ceiling)\n",
              static_cast<long long>(SliceBytes() / 1024),
              static_cast<long long>(kWholeIterations));
  for (const TlsResult& r : results) {
    std::printf("\nUCX_TLS=%s; connection: %s\n\n", r.tls.c_str(), r.describe.c_str());
    std::printf("| %-9s | %-5s | %-20s | %-19s | %-22s | %-5s | %-6s | %-22s | %-20s | %s\n",
                "size", "puts", "Tandem MiB/s", "latency ms", "ucx_perftest MiB/s", "ratio",
                ">= 80%", "perftest 1 put MiB/s", "memcpy MiB/s", "of memcpy");
    std::printf("|-----------|-------|----------------------|---------------------|"
                "------------------------|-------|--------|------------------------|"
                "----------------------|----------\n");
    for (const Row& row : r.rows) {
      const int64_t bytes = row.blocks * BlockBytes();
      std::string ratio = "-", verdict = "-";
      if (!row.peer_mib_s.empty()) {
        const double q = Median(row.tandem_mib_s) / Median(row.peer_mib_s);
        ratio = absl::StrFormat("%.2f", q);
        if (bytes >= kTargetFromBytes) verdict = q >= kTargetRatio ? "yes" : "MISSED";
      } else if (!row.peer_note.empty()) {
        verdict = "no peer";
      }
      std::printf("| %-9s | %-5s | %-20s | %-19s | %-22s | %-5s | %-6s | %-22s | %-20s | %.2f\n",
                  MiBText(bytes).c_str(), absl::StrCat(row.blocks * kLayers).c_str(),
                  Cell(row.tandem_mib_s).c_str(), Cell(row.latency_ms, 2).c_str(),
                  Cell(row.peer_mib_s).c_str(), ratio.c_str(), verdict.c_str(),
                  Cell(row.whole_mib_s).c_str(), Cell(row.memcpy_mib_s).c_str(),
                  Median(row.tandem_mib_s) / Median(row.memcpy_mib_s));
    }
    for (const Row& row : r.rows) {
      if (!row.peer_note.empty()) {
        std::printf("no ucx_perftest figure for %s: %s\n",
                    MiBText(row.blocks * BlockBytes()).c_str(), row.peer_note.c_str());
      }
    }
    for (const OverlapRow& o : r.overlap) {
      std::printf("\noverlap (%s, compute=%s, %lld us per layer): compute alone %s ms, transfer "
                  "alone %s ms, both %s ms\n  hidden = (C + X - T) / X = %s (1.0: fully hidden; "
                  "at most %.2f, the last layer's write follows its compute)\n",
                  MiBText(BlocksFor(absl::GetFlag(FLAGS_overlap_mb)) * BlockBytes()).c_str(),
                  o.mode.c_str(), static_cast<long long>(o.compute_us),
                  Cell(o.compute_ms, 2).c_str(), Cell(o.transfer_ms, 2).c_str(),
                  Cell(o.overlap_ms, 2).c_str(), Cell(o.hidden, 2).c_str(),
                  1.0 - 1.0 / static_cast<double>(kLayers));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseFlagsWithEnvironment(
      argc, argv,
      "kv_transfer_bench: KV transfer bytes/s and latency between two processes over UCX, next to "
      "ucx_perftest.\nusage: kv_transfer_bench [--tls=posix,self;tcp,self] [--sizes_mb=1,4,16,64] "
      "[--repetitions=5]");
  tandem::SetLogOptions({.min_severity = absl::GetFlag(FLAGS_verbose) ? tandem::LogSeverity::kInfo
                                                                      : tandem::LogSeverity::kWarning,
                         .format = tandem::LogFormat::kText});
  const bool owner = absl::GetFlag(FLAGS_role) == "owner";
  if (!owner && absl::GetFlag(FLAGS_role) != "writer") {
    std::fprintf(stderr, "kv_transfer_bench: --role must be writer or owner\n");
    return 2;
  }
  if (const auto kv = tandem::ParseKvDType(absl::GetFlag(FLAGS_kv_dtype)); !kv.ok()) {
    std::fprintf(stderr, "kv_transfer_bench: %s\n", std::string(kv.status().message()).c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const absl::Status s = owner ? tandem::RunOwner() : tandem::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "kv_transfer_bench%s: %s\n", owner ? " (owner)" : "",
                 s.ToString().c_str());
    return 1;
  }
  return 0;
}
