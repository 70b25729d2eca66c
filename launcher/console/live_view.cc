#include "launcher/console/live_view.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/fd.h"
#include "common/proc_scan.h"

namespace dflash {

std::string CompactDuration(double s) {
  if (s < 0) s = 0;
  auto t = static_cast<int64_t>(s);
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                                   static_cast<long long>(t % 60));
  else if (t < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                                    static_cast<long long>(t % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(t / 86400),
                     static_cast<long long>(t % 86400 / 3600));
  return buf;
}

std::string CompactBytes(int64_t b) {
  if (b < 0) return "-";
  char buf[32];
  double v = static_cast<double>(b);
  if (v < 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.0fK", v / 1024);
  else if (v < 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.0fM", v / (1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1fG", v / (1024.0 * 1024 * 1024));
  return buf;
}

std::string FitLine(std::string_view text, size_t width) {
  std::string out;
  size_t cols = 0;
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
    bool valid = i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (c >= 0x80 && (len == 1 || !valid)) {  // a stray byte: one '?'
      len = 1;
      valid = false;
    }
    if (cols + 1 > width) break;
    if (c < 0x20 || c == 0x7f || !valid) out += '?';
    else out.append(text.substr(i, len));
    ++cols;
    i += len;
  }
  return out;
}

namespace {

const char* StateColor(const std::string& state) {
  if (state == "RUNNING") return "32";
  if (state == "STARTING" || state == "WAITING") return "36";
  if (state == "BACKOFF" || state == "STOPPING") return "33";
  if (state == "FAILED" || state == "FATAL") return "31";
  return "2";  // EXITED, NOT_STARTED: dim
}

std::string Pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

std::vector<std::string> RenderStatus(const RunStatus& st, size_t width, size_t max_lines, bool color) {
  const size_t w = width > 1 ? width - 1 : 1;
  std::vector<std::string> lines;
  size_t running = 0;
  for (const auto& p : st.processes) running += p.state == "RUNNING";
  std::string head = "-- run " + st.run_id + " | up " + CompactDuration(st.uptime_s) + " | " +
                     std::to_string(running) + "/" + std::to_string(st.processes.size()) + " running";
  if (st.stopping) head += " | stopping";
  lines.push_back(FitLine(head, w));
  size_t name_w = 4;
  for (const auto& p : st.processes) name_w = std::max(name_w, std::min<size_t>(p.name.size(), 24));
  // NAME STATE PID GPU GATE RESTARTS RSS CPU UP STATUS
  lines.push_back(FitLine(Pad("NAME", name_w) + " " + Pad("STATE", 11) + " " + Pad("PID", 7) + " " + Pad("GPU", 3) +
                              " " + Pad("GATE", 7) + " " + Pad("RESTARTS", 8) + " " + Pad("RSS", 6) + " " +
                              Pad("CPU", 4) + " " + Pad("UP", 6) + " STATUS",
                          w));
  size_t room = max_lines > 2 ? max_lines - 2 : 0;
  size_t shown = st.processes.size() <= room ? st.processes.size() : (room > 0 ? room - 1 : 0);
  for (size_t i = 0; i < shown; ++i) {
    const ProcessStatus& p = st.processes[i];
    std::string restarts = p.restarts.Text();
    std::string cpu = p.cpu_percent < 0 ? "-" : std::to_string(static_cast<int>(p.cpu_percent + 0.5)) + "%";
    std::string state = p.held ? p.state + "*" : p.state;  // * stopped by hand: stays so until `ctl start`
    std::string text = p.status;
    if (!p.reason.empty() && (text.empty() || (p.state != "RUNNING" && p.state != "STARTING"))) text = p.reason;
    std::string name = FitLine(p.name, name_w);
    std::string prefix = Pad(name, name_w) + " ";
    std::string line = prefix + Pad(state, 11) + " " + Pad(p.pid > 0 ? std::to_string(p.pid) : "-", 7) + " " +
                       Pad(p.gpu.empty() ? "-" : p.gpu, 3) + " " + Pad(p.gate.empty() ? "-" : p.gate, 7) + " " +
                       Pad(restarts, 8) + " " + Pad(CompactBytes(p.rss_bytes), 6) + " " + Pad(cpu, 4) + " " +
                       Pad(p.uptime_s > 0 ? CompactDuration(p.uptime_s) : "-", 6) + " " + text;
    // Trailing spaces of an empty status are noise on a narrow screen.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    line = FitLine(line, w);
    const size_t at = prefix.size();
    if (color && line.size() >= at + state.size()) {
      line = line.substr(0, at) + "\x1b[" + StateColor(p.state) + "m" + state + "\x1b[0m" +
             line.substr(at + state.size());
    }
    lines.push_back(std::move(line));
  }
  if (shown < st.processes.size() && room > 0)
    lines.push_back(FitLine("... " + std::to_string(st.processes.size() - shown) +
                                " more (a taller terminal, or dflash-launch ctl " + st.run_id + " status)",
                            w));
  return lines;
}

std::string LiveScreen::Erase() const {
  if (drawn_ == 0) return "";
  std::string s = "\r";
  if (drawn_ > 1) s += "\x1b[" + std::to_string(drawn_ - 1) + "A";
  s += "\x1b[J";
  return s;
}

std::string LiveScreen::Frame(std::string_view scroll, const std::vector<std::string>& block) {
  std::string out = Erase();
  out.append(scroll);
  for (size_t i = 0; i < block.size(); ++i) {
    out += block[i];
    if (i + 1 < block.size()) out += '\n';
  }
  drawn_ = block.size();
  return out;
}

std::string LiveScreen::Clear() {
  std::string out = Erase();
  drawn_ = 0;
  return out;
}

void ProcMeter::Fill(RunStatus* status) {
  static const long kTicks = ::sysconf(_SC_CLK_TCK);
  static const long kPage = ::sysconf(_SC_PAGESIZE);
  const auto now = std::chrono::steady_clock::now();
  std::map<int, Last> next;
  for (ProcessStatus& p : status->processes) {
    // A payload's MAINPID was checked when it was claimed, but pids are reused: once that process is gone its
    // number may name anyone's. Only a pid still in the process's tree is shown and measured as its payload.
    if (p.payload_pid > 0 && !InProcessTree(p.payload_pid, p.pid)) p.payload_pid = -1;
    int pid = p.payload_pid > 0 ? p.payload_pid : p.pid;
    if (pid <= 0) continue;
    std::string stat, statm, err;
    const std::string base = "/proc/" + std::to_string(pid);
    if (!ReadFile(base + "/stat", &stat, &err) || !ReadFile(base + "/statm", &statm, &err)) continue;
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    // Fields after the name: 3 state ... 14 utime, 15 stime, 22 starttime.
    std::vector<std::string> f;
    size_t i = close + 2;
    while (i < stat.size() && f.size() < 21) {
      size_t sp = stat.find(' ', i);
      f.push_back(stat.substr(i, sp - i));
      if (sp == std::string::npos) break;
      i = sp + 1;
    }
    if (f.size() < 20) continue;
    uint64_t ticks = std::strtoull(f[11].c_str(), nullptr, 10) + std::strtoull(f[12].c_str(), nullptr, 10);
    uint64_t start = std::strtoull(f[19].c_str(), nullptr, 10);
    // statm: size resident shared ... (pages); the second field is the RSS.
    const char* rest = std::strchr(statm.c_str(), ' ');
    long rss_pages = rest ? std::strtol(rest + 1, nullptr, 10) : 0;
    p.rss_bytes = static_cast<int64_t>(rss_pages) * kPage;
    auto it = last_.find(pid);
    if (it != last_.end() && now > it->second.at) {
      double wall = std::chrono::duration<double>(now - it->second.at).count();
      p.cpu_percent = 100.0 * static_cast<double>(ticks - std::min(ticks, it->second.ticks)) / kTicks / wall;
    } else {
      double uptime = 0;
      std::string up;
      if (ReadFile("/proc/uptime", &up, &err)) uptime = std::strtod(up.c_str(), nullptr);
      double age = uptime - static_cast<double>(start) / kTicks;
      p.cpu_percent = age > 0 ? 100.0 * static_cast<double>(ticks) / kTicks / age : 0;
    }
    next[pid] = Last{ticks, now};
  }
  last_ = std::move(next);
}

void TerminalSize(int fd, size_t* width, size_t* height) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    *width = ws.ws_col;
    *height = ws.ws_row;
  } else {
    *width = 80;
    *height = 24;
  }
}

}  // namespace dflash
