// The fleet load generator's library (fleet_load.h). Threads: gRPC's callback threads run the Join callbacks
// and the session reactors (a ping is answered with a pong there); one scheduler thread sends the Joins at
// their times, their retries after a retry-after, and the heartbeats (one bucket of sessions every 50 ms, so
// that a tick costs O(sessions / buckets)); a few workers download and upload for tasks with the blocking API.
#include "fleet_load.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/chunk_reader.h"
#include "fl/proto/convert.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::bench {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What a fleet counts, updated from any thread.
struct Counters {
  std::atomic<uint64_t> joins_sent{0}, admitted{0}, join_retried{0}, join_failed{0}, sessions_open{0},
      sessions_ended{0}, heartbeats{0}, pongs{0}, train_tasks{0}, eval_tasks{0}, updates_accepted{0}, updates_other{0},
      shutdowns{0};
  std::atomic<int64_t> first_join_ns{0}, last_admitted_ns{0}, last_welcome_ns{0};
};

void StoreMax(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

struct Fleet::Impl {
  struct Member;

  // One client's session stream. Writes are queued and written one at a time (the callback API allows one
  // outstanding write); reads are answered in OnReadDone.
  class Session final : public grpc::ClientBidiReactor<fl::v1::ClientMessage, fl::v1::ServerMessage> {
   public:
    Session(Impl* fleet, Member* member) : fleet_(fleet), member_(member) {}

    void Open(fl::v1::Federation::Stub* stub) {
      fl::v1::ClientMessage hello;
      hello.mutable_hello()->set_client_id(member_->id);
      hello.mutable_hello()->set_session_token(member_->token);
      hello.mutable_hello()->set_sent_client_ns(NowNs());
      stub->async()->Session(&ctx_, this);
      Enqueue(std::move(hello));
      StartRead(&in_);
      StartCall();
    }
    void Enqueue(fl::v1::ClientMessage m) {
      fl::MutexLock lock(mu_);
      if (done_) return;
      m.set_seq(++seq_);
      out_.push_back(std::move(m));
      if (!writing_) {
        writing_ = true;
        StartWrite(&out_.front());
      }
    }
    void OnWriteDone(bool ok) override {
      fl::MutexLock lock(mu_);
      out_.pop_front();
      if (!ok || out_.empty()) {
        writing_ = false;
        return;
      }
      StartWrite(&out_.front());
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      Handle(in_);
      StartRead(&in_);
    }
    void OnDone(const grpc::Status& status) override {
      {
        fl::MutexLock lock(mu_);
        done_ = true;
        status_ = status;
      }
      if (welcomed_) fleet_->counters.sessions_open.fetch_sub(1);
      if (!fleet_->stopping.load()) fleet_->counters.sessions_ended.fetch_add(1);
      fleet_->SessionDone();
    }
    void Cancel() { ctx_.TryCancel(); }

   private:
    void Handle(const fl::v1::ServerMessage& m) {
      switch (m.kind_case()) {
        case fl::v1::ServerMessage::kWelcome:
          if (!welcomed_) {
            welcomed_ = true;
            fleet_->counters.sessions_open.fetch_add(1);
            StoreMax(fleet_->counters.last_welcome_ns, NowNs());
            member_->open.store(true);
          }
          break;
        case fl::v1::ServerMessage::kPing: {
          const int64_t now = NowNs();
          fl::v1::ClientMessage pong;
          pong.mutable_pong()->set_ping_id(m.ping().ping_id());
          pong.mutable_pong()->set_ping_sent_server_ns(m.ping().sent_server_ns());
          pong.mutable_pong()->set_received_client_ns(now);
          pong.mutable_pong()->set_sent_client_ns(now);
          Enqueue(std::move(pong));
          fleet_->counters.pongs.fetch_add(1);
          break;
        }
        case fl::v1::ServerMessage::kTask:
          fleet_->PostWork([this, task = m.task()] { fleet_->DoTask(*member_, task); });
          break;
        case fl::v1::ServerMessage::kShutdown: fleet_->counters.shutdowns.fetch_add(1); break;
        default: break;
      }
    }

    Impl* fleet_;
    Member* member_;
    grpc::ClientContext ctx_;
    fl::v1::ServerMessage in_;
    fl::Mutex mu_;
    std::deque<fl::v1::ClientMessage> out_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool done_ ABSL_GUARDED_BY(mu_) = false;
    uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
    grpc::Status status_ ABSL_GUARDED_BY(mu_);
    bool welcomed_ = false;  // reactor's read side only
  };

  struct Member {
    uint32_t index = 0;
    std::string id;
    std::string token;
    fl::v1::Federation::Stub* stub = nullptr;
    std::unique_ptr<Session> session;
    std::atomic<bool> open{false};
  };

  struct JoinCall {
    grpc::ClientContext ctx;
    fl::v1::JoinRequest request;
    fl::v1::JoinResponse response;
  };

  explicit Impl(FleetOptions o) : options(std::move(o)) {}

  FleetOptions options;
  Counters counters;
  std::atomic<bool> stopping{false};
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<fl::v1::Federation::Stub>> stubs;
  std::vector<std::unique_ptr<Member>> members;
  std::shared_ptr<const core::ModelSpec> spec;
  fl::v1::ModelSpec spec_proto;

  // Scheduler: Joins (first and retried) at their times, and the heartbeat buckets.
  fl::Mutex mu;
  fl::CondVar cv;
  std::multimap<int64_t, std::function<void()>> timed ABSL_GUARDED_BY(mu);  // steady ns -> what to do
  std::deque<std::function<void()>> work ABSL_GUARDED_BY(mu);               // for the workers
  uint64_t sessions_running ABSL_GUARDED_BY(mu) = 0;
  uint64_t joins_running ABSL_GUARDED_BY(mu) = 0;
  uint64_t updates_answered ABSL_GUARDED_BY(mu) = 0;
  bool stop_threads ABSL_GUARDED_BY(mu) = false;
  std::thread scheduler;
  std::vector<std::thread> workers;

  void At(int64_t when_ns, std::function<void()> fn) {
    {
      fl::MutexLock lock(mu);
      timed.emplace(when_ns, std::move(fn));
    }
    cv.NotifyAll();
  }
  void PostWork(std::function<void()> fn) {
    {
      fl::MutexLock lock(mu);
      work.push_back(std::move(fn));
    }
    cv.NotifyAll();
  }
  void SessionDone() {
    {
      fl::MutexLock lock(mu);
      --sessions_running;
    }
    cv.NotifyAll();
  }
  void UpdateAnswered(bool accepted) {
    (accepted ? counters.updates_accepted : counters.updates_other).fetch_add(1);
    {
      fl::MutexLock lock(mu);
      ++updates_answered;
    }
    cv.NotifyAll();
  }

  // Both run what they take off the queue without the lock (it may call At or PostWork).
  void RunScheduler() {
    mu.Lock();
    while (!stop_threads) {
      if (timed.empty()) {
        cv.Wait(mu);
        continue;
      }
      const int64_t due = timed.begin()->first;
      const int64_t now = NowNs();
      if (due > now) {
        cv.WaitFor(mu, std::chrono::nanoseconds(due - now));
        continue;
      }
      auto fn = std::move(timed.begin()->second);
      timed.erase(timed.begin());
      mu.Unlock();
      fn();
      mu.Lock();
    }
    mu.Unlock();
  }

  void RunWorker() {
    mu.Lock();
    while (true) {
      cv.Wait(mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop_threads || !work.empty(); });
      if (stop_threads) break;
      auto fn = std::move(work.front());
      work.pop_front();
      mu.Unlock();
      fn();
      mu.Lock();
    }
    mu.Unlock();
  }

  // Heartbeats: every interval, bucket b of kBuckets gets its heartbeat at b * interval / kBuckets.
  static constexpr uint32_t kBucketMs = 50;
  void ScheduleHeartbeats(uint32_t interval_ms, uint32_t bucket, uint32_t buckets) {
    At(NowNs() + int64_t{interval_ms} * 1'000'000, [this, interval_ms, bucket, buckets] {
      if (stopping.load()) return;
      for (size_t i = bucket; i < members.size(); i += buckets) {
        Member& m = *members[i];
        if (!m.open.load() || m.session == nullptr) continue;
        fl::v1::ClientMessage hb;
        hb.mutable_heartbeat()->set_sent_client_ns(NowNs());
        hb.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
        m.session->Enqueue(std::move(hb));
        counters.heartbeats.fetch_add(1);
      }
      ScheduleHeartbeats(interval_ms, bucket, buckets);
    });
  }
  std::once_flag heartbeats_started;

  void SendJoin(Member& m) {
    if (stopping.load()) return;
    auto call = std::make_shared<JoinCall>();
    call->request.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    call->request.set_client_name(m.id);
    call->request.set_task("classification");
    call->request.set_num_train_examples(10);
    call->request.set_num_test_examples(10);
    call->request.mutable_device()->set_device_class("fleet-load");
    call->request.set_session_token(m.token);
    *call->request.mutable_model_spec() = spec_proto;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    {
      fl::MutexLock lock(mu);
      ++joins_running;
    }
    int64_t expected = 0;
    counters.first_join_ns.compare_exchange_strong(expected, NowNs());
    counters.joins_sent.fetch_add(1);
    m.stub->async()->Join(&call->ctx, &call->request, &call->response,
                          [this, &m, call](grpc::Status status) { OnJoined(m, *call, status); });
  }

  void OnJoined(Member& m, JoinCall& call, const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && !stopping.load()) {
      // Shed or over the session limit: come back after the server's retry-after.
      int64_t retry_ms = 1000;
      const auto& trailers = call.ctx.GetServerTrailingMetadata();
      if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
        retry_ms = std::max<int64_t>(1, std::atoll(std::string(it->second.data(), it->second.size()).c_str()));
      }
      counters.join_retried.fetch_add(1);
      At(NowNs() + retry_ms * 1'000'000, [this, &m] { SendJoin(m); });
    } else if (!status.ok() || !call.response.admitted()) {
      counters.join_failed.fetch_add(1);
    } else {
      counters.admitted.fetch_add(1);
      StoreMax(counters.last_admitted_ns, NowNs());
      m.token = call.response.session_token();
      const uint32_t interval = std::max<uint32_t>(call.response.heartbeat_interval_ms(), kBucketMs);
      std::call_once(heartbeats_started, [&] {
        const uint32_t buckets = std::max<uint32_t>(1, interval / kBucketMs);
        for (uint32_t b = 0; b < buckets; ++b) {
          At(NowNs() + int64_t{b} * interval * 1'000'000 / buckets,
             [this, interval, b, buckets] { ScheduleHeartbeats(interval, b, buckets); });
        }
      });
      if (call.response.initial_model_requested()) {
        PostWork([this, &m] {
          UploadInitialModel(m);
          OpenSession(m);
        });
      } else {
        OpenSession(m);
      }
    }
    {
      fl::MutexLock lock(mu);
      --joins_running;
    }
    cv.NotifyAll();
  }

  void OpenSession(Member& m) {
    if (stopping.load()) return;
    {
      fl::MutexLock lock(mu);
      ++sessions_running;
    }
    m.session = std::make_unique<Session>(this, &m);
    m.session->Open(m.stub);
  }

  // One upload (header, the payload in one chunk, trailer); true when accepted.
  bool Upload(Member& m, fl::v1::UpdateHeader header, const std::vector<uint8_t>& payload) {
    header.set_client_id(m.id);
    header.set_session_token(m.token);
    header.set_model_fingerprint(spec->fingerprint());
    header.set_payload_bytes(payload.size());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    fl::v1::UploadUpdateResponse resp;
    auto writer = m.stub->UploadUpdate(&ctx, &resp);
    proto::WriteWholeUpload(*writer, header, payload, core::TransferChecksum64(payload));
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    return status.ok() && resp.outcome() == fl::v1::UPDATE_OUTCOME_ACCEPTED;
  }

  std::vector<uint8_t> Encode(float value) {
    std::vector<float> values(options.model_values, value);
    std::vector<uint8_t> payload;
    auto codec = core::MakeCodec(core::CodecKind::kFp32);
    (void)(*codec)->Encode(values, &payload);
    return payload;
  }

  void UploadInitialModel(Member& m) {
    fl::v1::UpdateHeader h;
    h.set_kind(fl::v1::UPDATE_KIND_INITIAL_MODEL);
    h.set_codec("fp32");
    h.set_num_examples(10);
    (void)Upload(m, h, Encode(0.5f));
  }

  // A task: train = download the model, upload a small delta; evaluate = report a result on the session.
  void DoTask(Member& m, const fl::v1::Task& task) {
    if (stopping.load()) return;
    if (task.kind() == fl::v1::TASK_KIND_EVALUATE) {
      counters.eval_tasks.fetch_add(1);
      fl::v1::ClientMessage r;
      r.mutable_evaluation()->set_task_id(task.task_id());
      r.mutable_evaluation()->set_round(task.round());
      r.mutable_evaluation()->set_model_version(task.model_version());
      r.mutable_evaluation()->set_num_examples(10);
      r.mutable_evaluation()->set_loss(1.0);
      r.mutable_evaluation()->set_accuracy(0.5);
      if (m.session != nullptr) m.session->Enqueue(std::move(r));
      return;
    }
    counters.train_tasks.fetch_add(1);
    uint64_t version = task.model_version();
    {
      fl::v1::DownloadModelRequest req;
      req.set_client_id(m.id);
      req.set_session_token(m.token);
      req.set_task_id(task.task_id());
      req.set_model_version(task.model_version());
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = m.stub->DownloadModel(&ctx, req);
      fl::v1::ModelChunk chunk;
      while (reader->Read(&chunk)) {
        if (chunk.has_header()) version = chunk.header().model_version();
      }
      if (!reader->Finish().ok()) {
        UpdateAnswered(false);
        return;
      }
    }
    fl::v1::UpdateHeader h;
    h.set_task_id(task.task_id());
    h.set_round(task.round());
    h.set_base_model_version(version);
    h.set_kind(fl::v1::UPDATE_KIND_DELTA);
    h.set_num_examples(10);
    h.set_codec("fp32");
    UpdateAnswered(Upload(m, h, Encode(0.001f)));
  }
};

