// Exit codes of every dflash binary, in one place. Each comment opens with the meaning
// docs/exit-codes.md gives the code; tests/test_exit_codes.py checks the two agree (and
// that the Python package's copies are these numbers).
#pragma once

namespace dflash::exit_code {

constexpr int kOk = 0;              // success
constexpr int kFailure = 1;         // a runtime failure, explained on stderr
constexpr int kConfig = 2;          // the config is invalid; nothing was spawned
constexpr int kUsage = 64;          // usage error (EX_USAGE: bad command line)
constexpr int kFrameContract = 65;  // a hidden-state frame (or the shared weights) violates the [model] contract (EX_DATAERR)
constexpr int kNoSuchRun = 66;      // `ctl`: no such run, or it has ended (EX_NOINPUT: no control socket, nobody listening)
constexpr int kUnknownTarget = 67;  // `ctl`: the TARGET names no process of the run (EX_NOUSER)
constexpr int kInUse = 69;          // something this run needs is held by another (EX_UNAVAILABLE: run id, live or used before without --resume, port, its node in the store, or the store itself); nothing spawned
constexpr int kNodeFailed = 70;     // store mode: stopped because another node failed, its launcher was lost, or the store was (summary.json names it)
constexpr int kCannotCreate = 73;   // the cache/gate/run directory cannot be created, or is insecure (EX_CANTCREAT)
constexpr int kTimeout = 75;        // timed out: waiting for the gate, for a process to become ready, or for every node at the start barrier (EX_TEMPFAIL)
constexpr int kDeposed = 76;        // store mode: this node stopped because the run moved on without it (its registration was deleted, expired or taken by another launcher, or node 0's session ended); it never re-registers into it
constexpr int kRefused = 77;        // `ctl`/`ps`: refused: the run's control socket or run dir could be another user's (EX_NOPERM)
constexpr int kCheckpointRefused = 78;  // a checkpoint cannot be restored exactly (another run's, damaged with frames it committed, or frames committed by a checkpoint that is gone); never restarted
constexpr int kNotExecutable = 126; // the command exists but cannot be executed
constexpr int kNotFound = 127;      // the command was not found
constexpr int kSignalBase = 128;    // the process was killed by signal N (exit 128+N)

}  // namespace dflash::exit_code
