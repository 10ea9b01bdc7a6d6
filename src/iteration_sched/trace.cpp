#include "iteration_sched/trace.hpp"

#include <nlohmann/json.hpp>

namespace salus {

namespace {
// Page moves get a row of their own under each device, below its lanes.
constexpr int kMoveRow = 1000;
}  // namespace

void TraceRecorder::make_room() {
  if (max_events_ == 0) return;
  while (spans_.size() + moves_.size() + counters_.size() >= max_events_) {
    // Each kind is in time order; dropping from the largest keeps every kind's recent past.
    if (spans_.size() >= moves_.size() && spans_.size() >= counters_.size()) {
      spans_.pop_front();
    } else if (counters_.size() >= moves_.size()) {
      counters_.pop_front();
    } else {
      moves_.pop_front();
    }
    ++dropped_;
  }
}

void TraceRecorder::span(Span span) {
  std::lock_guard lock(mu_);
  if (max_events_ == 0) return void(++dropped_);
  make_room();
  spans_.push_back(std::move(span));
}

void TraceRecorder::move(Move move) {
  std::lock_guard lock(mu_);
  if (max_events_ == 0) return void(++dropped_);
  make_room();
  moves_.push_back(std::move(move));
}

void TraceRecorder::counter(Counter counter) {
  std::lock_guard lock(mu_);
  if (max_events_ == 0) return void(++dropped_);
  make_room();
  counters_.push_back(std::move(counter));
}

std::size_t TraceRecorder::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

namespace {

// One process per device, one thread per lane: each lane reads as a row of iterations.
void add_spans(nlohmann::json& events, const auto& spans) {
  std::vector<std::pair<int, int>> named;
  for (const auto& s : spans) {
    const std::pair<int, int> row{s.device, s.lane};
    if (std::find(named.begin(), named.end(), row) == named.end()) {
      named.push_back(row);
      events.push_back({{"ph", "M"},
                        {"name", "process_name"},
                        {"pid", s.device},
                        {"tid", 0},
                        {"args", {{"name", "gpu" + std::to_string(s.device)}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", s.device},
                        {"tid", s.lane},
                        {"args", {{"name", "lane " + std::to_string(s.lane)}}}});
    }
    events.push_back({{"ph", "X"},
                      {"name", s.job},
                      {"cat", "iteration"},
                      {"pid", s.device},
                      {"tid", s.lane},
                      {"ts", s.begin_us},
                      {"dur", s.end_us - s.begin_us},
                      {"args", {{"iteration", s.iteration}, {"asked", s.asked_us}}}});
  }
}

// Page moves: a row of their own per device.
void add_moves(nlohmann::json& events, const auto& moves) {
  std::vector<int> move_rows;
  for (const auto& m : moves) {
    if (std::find(move_rows.begin(), move_rows.end(), m.device) == move_rows.end()) {
      move_rows.push_back(m.device);
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", m.device},
                        {"tid", kMoveRow},
                        {"args", {{"name", "page moves"}}}});
    }
    const double seconds = (m.end_us - m.begin_us) * 1e-6;
    events.push_back(
        {{"ph", "X"},
         {"name", m.what},
         {"cat", "move"},
         {"pid", m.device},
         {"tid", kMoveRow},
         {"ts", m.begin_us},
         {"dur", m.end_us - m.begin_us},
         {"args",
          {{"pages", m.pages},
           {"MiB", static_cast<double>(m.bytes) / (1 << 20)},
           {"GBps", seconds > 0 ? static_cast<double>(m.bytes) / seconds / 1e9 : 0.0}}}});
  }
}

}  // namespace

std::string TraceRecorder::json() const {
  using nlohmann::json;
  std::lock_guard lock(mu_);
  json events = json::array();
  add_spans(events, spans_);
  add_moves(events, moves_);
  for (const Counter& c : counters_) {
    json args = json::object();
    for (const auto& [key, value] : c.values) args[key] = value;
    events.push_back(
        {{"ph", "C"}, {"name", c.name}, {"pid", c.device}, {"ts", c.at_us}, {"args", args}});
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  if (dropped_ > 0) doc["otherData"] = {{"dropped_events", dropped_}};
  return doc.dump();
}

}  // namespace salus
