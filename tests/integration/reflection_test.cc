// Server reflection as reflection-driven tools use it (grpcurl, grpc_health_probe): list the
// services, resolve each one's descriptor through grpc.reflection.v1alpha alone, and call
// grpc.health.v1.Health/Check with a request built from the resolved descriptor. This binary
// links no health descriptor of its own: everything comes from the daemon.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ferryd_process.h"
#include "generic_calls.h"
#include "wire_bytes.h"

namespace ferry {
namespace {

namespace pb = google::protobuf;
using testing::FerrydProcess;
using testing::LengthField;

// A reflection client speaking grpc.reflection.v1alpha.ServerReflection on the wire (its
// messages are small; this test decodes them as unknown fields rather than link a copy of
// reflection.proto). Each question is one ServerReflectionInfo stream: the server then sends
// a file's dependencies along with it.
class ReflectionClient {
 public:
  explicit ReflectionClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)) {}

  /// Send one ServerReflectionRequest (encoded); return the response's fields, or an error.
  bool Ask(const std::string& request, pb::UnknownFieldSet* response, std::string* error) {
    std::string why;
    std::optional<std::string> answer = testing::ReflectionExchange(channel_, request, &why);
    if (!answer) {
      *error = "no reflection answer: " + why;
      return false;
    }
    if (!response->ParseFromString(*answer)) {
      *error = "the reflection answer does not parse";
      return false;
    }
    return true;
  }

