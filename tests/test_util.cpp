#include "test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

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

TempFile::TempFile(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ft_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  path_ = (dir / name).string();
}

TempFile::~TempFile() {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  std::filesystem::remove(std::filesystem::path(path_).parent_path(), ec);  // only once empty
}

}  // namespace ft::test
