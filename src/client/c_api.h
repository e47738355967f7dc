/* Stable C ABI of the refit client libraries (librefit_client.so), for bindings (Python ctypes)
 * and programs that cannot link C++: the trainer side (connect, begin a session, push tensors,
 * commit or abort) and the engine side (register parameters, serve pause/resume).
 *
 * Versioning. REFIT_ABI_VERSION grows when something is added; nothing is ever removed or
 * reordered. Every struct that crosses the ABI starts with `struct_size`, which the caller sets to
 * sizeof(the struct it was compiled with):
 *   - inputs: the library reads only the first struct_size bytes; fields a newer library added
 *     beyond them take their documented defaults (so a newer library serves an older caller);
 *   - outputs: the library writes only fields that fit inside struct_size;
 *   - arrays of structs are struct_size apart (the first element's struct_size; all must agree);
 *   - a struct_size below the version-1 size (the end of the struct's last version-1 field; fields
 *     added later never raise it) is refused with REFIT_INVALID_ARGUMENT.
 * Handles are opaque. Strings are NUL-terminated UTF-8.
 *
 * Errors. Functions return 0 (REFIT_OK) or a code below (the canonical status codes); the
 * message of the last failure on the calling thread is refit_last_error() (thread-local, valid
 * until the next failing call on that thread), and refitd's cause of it, where it gave one,
 * refit_last_cause() (ABI 12). Exceptions never cross the ABI.
 *
 * Multi-rank sessions (ABI 3). Several trainer processes (tensor-, pipeline-, expert-parallel
 * ranks) push one refit together:
 *   rank 0:  refit_session_begin (the manifest lists every tensor of the refit, whole), hand
 *            refit_session_id to the other ranks (any channel: a collective, a file, an env var);
 *   rank k:  its own refit_client, refit_session_join(client, &id, 1, &s), push its tensors or
 *            slices (refit_tensor.full_rank/full_shape/slice_dim/slice_start), refit_session_detach;
 *   rank 0:  push its own share, then refit_session_commit.
 * refit_session_commit waits until every rank that has joined has detached, at most until the
 * session's deadline (refit_manifest.deadline_ms, else refitd's default), then validates the
 * whole refit: every manifest tensor exactly once, every sliced tensor tiled by its slices (a
 * refusal names the tensor and the missing range). Make sure every rank has joined before rank 0
 * commits (a barrier after the joins): a rank that joins once the commit started is refused, and
 * the commit cannot wait for a rank it has not seen. A joined rank that exits or disconnects
 * without detaching aborts the session (the engine is untouched); rank 0's commit then returns
 * REFIT_ABORTED naming why (REFIT_DEADLINE_EXCEEDED if the deadline ended it). A joined rank
 * cannot commit and rank 0 cannot detach (REFIT_FAILED_PRECONDITION).
 *
 * Threading. A refit_client and its sessions belong to the thread that connected (they own an
 * event loop); a call from another thread fails with REFIT_FAILED_PRECONDITION. One client per
 * thread. refit_engine functions are thread-safe; its callbacks run on the engine's agent thread.
 */
#ifndef REFIT_CLIENT_C_API_H_
#define REFIT_CLIENT_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define REFIT_API __attribute__((visibility("default")))
#else
#define REFIT_API
#endif

#define REFIT_ABI_VERSION                                                               \
  14 /* 2: refit_client_connect_fanout; 3: multi-rank sessions (refit_session_join,     \
         refit_session_detach, refit_session_ids, slices in refit_tensor), version      \
         tags (refit_manifest.tag, refit_report.tag/cause/verify_ms,                    \
         refit_daemon_status.tag/verify_*, refit_engine_options.tag/resume_tagged,      \
         refit_engine_tag) and held versions (refit_manifest.stage_only,                \
         refit_client_commit_version, refit_client_rollback, refit_client_versions);    \
         4: refit_session_measure_amax; 5: engine ranks (refit_engine_options.tp_rank,  \
         tp_size, ep_rank, ep_size, device, model); 6: trainer-side conversion          \
         (refit_manifest.wire_format);                                                  \
         7: in-place registration (REFIT_STORAGE_CUDA_PTR, refit_engine_param.cuda_ptr, \
         refit_engine_allocations), sleep and wake (refit_engine_sleep,                 \
         refit_engine_wake, refit_engine_asleep, refit_daemon_status.engine_asleep/     \
         awaiting_wake), the registration audit (refit_engine_options.audit);           \
         8: trainer-supplied amax per tensor (refit_tensor.has_amax/amax) and           \
         fused NVFP4 groups (refit_session_amax_group);                                 \
         9: REFIT_STORAGE_CUDA_PTR parameters in CUDA virtual memory (no struct         \
         change: exported as POSIX file descriptors over a unix: address);              \
         10: refit_session_push_in_place;                                               \
         11: refit_report.bytes_in_place/bytes_pushed_in_place;                         \
         12: refit_last_cause, and a commit's report filled when it fails;              \
         13: engine groups (refit_client_commit_group, refit_client_abort_group);       \
         14: refit_daemon_status.group_* (the daemon's engine group) */

