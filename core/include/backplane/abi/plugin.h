/* The backplane plugin ABI, version 1.5: the C contract between the core and a device plugin. */
#ifndef BACKPLANE_ABI_PLUGIN_H
#define BACKPLANE_ABI_PLUGIN_H

/*
 * Rules that hold for everything in this header (docs/plugin-abi.md says the same at length):
 *
 * - Only C types cross this boundary. No C++ object, exception or allocation made with one side's
 *   allocator and freed by the other side's. Strings passed in are borrowed for the call; strings
 *   and blobs passed out go through buffers or sinks that the caller provides.
 * - Versioning: ABI major must be equal on both sides; minor may differ. Every table and every
 *   argument struct starts with `struct_size`. A reader only touches fields that lie inside the
 *   struct_size the writer set, so a newer host can use an older plugin (it sees the plugin's
 *   smaller table and does without the missing functions) and an older host can use a newer
 *   plugin (the plugin sees the host's smaller argument structs and uses defaults for the rest).
 *   New fields are only ever appended, together with a minor version bump.
 * - Every fallible function returns a bp_status and, when it fails, fills the bp_error the caller
 *   passed (which may be NULL). BP_SUCCESS is 0.
 * - Handles are opaque pointers owned by the plugin; the core releases each one exactly once with
 *   the matching release/destroy function, and never after the owning device is closed.
 * - Enumerations inside argument structs arrive as plain integers from C callers: a plugin reads
 *   them as integers and rejects unknown values with BP_ERROR_INVALID_ARGUMENT (never switch on an
 *   out-of-range enum value).
 * - Bad arguments are answered, never crashed on: a NULL argument struct or out pointer (unless
 *   the function says it may be NULL), a size or offset outside the page (including sums that
 *   overflow 64 bits), an index past the device count, flags this version does not define: each
 *   returns BP_ERROR_INVALID_ARGUMENT (NOT_FOUND for indices) with a message. `backplane
 *   conformance` checks every rule of this header (docs/conformance.md).
 * - Thread safety: plugin-level and device-level functions may be called from any thread at any
 *   time. Functions that take a bp_stream are never called concurrently for the same stream (the
 *   core serialises per stream) but are called concurrently for different streams. Event
 *   functions (query, wait, release, elapsed) may be called from any thread, concurrently.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of this header. Major: must match. Minor: only grows, see docs/plugin-abi.md. */
#define BP_ABI_VERSION_MAJOR 1
#define BP_ABI_VERSION_MINOR 7

/* The one symbol a plugin library exports; see bp_get_plugin_api_fn. */
#define BP_PLUGIN_ENTRY_SYMBOL "bp_get_plugin_api"

#if defined(_WIN32)
#define BP_PLUGIN_EXPORT __declspec(dllexport)
#else
#define BP_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */

/// Result of every fallible call. New codes may be added in a minor version; a host treats an
/// unknown code like BP_ERROR_INTERNAL.
typedef enum bp_status {
    BP_SUCCESS = 0,
    BP_ERROR_INVALID_ARGUMENT = 1, ///< the caller broke the contract (bad handle, size, offset)
    BP_ERROR_UNSUPPORTED = 2,      ///< the plugin or device does not offer this operation
    BP_ERROR_OUT_OF_MEMORY = 3,    ///< the allocation does not fit now; the core may free and retry
    BP_ERROR_NOT_FOUND = 4,        ///< no such device index, kernel entry point, ...
    BP_ERROR_NO_DRIVER = 5,        ///< the vendor runtime is missing (message names the library)
    BP_ERROR_NO_DEVICE = 6,        ///< the vendor runtime is there but reports no usable device
    BP_ERROR_DEVICE_LOST = 7,      ///< the device is unusable (sticky error); later calls fail fast
    BP_ERROR_COMPILE = 8,          ///< kernel compilation failed; the log went to the log sink
    BP_ERROR_LAUNCH = 9,           ///< a launch was rejected (resources, block size, bindings)
    BP_ERROR_TIMEOUT = 10,         ///< a host wait ran out of time; the work is still pending
    BP_ERROR_NOT_READY = 11,       ///< an event query found pending work (not a failure)
    BP_ERROR_INTERNAL = 12,        ///< anything else, including a C++ exception caught by the SDK
    BP_ERROR_REMOTE = 13,          ///< (1.1) a peer of a collective failed, left or timed out;
                                   ///< the communicator is unusable (destroy it, make a new one)
} bp_status;

/// Capacity of bp_error::message, including the terminating NUL.
#define BP_ERROR_MESSAGE_CAPACITY 1024

/// Error details filled by a failing call. Owned by the caller; the plugin writes into it.
typedef struct bp_error {
    size_t struct_size;  ///< sizeof(bp_error) as the caller knows it
    bp_status code;      ///< same value as the function returned
    int64_t vendor_code; ///< CUresult, VkResult, hipError_t, errno...; 0 if none
    char message[BP_ERROR_MESSAGE_CAPACITY]; ///< NUL-terminated, truncated if longer; names the
                                             ///< failing vendor call and what the user can do
} bp_error;

/* ---------------------------------------------------------------------------------------------
 * Opaque handles (all owned by the plugin)
 * ------------------------------------------------------------------------------------------- */

typedef struct bp_plugin bp_plugin; ///< one initialised plugin instance
typedef struct bp_device bp_device; ///< one opened device (context, queues)
typedef struct bp_memory bp_memory; ///< one page of memory (device, pinned host or host-visible)
typedef struct bp_stream bp_stream; ///< an in-order queue of work on one device
typedef struct bp_event bp_event;   ///< a completion point of a stream, created by a flush
typedef struct bp_kernel bp_kernel; ///< a loaded kernel (module + entry point, or pipeline)

