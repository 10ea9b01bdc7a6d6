#include "waits/blocking.hpp"
#include "remote/daemon_link.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>

namespace salus::remote {

DaemonLink::DaemonLink(const std::string& socket_path)
    : path_(socket_path), channel_(connect_to(socket_path)) {
  reader_ = std::thread([this] { read_loop(); });
  handler_ = std::thread([reclaims = reclaims_] { handle_reclaims(reclaims); });
  try {
    Hello hello;
    hello.pid = static_cast<std::uint32_t>(::getpid());
    std::string exe = "client";
    char buf[256];
    if (const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf)); n > 0) {
      exe.assign(buf, static_cast<std::size_t>(n));
    }
    set_name(hello.name, exe.substr(exe.rfind('/') + 1));
    welcome_ = body_as<Welcome>(call(MessageType::hello, hello).record);
  } catch (const std::exception& e) {
    stop();  // the destructor does not run for a constructor that throws
    throw DeviceError("salusd", "SALUSD_REFUSED", 0,
                      fmt::format("salusd at '{}' refused the connection: {}", path_, e.what()));
  }
}

DaemonLink::~DaemonLink() {
  stop();
}

void DaemonLink::stop() noexcept {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard lock(reclaims_->mu);
    reclaims_->stopping = true;
  }
  reclaims_->cv.notify_all();
  channel_.shutdown();
  if (reader_.joinable()) reader_.join();
  // The last owner may let go inside the reclaim handler, on the handler's own thread.
  if (handler_.joinable()) {
    if (handler_.get_id() == std::this_thread::get_id()) {
      handler_.detach();
    } else {
      handler_.join();
    }
  }
}

bool DaemonLink::alive() const {
  std::lock_guard lock(mu_);
  return !gone_;
}

DeviceError salusd_gone(const std::string& socket_path, const std::string& why) {
  return DeviceError("salusd", "SALUSD_GONE", 0,
                     fmt::format("salusd at '{}' is gone: {}", socket_path, why));
}

void DaemonLink::throw_gone() const {
  throw salusd_gone(path_, gone_why_);
}

Received DaemonLink::call(MessageType type, std::span<const std::byte> body,
                          std::span<const int> fds) {
  std::uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    if (gone_) throw_gone();
    seq = next_seq_++;
    pending_.emplace(seq, Pending{});
  }
  try {
    channel_.send(encode_body(type, seq, body), fds);
  } catch (const Error&) {
    std::lock_guard lock(mu_);
    pending_.erase(seq);
    if (gone_) throw_gone();
    throw;
  }
  std::unique_lock lock(mu_);
  if (!gone_ && !pending_.at(seq).reply.has_value()) waits::before_blocking();
  cv_.wait(lock, [&] { return gone_ || pending_.at(seq).reply.has_value(); });
  auto node = pending_.extract(seq);
  if (!node.mapped().reply) throw_gone();
  Received reply = std::move(*node.mapped().reply);
  lock.unlock();
  if (reply.record.type() == MessageType::failure) {
    throw_failure(body_as<Failure>(reply.record), to_string(type));
  }
  return reply;
}

void DaemonLink::post(MessageType type, std::span<const std::byte> body,
                      std::span<const int> fds) {
  {
    std::lock_guard lock(mu_);
    if (gone_) return;
  }
  try {
    channel_.send(encode_body(type, 0, body), fds);
  } catch (const Error&) {
    // The daemon is gone: it takes back what this process held when it notices.
  }
}

void DaemonLink::on_reclaim(std::function<void(const PageCount&)> handler) {
  std::lock_guard lock(reclaims_->mu);
  reclaims_->handler = std::move(handler);
}

void DaemonLink::read_loop() {
  std::string why = "its connection closed";
  try {
    while (auto received = channel_.receive()) {
      std::lock_guard lock(mu_);
      const Record& r = received->record;
      if (r.header.seq == 0) {
        if (r.type() == MessageType::reclaim) queue_reclaim(body_as<PageCount>(r));
        continue;
      }
      auto it = pending_.find(r.header.seq);
      if (it == pending_.end()) continue;  // a reply to a post
      it->second.reply = std::move(*received);
      cv_.notify_all();
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  fail_all(why);
}

void DaemonLink::queue_reclaim(const PageCount& want) {
  std::lock_guard lock(reclaims_->mu);
  // One waiting reclaim a device, for the most pages asked: a process that was stopped (or busy)
  // while the daemon asked again and again answers once, not once for every ask it missed.
  auto same = std::find_if(reclaims_->queue.begin(), reclaims_->queue.end(),
                           [&](const PageCount& q) { return q.device == want.device; });
  if (same != reclaims_->queue.end()) {
    same->count = std::max(same->count, want.count);
    return;
  }
  reclaims_->queue.push_back(want);
  reclaims_->cv.notify_all();
}

void DaemonLink::fail_all(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (!gone_) {
      gone_ = true;
      gone_why_ = why;
    }
  }
  cv_.notify_all();
}

void DaemonLink::handle_reclaims(const std::shared_ptr<Reclaims>& reclaims) {
  std::unique_lock lock(reclaims->mu);
  for (;;) {
    reclaims->cv.wait(lock, [&] { return reclaims->stopping || !reclaims->queue.empty(); });
    if (reclaims->stopping) return;
    const PageCount want = reclaims->queue.front();
    reclaims->queue.pop_front();
    auto handler = reclaims->handler;
    lock.unlock();
    try {
      if (handler) handler(want);
    } catch (const std::exception&) {
      // Giving back is a favour to other processes: a failure here costs them pages, not us.
    }
    handler = nullptr;  // what it holds goes here, on this thread, before the lock is taken
    lock.lock();
  }
}

}  // namespace salus::remote