/* Return codes: the canonical status codes (same numbers as absl::StatusCode and gRPC). */
#define REFIT_OK 0
#define REFIT_CANCELLED 1
#define REFIT_UNKNOWN 2
#define REFIT_INVALID_ARGUMENT 3 /* bad input; the message names the tensor or field */
#define REFIT_DEADLINE_EXCEEDED 4
#define REFIT_NOT_FOUND 5
#define REFIT_ALREADY_EXISTS 6
#define REFIT_PERMISSION_DENIED 7
#define REFIT_RESOURCE_EXHAUSTED 8
#define REFIT_FAILED_PRECONDITION 9 /* refit refused (message names every offending tensor), wrong thread */
#define REFIT_ABORTED 10
#define REFIT_OUT_OF_RANGE 11
#define REFIT_UNIMPLEMENTED 12 /* e.g. CUDA memory where this build has no GPU path */
#define REFIT_INTERNAL 13
#define REFIT_UNAVAILABLE 14 /* refitd unreachable, disconnected or busy: retry later (refit_last_cause tells) */
#define REFIT_DATA_LOSS 15
#define REFIT_UNAUTHENTICATED 16

/* Where a tensor's bytes live. */
#define REFIT_MEMORY_HOST 0
#define REFIT_MEMORY_CUDA 1 /* CUDA device memory (refused with REFIT_UNIMPLEMENTED by a build without
                              CUDA). On the NCCL data plane it is read asynchronously until the
                              bucket holding it is sent (the next flush/commit or an overflowing
                              push): keep it unchanged until then; on UCX it is copied at once. */

/* How an engine parameter's storage is shared with refitd. */
#define REFIT_STORAGE_SHM 0      /* POSIX shm object `shm_name`, at `offset` */
#define REFIT_STORAGE_CUDA_IPC 1 /* cudaIpcMemHandle_t bytes (`cuda_ipc_handle`) + offset on `cuda_device` */
#define REFIT_STORAGE_CUDA_PTR 2 /* ABI 7: in place, the device pointer `cuda_ptr` (e.g. a tensor's data_ptr):
                                    grouped by CUDA allocation, one IPC handle per allocation base;
                                    ABI 9: in CUDA virtual memory (cuMemCreate + cuMemMap), one POSIX
                                    file descriptor per mapped piece, passed only over a unix:
                                    address, at most 64 pieces. Refused naming the parameter: host
                                    and managed memory, virtual memory without the POSIX descriptor
                                    handle type, virtual memory over TCP */

typedef struct refit_client refit_client;
typedef struct refit_session refit_session;
typedef struct refit_engine refit_engine;

/* ---- Library ---------------------------------------------------------------------------- */

/* REFIT_ABI_VERSION of the loaded library; a caller built against version N needs >= N. */
REFIT_API uint32_t refit_abi_version(void);
/* Message of the last failed call on this thread ("" if none). */
REFIT_API const char* refit_last_error(void);
/* ABI 12. refitd's cause of the last failed call on this thread, where the code alone does not say
 * how to handle it (thread-local, as refit_last_error; "" when refitd gave none): one of
 * refit_report.cause's names. Among them: "busy" (REFIT_UNAVAILABLE: another session or commit
 * holds refitd; begin again once it ended), "engine_error" (REFIT_UNAVAILABLE: no engine, or one
 * not answering), "engine_dirty" (a commit failed and left the engine's weights mixed, or a partial
 * refit was refused for such an engine: only a full refit lands), "verify_mismatch",
 * "deadline_exceeded", "overloaded", "incomplete", "invalid_input". */