/* ---------------------------------------------------------------------------------------------
 * Host services offered to the plugin
 * ------------------------------------------------------------------------------------------- */

typedef enum bp_log_level {
    BP_LOG_TRACE = 0,
    BP_LOG_DEBUG = 1,
    BP_LOG_INFO = 2,
    BP_LOG_WARN = 3,
    BP_LOG_ERROR = 4,
} bp_log_level;

/// Receives variable-size output (a compiled binary, a compiler log). The plugin may call `write`
/// several times; the chunks are appended. `user` is passed back untouched.
typedef struct bp_blob_sink {
    void *user;
    void (*write)(void *user, const void *data, size_t size);
} bp_blob_sink;

/// Arguments of bp_plugin_api::plugin_init. Everything is borrowed for the duration of the call,
/// except `log`/`log_user`, which stay valid until plugin_destroy returns.
typedef struct bp_plugin_init_args {
    size_t struct_size;
    uint32_t host_abi_major;
    uint32_t host_abi_minor;
    /// Log sink of the core (subsystem "plugin.<name>"); may be called from any thread. May be NULL.
    void (*log)(void *log_user, bp_log_level level, const char *message);
    void *log_user;
    /// Directory the plugin may use for its own caches (e.g. a VkPipelineCache); created by the
    /// core, may be NULL when caching is off.
    const char *cache_dir;
    /// Plugin-specific options from the config file's `plugins.options.<name>` object, as JSON
    /// text; "{}" when none.
    const char *options_json;
} bp_plugin_init_args;

/* ---------------------------------------------------------------------------------------------
 * Probe and device description
 * ------------------------------------------------------------------------------------------- */

/// Result of the cheap probe: is the vendor runtime present and how many devices does it see.
/// Probing must not create contexts or queues.
typedef struct bp_probe_result {
    size_t struct_size;
    uint32_t device_count;
    char driver_version[64]; ///< vendor runtime/driver version, "" if unknown
} bp_probe_result;

typedef enum bp_device_type {
    BP_DEVICE_TYPE_OTHER = 0,
    BP_DEVICE_TYPE_DISCRETE_GPU = 1,
    BP_DEVICE_TYPE_INTEGRATED_GPU = 2,
    BP_DEVICE_TYPE_VIRTUAL_GPU = 3,
    BP_DEVICE_TYPE_CPU = 4,
} bp_device_type;

/// Kernel source dialects. A plugin lists the ones it accepts in bp_device_info::dialects as a
/// bit mask of (1u << dialect).
typedef enum bp_dialect {
    BP_DIALECT_CUDA = 0,  ///< CUDA C++ (NVRTC; hiprtc for HIP)
    BP_DIALECT_HIP = 1,   ///< HIP C++
    BP_DIALECT_GLSL = 2,  ///< GLSL compute shader, compiled to SPIR-V
    BP_DIALECT_SPIRV = 3, ///< SPIR-V binary (source_size a multiple of 4)
    BP_DIALECT_HOST = 4,  ///< a native function: source is a bp_host_kernel_source
    /// (1.5) C++ source compiled for the host CPU by the plugin (the host plugin, with the
    /// system's compiler): it defines `extern "C" void ENTRY(const bp_host_kernel_context *)`,
    /// called once per workgroup like a BP_DIALECT_HOST function, with user_data NULL. The
    /// source declares what it uses itself (no include path is given). The blob is a shared
    /// object, portable to another process of the same compiler and CPU. Optionally (no version
    /// change: a plugin looks it up and falls back to one call per workgroup) the source defines `extern "C" void ENTRY` BP_CPP_RUNS_SUFFIX
    /// `(const bp_host_kernel_context *, uint32_t runs)`, which computes the `runs` workgroups
    /// workgroup[0], workgroup[0] + 1, ... along x with one call (a plugin may then launch
    /// runs of small workgroups instead of one call each).
    BP_DIALECT_CPP = 5,
} bp_dialect;

/// Capability bits of bp_device_info::capabilities.
enum {
    /// Streams run asynchronously to the host and flush returns real device events. Without it
    /// the core drives the device through its scheduler streams (one backend stream, task queues).
    BP_CAPABILITY_ASYNC_STREAMS = 1u << 0,
    /// stream_flush can create timing events and event_elapsed_ns works.
    BP_CAPABILITY_TIMESTAMPS = 1u << 1,
    /// copy_peer works between two devices of this plugin.
    BP_CAPABILITY_PEER_COPY = 1u << 2,
    /// BP_MEMORY_DEVICE pages can be mapped into the host address space (memory_map).
    BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY = 1u << 3,
    /// kernel_launch accepts a grid read from a buffer (bp_launch_args::grid_memory).
    BP_CAPABILITY_INDIRECT_DISPATCH = 1u << 4,
    /// kernel_compile produces blobs that stay valid in another process (the core may put them in
    /// its on-disk cache). Host-dialect kernels, for instance, are function pointers: not portable.
    /// (1.5) Never covers BP_DIALECT_HOST blobs, which a core of 1.5 or newer keeps in memory
    /// only; a plugin that also compiles host functions declares it only to such a core
    /// (bp_plugin_init_args::host_abi_minor >= 5).
    BP_CAPABILITY_PORTABLE_BINARIES = 1u << 5,
    /// (1.1) comm_id_create, comm_create, comm_destroy, comm_abort, comm_group and collective
    /// work on this device (bp_device_info::collectives names the engine).
    BP_CAPABILITY_COLLECTIVES = 1u << 6,
    /// (1.7) native_handle(BP_NATIVE_MEMORY) of a page is a byte address (a CUdeviceptr, a
    /// hipDeviceptr_t, a host pointer): the address of byte n of the page is that value + n. The
    /// core then hands out a buffer's own address (its page's plus its offset); without the bit
    /// the value is an opaque handle (a VkBuffer) and the core gives the handle and the offset.
    BP_CAPABILITY_ADDRESSABLE_MEMORY = 1u << 7,
};

