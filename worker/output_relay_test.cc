#include "worker/output_relay.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "common/fd.h"

namespace dflash {
namespace {

/// A memfd the relay writes into; Take() returns what was written since the
/// last Take() (a file, not a pipe, so large writes never block the test).
struct Sink {
  UniqueFd fd{::memfd_create("relay-sink", MFD_CLOEXEC)};
  off_t taken = 0;
  int get() const { return fd.get(); }
  std::string Take() {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = ::pread(fd.get(), buf, sizeof buf, taken)) > 0) {
      s.append(buf, static_cast<size_t>(n));
      taken += n;
    }
    return s;
  }
};

TEST(OutputRelay, WritesAtLineBoundariesAndSplitsLines) {
  Sink sink;
  std::vector<std::string> lines;
  OutputRelay r(sink.get(), [&](std::string_view l) { lines.emplace_back(l); });
  r.Feed("hel");
  EXPECT_EQ(sink.Take(), "");  // a partial line waits
  r.Feed("lo\r\nwor");
  EXPECT_EQ(sink.Take(), "hello\r\n");
  r.Feed("ld\n\npro 10%\rpro 20%\r");
  EXPECT_EQ(sink.Take(), "world\n\npro 10%\rpro 20%\r");  // '\r' flushes: live progress bars
  r.Feed("tail");
  r.Finish();
  EXPECT_EQ(sink.Take(), "tail");
  EXPECT_EQ(lines, (std::vector<std::string>{"hello", "world", "", "pro 10%\rpro 20%\rtail"}));
}

TEST(OutputRelay, StopLinesFromInsideTheCallback) {
  Sink sink;
  int calls = 0;
  OutputRelay* self = nullptr;
  OutputRelay r(sink.get(), [&](std::string_view) {
    ++calls;
    self->StopLines();
  });
  self = &r;
  r.Feed("a\nb\nc\n");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sink.Take(), "a\nb\nc\n");
}

TEST(OutputRelay, LongPartialLineIsNotHeldForever) {
  Sink sink;
  OutputRelay r(sink.get(), nullptr);
  std::string chunk(40000, 'x');
  r.Feed(chunk);
  r.Feed(chunk);  // 80000 > the 64 KiB bound
  EXPECT_EQ(sink.Take().size(), 80000u);
}

}  // namespace
}  // namespace dflash