REFIT_API const char* refit_last_cause(void);
/* "OK", "INVALID_ARGUMENT", ... ("UNKNOWN" for codes it does not know). */
REFIT_API const char* refit_code_name(int code);
/* Bytes of a dense tensor of `dtype` (safetensors spelling: "BF16", "F32", "F8_E4M3", ...). */
REFIT_API int refit_dense_bytes(const char* dtype, const int64_t* shape, uint32_t rank, uint64_t* out_bytes);
/* refitd's checksum of a byte range (the one refit_client_checksums reports); `seed` chains. */
REFIT_API uint64_t refit_checksum64(const void* data, uint64_t bytes, uint64_t seed);

/* ---- Trainer side ----------------------------------------------------------------------- */

/* One tensor a session will carry. */
typedef struct refit_tensor_desc {
  uint32_t struct_size;
  const char* name;     /* Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight" */
  const char* dtype;    /* "BF16" or "F32" for tensors refitd converts; any dtype passes through */
  const int64_t* shape; /* `rank` dimensions */
  uint32_t rank;
} refit_tensor_desc;

typedef struct refit_manifest {
  uint32_t struct_size;
  const char* model; /* must equal the model of refitd's spec */
  const refit_tensor_desc* tensors;
  uint64_t num_tensors;
  uint32_t partial;     /* nonzero: only whole parameters the spec marks updatable alone */
  uint32_t deadline_ms; /* 0: refitd's default */
  /* ABI 3. The trainer's version tag, e.g. "step-1200": NULL or "" for none, else 1..128 bytes of
   * A-Z a-z 0-9 . _ : + - (refused with REFIT_INVALID_ARGUMENT otherwise). Carried to the report,
   * refitd's status, metrics and log, and the engine's resume. refitd's own `version` still
   * orders commits. */
  const char* tag;
  /* ABI 3. Nonzero: stage only (refitd config hold: K): receive, convert and validate, then keep
   * the refit in staging under `tag` (required) instead of writing it; the commit reports outcome
   * "staged". A later commit by tag (`refitctl commit TAG`) writes it. */
  uint32_t stage_only;
  /* ABI 6. What the session's buckets carry: NULL, "" or "bf16": every tensor as pushed (refitd
   * converts); "checkpoint": the library converts each BF16/F32 tensor refitd's wire plan lists
   * (the spec's FP8/FP4 formats) before packing, with refitd's own code (the CPU reference
   * quantizers for host tensors, the GPU kernels for CUDA tensors in builds with CUDA), and sends
   * its checkpoint-format outputs (data plus scales). Engine bytes are identical either way.
   * A slice of a converted tensor converts on its own when it does not cut the format's blocks;
   * otherwise, and for NVFP4 or transposed tensors, it is refused (REFIT_INVALID_ARGUMENT). */
  const char* wire_format;
} refit_manifest;

/* One tensor's bytes, dense row-major. */
typedef struct refit_tensor {
  uint32_t struct_size;
  const char* name;
  const char* dtype;
  const int64_t* shape;
  uint32_t rank;
  const void* data;
  uint64_t nbytes; /* 0: not checked; otherwise must equal the dense size of dtype x shape */
  uint32_t memory; /* REFIT_MEMORY_HOST */
  int32_t device;  /* CUDA device ordinal when memory is REFIT_MEMORY_CUDA */
  /* ABI 3: a slice of the manifest's tensor `name` (e.g. this rank's tensor-parallel shard).
   * full_rank 0 (the default, and what older callers pass): the whole tensor. Otherwise
   * full_shape[full_rank] is the whole tensor's shape (as in the manifest), `shape` is the
   * slice's: equal to full_shape except in dimension slice_dim, where the slice covers indices
   * [slice_start, slice_start + shape[slice_dim]). refitd assembles the tensor from its slices
   * (pushed by any ranks of the session, in any order) before converting it. */
  const int64_t* full_shape;
  uint32_t full_rank;
  int32_t slice_dim;
  uint64_t slice_start;
  /* ABI 8: has_amax != 0: `amax` is the tensor's max|x| as the trainer states it (TensorRef::amax).
   * Wire format checkpoint, NVFP4 tensors the wire plan lists: the global amax to encode against,
   * reduced by the caller over the tensor's fused group (refit_session_amax_group) and over every
   * rank's slices; a group member or a slice pushed without one is refused naming the tensor. */
  uint32_t has_amax;
  float amax;
} refit_tensor;

