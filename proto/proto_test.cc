// Tests of the tandem.v1 protos and the C++ code generated from them: round trips of fully
// populated messages, field presence, oneofs, compatibility with newer peers, documentation of
// every element, and the gRPC services end to end on loopback.

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "proto/testing/sample_messages.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::UnknownFieldSet;
using google::protobuf::util::MessageDifferencer;
using proto_testing::AllSampleMessages;
using proto_testing::SampleMessage;

// The .proto files under test.
std::vector<const FileDescriptor*> ProtoFiles() {
  return {v1::GenerateRequest::descriptor()->file(), v1::Snapshot::descriptor()->file()};
}

void CollectMessageTypes(const Descriptor* type, std::vector<const Descriptor*>* out) {
  out->push_back(type);
  for (int i = 0; i < type->nested_type_count(); ++i) CollectMessageTypes(type->nested_type(i), out);
}

// Every message type declared in the .proto files, nested ones included.
std::vector<const Descriptor*> AllMessageTypes() {
  std::vector<const Descriptor*> types;
  for (const FileDescriptor* file : ProtoFiles()) {
    for (int i = 0; i < file->message_type_count(); ++i) CollectMessageTypes(file->message_type(i), &types);
  }
  return types;
}

std::unique_ptr<Message> NewMessage(const Descriptor* type) {
  return std::unique_ptr<Message>(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New());
}

// Serializes `message` and parses the bytes into a fresh message of the same type.
std::unique_ptr<Message> RoundTrip(const Message& message) {
  std::string bytes;
  EXPECT_TRUE(message.SerializeToString(&bytes)) << message.GetTypeName();
  std::unique_ptr<Message> parsed(message.New());
  EXPECT_TRUE(parsed->ParseFromString(bytes)) << message.GetTypeName();
  return parsed;
}

// Empty string when equal, else the differences field by field.
std::string Differences(const Message& expected, const Message& actual) {
  std::string report;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(expected, actual)) return "";
  return report.empty() ? "messages differ" : report;
}

// Sets a singular field to its zero value (empty message for a message field): it is then
// present, for fields that track presence.
void SetToZero(Message* message, const FieldDescriptor* field) {
  const Reflection* reflection = message->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: reflection->SetInt32(message, field, 0); break;
    case FieldDescriptor::CPPTYPE_INT64: reflection->SetInt64(message, field, 0); break;
    case FieldDescriptor::CPPTYPE_UINT32: reflection->SetUInt32(message, field, 0); break;
    case FieldDescriptor::CPPTYPE_UINT64: reflection->SetUInt64(message, field, 0); break;
    case FieldDescriptor::CPPTYPE_FLOAT: reflection->SetFloat(message, field, 0.0F); break;
    case FieldDescriptor::CPPTYPE_DOUBLE: reflection->SetDouble(message, field, 0.0); break;
    case FieldDescriptor::CPPTYPE_BOOL: reflection->SetBool(message, field, false); break;
    case FieldDescriptor::CPPTYPE_ENUM: reflection->SetEnumValue(message, field, 0); break;
    case FieldDescriptor::CPPTYPE_STRING: reflection->SetString(message, field, ""); break;
    case FieldDescriptor::CPPTYPE_MESSAGE: reflection->MutableMessage(message, field); break;
  }
}

// Bytes of extra fields that a newer peer could send: numbers far above any field in use, one of
// each wire type.
std::string FutureFieldBytes() {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream out(&stream);
  out.WriteTag((1000 << 3) | 0);  // varint
  out.WriteVarint64(123456789);
  out.WriteTag((1001 << 3) | 2);  // length-delimited
  out.WriteVarint32(6);
  out.WriteString("future");
  out.WriteTag((1002 << 3) | 1);  // fixed64
  out.WriteLittleEndian64(0xFEDCBA9876543210ULL);
  out.WriteTag((1003 << 3) | 5);  // fixed32
  out.WriteLittleEndian32(0xCAFEF00D);
  return bytes;
}
constexpr int kFutureFieldCount = 4;

// A length-delimited field `number` holding `payload`.
std::string LengthDelimitedField(int number, const std::string& payload) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag((static_cast<uint32_t>(number) << 3) | 2);
    out.WriteVarint32(static_cast<uint32_t>(payload.size()));
    out.WriteString(payload);
  }
  return bytes;
}