/// (1.4) Element types of the kernel language. Bit t of the masks in bp_device_info
/// (element_storage, element_arithmetic, ...) stands for type t: (1u << BP_ELEMENT_F16) is f16.
typedef enum bp_element_type {
    BP_ELEMENT_BOOL = 0,
    BP_ELEMENT_I8 = 1,
    BP_ELEMENT_U8 = 2,
    BP_ELEMENT_I16 = 3,
    BP_ELEMENT_U16 = 4,
    BP_ELEMENT_I32 = 5,
    BP_ELEMENT_U32 = 6,
    BP_ELEMENT_I64 = 7,
    BP_ELEMENT_U64 = 8,
    BP_ELEMENT_F16 = 9,
    BP_ELEMENT_BF16 = 10,
    BP_ELEMENT_F32 = 11,
    BP_ELEMENT_F64 = 12,
} bp_element_type;

/// (1.4) Most entries of bp_device_info::matrix_shapes.
#define BP_MAX_MATRIX_SHAPES 16

/// (1.4) One shape of the device's matrix units: D (m x n, type c) = A (m x k, type a) *
/// B (k x n, type b) + C (m x n, type c). a, b and c hold bp_element_type values; m, n, k > 0;
/// reserved is 0.
typedef struct bp_matrix_shape {
    uint16_t m, n, k;
    uint8_t a, b, c, reserved;
} bp_matrix_shape;

/// What a device is and what it can do. Filled by device_info, which must be cheap (no context).
///
/// Kernel features (ABI 1.4): what kernels may use on the device, asked from the plugin and
/// never assumed; the core refuses a kernel that needs more. Masks of (1u << bp_element_type),
/// with these rules (conformance case info.kernel_features checks them):
/// - storage and arithmetic hold at least BOOL, I32, U32 and F32;
/// - arithmetic, atomic_add and atomic_bits are subsets of storage (a type is counted for
///   arithmetic or atomics only when kernels can also keep it in buffers);
/// - arithmetic means the device computes in the type natively or exactly as if it did (the
///   host computes f16 in f32 with one rounding per operation); without the bit the language
///   computes in a wider type and rounds where the documentation of the kernel language says;
/// - vector_widths uses bits 2, 4 and 8 only;
/// - matrix_shape_count <= BP_MAX_MATRIX_SHAPES, and the entries in use follow bp_matrix_shape.
/// A plugin older than 1.4 (its struct_size ends before the end of matrix_shapes, or its table
/// says abi_minor < 4) is treated as ABI 1.3 kernels were: storage and arithmetic of BOOL, I32,
/// U32 and F32; atomic add and atomic bits on I32 and U32; no vectors; no matrix units. A reader
/// checks the end of the group, not its start: ABI 1.3's struct ended in 4 bytes of padding,
/// which is where element_storage now lies, so a 1.3 struct_size covers that field.
typedef struct bp_device_info {
    size_t struct_size;
    char name[256];          ///< "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)"
    char vendor[64];         ///< "NVIDIA", "AMD", "Mesa", "backplane"
    char arch[64];           ///< "sm_90", "gfx90a", "lavapipe", "x86_64"
    char driver_version[64]; ///< part of the device fingerprint used to key caches
    char pci_bus_id[32];     ///< "0000:1b:00.0", "" if the device has none
    uint8_t uuid[16];        ///< stable identity; equal for one GPU seen through two plugins
    uint32_t has_uuid;       ///< 0 when the vendor API reports no UUID (uuid is then all zero)
    bp_device_type type;
    uint64_t memory_bytes;         ///< device-local memory the device may allocate
    uint64_t max_allocation_bytes; ///< largest single page memory_allocate accepts
    uint32_t max_block_size[3];    ///< per dimension
    uint32_t max_block_threads;    ///< product of block dims
    uint32_t max_grid_size[3];
    uint32_t max_shared_memory_bytes;
    uint32_t subgroup_size;         ///< warp / wavefront / subgroup width, 1 on a CPU
    uint32_t binding_alignment;     ///< bp_binding::offset must be a multiple of this (>= 1)
    uint32_t max_bindings;          ///< buffers per launch
    uint32_t max_scalar_bytes;      ///< bp_launch_args::scalar_size limit
    uint32_t max_streams;           ///< concurrent backend streams worth creating (>= 1)
    uint32_t dialects;              ///< mask of (1u << bp_dialect)
    uint32_t capabilities;          ///< mask of BP_CAPABILITY_*
    /* ABI 1.1 */
    /// The collective engine and its version when BP_CAPABILITY_COLLECTIVES is set ("nccl
    /// 2.28.9", "gloo 0.5.0"); otherwise why not ("libnccl.so.2 not found: ..."), or "".
    char collectives[256];
    /* ABI 1.4 (see "Kernel features" above) */
    uint32_t element_storage;     ///< types kernels may keep in buffers (loads and stores)
    uint32_t element_arithmetic;  ///< types with native arithmetic on the device
    uint32_t element_atomic_add;  ///< types with atomicAdd on buffers and shared memory
    uint32_t element_atomic_bits; ///< types with atomic min, max, and, or, xor, exchange
    uint32_t vector_widths;       ///< bit n set: vector loads/stores of n elements (n = 2, 4, 8)
    uint32_t matrix_shape_count;  ///< entries of matrix_shapes in use
    bp_matrix_shape matrix_shapes[BP_MAX_MATRIX_SHAPES];
    /* ABI 1.5 */
    /// The compiler of BP_DIALECT_CPP kernels when the device accepts them ("g++ (Debian
    /// 12.2.0-14) 12.2.0 -O3 -march=native ..."); otherwise why not ("no C++ compiler found on
    /// PATH"), or "" when the plugin compiles no host code.
    char kernel_compiler[256];
} bp_device_info;