/* What a session did. Strings and arrays are owned by the session handle and stay valid until
 * it is closed. */
typedef struct refit_report {
  uint32_t struct_size;
  uint64_t session_id;
  uint64_t version;     /* the engine's version after a committed refit */
  const char* outcome;  /* "committed" | "staged" | "refused" | "aborted" | "failed"; "none": no report came */
  const char* reason;
  uint64_t bytes_in;
  uint64_t bytes_out;
  uint32_t buckets;
  uint32_t tensors;
  double receive_ms, convert_ms, validate_ms, commit_ms, pause_ms, total_ms;
  /* Bytes written per output format ("fp8_block128", "bf16", ...); empty while refitd's wire
   * report does not carry them (proto/refit.capnp has no such field yet). */
  uint32_t num_formats;
  const char* const* format_names;
  const uint64_t* format_bytes;
  /* ABI 3. */
  const char* tag;    /* the manifest's tag ("" when none) */
  const char* cause;  /* "none", "client_abort", ..., "engine_error", "verify_mismatch" (the metric's reason);
                         a commit that failed before refitd reported: refit_last_cause() ("none" if "") */
  double verify_ms;   /* engine.verify_after_commit: checksumming staged and engine bytes */
  /* ABI 11. */
  uint64_t bytes_in_place;        /* output bytes refitd converted straight into the engine (staging: direct) */
  uint64_t bytes_pushed_in_place; /* bytes this session sent from where they lie (refit_session_push_in_place),
                                     not packed; 0 for a kept version's commit */
} refit_report;

/* refitd's state. Strings are owned by the client handle and valid until its next status call. */
typedef struct refit_daemon_status {
  uint32_t struct_size;
  const char* model;
  uint32_t engine_registered;
  uint32_t engine_params;
  uint64_t engine_bytes;
  uint64_t version;
  uint64_t active_session; /* 0: none */
  uint64_t staging_bytes;
  uint64_t staging_limit_bytes;
  uint64_t committed, refused, aborted;
  const char* data_endpoint;
  /* ABI 3. */
  const char* tag;              /* the trainer's tag of `version` ("" when none) */
  uint32_t engine_dirty;        /* the engine's weights may be mixed; only a full refit clears it */
  uint32_t verify_after_commit; /* engine.verify_after_commit is on */
  uint64_t verify_mismatches;   /* commits it failed */
  /* ABI 7. */
  uint32_t engine_asleep;  /* the engine released its weights (refit_engine_sleep) */
  uint64_t awaiting_wake;  /* the session whose validated refit commits when the engine wakes; 0: none */
  /* ABI 14: the daemon as a member of an engine group (docs/architecture.md "Engine groups"). */
  const char* group_name;        /* "" when the daemon is in no group */
  uint32_t group_members;        /* group.members */
  uint32_t group_member;         /* group.member: this daemon's index */
  const char* group_phase;       /* joining | idle | copying | copied | resuming | restoring ("" no group) */
  const char* group_tag;         /* the group version this member serves ("" before its first) */
  const char* group_pending_tag; /* the group version in flight ("" none) */
  uint32_t group_dirty;          /* the group may be mixed: a full group refit must land */
  const char* group_reason;      /* why it is dirty or joining */
  const char* group_version;     /* late join: the version the other members serve ("" unknown) */
  uint64_t group_commits;        /* group versions resumed */
  uint64_t group_aborts;         /* group versions aborted or restored */
} refit_daemon_status;

typedef struct refit_param_checksum {
  uint32_t struct_size;
  const char* name;
  uint64_t checksum;
  uint64_t nbytes;
} refit_param_checksum;

/* `address`: "unix:/path" or "host:port". */
REFIT_API int refit_client_connect(const char* address, refit_client** out);
/* One client feeding `count` daemons at once (fan-out, see FanoutClient in trainer_client.h):
 * sessions begin, receive every bucket and commit on all of them; a commit fails naming any
 * daemon that did not commit. Status, abort_active and checksums address the first daemon. */
