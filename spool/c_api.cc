// The spool's C ABI (c_api.h) over the one implementation (spool.h, spool_commit.h, spool_ring.h, map_cache.h):
// handles, statuses and JSON in and out, nothing of the protocol's own.
// The dfs_* functions are the library's only exports (-fvisibility=hidden otherwise).
#pragma GCC visibility push(default)
#include "spool/c_api.h"
#pragma GCC visibility pop

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "contract/spool_layout.h"
#include "spool/frame_contract.h"
#include "spool/map_cache.h"
#include "spool/safetensors.h"
#include "spool/spool.h"
#include "spool/spool_commit.h"
#include "spool/spool_ring.h"

using dflash::ErrnoMessage;
namespace spool = dflash::spool;
namespace st = dflash::safetensors;

struct dfs_producer {
  std::unique_ptr<spool::SpoolProducer> p;
  int64_t max_bytes = 0;
};

/// Frees acknowledged frames' bytes on a thread of its own: 100 MB of tmpfs pages cost about a memcpy to free,
/// which the consumer's next claim and step need not wait for.
class Dropper {
 public:
  explicit Dropper(spool::SpoolPaths paths) : paths_(std::move(paths)) {}
  ~Dropper() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void Drop(std::string file) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(file));
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    cv_.notify_all();
  }
  void Flush() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return queue_.empty() && !busy_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const std::string done = paths_.Done() + "/" + queue_.front();
      queue_.pop_front();
      busy_ = true;
      l.unlock();
      if (!spool::Recycle(paths_, done)) spool::EmptyFile(done);  // the name stays: the record
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  spool::SpoolPaths paths_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

struct dfs_consumer {
  std::unique_ptr<spool::SpoolConsumer> c;
  spool::SpoolPaths paths;
  std::string name;
  int producers = 0;
  std::vector<std::string> rejected_at_order;  // rejected/ when the fixed order was set: what it leaves out
  std::shared_ptr<st::MapCache> maps = std::make_shared<st::MapCache>(64, spool::kRingMinBytes);
  std::unique_ptr<Dropper> dropper;  // last: it goes first, its queue done
};