/// Arguments of device_open. Reserved for options; fill struct_size.
typedef struct bp_device_open_args {
    size_t struct_size;
    uint32_t flags; ///< none defined in v1; must be 0 (others: BP_ERROR_INVALID_ARGUMENT)
} bp_device_open_args;

/* ---------------------------------------------------------------------------------------------
 * Storage
 * ------------------------------------------------------------------------------------------- */

typedef enum bp_memory_kind {
    BP_MEMORY_DEVICE = 0,       ///< device-local; the core slices these pages into pools
    BP_MEMORY_PINNED_HOST = 1,  ///< page-locked host memory for staging; always mapped
    BP_MEMORY_HOST_VISIBLE = 2, ///< device memory the host can map (BAR / unified); always mapped
} bp_memory_kind;

typedef struct bp_memory_allocate_args {
    size_t struct_size;
    bp_memory_kind kind;
    uint64_t size; ///< bytes, > 0
} bp_memory_allocate_args;

/// memory_register (ABI 1.3): a range of host memory that the application allocated, to be
/// registered (page-locked) with the device so that transfers from and into it run like those
/// of BP_MEMORY_PINNED_HOST pages.
typedef struct bp_memory_register_args {
    size_t struct_size;
    void *host;     ///< start of the range, not NULL; any alignment
    uint64_t size;  ///< bytes, > 0
    uint32_t flags; ///< none defined: 0
} bp_memory_register_args;

/// Native objects a plugin can hand out for interop (bp_plugin_api::native_handle).
typedef enum bp_native_kind {
    BP_NATIVE_DEVICE = 0, ///< object: NULL. CUcontext, VkDevice, hipDevice_t, or the plugin's
                          ///< own device object where there is no vendor handle
    BP_NATIVE_STREAM = 1, ///< object: bp_stream*. CUstream, VkQueue, hipStream_t...
    BP_NATIVE_MEMORY = 2, ///< object: bp_memory*. CUdeviceptr, VkBuffer, void*...
} bp_native_kind;

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */

typedef struct bp_stream_create_args {
    size_t struct_size;
    uint32_t priority; ///< 0 = default; reserved in v1
} bp_stream_create_args;

/// Flags of bp_flush_args::flags.
enum {
    /// The event must carry a device timestamp usable with event_elapsed_ns.
    BP_FLUSH_TIMING_EVENT = 1u << 0,
};

typedef struct bp_flush_args {
    size_t struct_size;
    uint32_t flags; ///< BP_FLUSH_*
} bp_flush_args;

/* ---------------------------------------------------------------------------------------------
 * Transfers (all stream-ordered and asynchronous: host pointers must stay valid and unchanged
 * until an event flushed after the call has completed). A size of 0 is valid and does nothing,
 * at any offset up to the page's size; any byte of a range past the page is
 * BP_ERROR_INVALID_ARGUMENT and nothing is written.
 * ------------------------------------------------------------------------------------------- */

typedef struct bp_copy_host_to_device_args {
    size_t struct_size;
    const void *src;
    bp_memory *dst;
    uint64_t dst_offset;
    uint64_t size;
} bp_copy_host_to_device_args;

typedef struct bp_copy_device_to_host_args {
    size_t struct_size;
    bp_memory *src;
    uint64_t src_offset;
    void *dst;
    uint64_t size;
} bp_copy_device_to_host_args;

/// Copy within one device, or (copy_peer) from another device of the same plugin.
typedef struct bp_copy_device_to_device_args {
    size_t struct_size;
    bp_memory *src;
    uint64_t src_offset;
    bp_memory *dst;
    uint64_t dst_offset;
    uint64_t size;
} bp_copy_device_to_device_args;

/// Fill `size` bytes with a repeated 4-byte pattern; offset and size are multiples of 4.
typedef struct bp_fill_args {
    size_t struct_size;
    bp_memory *dst;
    uint64_t offset;
    uint64_t size;
    uint32_t pattern;
} bp_fill_args;

/* ---------------------------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------------------------- */

/// One workgroup's view of a host-dialect launch.
typedef struct bp_host_kernel_context {
    size_t struct_size;
    uint32_t grid[3];        ///< number of workgroups
    uint32_t block[3];       ///< threads per workgroup (the function loops over them itself)
    uint32_t workgroup[3];   ///< id of the workgroup this call computes
    void *const *buffers;    ///< binding i's host address, offset applied
    const uint64_t *buffer_sizes;
    uint32_t buffer_count;
    const void *scalars;
    size_t scalar_size;
    /* ABI 1.2 */
    /// bp_host_kernel_source::user_data of the kernel, unchanged; NULL when the kernel was
    /// compiled from a 1.1 (smaller) bp_host_kernel_source. Read it only when struct_size covers
    /// it: a 1.1 plugin passes the smaller context.
    const void *user_data;
    /* ABI 1.6 */
    /// Reports that this call could not compute its workgroup(s) (no memory for its scratch, an
    /// internal error): the plugin then fails the launch with `status` (BP_ERROR_OUT_OF_MEMORY,
    /// BP_ERROR_INTERNAL...) and `message` (copied; name the kernel) instead of completing it,
    /// so a workgroup is never silently left undone. May be called from several calls of one
    /// launch at once; the first report wins. NULL from an older plugin: read it only when
    /// struct_size covers it.
    void (*fail)(const struct bp_host_kernel_context *context, bp_status status,
                 const char *message);
    /// The plugin's state for `fail`; a host kernel passes the context back unchanged.
    void *fail_state;
} bp_host_kernel_context;

