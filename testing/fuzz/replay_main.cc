// The main() of a fuzz target outside --config=fuzz: runs every input of the
// corpus directories (or files) named on the command line through
// LLVMFuzzerTestOneInput once, so that `bazel test` replays the seeds and
// every input that once made the target fail. A relative path that does not
// exist as given is looked up in the test's runfiles.
//
// Exit status: 0 when every input ran (a crash, sanitizer report or failed
// check inside the target ends the process before that), 1 when an
// argument names nothing or a directory holds no input: an empty corpus
// would make the test pass without testing anything.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string Resolve(const std::string& path) {
  if (std::filesystem::exists(path)) return path;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return path;
  return std::string(srcdir) + "/" + (workspace ? workspace : "downpour") +
         "/" + path;
}

bool RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  // A copy of exactly the input's size, so that ASan sees reads past it.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size()]);
  std::copy(bytes.begin(), bytes.end(), copy.get());
  LLVMFuzzerTestOneInput(copy.get(), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 1;
  }
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string path = Resolve(argv[i]);
    if (std::filesystem::is_directory(path)) {
      std::vector<std::string> files;
      for (const auto& entry :
           std::filesystem::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path().string());
      }
      std::sort(files.begin(), files.end());  // a stable order to reproduce
      if (files.empty()) {
        std::fprintf(stderr, "replay: %s holds no input\n", path.c_str());
        return 1;
      }
      for (const std::string& f : files) {
        if (!RunFile(f)) return 1;
        ++ran;
      }
    } else if (std::filesystem::is_regular_file(path)) {
      if (!RunFile(path)) return 1;
      ++ran;
    } else {
      std::fprintf(stderr, "replay: %s does not exist\n", path.c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "replay: %d inputs ran\n", ran);
  return 0;
}