// Finds a sample by label; fails the test when there is none.
std::unique_ptr<Message> SampleByLabel(const std::string& label) {
  for (SampleMessage& sample : AllSampleMessages()) {
    if (sample.label == label) return std::move(sample.message);
  }
  ADD_FAILURE() << "no sample labelled " << label;
  return nullptr;
}

std::vector<std::string> SampleLabels() {
  std::vector<std::string> labels;
  for (const SampleMessage& sample : AllSampleMessages()) labels.push_back(sample.label);
  return labels;
}

// ---------------------------------------------------------------------------------------------
// Every sample: round trip, and survival of a newer peer's fields.
// ---------------------------------------------------------------------------------------------

class SampleTest : public testing::TestWithParam<std::string> {};

TEST_P(SampleTest, SerializesAndParsesBackEqual) {
  std::unique_ptr<Message> sample = SampleByLabel(GetParam());
  ASSERT_NE(sample, nullptr);
  std::string bytes;
  ASSERT_TRUE(sample->SerializeToString(&bytes));
  EXPECT_EQ(bytes.size(), sample->ByteSizeLong());

  std::unique_ptr<Message> parsed(sample->New());
  ASSERT_TRUE(parsed->ParseFromString(bytes));
  EXPECT_EQ(Differences(*sample, *parsed), "");
  EXPECT_EQ(parsed->GetReflection()->GetUnknownFields(*parsed).field_count(), 0);
}

TEST_P(SampleTest, KeepsUnknownFieldsFromANewerPeer) {
  std::unique_ptr<Message> sample = SampleByLabel(GetParam());
  ASSERT_NE(sample, nullptr);
  const std::string bytes = sample->SerializeAsString() + FutureFieldBytes();

  std::unique_ptr<Message> parsed(sample->New());
  ASSERT_TRUE(parsed->ParseFromString(bytes));
  const UnknownFieldSet& unknown = parsed->GetReflection()->GetUnknownFields(*parsed);
  ASSERT_EQ(unknown.field_count(), kFutureFieldCount);
  EXPECT_EQ(unknown.field(0).number(), 1000);
  EXPECT_EQ(unknown.field(0).varint(), 123456789U);
  EXPECT_EQ(unknown.field(1).length_delimited(), "future");
  EXPECT_EQ(unknown.field(2).fixed64(), 0xFEDCBA9876543210ULL);
  EXPECT_EQ(unknown.field(3).fixed32(), 0xCAFEF00DU);

  // Known fields are unaffected, and a relay passes the unknown ones on byte for byte.
  std::unique_ptr<Message> known(parsed->New());
  known->CopyFrom(*parsed);
  known->GetReflection()->MutableUnknownFields(known.get())->Clear();
  EXPECT_EQ(Differences(*sample, *known), "");
  EXPECT_EQ(parsed->SerializeAsString(), bytes);
}

INSTANTIATE_TEST_SUITE_P(AllSamples, SampleTest, testing::ValuesIn(SampleLabels()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

void CollectSetFields(const Message& message, std::set<std::string>* fields,
                      std::set<std::string>* types) {
  types->insert(message.GetDescriptor()->full_name());
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> set_fields;
  reflection->ListFields(message, &set_fields);
  for (const FieldDescriptor* field : set_fields) {
    fields->insert(field->full_name());
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        CollectSetFields(reflection->GetRepeatedMessage(message, field, i), fields, types);
      }
    } else {
      CollectSetFields(reflection->GetMessage(message, field), fields, types);
    }
  }
}

// The round-trip tests only mean something if the samples cover the whole schema.
TEST(SampleMessagesTest, SetEveryFieldOfEveryMessage) {
  std::set<std::string> set_fields;
  std::set<std::string> seen_types;
  for (const SampleMessage& sample : AllSampleMessages()) {
    CollectSetFields(*sample.message, &set_fields, &seen_types);
  }
  for (const Descriptor* type : AllMessageTypes()) {
    EXPECT_TRUE(seen_types.count(type->full_name()))
        << "no sample contains a " << type->full_name()
        << "; add one in proto/testing/sample_messages.cc";
    for (int i = 0; i < type->field_count(); ++i) {
      EXPECT_TRUE(set_fields.count(type->field(i)->full_name()))
          << "no sample sets " << type->field(i)->full_name()
          << " to a non-default value; add one in proto/testing/sample_messages.cc";
    }
  }
}

