// The fuzz targets outside libFuzzer: runs LLVMFuzzerTestOneInput over every file under the
// folders (or files) named on the command line, so the checked-in corpus and every crash
// reproducer run in every normal and sanitizer build as ctest's Fuzz.Replay.<target>. A finding
// aborts (the target's own checks) or is reported by the sanitizers, as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;

// Input files under `root` in a stable order; README and .gitkeep files are not inputs.
std::vector<fs::path> inputs_under(const fs::path& root) {
  std::vector<fs::path> files;
  if (fs::is_regular_file(root)) return {root};
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == ".gitkeep" || name.rfind("README", 0) == 0) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    if (!fs::exists(argv[i])) {
      std::fprintf(stderr, "%s: no such file or folder\n", argv[i]);
      return 2;
    }
    for (const fs::path& file : inputs_under(argv[i])) {
      std::ifstream in(file, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replay %s (%zu bytes)\n", file.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++ran;
    }
  }
  std::printf("replayed %zu inputs\n", ran);
  // A target with an empty corpus checks nothing: that is a set-up error, not a pass.
  return ran > 0 ? 0 : 1;
}
