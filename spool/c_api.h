/* The spool's C ABI: what the Python package (dflash_launch/spool/_native.py, ctypes) calls, so that the protocol
 * (every state move: publish, claim, ack, pending, commit, replay, quarantine, the fixed order, the ring, the
 * manifest) is written once, in C++ (spool.h), and the wheel stays free of a Python ABI (py3-none). libdflash_spool.so
 * exports these dfs_* functions only.
 *
 * Conventions:
 * - Every call returns a status: DFS_OK (0); DFS_NOT_YET (1) when its bounded wait passed with nothing to give
 *   (call again: the caller loops over short waits so its signal handlers run between them); DFS_END (2) when a
 *   consumer's spool ended; negative on an error, whose message dfs_last_error() holds (thread-local, valid until
 *   the thread's next call). DFS_FULL: the spool's filesystem cannot hold a frame (ENOSPC), nothing published.
 * - No call waits longer than the timeout_s it is given (< 0: no bound; the only unbounded wait is a caller's
 *   choice). Calls on one handle are not concurrent.
 * - Strings the library returns (char**) are malloc'd and freed with dfs_free. Strings passed in are copied.
 * - Paths and names are UTF-8 / bytes as the filesystem has them, NUL-terminated. */
#ifndef DFLASH_SPOOL_C_API_H_
#define DFLASH_SPOOL_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFS_ABI_VERSION 1

#define DFS_OK 0
#define DFS_NOT_YET 1
#define DFS_END 2
#define DFS_ERR (-1)
#define DFS_FULL (-2)
#define DFS_BAD_FRAME (-3) /* dfs_map, dfs_parse_header: not a frame the format can read (the frame's fault) */

typedef struct dfs_producer dfs_producer;
typedef struct dfs_consumer dfs_consumer;

/* One tensor to publish: its bytes are the caller's until the call returns (written with one writev). */
typedef struct {
  const char* name;
  const char* dtype; /* safetensors: "F32", "BF16", "F16", "I64", ... */
  int32_t ndim;
  const int64_t* shape;
  const void* data;
  uint64_t nbytes;
} dfs_tensor;

/* A frame a consumer holds. */
typedef struct {
  char file[256];      /* <producer>-<seq:010d>.safetensors */
  char path[4096];     /* where it is now (claimed/<consumer>/ or, delivered again, pending/<consumer>/) */
  char producer[240];
  int64_t seq;
  int32_t taken_back;  /* claimed by an earlier attempt, taken over from another consumer, or a replay */
} dfs_frame;

int dfs_abi_version(void);
/* The spool's layout (contract/spool_layout.h) as JSON, so that no other language spells it: {"states": {"tmp":
 * "tmp", "ready": ..., ...}, "weights_file", "frame_ext", "frame_format", "weights_format", "seq_digits"}.
 * *out: dfs_free it. */
int dfs_layout(char** out);
const char* dfs_last_error(void);
void dfs_free(void* p);

/* ---- producer ---- */

/* Opens (creates) the spool at `root` for producer `name`: removes its half-written temp files, resumes after its
 * highest sequence number. `max_bytes` <= 0: the default budget (dfs_default_max_bytes). `producers`: how many
 * producers share the budget (each keeps max_bytes / producers). */
int dfs_producer_open(const char* root, const char* name, int32_t max_ready, int64_t max_bytes, int32_t producers,
                      dfs_producer** out);
void dfs_producer_close(dfs_producer* p);
int64_t dfs_producer_next_seq(const dfs_producer* p);
int32_t dfs_producer_finished(const dfs_producer* p);
int64_t dfs_producer_max_bytes(const dfs_producer* p);
/* Publishes one frame: `metadata_json` is a JSON object of strings ("producer" and "seq" are added); the header
 * is built here, the frame written once into pages allocated first (a file of the ring's, or a new one), within
 * the byte budget, then renamed into ready/. DFS_NOT_YET: no room within timeout_s (nothing written). */
int dfs_producer_publish(dfs_producer* p, const char* metadata_json, int32_t n, const dfs_tensor* tensors,
                         double timeout_s, int64_t* seq);
/* <root>/<file> once for the whole spool (the first publisher wins): *won = 1 if this call wrote it. */
int dfs_producer_publish_shared(dfs_producer* p, const char* file, const char* metadata_json, int32_t n,
                                const dfs_tensor* tensors, int32_t* won);
/* The end marker (producers/<name>.done), the producer's ring files dropped. */
int dfs_producer_finish(dfs_producer* p);

/* ---- consumer ---- */

/* Opens (creates) the spool for consumer `name`; `producers`: how many producers mark their end (0: unknown, the
 * consumer never ends by itself). Takes back what an earlier attempt of `name` claimed and never acknowledged. */
int dfs_consumer_open(const char* root, const char* name, int32_t producers, dfs_consumer** out);
void dfs_consumer_close(dfs_consumer* c);
/* From now on frames come in the spool's fixed order (rank `rank` of `world`, from round `start_round`). */
int dfs_consumer_set_order(dfs_consumer* c, int32_t rank, int32_t world, int64_t start_round);
/* The quarantined frames the fixed order leaves out (JSON list of names): all of them (passed_only = 0) or those
 * its walk has passed so far, in order (1). *out: dfs_free it. */
