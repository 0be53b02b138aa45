/* The C interface between the host plugin and its Gloo module (libbackplane_host_gloo.so).
 *
 * The module holds everything that needs libgloo: the rendezvous store, joining a communicator
 * and running one collective. The plugin opens it with dlopen the first time it describes a
 * device or a collective call needs it (gloo_loader.hpp), so the plugin itself never links
 * libgloo: where the module or libgloo is missing, only collectives are off, with the reason.
 *
 * The module is built and installed with the plugin, but it is checked like any loadable module
 * before its code runs: one exported entry symbol, which answers only the version it was built
 * for, and a table that starts with its size. Strings are borrowed for the call. No C++ type or
 * exception crosses; failures are a bp_status with the message in a bp_error. Every function is
 * thread-safe unless it says otherwise. */
#ifndef BACKPLANE_HOST_GLOO_MODULE_H
#define BACKPLANE_HOST_GLOO_MODULE_H

#include <backplane/abi/plugin.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The interface version; the module answers only its own (bumped on any change below). */
#define BP_HOST_GLOO_MODULE_VERSION 1u
/** The one exported symbol, a bp_host_gloo_entry_fn. */
#define BP_HOST_GLOO_MODULE_ENTRY "bp_host_gloo_module"
/** The module's file name; installed next to the host plugin. */
#define BP_HOST_GLOO_MODULE_FILE "libbackplane_host_gloo.so"

/** Where the collectives listen (the host plugin's "collectives" options; "" for unset). The
 *  environment (BACKPLANE_GLOO_ADDRESS, BACKPLANE_GLOO_INTERFACE) overrides both, read by the
 *  module. */
typedef struct bp_host_gloo_settings {
    size_t struct_size;
    const char *address;   /**< collectives.address */
    const char *interface; /**< collectives.interface */
} bp_host_gloo_settings;

/** One collective of one rank, checked by the plugin: the memory is the rank's host memory
 *  (send or recv NULL where the operation does not use it) and stays valid until comm_run
 *  returns. */
typedef struct bp_host_gloo_call {
    size_t struct_size;
    uint32_t op;     /**< bp_collective */
    uint32_t type;   /**< bp_data_type */
    uint32_t reduce; /**< bp_reduce_op (reducing operations) */
    uint32_t peer;   /**< root (reduce, broadcast) or peer (send, recv) */
    unsigned char *send;
    unsigned char *recv;
    uint64_t count;      /**< elements per rank */
    size_t element_size; /**< bytes of one element of `type` */
    uint32_t tag;        /**< from comm_next_tag, taken when the call was recorded */
} bp_host_gloo_call;

/** The module's rendezvous store and the ids naming it (one per plugin instance). */
typedef struct bp_host_gloo_ids bp_host_gloo_ids;
/** One rank's membership in a communicator. */
typedef struct bp_host_gloo_comm bp_host_gloo_comm;

typedef void (*bp_host_gloo_log_fn)(void *user, bp_log_level level, const char *message);

typedef struct bp_host_gloo_api {
    size_t struct_size;
    uint32_t version;   /**< BP_HOST_GLOO_MODULE_VERSION */
    const char *engine; /**< "gloo 0.5.0 (tcp)": bp_device_info::collectives; static */

    /** An id maker; cheap: its store starts with the first id. `log` (with `log_user`) receives
     *  the store's messages and must stay valid until ids_destroy. */
    bp_status (*ids_create)(const bp_host_gloo_settings *settings, bp_host_gloo_log_fn log,
                            void *log_user, bp_host_gloo_ids **out, bp_error *error);
    /** Stops the store. */
    void (*ids_destroy)(bp_host_gloo_ids *ids);
    /** A new communicator id (comm_id_create): at most `capacity` bytes into `out`. */
    bp_status (*id_make)(bp_host_gloo_ids *ids, void *out, size_t capacity, size_t *size,
                         bp_error *error);

    /** Joins the communicator of `args` (comm_create); blocks until every rank joined or the
     *  timeout. The caller checked rank < size and the id size. */
    bp_status (*comm_join)(const bp_comm_create_args *args, const bp_host_gloo_settings *settings,
                           bp_host_gloo_comm **out, bp_error *error);
    /** Drops the caller's reference; the connections close once no comm_run uses them. */
    void (*comm_release)(bp_host_gloo_comm *comm);
    /** Fails pending and later collectives with BP_ERROR_REMOTE (comm_abort). */
    void (*comm_abort)(bp_host_gloo_comm *comm);
    /** This rank and the number of ranks. */
    void (*comm_shape)(const bp_host_gloo_comm *comm, uint32_t *rank, uint32_t *size);
    /** The tag of the next collective of `op` (a send or recv counts per peer), in recording
     *  order. */
    uint32_t (*comm_next_tag)(bp_host_gloo_comm *comm, uint32_t op, uint32_t peer);
    /** Runs one collective to its end (the body of its stream task). BP_ERROR_REMOTE when a peer
     *  failed, left or timed out, or the communicator was aborted (it is then unusable);
     *  BP_ERROR_OUT_OF_MEMORY for scratch memory. */
    bp_status (*comm_run)(bp_host_gloo_comm *comm, const bp_host_gloo_call *call, bp_error *error);
} bp_host_gloo_api;

/** The entry: the table when `version` is the module's own, else NULL. */
typedef const bp_host_gloo_api *(*bp_host_gloo_entry_fn)(uint32_t version);

#ifdef __cplusplus
}
#endif

#endif /* BACKPLANE_HOST_GLOO_MODULE_H */
