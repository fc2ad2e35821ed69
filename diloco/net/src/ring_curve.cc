#include "ring_curve.h"

#include <zmq.h>

#include <array>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_allreduce.h"

namespace fl::diloco {

absl::Status CheckCurveSupport() {
  if (zmq_has("curve")) return absl::OkStatus();
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  return absl::UnavailableError(fl::StrCat("this libzmq (", major, ".", minor, ".", patch,
                                           ") was built without CURVE security, which the ring needs for its "
                                           "CurveZMQ keys; install a libzmq built with libsodium (Debian's libzmq5 "
                                           "is), or run the islands with --insecure on a trusted network"));
}

absl::Status RingCurveSupported() { return CheckCurveSupport(); }

bool IsZ85Key(const std::string& key) {
  if (key.size() != 40) return false;
  std::array<uint8_t, 32> raw{};
  return zmq_z85_decode(raw.data(), key.c_str()) != nullptr;
}

absl::StatusOr<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::Start(zmq::context_t& context,
                                                                          std::set<std::string> allowed) {
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    return std::unique_ptr<ZapAuthenticator>(new ZapAuthenticator(std::move(socket), std::move(allowed)));
  } catch (const zmq::error_t& e) {
    return absl::InternalError(fl::StrCat("ring: cannot start the CurveZMQ authenticator (ZAP): ", e.what()));
  }
}

ZapAuthenticator::ZapAuthenticator(zmq::socket_t socket, std::set<std::string> allowed)
    : socket_(std::move(socket)), allowed_(std::move(allowed)) {
  thread_ = std::thread([this] { Serve(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_.store(true);
  thread_.join();
  socket_.close();
}

std::string ZapAuthenticator::last_refused_key() const {
  fl::MutexLock lock(mu_);
  return last_refused_key_;
}

// ZAP (ZeroMQ RFC 27): a request is version, request id, domain, address, identity, mechanism and the
// mechanism's credentials (CURVE: the client's 32-byte public key); the reply is version, request id, status
// code, status text, user id and metadata.
void ZapAuthenticator::Serve() {
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      // A short poll so that the destructor's stop is seen promptly; handshakes are rare (one per connection).
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      std::vector<zmq::message_t> frames;
      do {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::none)) break;
        const bool more = frame.more();
        frames.push_back(std::move(frame));
        if (!more) break;
      } while (true);
      std::string status = "400", text = "malformed ZAP request";
      if (frames.size() >= 6) {
        const std::string mechanism = frames[5].to_string();
        if (mechanism == "CURVE" && frames.size() >= 7 && frames[6].size() == 32) {
          std::array<char, 41> z85{};
          zmq_z85_encode(z85.data(), static_cast<const uint8_t*>(frames[6].data()), 32);
          const std::string key(z85.data(), 40);
          if (allowed_.contains(key)) {
            status = "200";
            text = "OK";
          } else {
            text = "CURVE public key is not one of this ring's members";
            refused_.fetch_add(1);
            fl::MutexLock lock(mu_);
            last_refused_key_ = key;
          }
        } else {
          text = "the ring accepts only CURVE";
          refused_.fetch_add(1);
        }
      }
      const std::string version = frames.empty() ? "1.0" : frames[0].to_string();
      const std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
      socket_.send(zmq::buffer(version), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(status), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(std::string()), zmq::send_flags::sndmore);  // user id
      socket_.send(zmq::buffer(std::string()), zmq::send_flags::none);     // metadata
    } catch (const zmq::error_t&) {
      return;  // the context is terminating
    }
  }
}

}  // namespace fl::diloco
