#include "soak/soak_options.hpp"

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace salus::soak {
namespace {

const char* const kPolicies[] = {"fifo", "srtf", "fair", "pack", "priority", "memory_aware"};

double parse_number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0.0)) {
    throw std::invalid_argument(flag + " wants a non-negative number, got '" + text + "'");
  }
  return value;
}

bool parse_mode(const std::string& text) {
  if (text == "outlive") return true;
  if (text == "release") return false;
  throw std::invalid_argument("a mode is 'release' or 'outlive', got '" + text + "'");
}

bool parse_spill(const std::string& text) {
  if (text == "on" || text == "spill") return true;
  if (text == "off" || text == "nospill") return false;
  throw std::invalid_argument("spilling is 'on' or 'off', got '" + text + "'");
}

// "all", or a comma-separated list of MODE.POLICY.SPILL (Combo::name's form).
std::vector<Combo> parse_combos(const std::string& text) {
  if (text == "all") return all_combos();
  std::vector<Combo> combos;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    const auto first = item.find('.');
    const auto last = item.rfind('.');
    if (first == std::string::npos || first == last) {
      throw std::invalid_argument("--combos wants MODE.POLICY.SPILL items, got '" + item + "'");
    }
    combos.push_back({parse_mode(item.substr(0, first)), item.substr(first + 1, last - first - 1),
                      parse_spill(item.substr(last + 1))});
  }
  if (combos.empty()) throw std::invalid_argument("--combos lists nothing");
  return combos;
}

void check_options(const Options& o) {
  if (o.slots < 1) throw std::invalid_argument("--slots wants at least 1");
  if (o.max_iterations_per_job < 1)
    throw std::invalid_argument("--max-iterations-per-job wants at least 1");
  if (o.sample_ms < 10) throw std::invalid_argument("--sample-ms wants at least 10");
  if (o.cancel_interval_ms < 1) throw std::invalid_argument("--cancel-interval-ms wants >= 1");
  if (o.device_limit_mib < 8) throw std::invalid_argument("--device-limit-mib wants at least 8");
  if (o.stuck_seconds <= 0.0) throw std::invalid_argument("--stuck-seconds wants more than 0");
}

}  // namespace

std::string Combo::name() const {
  return std::string(blocks_outlive_job ? "outlive." : "release.") + policy +
         (spill ? ".spill" : ".nospill");
}

std::vector<Combo> all_combos() {
  std::vector<Combo> combos;
  for (const bool outlive : {true, false}) {
    for (const char* policy : kPolicies) {
      for (const bool spill : {true, false}) combos.push_back({outlive, policy, spill});
    }
  }
  return combos;
}

namespace {

// --mode, --policy and --spill: they shape the one combination unless --combos lists them.
struct ComboFlags {
  std::optional<bool> outlive;
  std::optional<std::string> policy;
  std::optional<bool> spill;
};

// One flag that takes a value; throws for an unknown flag.
void apply(Options& o, ComboFlags& combo, const std::string& flag, const char* value) {
  auto count = [&] { return static_cast<int>(parse_number(flag, value)); };
  if (flag == "--seconds")
    o.seconds = parse_number(flag, value);
  else if (flag == "--seed")
    o.seed = std::strtoull(value, nullptr, 0);
  else if (flag == "--csv")
    o.csv = value;
  else if (flag == "--stuck-seconds")
    o.stuck_seconds = parse_number(flag, value);
  else if (flag == "--warmup-seconds")
    o.warmup_seconds = parse_number(flag, value);
  else if (flag == "--slots")
    o.slots = count();
  else if (flag == "--racers")
    o.racers = count();
  else if (flag == "--max-iterations-per-job")
    o.max_iterations_per_job = count();
  else if (flag == "--policy")
    combo.policy = value;
  else if (flag == "--mode")
    combo.outlive = parse_mode(value);
  else if (flag == "--spill")
    combo.spill = parse_spill(value);
  else if (flag == "--combos")
    o.combos = parse_combos(value);
  else if (flag == "--device-limit-mib")
    o.device_limit_mib = static_cast<std::size_t>(count());
  else if (flag == "--host-limit-mib")
    o.host_limit_mib = static_cast<std::size_t>(count());
  else if (flag == "--sample-ms")
    o.sample_ms = count();
  else if (flag == "--cancel-interval-ms")
    o.cancel_interval_ms = count();
  else if (flag == "--rss-tolerance-mib")
    o.rss_tolerance_mib = parse_number(flag, value);
  else if (flag == "--simulate-hang")
    o.simulate_hang_after = parse_number(flag, value);
  else
    throw std::invalid_argument("unknown option " + flag);
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  ComboFlags combo;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-kernels") {
      o.kernels = false;
    } else if (flag == "--no-rss-verdict") {
      o.judge_rss = false;
    } else if (flag == "--no-stream-readers") {
      o.stream_readers = false;
    } else if (flag == "--device-compute") {
      o.host_compute = false;
      o.stream_readers = false;
    } else if (i + 1 < argc) {
      apply(o, combo, flag, argv[++i]);
    } else {
      throw std::invalid_argument("missing value after " + flag);
    }
  }
  if (o.combos.size() == 1) {
    if (combo.outlive) o.combos[0].blocks_outlive_job = *combo.outlive;
    if (combo.policy) o.combos[0].policy = *combo.policy;
    if (combo.spill) o.combos[0].spill = *combo.spill;
  } else if (combo.outlive || combo.policy || combo.spill) {
    throw std::invalid_argument("--mode, --policy and --spill do not go with --combos");
  }
  check_options(o);
  return o;
}

}  // namespace salus::soak