/// A host-dialect kernel: called once per workgroup, possibly concurrently for different ones.
typedef void (*bp_host_kernel_fn)(const bp_host_kernel_context *context);

/// The suffix of a BP_DIALECT_CPP source's optional entry that runs several workgroups along x
/// per call (the core's generated sources define it), and its type.
#define BP_CPP_RUNS_SUFFIX "__runs"
typedef void (*bp_host_kernel_runs_fn)(const bp_host_kernel_context *context, uint32_t runs);

/// The `source` of a BP_DIALECT_HOST kernel: the function itself, passed by address.
/// source_size is the caller's sizeof(bp_host_kernel_source); a plugin accepts the smaller 1.1
/// layout (struct_size without user_data) and then passes user_data = NULL.
typedef struct bp_host_kernel_source {
    size_t struct_size;
    bp_host_kernel_fn function;
    /* ABI 1.2 */
    /// Passed unchanged to every call of the function as bp_host_kernel_context::user_data (one
    /// function can then run many kernels: an interpreter and a per-kernel program). The plugin
    /// never dereferences it; the caller keeps it alive while the kernel is loaded and until the
    /// kernel's last launch completed (kernel_release may come earlier). kernel_compile puts it
    /// in the blob, so kernel_load of that blob passes the same pointer.
    const void *user_data;
} bp_host_kernel_source;

typedef struct bp_kernel_compile_args {
    size_t struct_size;
    bp_dialect dialect;
    const char *entry_point;     ///< function name in the source ("main" for GLSL)
    const void *source;          ///< text (not necessarily NUL-terminated) or binary
    size_t source_size;
    const char *const *options;  ///< compiler options, e.g. "-DTILE=16"; may be NULL
    uint32_t option_count;
    bp_blob_sink binary;         ///< receives the loadable blob (CUBIN, code object, SPIR-V...)
    bp_blob_sink log;            ///< receives the compiler log, also on success; write may be NULL
} bp_kernel_compile_args;

typedef struct bp_kernel_load_args {
    size_t struct_size;
    bp_dialect dialect;          ///< dialect the blob was compiled from
    const char *entry_point;
    const void *binary;          ///< a blob produced by kernel_compile of this plugin
    size_t binary_size;
} bp_kernel_load_args;

/// One buffer bound to a launch, in binding order.
typedef struct bp_binding {
    bp_memory *memory;
    uint64_t offset; ///< multiple of bp_device_info::binding_alignment
    uint64_t size;   ///< bytes visible to the kernel from offset
} bp_binding;

typedef struct bp_launch_args {
    size_t struct_size;
    bp_kernel *kernel;
    uint32_t grid[3];          ///< workgroups; ignored when grid_memory is set
    bp_memory *grid_memory;    ///< NULL, or a buffer holding three uint32 (x, y, z) read at
                               ///< execution time (needs BP_CAPABILITY_INDIRECT_DISPATCH)
    uint64_t grid_offset;
    uint32_t block[3];         ///< threads per workgroup
    const bp_binding *bindings;
    uint32_t binding_count;
    const void *scalars;       ///< copied during the call; may be NULL
    size_t scalar_size;
    uint32_t shared_memory_bytes; ///< dynamic shared memory per workgroup
} bp_launch_args;

/* ---------------------------------------------------------------------------------------------
 * Collectives (ABI 1.1, BP_CAPABILITY_COLLECTIVES)
 *
 * A communicator joins `size` ranks, one device each, in one or several processes. One rank
 * calls comm_id_create; the core hands the id bytes to every rank (its rendezvous), and each rank
 * calls comm_create with the id, its rank and the size. comm_create returns once every rank
 * joined, or fails with BP_ERROR_TIMEOUT after timeout_ms. When one process holds several ranks
 * of a communicator, the core calls their comm_create concurrently, one thread per rank.
 *
 * A collective is stream-ordered like a launch: it starts after earlier work of the stream, and
 * later work waits for it. When one thread issues one collective for several local ranks, the
 * core brackets those calls with comm_group(begin = 1) ... comm_group(begin = 0) (NCCL's group
 * semantics); a plugin whose collective call only enqueues may treat the group as a no-op, and a
 * plugin may defer a group's collectives to its end (so the core flushes no event on those
 * streams inside a group).
 * Every rank issues the same collectives in the same order (the engines' rule).
 *
 * A collective whose peer failed, left or exceeded the timeout fails with BP_ERROR_REMOTE: from
 * the call when it is known then, otherwise as the error of the stream's next event (event_wait
 * / event_query), like any failed work. comm_abort makes pending and later collectives of the
 * communicator fail with BP_ERROR_REMOTE instead of waiting for peers; comm_destroy may follow.
 * ------------------------------------------------------------------------------------------- */

typedef struct bp_comm bp_comm; ///< one rank's membership in a communicator

/// Largest id comm_id_create may produce (NCCL's is 128 bytes).
#define BP_COMM_ID_MAX_BYTES 512

typedef struct bp_comm_create_args {
    size_t struct_size;
    const void *id;      ///< bytes from comm_id_create (on any rank, any process)
    size_t id_size;
    uint32_t rank;       ///< < size
    uint32_t size;       ///< ranks in the communicator, >= 1
    uint64_t timeout_ms; ///< bound on joining and on waiting for peers; 0: the plugin's default
} bp_comm_create_args;

