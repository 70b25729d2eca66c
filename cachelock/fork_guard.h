// Keeps a forked (not exec'd) child from inheriting the gate's lock and records.
#pragma once

namespace dflash {

/// Registers `fd` so that in the child of a fork() it is pointed at /dev/null
/// (dup2) before the child runs any code of its own. O_CLOEXEC covers exec;
/// this covers fork without exec: an OFD lock lives as long as any fd of its
/// description, so a child that kept a copy would hold the gate after its
/// parent died. The fd number stays valid in the child, so its owner's later
/// close() closes /dev/null and never a number the child reused.
void GuardFdAcrossFork(int fd);

/// Undoes GuardFdAcrossFork before the fd is closed.
void UnguardFd(int fd);

}  // namespace dflash
