// The hidden-state spool's layout, spelled once: what every side that touches a spool agrees on (the spool's
// implementation in spool/, the launcher's metrics and resume check, the Python package through the spool's C
// ABI). Every state of a frame is the directory it is in (docs/builtin.md, "The spool"):
//
//   <root>/tmp/                          kTmp: a producer writes a frame here first (<frame>.tmp)
//   <root>/ready/<p>-<seq>.safetensors   kReady: published, not claimed yet
//   <root>/claimed/<consumer>/<frame>    kClaimed: held by exactly one consumer
//   <root>/pending/<consumer>/<pos>.<f>  kPending: acknowledged by a checkpointing consumer, awaiting its checkpoint
//   <root>/done/<frame>                  kDone: acknowledged (empty), or committed with a checkpoint (its record)
//   <root>/rejected/<frame> (+ .reason)  kRejected: violated the contract; never acknowledged
//   <root>/producers/<p>.done            kProducers: a producer's end marker, {"producer": p, "frames": n}
//   <root>/free/<frame>                  kFree: acknowledged frames' files, for their producer to write over
//   <root>/weights.safetensors           kWeightsFile: the target's embedding and LM head (first publisher wins)
//   <root>/budget.lock                   kBudgetLock: producers allocate a frame's bytes holding it (flock)
//
// No I/O here: names, their formats and parsers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dflash::spool::layout {

// The state directories.
inline constexpr std::string_view kTmp = "tmp";
inline constexpr std::string_view kReady = "ready";
inline constexpr std::string_view kClaimed = "claimed";
inline constexpr std::string_view kPending = "pending";
inline constexpr std::string_view kDone = "done";
inline constexpr std::string_view kRejected = "rejected";
inline constexpr std::string_view kProducers = "producers";
inline constexpr std::string_view kFree = "free";

// Files of the spool's root.
inline constexpr std::string_view kWeightsFile = "weights.safetensors";
inline constexpr std::string_view kBudgetLock = "budget.lock";

// Suffixes.
inline constexpr std::string_view kFrameExt = ".safetensors";   // a frame file
inline constexpr std::string_view kTmpExt = ".tmp";             // tmp/<frame>.tmp, tmp/<file>@<producer>.tmp
inline constexpr std::string_view kReasonExt = ".reason";       // rejected/<frame>.reason: why
inline constexpr std::string_view kCommitTmpExt = ".commit.tmp";  // tmp/<frame>.commit.tmp: a commit's record
inline constexpr std::string_view kEndMarkerExt = ".done";      // producers/<producer>.done

// The end marker's JSON keys: {"producer": <name>, "frames": <how many it published>}.
inline constexpr std::string_view kEndProducerKey = "producer";
inline constexpr std::string_view kEndFramesKey = "frames";

// A commit's record in done/<frame>: {"checkpoint": "<path>"} (spool/spool_commit.h CommitRecord).
inline constexpr std::string_view kRecordCheckpointKey = "checkpoint";

// The metadata keys every frame's safetensors header carries (spool/frame_contract.h FrameMetadata; the
// producer adds the first two at publish).
namespace meta {
inline constexpr std::string_view kProducer = "producer";
inline constexpr std::string_view kSeq = "seq";
inline constexpr std::string_view kFormat = "format";  // kFrameFormat
inline constexpr std::string_view kLayerIds = "layer_ids";
inline constexpr std::string_view kHidden = "hidden";
inline constexpr std::string_view kLayout = "layout";  // "concat"
inline constexpr std::string_view kDType = "dtype";
inline constexpr std::string_view kTargetLayers = "target_layers";
inline constexpr std::string_view kVocab = "vocab";
}  // namespace meta
inline constexpr std::string_view kFrameFormat = "dflash-frame/1";
// weights.safetensors' metadata "format".
inline constexpr std::string_view kWeightsFormat = "dflash-weights/1";
// A frame name's sequence number: this many digits, zero-padded, so names sort by producer, then seq.
inline constexpr int kSeqDigits = 10;

// The manifest (spool.json): its format and field names (spool::Manifest writes them in this order).
inline constexpr std::string_view kManifestFormat = "dflash-spool/1";
namespace manifest {
inline constexpr std::string_view kFormat = "format";
inline constexpr std::string_view kFinal = "final";
inline constexpr std::string_view kProducersExpected = "producers_expected";
inline constexpr std::string_view kProducersFinished = "producers_finished";
inline constexpr std::string_view kFramesPublished = "frames_published";
inline constexpr std::string_view kFramesConsumed = "frames_consumed";
inline constexpr std::string_view kReady = "ready";
inline constexpr std::string_view kClaimed = "claimed";
inline constexpr std::string_view kPending = "pending";
inline constexpr std::string_view kRejected = "rejected";
inline constexpr std::string_view kCommittedByCheckpoint = "committed_by_checkpoint";
inline constexpr std::string_view kExactlyOnce = "exactly_once";
inline constexpr std::string_view kProducers = "producers";
// Per producer, under "producers".
inline constexpr std::string_view kPublished = "published";
inline constexpr std::string_view kConsumed = "consumed";
inline constexpr std::string_view kFirstSeq = "first_seq";
inline constexpr std::string_view kLastSeq = "last_seq";
inline constexpr std::string_view kMissing = "missing";
inline constexpr std::string_view kMissingSeqs = "missing_seqs";
inline constexpr std::string_view kUnexpected = "unexpected";
inline constexpr std::string_view kUnexpectedSeqs = "unexpected_seqs";
inline constexpr std::string_view kCommittedBy = "committed_by";
}  // namespace manifest

/// "<producer>-<seq as 10 digits>.safetensors". Names sort by producer, then seq.
std::string FrameFile(std::string_view producer, int64_t seq);
/// Inverse of FrameFile; false for any other name (temp files, .reason files, an empty producer, no digits).
bool ParseFrameFile(std::string_view file, std::string* producer, int64_t* seq);

/// "<position as 10 digits>.<frame>": pending/<consumer>/ names, which sort in the order the consumer stepped.
std::string PendingName(int64_t position, std::string_view frame);
/// Inverse of PendingName; false for any other name.
bool ParsePendingName(std::string_view name, int64_t* position, std::string* frame);

/// "<producer>.done": the producer's end marker in producers/.
std::string EndMarkerFile(std::string_view producer);
/// Inverse of EndMarkerFile; false for any other name.
bool ParseEndMarkerFile(std::string_view name, std::string* producer);

/// "<root>/<dir>".
inline std::string Under(const std::string& root, std::string_view dir) { return root + "/" + std::string(dir); }

}  // namespace dflash::spool::layout
