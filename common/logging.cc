#include "common/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem {
namespace {

std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};

class StderrSink final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
};

absl::Mutex g_sink_mu;
LogSink* g_sink ABSL_GUARDED_BY(g_sink_mu) = nullptr;  // nullptr: stderr

LogSink& DefaultSink() {
  static StderrSink* sink = new StderrSink();  // never destroyed: logging works during exit
  return *sink;
}

absl::string_view Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

long CurrentThreadId() { return static_cast<long>(::syscall(SYS_gettid)); }  // NOLINT

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it is invalid.
size_t Utf8SequenceLength(absl::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  size_t len;
  uint32_t min;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  uint32_t cp = b0 & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

void SetLogOptions(const LogOptions& options) {
  g_min_severity.store(static_cast<int>(options.min_severity), std::memory_order_relaxed);
  g_format.store(static_cast<int>(options.format), std::memory_order_relaxed);
}

LogOptions GetLogOptions() {
  LogOptions options;
  options.min_severity = static_cast<LogSeverity>(g_min_severity.load(std::memory_order_relaxed));
  options.format = static_cast<LogFormat>(g_format.load(std::memory_order_relaxed));
  return options;
}

absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") return LogSeverity::kDebug;
  if (lower == "info") return LogSeverity::kInfo;
  if (lower == "warning" || lower == "warn") return LogSeverity::kWarning;
  if (lower == "error") return LogSeverity::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "' (expected debug, info, warning or error)"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "text") return LogFormat::kText;
  if (lower == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log format '", text, "' (expected text or json)"));
}

absl::string_view LogSeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return "DEBUG";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
    case LogSeverity::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  while (!text.empty()) {
    const auto c = static_cast<unsigned char>(text[0]);
    if (c >= 0x80) {
      const size_t len = Utf8SequenceLength(text);
      if (len == 0) {
        out->append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
        text.remove_prefix(1);
      } else {
        out->append(text.data(), len);
        text.remove_prefix(len);
      }
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppend(out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    text.remove_prefix(1);
  }
  out->push_back('"');
}

std::string FormatLogRecord(const LogRecord& record, LogFormat format) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", record.time, absl::UTCTimeZone());
  const absl::string_view file = Basename(record.file);
  if (format == LogFormat::kJson) {
    std::string out = absl::StrCat("{\"ts\":\"", ts, "\",\"level\":\"",
                                   LogSeverityName(record.severity), "\",\"thread\":",
                                   record.thread_id, ",\"src\":");
    AppendJsonString(&out, absl::StrCat(file, ":", record.line));
    out.append(",\"msg\":");
    AppendJsonString(&out, record.message);
    out.push_back('}');
    return out;
  }
  return absl::StrCat(ts, " ", LogSeverityName(record.severity).substr(0, 1), " ",
                      record.thread_id, " ", file, ":", record.line, "] ", record.message);
}

LogSink* SetLogSinkForTesting(LogSink* sink) {
  absl::MutexLock lock(&g_sink_mu);
  LogSink* previous = g_sink;
  g_sink = sink;
  return previous;
}

namespace log_internal {

bool Enabled(LogSeverity severity) {
  return static_cast<int>(severity) >= g_min_severity.load(std::memory_order_relaxed);
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() { Flush(); }

void LogMessage::Flush() {
  if (flushed_) return;
  flushed_ = true;
  const std::string message = stream_.str();
  LogRecord record;
  record.time = absl::Now();
  record.severity = severity_;
  record.file = file_;
  record.line = line_;
  record.thread_id = CurrentThreadId();
  record.message = message;
  std::string line = FormatLogRecord(record, GetLogOptions().format);
  line.push_back('\n');
  absl::MutexLock lock(&g_sink_mu);
  (g_sink != nullptr ? *g_sink : DefaultSink()).Write(line);
}

LogMessageFatal::LogMessageFatal(const char* file, int line)
    : LogMessage(file, line, LogSeverity::kFatal) {}

LogMessageFatal::~LogMessageFatal() {
  Flush();
  std::abort();
}

}  // namespace log_internal
}  // namespace tandem
