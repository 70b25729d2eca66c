#include "launcher/commands/supervisor_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <spdlog/sinks/base_sink.h>

#include <cerrno>
#include <mutex>

#include "common/fd.h"

namespace dflash {
namespace {

class FdSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(UniqueFd fd) : fd_(std::move(fd)) {}

  std::string Loss() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lost_ == 0) return "";
    return "supervisor.log lost " + std::to_string(lost_) + " line" + (lost_ == 1 ? "" : "s") + " from " +
           first_lost_ + " on: " + error_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    struct stat st{};
    bool sized = ::fstat(fd_.get(), &st) == 0;
    std::string err;
    if (WriteAll(fd_.get(), std::string_view(buf.data(), buf.size()), &err)) return;
    // ENOSPC after part of the line: take the part back, so the file ends
    // with the last whole line, and count the loss (said at the end of the run).
    if (sized && ::ftruncate(fd_.get(), st.st_size) != 0) {}  // nothing more to do: the loss is counted
    if (lost_++ == 0) {
      error_ = err;
      std::string line(buf.data(), buf.size());
      first_lost_ = line.substr(0, line.find('.'));  // "2026-12-02 04:40:01"
    }
  }
  void flush_() override {}

 private:
  UniqueFd fd_;
  size_t lost_ = 0;         // lines that did not reach the file
  std::string error_;       // why the first did not
  std::string first_lost_;  // when
};

}  // namespace

std::shared_ptr<spdlog::logger> OpenSupervisorLog(const std::string& path, const FileMode& files, std::string* err) {
  UniqueFd fd(OpenPrivateFile(path, O_WRONLY | O_APPEND, files, RunDirUse(), err));
  if (!fd) return nullptr;
  auto logger = std::make_shared<spdlog::logger>("dflash", std::make_shared<FdSink>(std::move(fd)));
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%f %l %v");  // microseconds: the benchmarks read these
  logger->set_level(spdlog::level::debug);
  logger->flush_on(spdlog::level::debug);
  return logger;
}

std::string SupervisorLogLoss(const spdlog::logger& log) {
  for (const auto& sink : log.sinks())
    if (auto* fd_sink = dynamic_cast<FdSink*>(sink.get())) return fd_sink->Loss();
  return "";
}

}  // namespace dflash