REFIT_API int refit_client_connect_fanout(const char* const* addresses, uint64_t count, refit_client** out);
/* Aborts and invalidates the client's open sessions (their handles must still be closed). */
REFIT_API void refit_client_close(refit_client* client);
REFIT_API int refit_client_status(refit_client* client, refit_daemon_status* out);
/* Aborts whatever session refitd has open; *out_aborted says whether there was one. */
REFIT_API int refit_client_abort_active(refit_client* client, const char* reason, int32_t* out_aborted);
/* The engine's version and each parameter's checksum as refitd reads them. The array and its
 * names are owned by the client and valid until its next checksums call. Its elements are
 * sizeof(refit_param_checksum) of this library apart: read them with refit_client_checksum_at. */
REFIT_API int refit_client_checksums(refit_client* client, uint64_t* out_version, uint64_t* out_count);
REFIT_API int refit_client_checksum_at(refit_client* client, uint64_t index, refit_param_checksum* out);

/* ABI 3. Versions refitd keeps in staging (config hold: K; docs/versions.md). */
typedef struct refit_staged_version {
  uint32_t struct_size;
  const char* tag;
  const char* state;   /* "held" | "current" | "previous" */
  uint64_t version;    /* refitd's version when last committed (0 while only held) */
  uint64_t bytes;      /* staging bytes it occupies */
  uint64_t checksum;   /* its staged tensors' checksum chain (docs/versions.md) */
  uint64_t session_id; /* the session that staged it */
} refit_staged_version;

/* ABI 3. Commits the held version `tag` (a stage-only refit) into the engine, or (rollback) the
 * version committed before the current one. REFIT_NOT_FOUND naming the held tags for an unknown
 * tag; REFIT_FAILED_PRECONDITION when nothing can be rolled back to. `out` (may be NULL) gets the
 * report; its strings are owned by the client until its next commit_version or rollback call.
 * ABI 12: filled whatever the code, as refit_session_commit's. */
REFIT_API int refit_client_commit_version(refit_client* client, const char* tag, refit_report* out);
REFIT_API int refit_client_rollback(refit_client* client, refit_report* out);
/* ABI 3. Lists the kept versions (held first, then current, then previous) and refitd's hold
 * limit; read them with refit_client_version_at (owned by the client until its next call). */
REFIT_API int refit_client_versions(refit_client* client, uint64_t* out_count, uint32_t* out_hold);

/* ABI 13. Engine groups (docs/architecture.md "Engine groups"): the daemons of a fan-out client
 * (refit_client_connect_fanout, in member order) are one engine group's members. A group version
 * is prepared by a fan-out session with refit_manifest.stage_only and a tag (every member holds
 * it), then committed by refit_client_commit_group: every member pauses its engine and copies
 * it, then every member resumes with it; a member that cannot copy (or does not answer within
 * `timeout_ms`, 0: 10 s) makes every member abort it (those that copied restore the version they
 * held). `member_deadline_ms` (0: the daemons' group.decision_timeout_ms): how long a copied
 * member waits for the resume or abort. `out_outcome` (may be NULL) gets "committed", "aborted" or
 * "dirty" (static strings). REFIT_OK when committed; REFIT_ABORTED when aborted, and
 * REFIT_FAILED_PRECONDITION (refit_last_cause "engine_dirty") when the group is left dirty, the
 * message naming each member's failure. refit_client_abort_group aborts `tag` on every member
 * (a prepared version is dropped, a copied one restored). */
REFIT_API int refit_client_commit_group(refit_client* client, const char* tag, uint32_t member_deadline_ms,
                                        uint32_t timeout_ms, const char** out_outcome);
REFIT_API int refit_client_abort_group(refit_client* client, const char* tag, const char* reason, uint32_t timeout_ms);
REFIT_API int refit_client_version_at(refit_client* client, uint64_t index, refit_staged_version* out);

/* Opens a session (one per refitd at a time; REFIT_UNAVAILABLE with refit_last_cause() "busy"
 * otherwise; "engine_error" without an engine; a partial refit of a dirty engine:
 * REFIT_FAILED_PRECONDITION, "engine_dirty"). */
REFIT_API int refit_session_begin(refit_client* client, const refit_manifest* manifest, refit_session** out);
REFIT_API uint64_t refit_session_id(const refit_session* session);
REFIT_API uint64_t refit_session_bucket_bytes(const refit_session* session);
/* Appends a tensor to the current bucket (copied: `data` may be reused on return). */
REFIT_API int refit_session_push(refit_session* session, const refit_tensor* tensor);
/* ABI 10. As refit_session_push, but a CUDA tensor on a data plane that sends device memory from
 * where it is (CUDA IPC) is not copied: runs of tensors lying one after another in one allocation
 * (16-byte aligned, at most 256 bytes apart) travel as one bucket of that memory, so `data` must
 * stay allocated and unchanged until refit_session_commit (or _detach, _abort) returns. Anything
 * else is pushed as refit_session_push does (RefitSession::PushInPlace). */
