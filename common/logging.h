// Process-wide logging: severities, text or JSON-lines output, and CHECK for broken invariants.
//
//   LOG(INFO) << "listening on " << port;
//   LOG(WARNING) << "UCX chose tcp for peer " << peer;
//   CHECK(block < num_blocks) << "block " << block;   // internal invariants only, never input
//
// Text lines look like `2026-12-02T14:00:00.123456Z I 1234 server.cc:42] listening on 8000`.
// JSON lines (for log collectors) look like
// `{"ts":"2026-12-02T14:00:00.123456Z","level":"INFO","thread":1234,"src":"server.cc:42","msg":"..."}`.
//
// Thread-safe: each record is formatted on the calling thread and written whole, under a lock, to
// the sink (stderr by default). LOG(FATAL) and a failed CHECK write the record and abort.
#ifndef TANDEM_COMMON_LOGGING_H_
#define TANDEM_COMMON_LOGGING_H_

#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };
enum class LogFormat { kText, kJson };

struct LogOptions {
  // Records below this severity are dropped (their stream expressions are not evaluated).
  LogSeverity min_severity = LogSeverity::kInfo;
  // kText for people, kJson for one JSON object per line.
  LogFormat format = LogFormat::kText;
};

void SetLogOptions(const LogOptions& options);
LogOptions GetLogOptions();

// Parses "debug" | "info" | "warning" | "error" (case-insensitive; "warn" too).
absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view text);
// Parses "text" | "json".
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text);
absl::string_view LogSeverityName(LogSeverity severity);

// One log record, as handed to the formatter.
struct LogRecord {
  absl::Time time;
  LogSeverity severity = LogSeverity::kInfo;
  absl::string_view file;  // basename is printed
  int line = 0;
  long thread_id = 0;  // NOLINT(runtime/int): matches gettid()
  absl::string_view message;
};

// Formats `record` as one line, without the trailing newline.
std::string FormatLogRecord(const LogRecord& record, LogFormat format);

// Appends `text` to `out` as a JSON string literal (quotes included), escaping control characters
// and replacing invalid UTF-8 with U+FFFD so every line stays valid JSON.
void AppendJsonString(std::string* out, absl::string_view text);

// Receives each formatted line (newline included). Implementations must be thread-safe.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Write(absl::string_view line) = 0;
};

// Replaces the process's sink and returns the previous one; nullptr restores stderr. The sink is
// not owned and must outlive its installation. Meant for tests.
LogSink* SetLogSinkForTesting(LogSink* sink);

namespace log_internal {

bool Enabled(LogSeverity severity);

// Severity constants named as the LOG() macro spells them.
inline constexpr LogSeverity kSeverity_DEBUG = LogSeverity::kDebug;
inline constexpr LogSeverity kSeverity_INFO = LogSeverity::kInfo;
inline constexpr LogSeverity kSeverity_WARNING = LogSeverity::kWarning;
inline constexpr LogSeverity kSeverity_ERROR = LogSeverity::kError;
inline constexpr LogSeverity kSeverity_FATAL = LogSeverity::kFatal;

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 protected:
  void Flush();

 private:
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
  bool flushed_ = false;
};

class LogMessageFatal : public LogMessage {
 public:
  LogMessageFatal(const char* file, int line);
  [[noreturn]] ~LogMessageFatal();
};

// Turns `stream << ...` into void so it fits the conditional operator in the macros.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace log_internal
}  // namespace tandem

#define TANDEM_LOG_STREAM_DEBUG \
  ::tandem::log_internal::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kDebug).stream()
#define TANDEM_LOG_STREAM_INFO \
  ::tandem::log_internal::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kInfo).stream()
#define TANDEM_LOG_STREAM_WARNING \
  ::tandem::log_internal::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kWarning).stream()
#define TANDEM_LOG_STREAM_ERROR \
  ::tandem::log_internal::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kError).stream()
#define TANDEM_LOG_STREAM_FATAL ::tandem::log_internal::LogMessageFatal(__FILE__, __LINE__).stream()

// LOG(DEBUG|INFO|WARNING|ERROR|FATAL) << ...;
#define LOG(severity)                                                       \
  !::tandem::log_internal::Enabled(::tandem::log_internal::kSeverity_##severity) \
      ? (void)0                                                             \
      : ::tandem::log_internal::Voidify() & TANDEM_LOG_STREAM_##severity

// Aborts with the condition's text (and anything streamed) when `condition` is false. For broken
// internal invariants only; external input gets an absl::Status.
#define CHECK(condition)                         \
  (condition) ? (void)0                          \
              : ::tandem::log_internal::Voidify() & \
                    TANDEM_LOG_STREAM_FATAL << "Check failed: " #condition " "

// Aborts when `status_expr` (an absl::Status) is not OK, printing it.
#define CHECK_OK(status_expr)                                                     \
  do {                                                                            \
    const ::absl::Status tandem_check_status_ = (status_expr);                    \
    CHECK(tandem_check_status_.ok()) << #status_expr << ": " << tandem_check_status_; \
  } while (false)

#ifdef NDEBUG
#define DCHECK(condition) \
  while (false) CHECK(condition)
#else
#define DCHECK(condition) CHECK(condition)
#endif

#endif  // TANDEM_COMMON_LOGGING_H_
