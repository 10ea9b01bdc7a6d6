// The fuzz_c_api target's calls on streams: salus_record_stream, and a framework's own streams
// (salus_stream_create / destroy / retire, bind / unbind), each checked against the model.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "c_api_model.hpp"
#include "fuzz_input.hpp"
#include "salus/c_api.h"

namespace salus::fuzz {

class StreamCalls {
 public:
  StreamCalls(FuzzInput& in, Model& m) : in_(in), m_(m) {}

  void record_stream() {
    if (m_.blocks.empty()) return;
    const Block& b =
        std::next(m_.blocks.begin(), static_cast<long>(in_.below(m_.blocks.size())))->second;
    void* stream = m_.pick_stream(in_, b.device);
    salus_status want = SALUS_OK;
    void* ptr = reinterpret_cast<void*>(b.ptr);
    switch (in_.below(8)) {
      case 0:
        stream = m_.invalid_stream(in_);
        want = SALUS_ERROR_INVALID_ARGUMENT;
        break;
      case 1:
        ptr = reinterpret_cast<void*>(b.ptr + 8);
        want = SALUS_ERROR_INVALID_ARGUMENT;
        break;
      case 2:
        ptr = nullptr;
        want = SALUS_ERROR_INVALID_ARGUMENT;
        break;
      default:
        break;
    }
    describe_call(format_call("salus_record_stream(%p, stream %p)", ptr, stream));
    const Snapshot before = m_.snapshot("salus_record_stream");
    m_.expect(salus_record_stream(m_.runtime, ptr, stream), {want}, "salus_record_stream", before);
    m_.check_all("salus_record_stream");
  }

  // ---- streams ----------------------------------------------------------------------------------

  void create_stream() {
    if (m_.streams.size() >= 8) return;
    bool valid = true;
    const int device = m_.pick_device(in_, valid);
    describe_call(format_call("salus_stream_create(device %d)", device));
    const Snapshot before = m_.snapshot("salus_stream_create");
    void* stream = nullptr;
    const salus_status st =
        salus_stream_create(m_.runtime, device, static_cast<int>(in_.below(3)) - 1, &stream);
    m_.expect(st, {valid ? SALUS_OK : SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_create", before);
    if (st == SALUS_OK) {
      FUZZ_CHECK(stream != nullptr, "salus_stream_create: a stream");
      m_.streams.push_back({stream, device, 0});
    }
    m_.check_all("salus_stream_create");
  }

  void destroy_or_retire_stream() {
    const bool destroy = in_.chance(60);
    const char* call = destroy ? "salus_stream_destroy" : "salus_stream_retire";
    const Snapshot before = m_.snapshot(call);
    if (m_.streams.empty() || in_.chance(20)) {
      void* stream = in_.chance(50) ? nullptr : m_.invalid_stream(in_);
      describe_call(format_call("%s(device 0, stream %p) of no stream", call, stream));
      const salus_status st = destroy ? salus_stream_destroy(m_.runtime, 0, stream)
                                      : salus_stream_retire(m_.runtime, 0, stream);
      m_.expect(st, {SALUS_ERROR_INVALID_ARGUMENT}, call, before);
      m_.check_all(call);
      return;
    }
    const std::size_t k = in_.below(m_.streams.size());
    const StreamModel s = m_.streams[k];
    describe_call(format_call("%s(device %d, stream %p)", call, s.device, s.handle));
    const salus_status st = destroy ? salus_stream_destroy(m_.runtime, s.device, s.handle)
                                    : salus_stream_retire(m_.runtime, s.device, s.handle);
    m_.expect(st, {SALUS_OK}, call, before);
    if (destroy) {
      m_.streams.erase(m_.streams.begin() + static_cast<long>(k));
      m_.destroyed_streams.push_back(s.handle);
    } else {
      m_.streams[k].bound_job = 0;  // a retired stream is bound to no job (c_api.h)
    }
    m_.check_all(call);
  }

  void bind_or_unbind() {
    if (m_.streams.empty()) return;
    StreamModel& s = m_.streams[in_.below(m_.streams.size())];
    if (in_.chance(40)) {
      describe_call(format_call("salus_stream_unbind(device %d, stream %p) bound to %u", s.device,
                                s.handle, s.bound_job));
      const Snapshot before = m_.snapshot("salus_stream_unbind");
      const salus_status st = salus_stream_unbind(m_.runtime, s.device, s.handle);
      const JobModel* bound = m_.job(s.bound_job);
      if (s.bound_job == 0) {
        m_.expect(st, {SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_unbind", before);
      } else if (bound == nullptr || bound->state == JobState::cancelled) {
        // The binding ended with its job (left), or may have (cancelled).
        m_.expect(st, {SALUS_OK, SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_unbind", before);
      } else {
        m_.expect(st, {SALUS_OK}, "salus_stream_unbind", before);
      }
      s.bound_job = 0;
      m_.check_all("salus_stream_unbind");
      return;
    }
    if (s.bound_job != 0) return;  // rebinding is not modelled
    const std::uint32_t id = in_.chance(10) ? 0 : m_.pick_job_id(in_);
    const JobModel* j = m_.job(id);
    salus_status want = id == 0 ? SALUS_ERROR_INVALID_ARGUMENT : m_.gone_status(id);
    if (want == SALUS_OK && j->device != s.device) want = SALUS_ERROR_INVALID_ARGUMENT;
    describe_call(
        format_call("salus_stream_bind(device %d, stream %p, job %u)", s.device, s.handle, id));
    const Snapshot before = m_.snapshot("salus_stream_bind");
    const salus_status st = salus_stream_bind(m_.runtime, s.device, s.handle, id);
    m_.expect(st, {want}, "salus_stream_bind", before);
    if (st == SALUS_OK) s.bound_job = id;
    m_.check_all("salus_stream_bind");
  }

 private:
  FuzzInput& in_;
  Model& m_;
};

}  // namespace salus::fuzz
