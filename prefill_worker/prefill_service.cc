#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_conversion.h"
#include "proto/conversion.h"

namespace tandem {
namespace {

// The prefill worker's transfer metrics (docs/metrics.md).
struct PrefillMetrics {
  prometheus::Family<prometheus::Counter>& requests = prometheus::BuildCounter()
      .Name("tandem_prefill_requests_total")
      .Help("Prefill requests by outcome: ok, error")
      .Register(ProcessMetrics());
  prometheus::Counter& bytes = prometheus::BuildCounter()
      .Name("tandem_prefill_transfer_bytes_total")
      .Help("KV bytes written into decode workers' pools")
      .Register(ProcessMetrics())
      .Add({});
  prometheus::Histogram& seconds = prometheus::BuildHistogram()
      .Name("tandem_prefill_transfer_seconds")
      .Help("From a request's arrival to its last KV write in place (compute and transfer overlap)")
      .Register(ProcessMetrics())
      .Add({}, RequestLatencyBuckets());
};

PrefillMetrics& Metrics() {
  static PrefillMetrics* metrics = new PrefillMetrics();
  return *metrics;
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

absl::Time Deadline(const grpc::ServerContext& context, absl::Duration timeout) {
  const absl::Time own = absl::Now() + timeout;
  const auto client = context.deadline();
  if (client == std::chrono::system_clock::time_point::max()) return own;
  return std::min(own, absl::FromChrono(client));
}

// What one Prefill call shares with the engine thread and the transport's thread.
struct Transfer {
  absl::Mutex mu;
  int64_t outstanding ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
  bool have_token ABSL_GUARDED_BY(mu) = false;
  int32_t token ABSL_GUARDED_BY(mu) = -1;
  std::optional<float> logprob ABSL_GUARDED_BY(mu);
  int64_t reused_tokens ABSL_GUARDED_BY(mu) = -1;  // prefix found in this worker's own cache
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  absl::Time compute_done ABSL_GUARDED_BY(mu);
  double compute_seconds ABSL_GUARDED_BY(mu) = 0;  // the first delta's prompt_seconds
  absl::Time writes_done ABSL_GUARDED_BY(mu);
};

}  // namespace

PrefillService::PrefillService(EngineLoop* loop, kvtransfer::KvTransport* transport,
                               Options options)
    : loop_(loop), transport_(transport), options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> PrefillService::ConnectionTo(
    const v1::KvDestination& destination, const kvtransfer::PoolDescriptor& pool,
    absl::Time deadline) {
  const std::string key = absl::StrCat(destination.worker_id(), "#", pool.pool_epoch, "#",
                                       pool.regions[0].base_address);
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(key);
    if (it != connections_.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> conn =
      transport_->Connect(pool, deadline);
  if (!conn.ok()) return conn.status();
  absl::MutexLock lock(&mu_);
  connections_[key] = *conn;
  return conn;
}

void PrefillService::ForgetConnection(const kvtransfer::Connection* connection) {
  absl::MutexLock lock(&mu_);
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    if (it->second.get() == connection) {
      connections_.erase(it);
      return;
    }
  }
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  grpc::Status status = Serve(context, request, response);
  Metrics().requests.Add({{"outcome", status.ok() ? "ok" : "error"}}).Increment();
  return status;
}

grpc::Status PrefillService::Serve(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                   v1::PrefillResponse* response) {
  const absl::Time start = absl::Now();
  if (!request->model().empty() && request->model() != loop_->model_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model '", request->model(), "' is not served here"));
  }
  const int64_t n = request->token_ids_size();
  const int64_t bs = loop_->kv_layout().block_size;
  const int64_t dst_cached = request->num_destination_cached_tokens();
  if (n == 0) return Invalid("the prompt is empty");
  if (dst_cached % bs != 0 || dst_cached >= n) {
    return Invalid(absl::StrCat("num_destination_cached_tokens ", dst_cached,
                                " must be a multiple of ", bs, " below the prompt's ", n));
  }
  if (request->destination().block_ids_size() < (n + bs - 1) / bs) {
    return Invalid(absl::StrCat("the destination has ", request->destination().block_ids_size(),
                                " blocks; the prompt needs ", (n + bs - 1) / bs));
  }
  absl::StatusOr<kvtransfer::PoolDescriptor> pool =
      kvtransfer::FromProto(request->destination().pool());
  if (!pool.ok()) return ToGrpcStatus(pool.status());
  for (uint32_t b : request->destination().block_ids()) {
    if (static_cast<int64_t>(b) >= pool->layout.num_blocks) {
      return Invalid(absl::StrCat("destination block ", b, " is outside its pool of ",
                                  pool->layout.num_blocks));
    }
  }
  const absl::Duration timeout = request->timeout_ms() > 0
                                     ? absl::Milliseconds(request->timeout_ms())
                                     : options_.default_timeout;
  const absl::Time deadline = Deadline(*context, timeout);
  absl::StatusOr<std::shared_ptr<kvtransfer::Connection>> conn =
      ConnectionTo(request->destination(), *pool, deadline);
  if (!conn.ok()) return ToGrpcStatus(conn.status());

  std::vector<int32_t> dst(request->destination().block_ids().begin(),
                           request->destination().block_ids().end());
  auto transfer = std::make_shared<Transfer>();
  const int64_t num_layers = loop_->kv_layout().num_layers;
  const uint64_t block_bytes = static_cast<uint64_t>(loop_->kv_layout().block_bytes());
  std::shared_ptr<kvtransfer::Connection> connection = *conn;

  // Writes layers [first, first + count) of logical blocks [from, to) on the engine thread; the
  // transport completes them on its own.
  auto write = [transfer, connection, dst, deadline, block_bytes](
                   absl::Span<const int32_t> table, int64_t from, int64_t to, int64_t first,
                   int64_t count) {
    kvtransfer::WriteOp op{.blocks = {}, .first_layer = static_cast<int32_t>(first),
                           .num_layers = static_cast<int32_t>(count)};
    for (int64_t k = from; k < to; ++k) {
      op.blocks.push_back({.src = table[static_cast<size_t>(k)], .dst = dst[static_cast<size_t>(k)]});
    }
    if (op.blocks.empty()) return;
    {
      absl::MutexLock lock(&transfer->mu);
      if (!transfer->error.ok()) return;
      ++transfer->outstanding;
      transfer->bytes += op.blocks.size() * static_cast<uint64_t>(count) * block_bytes;
    }
    absl::Status started = connection->Write(op, deadline, [transfer](absl::Status s) {
      absl::MutexLock lock(&transfer->mu);
      --transfer->outstanding;
      if (!s.ok()) transfer->error.Update(s);
      transfer->writes_done = absl::Now();
    });
    if (!started.ok()) {
      absl::MutexLock lock(&transfer->mu);
      --transfer->outstanding;
      transfer->error.Update(started);
    }
  };

  GenerationRequest r;
  r.prompt.assign(request->token_ids().begin(), request->token_ids().end());
  r.sampling = SamplingFromProto(request->sampling());
  r.priority = request->priority();
  // Only the next token, sampled after the request's earlier output (a migrated request).
  r.prior_output_tokens = request->num_prior_output_tokens();
  r.sampling.max_tokens = r.prior_output_tokens + 1;
  r.sampling.min_tokens = std::min<int64_t>(r.sampling.min_tokens, r.prior_output_tokens + 1);
  const int64_t dst_cached_blocks = dst_cached / bs;
  r.on_kv_layer = [transfer, write, dst_cached_blocks, bs, num_layers](const KvLayerDone& d) {
    {
      absl::MutexLock lock(&transfer->mu);
      if (transfer->reused_tokens < 0) transfer->reused_tokens = d.first_position;
    }
    // What this worker's own cache supplied was not computed: send it whole, once.
    if (d.layer == 0) {
      write(d.block_table, dst_cached_blocks, std::max(dst_cached_blocks, d.first_position / bs), 0,
            num_layers);
    }
    const int64_t from = std::max(dst_cached_blocks, d.first_position / bs);
    const int64_t to = (d.first_position + d.num_tokens + bs - 1) / bs;
    write(d.block_table, from, to, d.layer, 1);
  };
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    calls_[request->request_id()] = id;
  }
  struct Unregister {
    PrefillService* self;
    const std::string& key;
    ~Unregister() {
      absl::MutexLock lock(&self->mu_);
      self->calls_.erase(key);
    }
  } unregister{this, request->request_id()};