typedef enum bp_collective {
    BP_COLLECTIVE_ALL_REDUCE = 0,
    BP_COLLECTIVE_REDUCE = 1,         ///< result on rank `peer` only
    BP_COLLECTIVE_BROADCAST = 2,      ///< from rank `peer`
    BP_COLLECTIVE_ALL_GATHER = 3,
    BP_COLLECTIVE_REDUCE_SCATTER = 4,
    BP_COLLECTIVE_SEND = 5,           ///< to rank `peer`
    BP_COLLECTIVE_RECV = 6,           ///< from rank `peer`
} bp_collective;

typedef enum bp_data_type {
    BP_DATA_I8 = 0,
    BP_DATA_U8 = 1,
    BP_DATA_I32 = 2,
    BP_DATA_U32 = 3,
    BP_DATA_I64 = 4,
    BP_DATA_U64 = 5,
    BP_DATA_F16 = 6,
    BP_DATA_BF16 = 7,
    BP_DATA_F32 = 8,
    BP_DATA_F64 = 9,
} bp_data_type;

typedef enum bp_reduce_op {
    BP_REDUCE_SUM = 0,
    BP_REDUCE_PROD = 1,
    BP_REDUCE_MIN = 2,
    BP_REDUCE_MAX = 3,
    BP_REDUCE_AVG = 4, ///< sum divided by the rank count (integer types: truncated)
} bp_reduce_op;

/// One collective call of one rank. Counts are elements of `type`:
/// - ALL_REDUCE, REDUCE, BROADCAST, SEND, RECV: `count` elements in send and in recv;
/// - ALL_GATHER: `count` sent, `count * size` received (rank r's part at r * count);
/// - REDUCE_SCATTER: `count * size` sent, `count` received (rank r gets part r).
/// send and recv may be the same range (in place) for ALL_REDUCE, REDUCE and BROADCAST. SEND
/// ignores recv; RECV ignores send; BROADCAST reads send on the root only.
typedef struct bp_collective_args {
    size_t struct_size;
    bp_collective op;
    bp_data_type type;
    bp_reduce_op reduce; ///< ALL_REDUCE, REDUCE and REDUCE_SCATTER
    uint32_t peer;       ///< root of REDUCE and BROADCAST; the other rank of SEND and RECV
    bp_memory *send;
    uint64_t send_offset;
    bp_memory *recv;
    uint64_t recv_offset;
    uint64_t count;
} bp_collective_args;

/* ---------------------------------------------------------------------------------------------
 * Recorded sequences (ABI 1.3; all optional)
 *
 * A graph is a fixed sequence of operations (launches, copies, fills) that the core recorded once
 * and replays many times: a CUDA graph, a reusable Vulkan command buffer, a host replay list.
 * graph_launch records the whole sequence on a stream, after the stream's earlier work, with the
 * same meaning as calling the operations one after another on that stream (each starts after the
 * previous one completed). The core keeps every page, kernel and host block an op names alive and
 * unchanged in size for as long as the graph exists, and releases a graph only after every launch
 * of it completed. Host addresses in copy ops are pinned memory of this device (memory_allocate
 * with BP_MEMORY_PINNED_HOST), read or written when the replay runs. A plugin that cannot build
 * a graph for some op (indirect dispatch, a kind it does not know) returns BP_ERROR_UNSUPPORTED:
 * the core then replays the operations one by one through the ordinary calls. The core never
 * calls graph_update or graph_release of a graph concurrently with another call on that graph.
 * ------------------------------------------------------------------------------------------- */

typedef struct bp_graph bp_graph; ///< a recorded sequence of operations of one device

typedef enum bp_graph_op_kind {
    BP_GRAPH_OP_LAUNCH = 0,              ///< `launch`
    BP_GRAPH_OP_COPY_HOST_TO_DEVICE = 1, ///< `to_device`
    BP_GRAPH_OP_COPY_DEVICE_TO_HOST = 2, ///< `to_host`
    BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE = 3, ///< `copy`
    BP_GRAPH_OP_FILL = 4,                ///< `fill`
} bp_graph_op_kind;

/// One operation; only the pointer that `kind` names is read (the others may be NULL).
typedef struct bp_graph_op {
    size_t struct_size;
    bp_graph_op_kind kind;
    const bp_launch_args *launch;
    const bp_copy_host_to_device_args *to_device;
    const bp_copy_device_to_host_args *to_host;
    const bp_copy_device_to_device_args *copy;
    const bp_fill_args *fill;
} bp_graph_op;

typedef struct bp_graph_create_args {
    size_t struct_size;
    const bp_graph_op *ops; ///< copied during the call
    uint32_t op_count;      ///< > 0
} bp_graph_create_args;

/* ---------------------------------------------------------------------------------------------
 * The function table
 * ------------------------------------------------------------------------------------------- */