namespace {

thread_local std::string last_error;

int Fail(std::string message, int status = DFS_ERR) {
  last_error = std::move(message);
  return status;
}

char* Dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

std::string Str(const char* s) { return s ? std::string(s) : std::string(); }

bool Metadata(const char* text, st::Metadata* out, std::string* err) {
  nlohmann::json j = nlohmann::json::parse(Str(text).empty() ? "{}" : Str(text), nullptr, false);
  if (!j.is_object()) {
    *err = "frame metadata is not a JSON object";
    return false;
  }
  for (auto& [k, v] : j.items()) (*out)[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return true;
}

std::vector<st::TensorRef> Tensors(int32_t n, const dfs_tensor* t) {
  std::vector<st::TensorRef> out;
  for (int32_t i = 0; i < n; ++i)
    out.push_back({Str(t[i].name), Str(t[i].dtype), std::vector<int64_t>(t[i].shape, t[i].shape + t[i].ndim),
                   t[i].data, static_cast<size_t>(t[i].nbytes)});
  return out;
}

bool Positions(const char* text, std::map<std::string, int64_t>* out, std::string* err) {
  nlohmann::json j = nlohmann::json::parse(Str(text), nullptr, false);
  if (!j.is_object()) {
    *err = "positions are not a JSON object of consumer -> position";
    return false;
  }
  for (auto& [k, v] : j.items()) {
    if (!v.is_number_integer()) {
      *err = "position of " + k + " is not an integer";
      return false;
    }
    (*out)[k] = v.get<int64_t>();
  }
  return true;
}

spool::ClaimedFrame Claimed(const dfs_frame* f) {
  return {f->file, f->path, f->producer, f->seq, f->taken_back != 0};
}

void Fill(const spool::ClaimedFrame& c, dfs_frame* out) {
  std::snprintf(out->file, sizeof out->file, "%s", c.file.c_str());
  std::snprintf(out->path, sizeof out->path, "%s", c.path.c_str());
  std::snprintf(out->producer, sizeof out->producer, "%s", c.producer.c_str());
  out->seq = c.seq;
  out->taken_back = c.taken_back;
}

}  // namespace

extern "C" {

int dfs_abi_version(void) { return DFS_ABI_VERSION; }

int dfs_layout(char** out) {
  namespace l = spool::layout;
  nlohmann::ordered_json states;
  for (std::string_view s : {l::kTmp, l::kReady, l::kClaimed, l::kPending, l::kDone, l::kRejected, l::kProducers,
                             l::kFree})
    states[std::string(s)] = std::string(s);
  nlohmann::ordered_json j = {{"states", states},
                              {"weights_file", std::string(l::kWeightsFile)},
                              {"frame_ext", std::string(l::kFrameExt)},
                              {"frame_format", std::string(l::kFrameFormat)},
                              {"weights_format", std::string(l::kWeightsFormat)},
                              {"seq_digits", l::kSeqDigits}};
  *out = Dup(j.dump());
  return DFS_OK;
}
const char* dfs_last_error(void) { return last_error.c_str(); }
void dfs_free(void* p) { std::free(p); }

// ---- producer ----

int dfs_producer_open(const char* root, const char* name, int32_t max_ready, int64_t max_bytes, int32_t producers,
                      dfs_producer** out) {
  *out = nullptr;
  if (max_bytes <= 0 && dfs_default_max_bytes(root, nullptr, &max_bytes) != DFS_OK) return DFS_ERR;
  auto h = std::make_unique<dfs_producer>();
  h->max_bytes = max_bytes;
  h->p = std::make_unique<spool::SpoolProducer>(Str(root), Str(name), max_ready, max_bytes);
  h->p->set_producers(std::max(1, producers));
  std::string err;
  if (!h->p->Open(&err)) return Fail(err);
  *out = h.release();
  return DFS_OK;
}

void dfs_producer_close(dfs_producer* p) { delete p; }
int64_t dfs_producer_next_seq(const dfs_producer* p) { return p->p->next_seq(); }
int32_t dfs_producer_finished(const dfs_producer* p) { return p->p->finished(); }
int64_t dfs_producer_max_bytes(const dfs_producer* p) { return p->max_bytes; }

int dfs_producer_publish(dfs_producer* p, const char* metadata_json, int32_t n, const dfs_tensor* tensors,
                         double timeout_s, int64_t* seq) {
  st::Metadata meta;
  std::string err;
  bool not_yet = false;
  int err_no = 0;
  if (!Metadata(metadata_json, &meta, &err)) return Fail(err);
  if (!p->p->Publish(std::move(meta), Tensors(n, tensors), seq, &err, timeout_s, &not_yet, &err_no))
    return Fail(err, err_no == ENOSPC ? DFS_FULL : DFS_ERR);
  return not_yet ? DFS_NOT_YET : DFS_OK;
}

int dfs_producer_publish_shared(dfs_producer* p, const char* file, const char* metadata_json, int32_t n,
                                const dfs_tensor* tensors, int32_t* won) {
  st::Metadata meta;
  std::string err;
  bool w = false;
  if (!Metadata(metadata_json, &meta, &err) || !p->p->PublishShared(Str(file), meta, Tensors(n, tensors), &w, &err))
    return Fail(err);
  *won = w;
  return DFS_OK;
}

int dfs_producer_finish(dfs_producer* p) {
  std::string err;
  return p->p->Finish(&err) ? DFS_OK : Fail(err);
}

// ---- consumer ----

int dfs_consumer_open(const char* root, const char* name, int32_t producers, dfs_consumer** out) {
  *out = nullptr;
  auto h = std::make_unique<dfs_consumer>();
  h->paths.root = Str(root);
  h->name = Str(name);
  h->producers = producers;
  h->c = std::make_unique<spool::SpoolConsumer>(h->paths.root, h->name, producers);
  h->dropper = std::make_unique<Dropper>(h->paths);
  std::string err;
  if (!h->c->Open(&err)) return Fail(err);
  *out = h.release();
  return DFS_OK;
}

void dfs_consumer_close(dfs_consumer* c) { delete c; }

int dfs_consumer_set_order(dfs_consumer* c, int32_t rank, int32_t world, int64_t start_round) {
  std::string err;
  if (!spool::ListFrames(c->paths.Rejected(), &c->rejected_at_order, &err) ||
      !c->c->SetOrder(rank, world, start_round, &err))
    return Fail(err);
  std::sort(c->rejected_at_order.begin(), c->rejected_at_order.end());
  return DFS_OK;
}

int dfs_consumer_order_skipped(dfs_consumer* c, int32_t passed_only, char** out) {
  *out = Dup(nlohmann::json(passed_only ? c->c->order_skipped() : c->rejected_at_order).dump());
  return DFS_OK;
}

int dfs_consumer_next(dfs_consumer* c, double timeout_s, dfs_frame* out) {
  spool::ClaimedFrame f;
  bool end = false, not_yet = false;
  std::string err;
  if (!c->c->Next(&f, &end, &err, timeout_s, &not_yet)) return Fail(err);
  if (not_yet) return DFS_NOT_YET;
  if (end) return DFS_END;
  Fill(f, out);
  return DFS_OK;
}

int dfs_consumer_ack(dfs_consumer* c, const dfs_frame* f, int64_t position, int32_t drop_bytes) {
  spool::ClaimedFrame claimed = Claimed(f);
  claimed.position = position;
  std::string err;
  return c->c->Ack(claimed, &err, drop_bytes != 0) ? DFS_OK : Fail(err);
}

int dfs_consumer_drop_bytes(dfs_consumer* c, const char* file) {
  c->dropper->Drop(Str(file));
  return DFS_OK;
}

int dfs_consumer_flush(dfs_consumer* c) {
  c->dropper->Flush();
  return DFS_OK;
}

int dfs_consumer_reject(dfs_consumer* c, const dfs_frame* f, const char* reason) {
  std::string err;
  return c->c->Reject(Claimed(f), Str(reason), &err) ? DFS_OK : Fail(err);
}

int dfs_consumer_hold_for_checkpoint(dfs_consumer* c) {
  std::string err;
  return c->c->HoldForCheckpoint(&err) ? DFS_OK : Fail(err);
}

namespace {

/// The commit's say over a frame's bytes, from the caller: only its own frames that no view of its maps may go to
/// the ring or be truncated; another consumer's (a rank of another process) may still be mapped there.
spool::MayDrop MayDropOwn(const dfs_consumer* c, const char* keep_json) {
  std::set<std::string> keep;
  nlohmann::json j = nlohmann::json::parse(Str(keep_json).empty() ? "[]" : Str(keep_json), nullptr, false);
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_string()) keep.insert(v.get<std::string>());
  const std::string me = c->name;
  return [me, keep](const std::string& consumer, const std::string& frame) {
    return consumer == me && !keep.count(frame);
  };
}

}  // namespace

int dfs_consumer_restore(dfs_consumer* c, int64_t position, const char* positions_json, const char* checkpoint,
                         int32_t* committed) {
  std::map<std::string, int64_t> positions;
  std::string err;
  int n = 0;
  if (!Str(positions_json).empty() && !Positions(positions_json, &positions, &err)) return Fail(err);
  const spool::MayDrop may_drop = MayDropOwn(c, "[]");
  if (!c->c->Restore(position, positions, Str(checkpoint), &n, &err, &may_drop)) return Fail(err);
  *committed = n;
  return DFS_OK;
}

int dfs_consumer_commit(dfs_consumer* c, const char* positions_json, const char* checkpoint, const char* keep_json,
                        int32_t* committed) {
  std::map<std::string, int64_t> positions;
  std::string err;
  int n = 0;
  if (!Positions(positions_json, &positions, &err)) return Fail(err);
  const spool::MayDrop may_drop = MayDropOwn(c, keep_json);
  if (!c->c->Commit(positions, Str(checkpoint), &n, &err, &may_drop)) return Fail(err);
  *committed = n;
  return DFS_OK;
}

int dfs_consumer_pending_bytes(dfs_consumer* c, int64_t* out) {
  std::string err;
  return c->c->PendingBytes(out, &err) ? DFS_OK : Fail(err);
}

int dfs_consumer_count(dfs_consumer* c, int32_t* out) {
  int n = 0;
  std::string err;
  if (!spool::ConsumerCount(c->paths, &n, &err)) return Fail(err);
  *out = n;
  return DFS_OK;
}

int dfs_consumer_committed_records(dfs_consumer* c, char** out) {
  std::map<std::string, std::string> records;
  std::string err;
  if (!spool::CommittedRecords(c->paths, &records, &err)) return Fail(err);
  *out = Dup(nlohmann::json(records).dump());
  return DFS_OK;
}

int dfs_consumer_write_manifest_if_final(dfs_consumer* c, const char* path, int32_t* written) {
  return dfs_write_manifest_if_final(c->paths.root.c_str(), c->producers, path, written);
}

int dfs_consumer_stats(dfs_consumer* c, int64_t* taken_back, double* waited_s) {
  *taken_back = c->c->taken_back();
  *waited_s = c->c->waited_s();
  return DFS_OK;
}

// ---- the spool, without a handle ----

int dfs_manifest(const char* root, int32_t producers, int32_t* final, char** out) {
  nlohmann::ordered_json j;
  bool f = false;
  std::string err;
  if (!spool::Manifest(Str(root), producers, &j, &f, &err)) return Fail(err);
  *out = Dup(j.dump());
  *final = f;
  return DFS_OK;
}

int dfs_write_manifest_if_final(const char* root, int32_t producers, const char* path, int32_t* written) {
  bool w = false;
  std::string err;
  if (!spool::WriteManifestIfFinal(Str(root), producers, Str(path), &w, &err)) return Fail(err);
  *written = w;
  return DFS_OK;
}

int dfs_spool_bytes(const char* root, const char* owner, int64_t* out) {
  std::string err;
  return spool::SpoolBytes(spool::SpoolPaths{Str(root)}, out, &err, Str(owner)) ? DFS_OK : Fail(err);
}

int dfs_default_max_bytes(const char* root, const char* given_bytes, int64_t* out) {
  std::string err;
  const std::string given = Str(given_bytes);
  if (!given_bytes || given == Str(std::getenv("DFLASH_SPOOL_MAX_BYTES")))
    return spool::DefaultMaxBytes(Str(root), out, &err) ? DFS_OK : Fail(err);
  // TODO(spool-lib R7): DefaultMaxBytes(root, out, err, given). Until then the caller's own value, as it parses it.
  if (given.empty()) {
    struct statvfs s {};
    if (::statvfs(Str(root).c_str(), &s) != 0) return Fail(ErrnoMessage("statvfs(" + Str(root) + ")", errno));
    *out = std::max<int64_t>(1, static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize) / 2);
    return DFS_OK;
  }
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(given.c_str(), &end, 10);
  if (errno || end == given.c_str() || *end) return Fail("DFLASH_SPOOL_MAX_BYTES='" + given + "' is not a byte count");
  if (n <= 0) return Fail("DFLASH_SPOOL_MAX_BYTES='" + given + "' must be positive");
  *out = n;
  return DFS_OK;
}