REFIT_API int refit_session_push_in_place(refit_session* session, const refit_tensor* tensor);
REFIT_API int refit_session_flush(refit_session* session);
/* ABI 4. `on` != 0: every BF16 tensor pushed afterwards carries its max|x| (measured on the host,
 * or on the caller's GPU for device tensors), so refitd converts NVFP4 tensors in one pass
 * (RefitSession::MeasureAmax, docs/formats.md "Trainer-supplied amax"). Off by default. */
REFIT_API int refit_session_measure_amax(refit_session* session, int on);
/* ABI 8. Wire format checkpoint: the tensors whose max|x| tensor `name`'s NVFP4 global amax spans
 * (RefitSession::AmaxGroup: its fused group's members, or `name` alone), newline-separated, in *out
 * (owned by the session, valid until the session is freed); "" when the plan does not convert it
 * to NVFP4. */
REFIT_API int refit_session_amax_group(refit_session* session, const char* name, const char** out);
/* Flushes and asks refitd to validate and swap. A refused refit returns REFIT_FAILED_PRECONDITION
 * with refitd's message. `out` may be NULL. The session has ended afterwards, whatever the code.
 * ABI 12: `out` is filled whatever the code (past the arguments' checks): with refitd's report of
 * how the session ended (outcome "refused", "aborted", "failed" along with the code: its cause,
 * reason and times), or, when the commit failed before refitd reported (a send or the connection
 * failed), with outcome "none", the failure's cause (refit_last_cause) and message as reason.
 * refit_last_cause() may say more than the report's cause: "engine_dirty" for a failed commit
 * that left the engine dirty (whose report says "engine_error"). */
REFIT_API int refit_session_commit(refit_session* session, refit_report* out);
REFIT_API int refit_session_abort(refit_session* session, const char* reason);
/* ABI 3. Joins the active session begun by another trainer rank (see "Multi-rank sessions"):
 * `session_ids` holds one id per daemon of `client` (1 for a client of refit_client_connect;
 * for a fan-out client the beginning rank's refit_session_ids, in the same daemon order). The
 * joined session pushes over its own data-plane connection; it ends with refit_session_detach
 * (or refit_session_abort, which aborts the whole refit). REFIT_FAILED_PRECONDITION when the
 * session is not active or already committing. */
REFIT_API int refit_session_join(refit_client* client, const uint64_t* session_ids, uint64_t count,
                                 refit_session** out);
/* ABI 3. A joined rank is done: flushes, waits until everything it pushed has been sent, and
 * tells refitd. The session has ended afterwards (closing it no longer aborts the refit). */
REFIT_API int refit_session_detach(refit_session* session);
/* ABI 3. The session's id on each daemon (one unless fan-out): writes min(capacity, count) ids
 * to `out_ids` and the count to *out_count. */
REFIT_API int refit_session_ids(const refit_session* session, uint64_t* out_ids, uint64_t capacity,
                                uint64_t* out_count);
/* Aborts the session if it has not ended, and frees the handle. */
REFIT_API void refit_session_close(refit_session* session);

/* ---- Engine side ------------------------------------------------------------------------ */

typedef struct refit_engine_param {
  uint32_t struct_size;
  const char* name; /* the engine's parameter name (the spec maps trainer names onto these) */
  const char* dtype;
  const int64_t* shape;
  uint32_t rank;
  uint32_t storage;     /* REFIT_STORAGE_SHM or REFIT_STORAGE_CUDA_IPC */
  const char* shm_name; /* REFIT_STORAGE_SHM: "/name" of the shm object */
  uint64_t offset;      /* byte offset inside the shm object or the CUDA allocation */
  uint8_t cuda_ipc_handle[64];
  int32_t cuda_device;
  /* ABI 7. */
  const void* cuda_ptr; /* REFIT_STORAGE_CUDA_PTR: the parameter's first byte in device memory */
} refit_engine_param;

