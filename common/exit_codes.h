// Exit codes of every dflash binary, in one place (docs/exit-codes.md lists them).
#pragma once

namespace dflash::exit_code {

constexpr int kOk = 0;
constexpr int kFailure = 1;         // a generic runtime failure, explained on stderr
constexpr int kConfig = 2;          // run.toml is invalid; nothing was spawned
constexpr int kUsage = 64;          // EX_USAGE: bad command line
constexpr int kNoSuchRun = 66;      // EX_NOINPUT: `ctl`: no such run, or it has ended (its control socket is gone)
constexpr int kUnknownTarget = 67;  // EX_NOUSER: `ctl`: the TARGET names no process of the run
constexpr int kInUse = 69;          // EX_UNAVAILABLE: the run id or a port is held by another run; nothing spawned
constexpr int kCannotCreate = 73;   // EX_CANTCREAT: the gate/cache dir cannot be created or is insecure
constexpr int kTimeout = 75;        // EX_TEMPFAIL: waited for the gate or for readiness too long
constexpr int kRefused = 77;        // EX_NOPERM: `ctl`: the run's socket or dir could be another user's, or the run refused us
constexpr int kNotExecutable = 126; // the command exists but cannot be executed
constexpr int kNotFound = 127;      // the command was not found
constexpr int kSignalBase = 128;    // 128+N: killed by signal N

}  // namespace dflash::exit_code
