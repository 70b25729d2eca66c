#include "spool/spool_order.h"

#include <algorithm>


namespace dflash::spool {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SpoolOrder::SpoolOrder(FrameTransport* transport, int producers, int rank, int world, int64_t start_round)
    : transport_(transport), producers_(producers), rank_(rank), world_(std::max(1, world)),
      skip_(start_round * std::max(1, world) + rank) {}

SpoolOrder::SpoolOrder(SpoolPaths paths, int producers, int rank, int world, int64_t start_round)
    : SpoolOrder(nullptr, producers, rank, world, start_round) {
  own_ = std::make_unique<LocalDirTransport>(std::move(paths.root));
  transport_ = own_.get();
}

SpoolOrder::~SpoolOrder() = default;

bool SpoolOrder::Open(std::string* err) {
  if (producers_ <= 0) {
    *err = "a fixed frame order needs the number of producers (DFLASH_SPOOL_PRODUCERS)";
    return false;
  }
  std::vector<std::string> names;
  if (!transport_->List(FrameState::kRejected, "", &names, err)) return false;
  rejected_ = std::set<std::string>(names.begin(), names.end());
  return true;
}

bool SpoolOrder::Scan(std::string* err) {
  // In the frames' own direction (ready -> claimed -> pending -> done/rejected), so a frame moving while we look
  // is seen further on.
  std::vector<std::string> seen, names;
  for (FrameState s : {FrameState::kReady, FrameState::kClaimed, FrameState::kPending, FrameState::kDone,
                       FrameState::kRejected}) {
    if (!transport_->List(s, "", &names, err)) return false;
    seen.insert(seen.end(), names.begin(), names.end());
  }
  std::string prod;
  int64_t seq;
  for (const std::string& f : seen)
    if (ParseFrameFile(f, &prod, &seq)) {
      auto it = high_.find(prod);
      if (it == high_.end() || seq > it->second) high_[prod] = seq;
    }
  std::map<std::string, int64_t> ends;  // an end being written is not there yet: the next scan reads it
  if (!transport_->Ends(&ends, err)) return false;
  for (const auto& [p, n] : ends) count_.emplace(p, n);
  if (!names_) {
    std::set<std::string> known;
    for (const auto& [p, s] : high_) known.insert(p);
    for (const auto& [p, n] : count_) known.insert(p);
    if (static_cast<int>(known.size()) > producers_) {
      std::string list;
      for (const std::string& p : known) list += (list.empty() ? "" : ", ") + p;
      *err = "the spool has frames from " + std::to_string(known.size()) + " producers (" + list +
             ") but DFLASH_SPOOL_PRODUCERS is " + std::to_string(producers_) +
             ": the fixed order needs them all named up front; use a fresh spool, or set the producer count";
      return false;
    }
    if (static_cast<int>(known.size()) == producers_) names_ = std::vector<std::string>(known.begin(), known.end());
  }
  return true;
}

int SpoolOrder::Has(const std::string& prod, int64_t cycle) const {
  auto h = high_.find(prod);
  if (h != high_.end() && cycle <= h->second) return 1;
  auto c = count_.find(prod);
  if (c != count_.end()) return cycle < c->second ? 1 : 0;
  return -1;
}

bool SpoolOrder::Ended() const {
  if (!names_) return false;
  for (const std::string& p : *names_) {
    auto c = count_.find(p);
    if (c == count_.end() || cycle_ < c->second) return false;
  }
  return true;
}

bool SpoolOrder::NextEntry(const Deadline& deadline, Step* step, std::string* producer, int64_t* seq,
                           std::string* err) {
  const auto t0 = Clock::now();
  int64_t delay_us = 100;
  bool waited = false;
  auto done = [&](Step s) {
    if (waited) waited_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    *step = s;
    return true;
  };
  while (true) {
    if (names_) {
      while (true) {
        if (Ended()) return done(Step::kEnd);
        if (slot_ >= names_->size()) {
          ++cycle_;
          slot_ = 0;
          continue;
        }
        const std::string& prod = (*names_)[slot_];
        const int has = Has(prod, cycle_);
        if (has < 0) break;  // not known yet: look again
        ++slot_;
        if (has) {
          *producer = prod;
          *seq = cycle_;
          return done(Step::kEntry);
        }
      }
    }
    if (waited && !SleepBefore(deadline, &delay_us, 10'000)) return done(Step::kNotYet);
    waited = true;
    if (!Scan(err)) return false;
  }
}

bool SpoolOrder::Next(const Deadline& deadline, Step* step, std::string* producer, int64_t* seq,
                      std::string* err) {
  while (true) {
    if (!NextEntry(deadline, step, producer, seq, err)) return false;
    if (*step != Step::kEntry) return true;
    const std::string f = FrameFile(*producer, *seq);
    if (rejected_.count(f)) {
      skipped_.push_back(f);
      continue;
    }
    const int64_t i = index_++;
    if (i >= skip_ && (i - rank_) % world_ == 0) return true;
  }
}

}  // namespace dflash::spool
