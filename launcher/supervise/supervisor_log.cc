#include "launcher/supervise/supervisor_log.h"

#include <fcntl.h>
#include <spdlog/sinks/base_sink.h>

#include <cerrno>
#include <mutex>

#include "common/fd.h"

namespace dflash {
namespace {

class FdSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(UniqueFd fd) : fd_(std::move(fd)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    WriteAll(fd_.get(), std::string_view(buf.data(), buf.size()), nullptr);
  }
  void flush_() override {}

 private:
  UniqueFd fd_;
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

}  // namespace dflash