int dfs_consumer_order_skipped(dfs_consumer* c, int32_t passed_only, char** out);
/* The next frame: DFS_OK (*out filled), DFS_NOT_YET (timeout_s passed), DFS_END (the spool ended). */
int dfs_consumer_next(dfs_consumer* c, double timeout_s, dfs_frame* out);
/* After the step, `position` being the consumer's sample count when it took the frame: into done/ (acknowledging
 * a frame twice is an error) or, holding for a checkpoint, pending/<name>/<position>.<file>. With drop_bytes = 0
 * the bytes stay until dfs_consumer_drop_bytes (a view still maps them). */
int dfs_consumer_ack(dfs_consumer* c, const dfs_frame* f, int64_t position, int32_t drop_bytes);
/* An acknowledged frame's bytes, once nothing maps it: back to its producer (the ring) or truncated, done/<file>
 * staying as the record; on a thread of the library's (freeing 100 MB of pages costs about a memcpy), so it
 * returns at once. dfs_consumer_flush waits until every such drop is done. */
int dfs_consumer_drop_bytes(dfs_consumer* c, const char* file);
int dfs_consumer_flush(dfs_consumer* c);
/* Into rejected/ with <file>.reason. */
int dfs_consumer_reject(dfs_consumer* c, const dfs_frame* f, const char* reason);
int dfs_consumer_hold_for_checkpoint(dfs_consumer* c);
/* Back to `position`; with `checkpoint` (non-empty), the frames pending before the positions it recorded
 * (`positions_json`: {consumer: position}; "" = this consumer's `position`) are committed first. The frames
 * pending at or after `position` come again first, in order. *committed: how many it committed. */
int dfs_consumer_restore(dfs_consumer* c, int64_t position, const char* positions_json, const char* checkpoint,
                         int32_t* committed);
/* The checkpoint `checkpoint` committed having recorded `positions_json` ({consumer: position}): the frames
 * acknowledged before them go to done/ with its record. `keep_json`: a JSON list of frame names whose bytes
 * must not go to the ring (a view maps them). *committed: how many. */
int dfs_consumer_commit(dfs_consumer* c, const char* positions_json, const char* checkpoint, const char* keep_json,
                        int32_t* committed);
int dfs_consumer_pending_bytes(dfs_consumer* c, int64_t* out);
/* The number of consumers that have claimed so far (claimed/<consumer>/ directories). */
int dfs_consumer_count(dfs_consumer* c, int32_t* out);
/* {frame: checkpoint} of done/'s commit records, JSON: *out, dfs_free it. */
int dfs_consumer_committed_records(dfs_consumer* c, char** out);
/* Writes the manifest to `path` if the spool is final: *written = 1 if it did. */
int dfs_consumer_write_manifest_if_final(dfs_consumer* c, const char* path, int32_t* written);
int dfs_consumer_stats(dfs_consumer* c, int64_t* taken_back, double* waited_s);

/* ---- the spool, without a handle ---- */

/* The manifest of what the spool holds (JSON) and whether it is final. */
int dfs_manifest(const char* root, int32_t producers, int32_t* final, char** out);
int dfs_write_manifest_if_final(const char* root, int32_t producers, const char* path, int32_t* written);
/* The bytes the spool's frames hold against the budget (`owner`'s only, when non-empty). */
int dfs_spool_bytes(const char* root, const char* owner, int64_t* out);
/* The byte budget: `given_bytes` (NULL: $DFLASH_SPOOL_MAX_BYTES) if not empty, else half the free space of the
 * filesystem holding `root`. */
int dfs_default_max_bytes(const char* root, const char* given_bytes, int64_t* out);
/* mkdir -p, 0700, refusing a directory another user could swap (common/private_files.h). */
int dfs_make_private_dir(const char* path);
/* The header of a safetensors file as JSON ({"__metadata__": {...}, name: {"dtype", "shape", "begin", "end"}},
 * begin/end absolute offsets), checked as strictly as the C++ reader; DFS_ERR with what is wrong. */
int dfs_parse_header(const void* data, uint64_t size, char** out);

/* The [model] contract's check of a frame (frame_contract.h CheckFrame): `contract_json` {batch, seq_len, hidden,
 * tapped_layers, dtype, vocab, target_layers}, `header_json` {"__metadata__": {...}, name: {"dtype", "shape"}}.
 * DFS_BAD_FRAME with *message (dfs_free it) naming the frame, its producer, what was expected, found, the fix. */
int dfs_check_frame(const char* contract_json, const char* header_json, const char* frame, char** message);

/* ---- mappings (the consumer's tensor views) ---- */

/* Maps `path` MAP_PRIVATE (read/write: a write copies the page for this process only), reusing the mapping this
 * consumer kept of the same file: *addr, *size, *dev, *ino. */
int dfs_map(dfs_consumer* c, const char* path, void** addr, uint64_t* size, uint64_t* dev, uint64_t* ino);
/* Unmaps, or (keep = 1) keeps the mapping for the next frame written over the same file, the pages a write
 * copied dropped first. REQUIRES: nothing reads it any more. */
int dfs_unmap(dfs_consumer* c, void* addr, uint64_t size, uint64_t dev, uint64_t ino, int32_t keep);
int dfs_map_hits(dfs_consumer* c);

#ifdef __cplusplus
}
#endif

#endif /* DFLASH_SPOOL_C_API_H_ */
