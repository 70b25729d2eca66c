#include "launcher/metrics/spool_count.h"

#include "spool/frame_transport.h"

namespace dflash {

SpoolCounts CountSpool(const std::string& root, bool with_done) {
  // The spool's own transport counts (spool/frame_transport.h): no state is spelled here.
  const spool::FrameCounts n = spool::LocalDirTransport(root).Count(with_done);
  SpoolCounts c;
  c.present = n.present;
  c.writing = n.writing;
  c.ready = n.ready;
  c.claimed = n.claimed;
  c.pending = n.pending;
  c.done = n.done;
  c.rejected = n.rejected;
  return c;
}

}  // namespace dflash
