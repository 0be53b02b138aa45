// The host plugin's C++ compiler: finds the system's compiler, compiles BP_DIALECT_CPP kernels
// to shared objects (the blobs the core caches on disk) and loads them.
#pragma once

#include "host_options.hpp"

#include <backplane/abi/plugin.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::host {

/// A loaded kernel object: the dlopen handle and its entry. Closed when the last owner (the
/// kernel, and every launch recorded with it) lets go.
class LoadedObject {
public:
    LoadedObject(void *handle, bp_host_kernel_fn function,
                 bp_host_kernel_runs_fn runsEntry = nullptr)
        : handle_(handle), entry_(function), runs_(runsEntry) {}
    ~LoadedObject();
    LoadedObject(const LoadedObject &) = delete;
    LoadedObject &operator=(const LoadedObject &) = delete;
    bp_host_kernel_fn entry() const noexcept { return entry_; }
    /// The entry that runs several workgroups along x per call (BP_CPP_RUNS_SUFFIX), or NULL.
    bp_host_kernel_runs_fn runs() const noexcept { return runs_; }

private:
    void *handle_;
    bp_host_kernel_fn entry_;
    bp_host_kernel_runs_fn runs_;
};

/// The compiler of one plugin instance. Thread-safe; compiles run in the calling thread (the
/// core calls kernel_compile with no engine lock held), in a temporary directory each.
class HostCompiler {
public:
    /// Cheap: runs nothing until identity() is first asked.
    explicit HostCompiler(const HostOptions &options);

    struct Identity {
        bool available = false;
        /// What device_info's kernel_compiler says: the compiler and where it is, or why there
        /// is none ("compile_kernels is off", "no C++ compiler found ...").
        std::string description;
        /// 16 hex digits of a hash of the compiler's whole `--version` text, the flags and the
        /// CPU (model and feature flags): part of the driver version, so of every cache key.
        std::string fingerprint;
        std::string path; ///< the compiler's file
    };
    /// Finds the compiler and runs `--version` once (a few milliseconds), the first time.
    const Identity &identity() const;

    /// The flags every kernel is compiled with (before the variant's own options).
    static const std::vector<std::string> &flags();

    /// Compiles `source` (defining `entry`) with `options` appended to flags(); returns the
    /// blob (a header naming the fingerprint and entry, then the shared object) and sets `log`
    /// to the compiler's output. Throws sdk::Error(BP_ERROR_COMPILE) naming the kernel, with the
    /// log, when the compiler fails; BP_ERROR_UNSUPPORTED when there is no compiler.
    std::vector<unsigned char> compile(const std::string &entry, std::string_view source,
                                       const std::vector<std::string> &options,
                                       std::string &log) const;

    /// Loads a blob of compile(): checks its header against this compiler's fingerprint and the
    /// object's ELF header, then dlopens it (from a temporary file of a unique name). Throws sdk::Error(BP_ERROR_COMPILE)
    /// for a blob of another compiler or CPU, or one that does not load (the core then
    /// discards a cached copy and recompiles).
    std::shared_ptr<LoadedObject> load(const std::string &entry, const void *blob,
                                       size_t size) const;

private:
    HostOptions options_;
    mutable std::once_flag found_;
    mutable Identity identity_;
};

} // namespace backplane::host
