#include "test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ft::test {

std::string shared_dir() {
  if (const char* env = std::getenv("FT_SHARED_DIR")) return env;
  return FT_SHARED_DIR;
}

std::string shared_file(const std::string& rel) {
  const std::filesystem::path p = std::filesystem::path(shared_dir()) / rel;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace ft::test