/* Run on the agent thread. pause returns only once nothing reads the parameters; resume says
 * they now hold `version`. They must not call back into this engine's refit_engine_stop. */
typedef void (*refit_pause_fn)(void* user);
typedef void (*refit_resume_fn)(void* user, uint64_t version);
/* ABI 3: resume with the trainer's tag of `version` ("" when none; valid during the call). */
typedef void (*refit_resume_tag_fn)(void* user, uint64_t version, const char* tag);
/* ABI 7: the registration audit, before every commit: writes the names of registered parameters
 * that are no longer where the engine registered them into `out` ('\n'-separated, NUL-terminated,
 * at most `capacity` bytes) and returns how many there are (0: none stale). */
typedef uint64_t (*refit_audit_fn)(void* user, char* out, uint64_t capacity);

typedef struct refit_engine_options {
  uint32_t struct_size;
  const char* address;
  refit_pause_fn pause;   /* may be NULL */
  refit_resume_fn resume; /* may be NULL */
  void* user;             /* passed to the callbacks */
  uint64_t version;       /* the version the parameters hold now */
  /* ABI 3. */
  const char* tag;                   /* the trainer's tag of `version`; NULL or "" for none */
  refit_resume_tag_fn resume_tagged; /* when set, called instead of `resume` */
  /* ABI 5: engine ranks. One process per GPU of an engine of several ranks (TP/EP workers)
   * registers with the node's one refitd giving its place; tp_size 0 (the default) is a single
   * engine. refitd refuses, naming the field, a place unlike its spec's (docs/config.md). */
  int32_t tp_rank;
  int32_t tp_size;
  int32_t ep_rank;
  int32_t ep_size;    /* 0: no expert parallelism */
  int32_t device;     /* the CUDA device of the parameters (checked for CUDA IPC parameters only) */
  const char* model;  /* NULL or "": not checked; else must be refitd's model */
  /* ABI 7. */
  refit_audit_fn audit; /* may be NULL; in-place parameters are re-checked by the library too */
} refit_engine_options;

/* Connects, registers `params`, and returns once refitd accepted (or refused, naming the
 * parameter). The storage must stay mapped until refit_engine_stop returns. */
REFIT_API int refit_engine_start(const refit_engine_options* options, const refit_engine_param* params,
                                 uint64_t num_params, refit_engine** out);
REFIT_API uint64_t refit_engine_version(const refit_engine* engine);
/* ABI 3. Copies the trainer's tag of refit_engine_version ("" when none) into `out` (NUL-terminated;
 * 129 bytes always suffice); REFIT_OUT_OF_RANGE when `out_size` is too small. */
REFIT_API int refit_engine_tag(const refit_engine* engine, char* out, uint64_t out_size);
REFIT_API int32_t refit_engine_paused(const refit_engine* engine);
/* Nonzero when refitd disconnected between pause and resume: the weights may be a mix of
 * versions and must not be served until a later resume. */
REFIT_API int32_t refit_engine_dirty(const refit_engine* engine);
REFIT_API int32_t refit_engine_connected(const refit_engine* engine);
/* ABI 7. Sleep: the engine is about to release its weights; returns once refitd dropped its
 * mappings (REFIT_UNAVAILABLE while a commit is in flight: retry). A refit meanwhile is staged (or
 * refused: refitd's engine.asleep_refits). Not from a callback. */
REFIT_API int refit_engine_sleep(refit_engine* engine);
/* ABI 7. Wake: the weights are mapped again, the same parameters (names, dtypes, shapes, order) at
 * the same or new addresses: `params` (NULL and 0: the ones registered last). refitd maps them and
 * commits a refit staged meanwhile (pause/resume are called) before this returns; `committed`
 * (may be NULL) says whether one was. An error when the wake or that commit failed. Not from a
 * callback. */
REFIT_API int refit_engine_wake(refit_engine* engine, const refit_engine_param* params, uint64_t num_params,
                                int32_t* committed);
REFIT_API int32_t refit_engine_asleep(const refit_engine* engine);
/* ABI 7. Distinct CUDA allocations the in-place (REFIT_STORAGE_CUDA_PTR) parameters lie in. */
REFIT_API uint64_t refit_engine_allocations(const refit_engine* engine);
/* Disconnects, waits for the agent thread (and any callback in progress), frees the handle. */
REFIT_API void refit_engine_stop(refit_engine* engine);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_CLIENT_C_API_H_ */