  const absl::Status submitted =
      loop_->Submit(id, std::move(r), [transfer, deadline](const GenerationDelta& d) {
        absl::MutexLock lock(&transfer->mu);
        transfer->token = d.token;
        transfer->logprob = d.logprob;
        transfer->compute_done = absl::Now();
        transfer->compute_seconds = d.prompt_seconds;
        // The request's blocks are released when this returns: its writes must be done first.
        transfer->mu.AwaitWithDeadline(
            absl::Condition(
                +[](Transfer* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) { return t->outstanding == 0; },
                transfer.get()),
            deadline);
        transfer->have_token = true;
      });
  if (!submitted.ok()) return ToGrpcStatus(submitted);

  // Wait for the token (and the writes), the deadline or the caller going away. A prefill given
  // up is cancelled in the engine without waiting here (the engine thread may be waiting for its
  // writes in the delta callback); writes still running abandon_grace later are ended by
  // cancelling the connection.
  auto engine_done = std::make_shared<absl::Notification>();
  absl::Time given_up = absl::InfiniteFuture();
  bool connection_cancelled = false;
  absl::MutexLock lock(&transfer->mu);
  while (!transfer->have_token) {
    const absl::Time now = absl::Now();
    if (given_up == absl::InfiniteFuture() && (context->IsCancelled() || now > deadline)) {
      given_up = now;
      transfer->mu.Unlock();
      loop_->CancelAsync(id, [engine_done](bool) { engine_done->Notify(); });
      transfer->mu.Lock();
    }
    if (given_up != absl::InfiniteFuture()) {
      // Done once the engine let go of the request and no write reads its blocks any more.
      if (engine_done->HasBeenNotified() && transfer->outstanding == 0) break;
      if (engine_done->HasBeenNotified() && now > given_up + 10 * options_.abandon_grace) {
        LOG(ERROR) << "request " << request->request_id() << ": " << transfer->outstanding
                   << " KV writes did not end after their connection was cancelled";
        break;
      }
      if (!connection_cancelled && transfer->outstanding > 0 &&
          now > given_up + options_.abandon_grace) {
        connection_cancelled = true;
        LOG(WARNING) << "request " << request->request_id() << ": " << transfer->outstanding
                     << " KV writes to " << request->destination().worker_id()
                     << " still running after the prefill was given up; closing the connection";
        transfer->mu.Unlock();
        connection->Cancel();
        ForgetConnection(connection.get());
        transfer->mu.Lock();
      }
    }
    transfer->mu.AwaitWithTimeout(absl::Condition(&transfer->have_token), absl::Milliseconds(50));
  }
  if (!transfer->have_token) {
    return context->IsCancelled()
               ? grpc::Status(grpc::StatusCode::CANCELLED, "the caller cancelled the prefill")
               : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the prefill's deadline passed");
  }
  if (transfer->outstanding > 0 || !transfer->error.ok()) {
    // The connection may be broken for good: the next request connects again.
    ForgetConnection(connection.get());
  }
  if (transfer->outstanding > 0) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "the KV writes did not finish before the deadline");
  }
  if (!transfer->error.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("writing the KV to ", request->destination().worker_id(),
                                     " failed: ", transfer->error.message()));
  }
  Metrics().bytes.Increment(static_cast<double>(transfer->bytes));
  const absl::Time in_place = std::max(transfer->writes_done, transfer->compute_done);
  Metrics().seconds.Observe(absl::ToDoubleSeconds(in_place - start));
  response->set_first_token_id(transfer->token);
  if (transfer->logprob.has_value()) {
    response->mutable_first_token_logprobs()->set_token_id(transfer->token);
    response->mutable_first_token_logprobs()->set_logprob(*transfer->logprob);
  }
  const int64_t reused = std::max<int64_t>(0, transfer->reused_tokens);
  response->set_num_reused_tokens(static_cast<uint32_t>(reused));
  response->set_num_computed_tokens(static_cast<uint32_t>(n - reused));
  // The engine timed the prompt's steps; before them it queued.
  const absl::Time compute_start =
      std::max(transfer->compute_done - absl::Seconds(transfer->compute_seconds), start);
  v1::PrefillTimings* t = response->mutable_timings();
  t->set_queue_us(MicrosForProto(compute_start - start));
  t->set_compute_us(MicrosForProto(transfer->compute_done - compute_start));
  t->set_transfer_us(MicrosForProto(in_place - compute_start));
  t->set_transfer_bytes(transfer->bytes);
  return grpc::Status::OK;
}

grpc::Status PrefillService::Cancel(grpc::ServerContext* /*context*/,
                                    const v1::CancelRequest* request,
                                    v1::CancelResponse* response) {
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(request->request_id());
    if (it != calls_.end()) id = it->second;
  }
  response->set_found(id != 0 && loop_->Cancel(id));
  return grpc::Status::OK;
}

}  // namespace tandem