Fleet::Fleet(FleetOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Fleet::~Fleet() { Stop(); }

absl::Status Fleet::Start() {
  Impl& f = *impl_;
  const FleetOptions& o = f.options;
  if (o.sessions == 0 || o.channels == 0 || o.workers == 0 || o.model_values == 0) {
    return absl::InvalidArgumentError("fleet: sessions, channels, workers and model_values must be at least 1");
  }
  auto spec = core::ModelSpec::Create({{"w", {static_cast<int64_t>(o.model_values)}, core::DType::kFloat32, 0}});
  if (!spec.ok()) return spec.status();
  f.spec = std::make_shared<const core::ModelSpec>(std::move(*spec));
  f.spec_proto = proto::ToProto(*f.spec, "fleet-tiny");
  for (uint32_t c = 0; c < o.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("fl.fleet.channel", static_cast<int>(c));  // a distinct argument set: a connection of its own
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    f.channels.push_back(grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args));
    f.stubs.push_back(fl::v1::Federation::NewStub(f.channels.back()));
  }
  for (uint32_t i = 0; i < o.sessions; ++i) {
    auto m = std::make_unique<Impl::Member>();
    m->index = i;
    m->id = fl::StrCat(o.name_prefix, "-", i);
    m->stub = f.stubs[i % o.channels].get();
    f.members.push_back(std::move(m));
  }
  f.scheduler = std::thread([&f] { f.RunScheduler(); });
  for (uint32_t w = 0; w < o.workers; ++w) f.workers.emplace_back([&f] { f.RunWorker(); });
  // The first client alone (it is asked for the initial model), the others spread over the window.
  const int64_t start = NowNs();
  for (uint32_t i = 0; i < o.sessions; ++i) {
    const int64_t at = start + (o.sessions > 1 ? int64_t{o.join_window_ms} * 1'000'000 * i / o.sessions : 0);
    Impl::Member* m = f.members[i].get();
    f.At(at, [&f, m] { f.SendJoin(*m); });
  }
  return absl::OkStatus();
}

