#include "common/signal_names.h"

#include <csignal>
#include <strings.h>

namespace dflash {
namespace {

struct Entry { const char* name; int sig; };
constexpr Entry kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},     {"SIGQUIT", SIGQUIT}, {"SIGILL", SIGILL},
    {"SIGTRAP", SIGTRAP}, {"SIGABRT", SIGABRT},   {"SIGBUS", SIGBUS},   {"SIGFPE", SIGFPE},
    {"SIGKILL", SIGKILL}, {"SIGUSR1", SIGUSR1},   {"SIGSEGV", SIGSEGV}, {"SIGUSR2", SIGUSR2},
    {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM},   {"SIGTERM", SIGTERM}, {"SIGCHLD", SIGCHLD},
    {"SIGCONT", SIGCONT}, {"SIGSTOP", SIGSTOP},   {"SIGTSTP", SIGTSTP}, {"SIGTTIN", SIGTTIN},
    {"SIGTTOU", SIGTTOU}, {"SIGURG", SIGURG},     {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ},
    {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF}, {"SIGWINCH", SIGWINCH}, {"SIGIO", SIGIO},
    {"SIGPWR", SIGPWR},   {"SIGSYS", SIGSYS},
};

const char* const kNames[] = {
    "SIGHUP",  "SIGINT",  "SIGQUIT", "SIGILL",  "SIGTRAP", "SIGABRT",   "SIGBUS",  "SIGFPE",
    "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM",   "SIGTERM", "SIGCHLD",
    "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG",    "SIGXCPU", "SIGXFSZ",
    "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO", "SIGPWR", "SIGSYS",   nullptr};

}  // namespace

int SignalFromName(std::string_view name) {
  std::string n(name);
  if (n.size() < 3 || strncasecmp(n.c_str(), "SIG", 3) != 0) n = "SIG" + n;
  for (const Entry& e : kSignals)
    if (strcasecmp(e.name, n.c_str()) == 0) return e.sig;
  return 0;
}

std::string SignalName(int sig) {
  for (const Entry& e : kSignals)
    if (e.sig == sig) return e.name;
  return "SIG" + std::to_string(sig);
}

const char* const* SignalNames() { return kNames; }

}  // namespace dflash