/// The table returned by the entry symbol. Static storage in the plugin, valid while the library
/// is loaded. Every function added after ABI 1.0 lies past the struct_size of older plugins; the
/// host checks before calling (a NULL pointer inside struct_size also means "not provided").
typedef struct bp_plugin_api {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    const char *plugin_name;    ///< equals the manifest's "name"
    const char *plugin_version; ///< the plugin's own version, part of cache keys

    /* lifecycle --------------------------------------------------------------------------- */
    /// Creates the plugin instance. Cheap: no vendor contexts. May load the vendor library, or
    /// defer that to probe. Fails with BP_ERROR_INTERNAL or BP_ERROR_UNSUPPORTED (e.g. the host's
    /// ABI minor is too old for this plugin).
    bp_status (*plugin_init)(const bp_plugin_init_args *args, bp_plugin **out, bp_error *error);
    /// Destroys the instance; every device has been closed before. Joins plugin threads.
    void (*plugin_destroy)(bp_plugin *plugin);

    /* probe and devices --------------------------------------------------------------------- */
    /// Is the vendor runtime here and how many devices does it see. BP_ERROR_NO_DRIVER when the
    /// vendor library is missing (message: the loader's text), BP_ERROR_NO_DEVICE or
    /// device_count == 0 when there is none. Must not create contexts.
    bp_status (*probe)(bp_plugin *plugin, bp_probe_result *out, bp_error *error);
    /// Describes device `index` (< device_count). Cheap; no context.
    bp_status (*device_info)(bp_plugin *plugin, uint32_t index, bp_device_info *out,
                             bp_error *error);
    /// Opens device `index`: contexts, queues. A device may be opened again while it is open:
    /// each open is independent (its own streams, events, memory and kernels; closing one leaves
    /// the others working), as Runtime::open gives each call its own ComputeClient. A plugin
    /// may share what the device has once (its memory budget, a primary context) between them.
    /// Conformance case device.open_twice checks it.
    bp_status (*device_open)(bp_plugin *plugin, uint32_t index, const bp_device_open_args *args,
                             bp_device **out, bp_error *error);
    /// Closes a device after the core released every memory, stream, event and kernel of it.
    void (*device_close)(bp_device *device);

    /* storage ------------------------------------------------------------------------------- */
    /// Allocates one page. For PINNED_HOST and HOST_VISIBLE pages `*mapped` receives the host
    /// address (valid until memory_free). For DEVICE pages it is NULL, unless the page is
    /// directly host-addressable (a CPU plugin), in which case it may be that address. Out of
    /// memory is BP_ERROR_OUT_OF_MEMORY, never a crash.
    bp_status (*memory_allocate)(bp_device *device, const bp_memory_allocate_args *args,
                                 bp_memory **out, void **mapped, bp_error *error);
    /// Frees a page. The core guarantees no pending work uses it.
    void (*memory_free)(bp_device *device, bp_memory *memory);
    /// Host address of a DEVICE page, where BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY is set;
    /// BP_ERROR_UNSUPPORTED otherwise. Valid until memory_free.
    bp_status (*memory_map)(bp_device *device, bp_memory *memory, void **mapped, bp_error *error);

    /* streams and events -------------------------------------------------------------------- */
    bp_status (*stream_create)(bp_device *device, const bp_stream_create_args *args,
                               bp_stream **out, bp_error *error);
    /// Destroys a stream after waiting for its work. Events flushed from it stay valid.
    void (*stream_destroy)(bp_device *device, bp_stream *stream);
    /// Submits everything recorded on the stream. When `out` is not NULL, also returns an event
    /// that completes when all work submitted so far on this stream has completed. `args` may
    /// be NULL (flags 0).
    bp_status (*stream_flush)(bp_device *device, bp_stream *stream, const bp_flush_args *args,
                              bp_event **out, bp_error *error);
    /// Device-side wait: later work on `stream` starts after `event` completed. The event may
    /// come from any stream of the same device, or (1.1) of a device that device_peer_access
    /// reports as a peer of this one, and stays owned by the caller.
    bp_status (*stream_wait_event)(bp_device *device, bp_stream *stream, bp_event *event,
                                   bp_error *error);
    /// Host-side wait, at most timeout_ns (UINT64_MAX: forever). BP_ERROR_TIMEOUT if it ran out;
    /// the error of the work (e.g. BP_ERROR_DEVICE_LOST) if it failed.
    bp_status (*event_wait)(bp_device *device, bp_event *event, uint64_t timeout_ns,
                            bp_error *error);
    /// BP_SUCCESS when complete, BP_ERROR_NOT_READY when pending; never blocks.
    bp_status (*event_query)(bp_device *device, bp_event *event, bp_error *error);
    void (*event_release)(bp_device *device, bp_event *event);
    /// Device time between two completed timing events (BP_FLUSH_TIMING_EVENT), in nanoseconds.
    bp_status (*event_elapsed_ns)(bp_device *device, bp_event *start, bp_event *end,
                                  uint64_t *out, bp_error *error);

    /* transfers ------------------------------------------------------------------------------- */
    bp_status (*copy_host_to_device)(bp_device *device, bp_stream *stream,
                                     const bp_copy_host_to_device_args *args, bp_error *error);
    bp_status (*copy_device_to_host)(bp_device *device, bp_stream *stream,
                                     const bp_copy_device_to_host_args *args, bp_error *error);
    bp_status (*copy_device_to_device)(bp_device *device, bp_stream *stream,
                                       const bp_copy_device_to_device_args *args, bp_error *error);
    bp_status (*fill)(bp_device *device, bp_stream *stream, const bp_fill_args *args,
                      bp_error *error);
    /// Copies from `src_device`'s memory into `device`'s memory, ordered on `stream` (a stream of
    /// `device`). Needs BP_CAPABILITY_PEER_COPY on both; may be NULL.
    bp_status (*copy_peer)(bp_device *device, bp_stream *stream, bp_device *src_device,
                           const bp_copy_device_to_device_args *args, bp_error *error);

    /* kernels --------------------------------------------------------------------------------- */
    /// Compiles a source into a loadable blob for this device (its exact arch). Synchronous, does
    /// not touch streams. BP_ERROR_COMPILE with the log in args->log on a compile error.
    bp_status (*kernel_compile)(bp_device *device, const bp_kernel_compile_args *args,
                                bp_error *error);
    bp_status (*kernel_load)(bp_device *device, const bp_kernel_load_args *args, bp_kernel **out,
                             bp_error *error);
    /// May be called while launches of the kernel are recorded or pending: the plugin keeps
    /// what they use alive until they completed.
    void (*kernel_release)(bp_device *device, bp_kernel *kernel);
    /// Records a launch on the stream. Bindings must belong to this device.
    bp_status (*kernel_launch)(bp_device *device, bp_stream *stream, const bp_launch_args *args,
                               bp_error *error);

    /* interop --------------------------------------------------------------------------------- */
    /// The vendor object behind a handle, as an integer (pointer or 64-bit handle).
    bp_status (*native_handle)(bp_device *device, bp_native_kind kind, const void *object,
                               uint64_t *out, bp_error *error);

    /* ABI 1.1: peers ------------------------------------------------------------------------ */
    /// Sets *out to 1 when copy_peer from `src_device` into `device` works for this pair, and
    /// stream_wait_event on a stream of either accepts events of the other; 0 otherwise.
    /// BP_CAPABILITY_PEER_COPY only says that some pair can. May be NULL (then no pair can).
    bp_status (*device_peer_access)(bp_device *device, bp_device *src_device, uint32_t *out,
                                    bp_error *error);

    /* ABI 1.1: collectives (see "Collectives" above; all may be NULL) ----------------------- */
    /// Makes the id of a new communicator: at most `capacity` bytes into `out`, the length in
    /// *size. Called once per communicator, on one rank.
    bp_status (*comm_id_create)(bp_plugin *plugin, void *out, size_t capacity, size_t *size,
                                bp_error *error);
    /// Joins the communicator as args->rank on `device`; blocks until every rank joined.
    bp_status (*comm_create)(bp_device *device, const bp_comm_create_args *args, bp_comm **out,
                             bp_error *error);
    /// Leaves and frees; the core calls it after the communicator's work completed, or after
    /// comm_abort.
    void (*comm_destroy)(bp_device *device, bp_comm *comm);
    /// Makes pending and later collectives fail with BP_ERROR_REMOTE instead of waiting for
    /// peers. Any thread, any time, also while a collective runs.
    void (*comm_abort)(bp_device *device, bp_comm *comm);
    /// Starts (begin = 1) or ends (begin = 0) a group of collective calls of one thread.
    bp_status (*comm_group)(bp_plugin *plugin, uint32_t begin, bp_error *error);
    /// Records one collective of `comm` on `stream` (a stream of `device`).
    bp_status (*collective)(bp_device *device, bp_stream *stream, bp_comm *comm,
                            const bp_collective_args *args, bp_error *error);

    /* ABI 1.3: recorded sequences (see "Recorded sequences" above; all may be NULL) ------- */
    /// Builds a replayable graph of the ops, in order. Touches no stream. BP_ERROR_UNSUPPORTED
    /// when some op cannot be part of a graph on this device (the core then replays the ops).
    bp_status (*graph_create)(bp_device *device, const bp_graph_create_args *args, bp_graph **out,
                              bp_error *error);
    /// Records one replay of the whole graph on `stream`.
    bp_status (*graph_launch)(bp_device *device, bp_stream *stream, bp_graph *graph,
                              bp_error *error);
    /// Replaces op `index` of the graph with `op`: the same kind, for a launch the same kernel,
    /// block size and binding count (grid, bindings and scalars may change). Later launches of
    /// the graph use it; launches already recorded are not affected. BP_ERROR_UNSUPPORTED when
    /// the plugin cannot change the graph in place (the core then builds a new graph).
    bp_status (*graph_update)(bp_device *device, bp_graph *graph, uint32_t index,
                              const bp_graph_op *op, bp_error *error);
    /// Frees a graph; the core calls it after every launch of the graph completed.
    void (*graph_release)(bp_device *device, bp_graph *graph);

    /* ABI 1.3: host registration (may be NULL) ---------------------------------------------- */
    /// Registers [args->host, args->host + args->size) as a page of kind BP_MEMORY_PINNED_HOST
    /// whose mapped address is args->host: copy_host_to_device / copy_device_to_host from and
    /// into that range run as from pinned pages (cuMemHostRegister). The caller keeps the memory
    /// allocated and unchanged in place until memory_free of the page, which unregisters it and
    /// never frees the host memory; the core calls memory_free after every transfer using the
    /// range completed. BP_ERROR_UNSUPPORTED when the device cannot register host memory,
    /// BP_ERROR_INVALID_ARGUMENT for a range the vendor refuses (e.g. overlapping a registered
    /// one), BP_ERROR_OUT_OF_MEMORY when the system cannot lock more pages.
    bp_status (*memory_register)(bp_device *device, const bp_memory_register_args *args,
                                 bp_memory **out, bp_error *error);

    /* ABI 1.5: options (may be NULL) -------------------------------------------------------- */
    /// The schema of the options JSON this plugin's plugin_init takes (config `plugins.options.
    /// <name>`), as one line of JSON in a subset of JSON Schema: {"type": "object", "properties":
    /// {NAME: {"type": "integer" | "number" | "string" | "boolean" | "array" | "object",
    /// "description": ONE LINE, "default": ..., "minimum" / "maximum" (numbers), "enum" (allowed
    /// values), "maxLength" (strings), "items" (arrays: a schema), "properties" and
    /// "additionalProperties": false (objects)}}, "additionalProperties": false}. Static text,
    /// at most 64 KiB, readable before plugin_init: `backplane config check` validates a
    /// config's options against it and `backplane devices --options NAME` prints it
    /// (docs/plugin-abi.md, "Options schema"). NULL: the plugin publishes none.
    const char *options_schema;
} bp_plugin_api;

/// Signature of the entry symbol BP_PLUGIN_ENTRY_SYMBOL. Returns the plugin's static table; the
/// host checks abi_major before calling anything in it. Never fails, never allocates.
typedef const bp_plugin_api *(*bp_get_plugin_api_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_ABI_PLUGIN_H */
