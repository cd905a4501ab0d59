// Files and folders under /tmp that a test makes and that go when the test's object does, also
// when the test returns early. Used by unit and integration tests alike; not thread-safe (one
// object, one owner).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace ferry::testing {

/// A fresh folder /tmp/PREFIX-XXXXXX, removed with everything in it when this goes. path() is
/// empty when it could not be made.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ferry-test") {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  /// The path of `name` inside the folder.
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// A fresh file under /tmp holding `contents` byte for byte (e.g. a token file), removed when
/// this goes. path() is empty when it could not be made.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    char tmpl[] = "/tmp/ferry-test-file-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0) return;
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ferry::testing
