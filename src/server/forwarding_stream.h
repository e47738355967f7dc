// A kj::AsyncIoStream that forwards every call to the stream it wraps. Streams that change only
// what is read (the listener's peeked first byte, the per-message limits) derive from it and
// override tryRead().
#pragma once

#include <kj/async-io.h>

namespace refit::server {

class ForwardingStream : public kj::AsyncIoStream {
 public:
  explicit ForwardingStream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}
  ~ForwardingStream() noexcept(false) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return inner_->tryRead(buffer, min_bytes, max_bytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override { return inner_->write(buffer, size); }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, uint* length) override { inner_->getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, uint* length) override { inner_->getpeername(addr, length); }

 protected:
  kj::AsyncIoStream& inner() { return *inner_; }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
};

}  // namespace refit::server