absl::Status Fleet::WaitAllOpen(int64_t timeout_ms) {
  const int64_t deadline = NowNs() + timeout_ms * 1'000'000;
  while (NowNs() < deadline) {
    if (impl_->counters.sessions_open.load() >= impl_->options.sessions) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const FleetStats s = stats();
  return absl::DeadlineExceededError(fl::StrCat("fleet: ", s.sessions_open, " of ", impl_->options.sessions,
                                                " sessions open after ", timeout_ms, " ms (", s.admitted, " admitted, ",
                                                s.join_retried, " retried, ", s.join_failed, " failed, ",
                                                s.sessions_ended, " ended)"));
}

absl::Status Fleet::WaitUpdates(uint64_t updates, int64_t timeout_ms) {
  Impl& f = *impl_;
  fl::MutexLock lock(f.mu);
  if (f.cv.WaitFor(f.mu, std::chrono::milliseconds(timeout_ms),
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(f.mu) { return f.updates_answered >= updates; })) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      fl::StrCat("fleet: ", f.updates_answered, " of ", updates, " updates answered after ", timeout_ms, " ms"));
}

FleetStats Fleet::stats() const {
  const Counters& c = impl_->counters;
  FleetStats s;
  s.joins_sent = c.joins_sent;
  s.admitted = c.admitted;
  s.join_retried = c.join_retried;
  s.join_failed = c.join_failed;
  s.sessions_open = c.sessions_open;
  s.sessions_ended = c.sessions_ended;
  s.heartbeats = c.heartbeats;
  s.pongs = c.pongs;
  s.train_tasks = c.train_tasks;
  s.eval_tasks = c.eval_tasks;
  s.updates_accepted = c.updates_accepted;
  s.updates_other = c.updates_other;
  s.shutdowns = c.shutdowns;
  s.first_join_ns = c.first_join_ns;
  s.last_admitted_ns = c.last_admitted_ns;
  s.last_welcome_ns = c.last_welcome_ns;
  return s;
}

void Fleet::Stop() {
  Impl& f = *impl_;
  if (f.stopping.exchange(true)) return;
  {
    fl::MutexLock lock(f.mu);
    f.stop_threads = true;
    f.timed.clear();
  }
  f.cv.NotifyAll();
  if (f.scheduler.joinable()) f.scheduler.join();
  for (auto& w : f.workers) w.join();
  // Joins in flight finish (their callbacks open no session any more), then every session is cancelled.
  {
    fl::MutexLock lock(f.mu);
    f.cv.Wait(f.mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(f.mu) { return f.joins_running == 0; });
  }
  for (auto& m : f.members) {
    if (m->session != nullptr) m->session->Cancel();
  }
  fl::MutexLock lock(f.mu);
  f.cv.Wait(f.mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(f.mu) { return f.sessions_running == 0; });
}

}  // namespace fl::bench
