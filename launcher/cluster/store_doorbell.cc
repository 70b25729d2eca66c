#include "launcher/cluster/store_doorbell.h"

#include <unistd.h>

namespace dflash {

StoreDoorbell::StoreDoorbell(StoreUrl url, StoreAuth auth, std::string stream, Millis block, Millis retry,
                             std::function<void()> ring)
    : client_(std::move(url), block + Millis(2000), std::move(auth)),
      stream_(std::move(stream)),
      block_(block),
      retry_(retry),
      ring_(std::move(ring)),
      thread_([this] { Loop(); }) {}

StoreDoorbell::~StoreDoorbell() {
  quit_ = true;
  client_.Interrupt();
  thread_.join();
}

void StoreDoorbell::Loop() {
  std::string last = "0";  // from the start: an entry added before this thread read is news too
  while (!quit_) {
    RedisReply r;
    std::string err;
    if (!client_.Command({"XREAD", "BLOCK", std::to_string(block_.count()), "STREAMS", stream_, last}, &r, &err)) {
      // Away (the coordinator's own calls tell the outage): try again later; an interrupt ends it.
      for (Millis slept{0}; slept < retry_ && !quit_; slept += Millis(50)) ::usleep(50000);
      continue;
    }
    // [[stream, [[id, [field, value...]], ...]]]; nil: the block ran out.
    if (r.elements.empty() || r.elements[0].elements.size() < 2) continue;
    const std::vector<RedisReply>& entries = r.elements[0].elements[1].elements;
    if (entries.empty() || entries.back().elements.empty()) continue;
    last = entries.back().elements[0].str;
    if (!quit_) ring_();
  }
}

}  // namespace dflash