TEST(SampleMessagesTest, LabelsAreUniqueAndInteropLabelsExist) {
  const std::vector<std::string> labels = SampleLabels();
  const std::set<std::string> unique(labels.begin(), labels.end());
  EXPECT_EQ(unique.size(), labels.size());
  for (const std::string& label : proto_testing::InteropSampleLabels()) {
    EXPECT_TRUE(unique.count(label)) << label;
  }
}

// ---------------------------------------------------------------------------------------------
// Field presence and oneofs.
// ---------------------------------------------------------------------------------------------

// `optional` fields keep "set to zero" apart from "unset" across the wire, in every message.
TEST(PresenceTest, OptionalFieldSetToZeroDiffersFromUnsetAfterRoundTrip) {
  int optional_fields = 0;
  for (const Descriptor* type : AllMessageTypes()) {
    for (int i = 0; i < type->field_count(); ++i) {
      const FieldDescriptor* field = type->field(i);
      if (!field->has_optional_keyword()) continue;
      ++optional_fields;
      SCOPED_TRACE(field->full_name());

      std::unique_ptr<Message> unset = NewMessage(type);
      EXPECT_EQ(unset->ByteSizeLong(), 0U);
      std::unique_ptr<Message> unset_parsed = RoundTrip(*unset);
      EXPECT_FALSE(unset_parsed->GetReflection()->HasField(*unset_parsed, field));

      std::unique_ptr<Message> zero = NewMessage(type);
      SetToZero(zero.get(), field);
      EXPECT_GT(zero->ByteSizeLong(), 0U) << "a present zero must be on the wire";
      std::unique_ptr<Message> zero_parsed = RoundTrip(*zero);
      EXPECT_TRUE(zero_parsed->GetReflection()->HasField(*zero_parsed, field));
    }
  }
  // At least SamplingParams (10), TokenizeRequest, BlocksStored and PrefillResponse (1 each).
  EXPECT_GE(optional_fields, 13);
}

// The SamplingParams scalars where "unset = server default" must differ from 0.
TEST(PresenceTest, SamplingParamsScalarsAreOptional) {
  const Descriptor* type = v1::SamplingParams::descriptor();
  for (const char* name : {"max_tokens", "temperature", "top_p", "min_p", "top_k", "repetition_penalty",
                           "frequency_penalty", "presence_penalty", "seed", "min_tokens"}) {
    const FieldDescriptor* field = type->FindFieldByName(name);
    ASSERT_NE(field, nullptr) << name;
    EXPECT_TRUE(field->has_optional_keyword()) << name;
  }
  v1::SamplingParams greedy;
  greedy.set_temperature(0.0F);
  v1::SamplingParams parsed;
  ASSERT_TRUE(parsed.ParseFromString(greedy.SerializeAsString()));
  EXPECT_TRUE(parsed.has_temperature());
  EXPECT_EQ(parsed.temperature(), 0.0F);
  EXPECT_FALSE(parsed.has_top_p());
}

// Every case of every oneof survives a round trip, even when its value is empty.
TEST(OneofTest, CaseSurvivesRoundTripEvenWithEmptyValue) {
  int cases = 0;
  for (const Descriptor* type : AllMessageTypes()) {
    for (int o = 0; o < type->oneof_decl_count(); ++o) {
      const google::protobuf::OneofDescriptor* oneof = type->oneof_decl(o);
      if (oneof->is_synthetic()) continue;  // A proto3 `optional`, tested above.
      for (int f = 0; f < oneof->field_count(); ++f) {
        const FieldDescriptor* field = oneof->field(f);
        SCOPED_TRACE(field->full_name());
        ++cases;
        std::unique_ptr<Message> message = NewMessage(type);
        SetToZero(message.get(), field);
        std::unique_ptr<Message> parsed = RoundTrip(*message);
        EXPECT_EQ(parsed->GetReflection()->GetOneofFieldDescriptor(*parsed, oneof), field);
      }
      std::unique_ptr<Message> parsed = RoundTrip(*NewMessage(type));
      EXPECT_EQ(parsed->GetReflection()->GetOneofFieldDescriptor(*parsed, oneof), nullptr)
          << oneof->full_name() << " must stay unset";
    }
  }
  // GenerateRequest.input (3), TokenizeRequest.input (2), WorkerStateUpdate.update (3),
  // KvEvent.kind (3), ResponseFormat.format (5).
  EXPECT_EQ(cases, 16);

  v1::GenerateRequest request;
  request.set_prompt("");
  v1::GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  EXPECT_EQ(parsed.input_case(), v1::GenerateRequest::kPrompt);
}