  /// Return the names ListServices reports.
  std::vector<std::string> ListServices(std::string* error) {
    pb::UnknownFieldSet response;
    std::vector<std::string> names;
    if (!Ask(LengthField(7, ""), &response, error)) return names;  // list_services = 7
    for (int i = 0; i < response.field_count(); ++i) {
      const pb::UnknownField& f = response.field(i);
      if (f.number() != 6 || f.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      pb::UnknownFieldSet list;  // ListServiceResponse { repeated ServiceResponse service = 1 }
      if (!list.ParseFromString(f.length_delimited())) continue;
      for (int j = 0; j < list.field_count(); ++j) {
        pb::UnknownFieldSet service;  // ServiceResponse { string name = 1 }
        if (list.field(j).number() != 1) continue;
        if (!service.ParseFromString(list.field(j).length_delimited())) continue;
        for (int k = 0; k < service.field_count(); ++k) {
          if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
        }
      }
    }
    if (names.empty() && error->empty()) *error = ErrorOf(response);
    return names;
  }

  /// Ask with request field `number` (file_by_filename 3, file_containing_symbol 4) = `name`;
  /// return the FileDescriptorProtos of the answer (empty, with `error`, when refused).
  std::vector<pb::FileDescriptorProto> Files(int number, const std::string& name,
                                             std::string* error) {
    pb::UnknownFieldSet response;
    std::vector<pb::FileDescriptorProto> files;
    if (!Ask(LengthField(number, name), &response, error)) return files;
    for (int i = 0; i < response.field_count(); ++i) {
      const pb::UnknownField& f = response.field(i);
      if (f.number() != 4 || f.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      pb::UnknownFieldSet fdr;  // FileDescriptorResponse { repeated bytes file_descriptor_proto }
      if (!fdr.ParseFromString(f.length_delimited())) continue;
      for (int j = 0; j < fdr.field_count(); ++j) {
        pb::FileDescriptorProto file;
        if (fdr.field(j).number() == 1 && file.ParseFromString(fdr.field(j).length_delimited())) {
          files.push_back(std::move(file));
        }
      }
    }
    if (files.empty()) *error = ErrorOf(response);
    return files;
  }

 private:
  // The ErrorResponse (field 7: error_code 1, error_message 2) of a response, as text.
  static std::string ErrorOf(const pb::UnknownFieldSet& response) {
    for (int i = 0; i < response.field_count(); ++i) {
      if (response.field(i).number() != 7) continue;
      pb::UnknownFieldSet e;
      if (!e.ParseFromString(response.field(i).length_delimited())) break;
      std::string out = "reflection error";
      for (int j = 0; j < e.field_count(); ++j) {
        if (e.field(j).number() == 1) out += " " + std::to_string(e.field(j).varint());
        if (e.field(j).number() == 2) out += ": " + e.field(j).length_delimited();
      }
      return out;
    }
    return "no file descriptors in the answer";
  }

  std::shared_ptr<grpc::Channel> channel_;
};

// A descriptor database fed by server reflection only, as grpcurl's and grpc++'s
// ProtoReflectionDescriptorDatabase are: a pool built on it resolves what the server serves.
class ReflectionDatabase final : public pb::DescriptorDatabase {
 public:
  explicit ReflectionDatabase(ReflectionClient* client) : client_(client) {}

  bool FindFileByName(const std::string& filename, pb::FileDescriptorProto* output) override {
    if (cache_.FindFileByName(filename, output)) return true;
    return Fetch(3, filename) && cache_.FindFileByName(filename, output);
  }
  bool FindFileContainingSymbol(const std::string& symbol,
                                pb::FileDescriptorProto* output) override {
    if (cache_.FindFileContainingSymbol(symbol, output)) return true;
    return Fetch(4, symbol) && cache_.FindFileContainingSymbol(symbol, output);
  }
  bool FindFileContainingExtension(const std::string&, int, pb::FileDescriptorProto*) override {
    return false;
  }
  const std::string& last_error() const { return error_; }

 private:
  bool Fetch(int number, const std::string& name) {
    std::vector<pb::FileDescriptorProto> files = client_->Files(number, name, &error_);
    for (const auto& file : files) {
      pb::FileDescriptorProto known;
      if (!cache_.FindFileByName(file.name(), &known)) cache_.Add(file);
    }
    return !files.empty();
  }

  ReflectionClient* client_;
  pb::SimpleDescriptorDatabase cache_;
  std::string error_;
};

// grpc.health.v1.Health/Check for `service`, with request and response built and read
// through `pool` (resolved by reflection): the ServingStatus's name, or "error: ...".
std::string ReflectedHealthCheck(const pb::DescriptorPool& pool,
                                 std::shared_ptr<grpc::Channel> channel,
                                 const std::string& service) {
  const pb::ServiceDescriptor* health = pool.FindServiceByName("grpc.health.v1.Health");
  if (health == nullptr) return "error: grpc.health.v1.Health does not resolve";
  const pb::MethodDescriptor* check = health->FindMethodByName("Check");
  if (check == nullptr) return "error: no Check method";
  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> request(factory.GetPrototype(check->input_type())->New());
  const pb::FieldDescriptor* name = check->input_type()->FindFieldByName("service");
  if (name == nullptr) return "error: no service field in the request";
  request->GetReflection()->SetString(request.get(), name, service);

  std::string resp;
  grpc::Status s =
      testing::UnaryBytesCall(std::move(channel), "/" + health->full_name() + "/" + check->name(),
                              request->SerializeAsString(), &resp);
  if (!s.ok()) return "error: " + s.error_message();
  std::unique_ptr<pb::Message> response(factory.GetPrototype(check->output_type())->New());
  if (!response->ParseFromString(resp)) return "error: the response does not parse";
  const pb::FieldDescriptor* status = check->output_type()->FindFieldByName("status");
  if (status == nullptr || status->enum_type() == nullptr) return "error: no status enum";
  return response->GetReflection()->GetEnum(*response, status)->name();
}

TEST(ReflectionTest, ListsAndResolvesEveryServiceAndChecksHealthThroughIt) {
  FerrydProcess daemon;
  ASSERT_TRUE(daemon.ok()) << daemon.log();
  auto channel = grpc::CreateChannel(daemon.unix_target(), grpc::InsecureChannelCredentials());
  ReflectionClient client(channel);
  std::string error;
  std::vector<std::string> services = client.ListServices(&error);
  ASSERT_FALSE(services.empty()) << error;
  for (const char* want : {"ferry.v1.SessionService", "ferry.v1.Admin", "grpc.health.v1.Health",
                           "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_NE(std::find(services.begin(), services.end(), want), services.end())
        << want << " is not listed";
  }

  // Every listed service resolves to its descriptor through reflection alone (what `grpcurl
  // describe` and a reflection-driven health probe need).
  ReflectionDatabase db(&client);
  pb::DescriptorPool pool(&db);
  for (const std::string& name : services) {
    const pb::ServiceDescriptor* service = pool.FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name << " does not resolve: " << db.last_error();
  }
  const pb::ServiceDescriptor* health = pool.FindServiceByName("grpc.health.v1.Health");
  ASSERT_NE(health, nullptr) << db.last_error();
  EXPECT_EQ(health->file()->name(), "grpc/health/v1/health.proto");
  ASSERT_NE(health->FindMethodByName("Watch"), nullptr);
  EXPECT_TRUE(health->FindMethodByName("Watch")->server_streaming());

  // The health check, its messages built from the resolved descriptors.
  EXPECT_EQ(ReflectedHealthCheck(pool, channel, ""), "SERVING");
  EXPECT_EQ(ReflectedHealthCheck(pool, channel, "ferry.v1.SessionService"), "SERVING");
  EXPECT_EQ(ReflectedHealthCheck(pool, channel, "ferry.v1.Admin"), "SERVING");
  EXPECT_EQ(ReflectedHealthCheck(pool, channel, "no.such.Service").rfind("error: ", 0), 0u);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
}

}  // namespace
}  // namespace ferry
