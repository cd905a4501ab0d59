// For tests that run ferryctl (the build's, or $FERRY_TEST_FERRYCTL) and read what it wrote:
// its JSON is parsed through protobuf's JSON reader (objects into Struct, arrays into
// ListValue), a strict check that the output is JSON at all. Parse failures and missing
// fields are non-fatal test failures (EXPECT), and the helpers return an empty value instead.
#pragma once

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "ferryd_process.h"

#ifndef FERRYCTL_PATH
#error "FERRYCTL_PATH must name the ferryctl this build makes (tests/CMakeLists.txt defines it)"
#endif

namespace ferry::testing {

inline std::string FerryctlPath() { return ProgramPath("FERRY_TEST_FERRYCTL", FERRYCTL_PATH); }

/// The whole of the file at `path` ("" when it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// `json` as a JSON object.
inline google::protobuf::Struct ParseObject(const std::string& json) {
  google::protobuf::Struct s;
  auto status = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return s;
}

/// `json` as a JSON array.
inline google::protobuf::ListValue ParseArray(const std::string& json) {
  google::protobuf::ListValue l;
  auto status = google::protobuf::util::JsonStringToMessage(json, &l);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return l;
}

/// Field `k` of `s` (a null value when `s` has none).
inline const google::protobuf::Value& Field(const google::protobuf::Struct& s,
                                            const std::string& k) {
  static const google::protobuf::Value kMissing;
  auto it = s.fields().find(k);
  EXPECT_NE(it, s.fields().end()) << "no field " << k;
  return it == s.fields().end() ? kMissing : it->second;
}

}  // namespace ferry::testing