// ---------------------------------------------------------------------------------------------
// A newer peer: unknown nested fields, enum values and oneof cases.
// ---------------------------------------------------------------------------------------------

TEST(CompatibilityTest, KeepsUnknownFieldsInsideNestedMessages) {
  v1::GenerateRequest request = proto_testing::SampleGenerateRequest(v1::GenerateRequest::kPrompt);
  const std::string sampling_bytes = request.sampling().SerializeAsString() + FutureFieldBytes();
  request.clear_sampling();
  const std::string bytes = request.SerializeAsString() +
                            LengthDelimitedField(v1::GenerateRequest::kSamplingFieldNumber, sampling_bytes);

  v1::GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.sampling().GetReflection()->GetUnknownFields(parsed.sampling()).field_count(),
            kFutureFieldCount);
  EXPECT_EQ(parsed.sampling().top_k(), 40);
  v1::GenerateRequest relayed;
  ASSERT_TRUE(relayed.ParseFromString(parsed.SerializeAsString()));
  EXPECT_EQ(relayed.sampling().GetReflection()->GetUnknownFields(relayed.sampling()).field_count(),
            kFutureFieldCount);
}

TEST(CompatibilityTest, KeepsUnknownEnumValues) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag((v1::GenerateResponse::kFinishReasonFieldNumber << 3) | 0);
    out.WriteVarint32(99);  // A FinishReason added later.
  }
  v1::GenerateResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(static_cast<int>(parsed.finish_reason()), 99);
  EXPECT_FALSE(v1::FinishReason_IsValid(parsed.finish_reason()));
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
}

TEST(CompatibilityTest, UnknownOneofCaseLeavesCaseUnsetAndIsKept) {
  const std::string bytes = LengthDelimitedField(9, "new kind of update");
  v1::WorkerStateUpdate parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.update_case(), v1::WorkerStateUpdate::UPDATE_NOT_SET);
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
}

// ---------------------------------------------------------------------------------------------
// Style: enums and comments.
// ---------------------------------------------------------------------------------------------

// Zero value <PREFIX>_UNSPECIFIED, every value carries the same prefix (enum values share the
// package's namespace).
TEST(StyleTest, EnumValuesArePrefixedAndZeroIsUnspecified) {
  int enums = 0;
  for (const FileDescriptor* file : ProtoFiles()) {
    for (int e = 0; e < file->enum_type_count(); ++e) {
      const google::protobuf::EnumDescriptor* type = file->enum_type(e);
      ++enums;
      const google::protobuf::EnumValueDescriptor* zero = type->FindValueByNumber(0);
      ASSERT_NE(zero, nullptr) << type->full_name();
      const std::string suffix = "_UNSPECIFIED";
      ASSERT_GT(zero->name().size(), suffix.size()) << zero->name();
      ASSERT_EQ(zero->name().substr(zero->name().size() - suffix.size()), suffix) << type->full_name();
      const std::string prefix = zero->name().substr(0, zero->name().size() - suffix.size() + 1);
      for (int v = 0; v < type->value_count(); ++v) {
        EXPECT_EQ(type->value(v)->name().rfind(prefix, 0), 0U)
            << type->value(v)->full_name() << " lacks the prefix " << prefix;
      }
    }
  }
  EXPECT_EQ(enums, 4);  // FinishReason, WorkerRole, MemoryType, DType.
}

// Checks that every element of a .proto file has a comment, from protoc's source info.
class CommentChecker {
 public:
  explicit CommentChecker(const google::protobuf::FileDescriptorProto& file) : file_(file) {
    for (const auto& location : file.source_code_info().location()) {
      if (!location.leading_comments().empty() || !location.trailing_comments().empty() ||
          location.leading_detached_comments_size() > 0) {
        commented_.insert(std::vector<int>(location.path().begin(), location.path().end()));
      }
    }
  }

  void CheckFile() {
    Expect({12}, "the file (a paragraph before `syntax`)");
    for (int i = 0; i < file_.message_type_size(); ++i) CheckMessage(file_.message_type(i), {4, i});
    for (int i = 0; i < file_.enum_type_size(); ++i) CheckEnum(file_.enum_type(i), {5, i});
    for (int s = 0; s < file_.service_size(); ++s) {
      const auto& service = file_.service(s);
      Expect({6, s}, "service " + service.name());
      for (int m = 0; m < service.method_size(); ++m) {
        Expect({6, s, 2, m}, "rpc " + service.name() + "." + service.method(m).name());
      }
    }
  }