int dfs_make_private_dir(const char* path) {
  std::string err;
  return spool::MakeDir(Str(path), &err) ? DFS_OK : Fail(err);
}

int dfs_parse_header(const void* data, uint64_t size, char** out) {
  st::Header h;
  std::string err;
  if (!st::ParseHeader(std::string_view(static_cast<const char*>(data), size), size, &h, &err))
    return Fail(err, DFS_BAD_FRAME);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["__metadata__"] = h.metadata;
  for (const st::TensorEntry& t : h.tensors)
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"begin", h.data_offset + t.begin},
                 {"end", h.data_offset + t.end}};
  *out = Dup(j.dump());
  return DFS_OK;
}

int dfs_check_frame(const char* contract_json, const char* header_json, const char* frame, char** message) {
  *message = nullptr;
  const nlohmann::json c = nlohmann::json::parse(Str(contract_json), nullptr, false);
  const nlohmann::json h = nlohmann::json::parse(Str(header_json), nullptr, false);
  if (!c.is_object() || !h.is_object()) return Fail("the contract and the header are JSON objects");
  dflash::FrameContract fc;
  st::Header header;
  try {
    fc.taps = c.at("tapped_layers").get<std::vector<int64_t>>();
    fc.shape = {c.at("batch").get<int64_t>(), c.at("seq_len").get<int64_t>(), static_cast<int64_t>(fc.taps.size()),
                c.at("hidden").get<int64_t>()};
    fc.target_layers = c.at("target_layers").get<int64_t>();
    fc.vocab = c.at("vocab").get<int64_t>();
    fc.dtype = c.at("dtype").get<std::string>();
    for (const auto& [k, v] : h.items()) {
      if (k == "__metadata__") header.metadata = v.get<st::Metadata>();
      else header.tensors.push_back({k, v.at("dtype").get<std::string>(), v.at("shape").get<std::vector<int64_t>>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return Fail(std::string("the contract or the header: ") + e.what());
  }
  std::string m;
  if (dflash::CheckFrame(fc, header, Str(frame), &m)) return DFS_OK;
  *message = Dup(m);
  return DFS_BAD_FRAME;
}

// ---- mappings ----

int dfs_map(dfs_consumer* c, const char* path, void** addr, uint64_t* size, uint64_t* dev, uint64_t* ino) {
  dflash::UniqueFd fd(::open(Str(path).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat s {};
  if (!fd || ::fstat(fd.get(), &s) != 0) return Fail(ErrnoMessage("open(" + Str(path) + ")", errno));
  if (s.st_size == 0) return Fail("not a safetensors file: the file is empty", DFS_BAD_FRAME);
  void* p = c->maps->Take(s);
  if (!p) {
    p = ::mmap(nullptr, static_cast<size_t>(s.st_size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) return Fail(ErrnoMessage("mmap(" + Str(path) + ")", errno));
  }
  *addr = p;
  *size = static_cast<uint64_t>(s.st_size);
  *dev = s.st_dev;
  *ino = s.st_ino;
  return DFS_OK;
}

int dfs_unmap(dfs_consumer* c, void* addr, uint64_t size, uint64_t dev, uint64_t ino, int32_t keep) {
  if (keep) c->maps->Put(static_cast<dev_t>(dev), static_cast<ino_t>(ino), addr, static_cast<size_t>(size));
  else ::munmap(addr, static_cast<size_t>(size));
  return DFS_OK;
}

int dfs_map_hits(dfs_consumer* c) { return c->maps->hits(); }

}  // extern "C"
