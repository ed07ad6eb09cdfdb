// proto_interop_tool: the C++ side of the cross-language wire test (interop_test.py).
//
//   proto_interop_tool write   prints the interop samples, one per line:
//                              "<label> <full message type> <hex of the serialized bytes>"
//   proto_interop_tool check   reads lines in the same format from stdin (written by Python),
//                              parses each and compares it with the C++ sample of that label.
//                              Exits 1 naming every mismatch (field by field), a missing or
//                              unexpected label, a wrong type, bad hex or unparseable bytes.
//
// The samples are proto/testing/sample_messages.h; interop_test.py builds the same values.

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/message.h>
#include <google/protobuf/util/message_differencer.h>

#include "proto/testing/sample_messages.h"

namespace {

using google::protobuf::Message;
using tandem::proto_testing::SampleMessage;

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xF]);
  }
  return hex;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string bytes;
  bytes.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int high = HexDigit(hex[i]);
    const int low = HexDigit(hex[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    bytes.push_back(static_cast<char>((high << 4) | low));
  }
  return bytes;
}

// The interop samples, by label.
std::map<std::string, std::unique_ptr<Message>> InteropSamples() {
  std::map<std::string, std::unique_ptr<Message>> by_label;
  std::vector<SampleMessage> all = tandem::proto_testing::AllSampleMessages();
  for (const std::string& label : tandem::proto_testing::InteropSampleLabels()) {
    for (SampleMessage& sample : all) {
      if (sample.label == label) by_label[label] = std::move(sample.message);
    }
  }
  return by_label;
}

int Write() {
  for (const auto& [label, message] : InteropSamples()) {
    std::string bytes;
    if (!message->SerializeToString(&bytes)) {
      std::cerr << "cannot serialize " << label << "\n";
      return 1;
    }
    std::cout << label << ' ' << message->GetTypeName() << ' ' << ToHex(bytes) << '\n';
  }
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}

// Checks one input line against the samples; returns the problems found (empty when none).
std::vector<std::string> CheckLine(const std::string& line,
                                   const std::map<std::string, std::unique_ptr<Message>>& samples,
                                   std::string* label) {
  std::istringstream fields(line);
  std::string type_name;
  std::string hex;
  std::string extra;
  if (!(fields >> *label >> type_name >> hex) || (fields >> extra)) {
    return {"malformed line (want '<label> <type> <hex>'): " + line.substr(0, 80)};
  }
  const auto sample = samples.find(*label);
  if (sample == samples.end()) return {*label + ": no C++ sample has this label"};
  const Message& expected = *sample->second;
  if (type_name != expected.GetTypeName()) {
    return {*label + ": type " + type_name + ", want " + expected.GetTypeName()};
  }
  const std::optional<std::string> bytes = FromHex(hex);
  if (!bytes) return {*label + ": payload is not hex"};
  std::unique_ptr<Message> actual(expected.New());
  if (!actual->ParseFromString(*bytes)) return {*label + ": bytes do not parse as " + type_name};

  std::vector<std::string> problems;
  if (actual->GetReflection()->GetUnknownFields(*actual).field_count() > 0) {
    problems.push_back(*label + ": has fields this build does not know (schemas differ)");
  }
  std::string report;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (!differencer.Compare(expected, *actual)) {
    std::istringstream lines(report);
    for (std::string difference; std::getline(lines, difference);) {
      problems.push_back(*label + ": " + difference);
    }
  }
  return problems;
}

int Check() {
  const std::map<std::string, std::unique_ptr<Message>> samples = InteropSamples();
  std::map<std::string, int> seen;
  std::vector<std::string> problems;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    std::string label;
    for (std::string& problem : CheckLine(line, samples, &label)) problems.push_back(std::move(problem));
    ++seen[label];
  }
  for (const auto& [label, message] : samples) {
    if (seen[label] == 0) problems.push_back(label + ": missing from the input");
    if (seen[label] > 1) problems.push_back(label + ": given more than once");
  }
  for (const std::string& problem : problems) std::cerr << "mismatch: " << problem << "\n";
  if (!problems.empty()) return 1;
  std::cout << "ok: " << samples.size() << " messages match\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc == 2 ? argv[1] : "";
  if (mode == "write") return Write();
  if (mode == "check") return Check();
  std::cerr << "usage: proto_interop_tool write|check\n";
  return 2;
}