 private:
  // Field numbers of descriptor.proto, as source-info paths use them.
  void CheckMessage(const google::protobuf::DescriptorProto& message, std::vector<int> path) {
    Expect(path, "message " + message.name());
    std::set<int> synthetic_oneofs;
    for (int i = 0; i < message.field_size(); ++i) {
      const auto& field = message.field(i);
      if (field.proto3_optional()) synthetic_oneofs.insert(field.oneof_index());
      Expect(Child(path, 2, i), "field " + message.name() + "." + field.name());
    }
    for (int i = 0; i < message.oneof_decl_size(); ++i) {
      if (synthetic_oneofs.count(i)) continue;
      Expect(Child(path, 8, i), "oneof " + message.name() + "." + message.oneof_decl(i).name());
    }
    for (int i = 0; i < message.nested_type_size(); ++i) CheckMessage(message.nested_type(i), Child(path, 3, i));
    for (int i = 0; i < message.enum_type_size(); ++i) CheckEnum(message.enum_type(i), Child(path, 4, i));
  }

  void CheckEnum(const google::protobuf::EnumDescriptorProto& type, const std::vector<int>& path) {
    Expect(path, "enum " + type.name());
    for (int i = 0; i < type.value_size(); ++i) Expect(Child(path, 2, i), "enum value " + type.value(i).name());
  }

  static std::vector<int> Child(std::vector<int> path, int kind, int index) {
    path.push_back(kind);
    path.push_back(index);
    return path;
  }

  void Expect(const std::vector<int>& path, const std::string& what) {
    EXPECT_TRUE(commented_.count(path)) << file_.name() << ": " << what << " has no comment";
  }

  const google::protobuf::FileDescriptorProto& file_;
  std::set<std::vector<int>> commented_;
};

TEST(StyleTest, EveryElementHasAComment) {
  std::ifstream in(TANDEM_PROTO_DESCRIPTOR_SET, std::ios::binary);
  ASSERT_TRUE(in) << "cannot open " << TANDEM_PROTO_DESCRIPTOR_SET;
  std::stringstream contents;
  contents << in.rdbuf();
  google::protobuf::FileDescriptorSet set;
  ASSERT_TRUE(set.ParseFromString(contents.str()));

  std::set<std::string> checked;
  for (const auto& file : set.file()) {
    CommentChecker(file).CheckFile();
    checked.insert(file.name());
  }
  EXPECT_EQ(checked, (std::set<std::string>{"tandem/v1/inference.proto", "tandem/v1/worker.proto"}));
}

// ---------------------------------------------------------------------------------------------
// The generated services, end to end over gRPC on loopback.
// ---------------------------------------------------------------------------------------------

// Streams `sampling.max_tokens` deltas: token i has id 100 + i and text "<i>". The last one
// carries the finish reason and usage.
class FakeInference final : public v1::Inference::Service {
 public:
  grpc::Status ListModels(grpc::ServerContext* /*context*/, const v1::ListModelsRequest* /*request*/,
                          v1::ListModelsResponse* response) override {
    *response = proto_testing::SampleListModelsResponse();
    return grpc::Status::OK;
  }

  grpc::Status Generate(grpc::ServerContext* /*context*/, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    if (request->input_case() == v1::GenerateRequest::INPUT_NOT_SET) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no input");
    }
    const uint32_t deltas = request->sampling().max_tokens();
    for (uint32_t i = 0; i < deltas; ++i) {
      v1::GenerateResponse response;
      response.set_request_id(request->request_id());
      response.add_token_ids(100 + static_cast<int32_t>(i));
      response.set_text("<" + std::to_string(i) + ">");
      if (i + 1 == deltas) {
        response.set_finish_reason(v1::FINISH_REASON_LENGTH);
        response.mutable_usage()->set_completion_tokens(deltas);
      }
      if (!writer->Write(response)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    }
    return grpc::Status::OK;
  }
};

