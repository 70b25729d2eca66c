// One console line for what several processes of one role say alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dflash {

/// The line with every run of digits (and every 0x hex literal) as one '*':
/// "rank 3 at 0x7f3a step 12" -> "rank * at * step *". Two lines match when
/// their masks do, as Ray's LogDeduplicator matches them (so "rank 0 ready"
/// and "rank 1 ready" are one line said by two processes).
std::string MaskNumbers(std::string_view line);

/// "0-2", "0,2", "0-2,5": the ranks (sorted, unique) as ranges.
std::string RankRanges(std::vector<int> ranks);

/// One line out of `texts` (what several ranks said, in rank order; their
/// MaskNumbers alike): each number they said alike once, each number that
/// differs as every rank's value in rank order, "step 50 loss 4.11|4.21|4.31".
/// A number is a digit run or 0x literal with what joins it to the next ("4.11",
/// "1e-05", "1.2.3") and a sign before it ("-0.5"). False when the texts do not
/// line up piece by piece (a literal '*' in one of them masks like a number):
/// then the caller prints each rank's own line.
bool MergeNumbers(const std::vector<std::string>& texts, std::string* out);

/// Holds each line of a group (one role's stdout, or its stderr) for `window`
/// from its first saying; other members (ranks) of the group that say the
/// same line (by MaskNumbers) within it join that line instead of being
/// printed again. Each member's lines stay in its own order: a member joins
/// only a held line newer than the last one it said. Nothing is dropped: a
/// line said by one member comes out as it was said, only later.
///
/// Pure (the caller passes the clock), not thread-safe: the Console calls it
/// under its lock.
class LineDedup {
 public:
  using Clock = std::chrono::steady_clock;
  struct Line {
    int group = 0;
    std::vector<int> members;   // in the order they said it; the first is the one printed
    std::vector<int> sources;   // the caller's tags (Console's SourceId), one per member
    std::string text;           // the first member's words
    bool varied = false;        // some members said it with other numbers
    std::vector<std::string> texts;  // varied: each member's own words, as `members`
    bool verbatim = false;      // AddAfterHeld: the caller's own text, printed as it is
    Clock::time_point first_at;
  };

  /// `max_held` lines or `max_held_bytes` of text: past either, the oldest
  /// come out early (a flood must not hold memory or the console back).
  explicit LineDedup(std::chrono::milliseconds window, size_t max_held = 4096, size_t max_held_bytes = 1 << 20)
      : window_(window), max_held_(max_held), max_held_bytes_(max_held_bytes) {}

  void Add(int group, int member, int source, std::string_view line, Clock::time_point now);
  /// Queues `text` behind every line held now, to come out right after the
  /// last of them (at once if none is held: then it is due now). Nothing joins
  /// it. For the supervisor's own lines ("drafter:1 exited"), which must not
  /// overtake what the process said before.
  void AddAfterHeld(std::string_view text, Clock::time_point now);
  /// Moves the lines due at `now` (every held line if `all`) to `out`, in the
  /// order they were first said.
  void TakeDue(Clock::time_point now, bool all, std::vector<Line>* out);
  /// When the oldest held line is due (Clock::time_point::max() if none).
  Clock::time_point NextDue() const;
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    uint64_t seq;
    std::string key;  // group + '\0' + mask
    Line line;
    size_t bytes = 0;  // of text and texts: what max_held_bytes counts
  };
  std::chrono::milliseconds window_;
  size_t max_held_;
  size_t max_held_bytes_;
  size_t held_bytes_ = 0;
  uint64_t next_seq_ = 1;
  std::deque<Held> held_;                           // by seq
  std::unordered_map<std::string, std::vector<uint64_t>> open_;   // key -> seqs held, ascending
  std::unordered_map<uint64_t, uint64_t> last_seq_;               // (group, member) -> its newest line's seq
};

}  // namespace dflash