// Sends a snapshot, then one batch of KV events.
class FakeWorkerState final : public v1::WorkerState::Service {
 public:
  grpc::Status WatchState(grpc::ServerContext* /*context*/, const v1::WatchStateRequest* /*request*/,
                          grpc::ServerWriter<v1::WorkerStateUpdate>* writer) override {
    v1::WorkerStateUpdate update;
    *update.mutable_snapshot() = proto_testing::SampleSnapshot();
    writer->Write(update);
    *update.mutable_kv_events() = proto_testing::SampleKvEventBatch();
    writer->Write(update);
    return grpc::Status::OK;
  }
};

class ServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&inference_);
    builder.RegisterService(&worker_state_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // A client context that cannot hang the test.
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  FakeInference inference_;
  FakeWorkerState worker_state_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServiceTest, ListModelsReturnsTheServersModels) {
  auto stub = v1::Inference::NewStub(channel_);
  v1::ListModelsResponse response;
  grpc::Status status = stub->ListModels(Context().get(), v1::ListModelsRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Differences(proto_testing::SampleListModelsResponse(), response), "");
}

TEST_F(ServiceTest, GenerateStreamsDeltasThenFinishes) {
  auto stub = v1::Inference::NewStub(channel_);
  for (auto input : {v1::GenerateRequest::kPrompt, v1::GenerateRequest::kChat, v1::GenerateRequest::kTokenIds}) {
    SCOPED_TRACE(input);
    v1::GenerateRequest request = proto_testing::SampleGenerateRequest(input);
    request.mutable_sampling()->set_max_tokens(3);
    auto context = Context();
    auto reader = stub->Generate(context.get(), request);

    std::vector<v1::GenerateResponse> responses;
    v1::GenerateResponse response;
    while (reader->Read(&response)) responses.push_back(response);
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();

    ASSERT_EQ(responses.size(), 3U);
    std::string text;
    for (size_t i = 0; i < responses.size(); ++i) {
      EXPECT_EQ(responses[i].request_id(), request.request_id());
      ASSERT_EQ(responses[i].token_ids_size(), 1);
      EXPECT_EQ(responses[i].token_ids(0), 100 + static_cast<int32_t>(i));
      EXPECT_EQ(responses[i].finish_reason(),
                i + 1 == responses.size() ? v1::FINISH_REASON_LENGTH : v1::FINISH_REASON_UNSPECIFIED);
      EXPECT_EQ(responses[i].has_usage(), i + 1 == responses.size());
      text += responses[i].text();
    }
    EXPECT_EQ(text, "<0><1><2>");
    EXPECT_EQ(responses.back().usage().completion_tokens(), 3U);
  }
}

TEST_F(ServiceTest, StatusCodesCrossTheWire) {
  auto inference = v1::Inference::NewStub(channel_);
  {
    auto context = Context();
    auto reader = inference->Generate(context.get(), v1::GenerateRequest());
    v1::GenerateResponse response;
    EXPECT_FALSE(reader->Read(&response));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  v1::TokenizeResponse tokenized;
  EXPECT_EQ(inference->Tokenize(Context().get(), v1::TokenizeRequest(), &tokenized).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  // Services that this server does not register: their stubs reach it and get UNIMPLEMENTED.
  v1::PrefillResponse prefilled;
  EXPECT_EQ(v1::Prefill::NewStub(channel_)
                ->Prefill(Context().get(), proto_testing::SamplePrefillRequest(), &prefilled)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  v1::CancelResponse cancelled;
  EXPECT_EQ(v1::Decode::NewStub(channel_)->Cancel(Context().get(), v1::CancelRequest(), &cancelled).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(ServiceTest, WatchStateOpensWithASnapshot) {
  auto stub = v1::WorkerState::NewStub(channel_);
  auto context = Context();
  auto reader = stub->WatchState(context.get(), proto_testing::SampleWatchStateRequest());
  std::vector<v1::WorkerStateUpdate> updates;
  v1::WorkerStateUpdate update;
  while (reader->Read(&update)) updates.push_back(update);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(updates.size(), 2U);
  ASSERT_EQ(updates[0].update_case(), v1::WorkerStateUpdate::kSnapshot);
  EXPECT_EQ(Differences(proto_testing::SampleSnapshot(), updates[0].snapshot()), "");
  ASSERT_EQ(updates[1].update_case(), v1::WorkerStateUpdate::kKvEvents);
  EXPECT_EQ(Differences(proto_testing::SampleKvEventBatch(), updates[1].kv_events()), "");
}

}  // namespace
}  // namespace tandem
