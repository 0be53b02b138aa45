// Runtime compilation of kernel sources (NVRTC / hiprtc) to a binary for one exact target.
#include "gpu_compile.hpp"

#include <cstring>

namespace backplane::gpu {
namespace {

// Owns one compiler program.
class Program {
public:
    Program(const bpv::Rtc &c, const std::string &source, const std::string &name) : c_(c) {
        const bpv::RtcResult r = bpv::rtcCreate(c_, &program_, source.c_str(), name.c_str());
        if (r != bpv::kRtcSuccess)
            throw sdk::Error(BP_ERROR_INTERNAL,
                             std::string(bpv::kRtcName) + " could not create a program for '" +
                                 name + "': " + bpv::rtcErrorString(c_, r),
                             r);
    }
    ~Program() { bpv::rtcDestroy(c_, &program_); }
    Program(const Program &) = delete;
    Program &operator=(const Program &) = delete;
    bpv::RtcProgram get() const { return program_; }

private:
    const bpv::Rtc &c_;
    bpv::RtcProgram program_{};
};

} // namespace

void compileSource(const bpv::Rtc &compiler, const CompileRequest &request,
                   sdk::CompileOutput &out) {
    const std::string source(request.source);
    Program program(compiler, source, request.entryPoint + ".cu");

    std::vector<std::string> options{bpv::archOption(request.arch)};
    options.insert(options.end(), request.options.begin(), request.options.end());
    std::vector<const char *> argv;
    for (const auto &o : options) argv.push_back(o.c_str());
    const bpv::RtcResult compiled =
        bpv::rtcCompile(compiler, program.get(), static_cast<int>(argv.size()), argv.data());

    size_t logSize = 0;
    if (bpv::rtcLogSize(compiler, program.get(), &logSize) == bpv::kRtcSuccess && logSize > 1) {
        std::string log(logSize, '\0');
        if (bpv::rtcLog(compiler, program.get(), log.data()) == bpv::kRtcSuccess) {
            log.resize(std::strlen(log.c_str()));
            out.log = std::move(log);
        }
    }
    if (compiled != bpv::kRtcSuccess)
        throw sdk::Error(BP_ERROR_COMPILE,
                         "kernel '" + request.entryPoint + "' failed to compile for " +
                             request.arch + " with " + bpv::kRtcName + " (" +
                             bpv::rtcErrorString(compiler, compiled) + "):\n" + out.log,
                         compiled);

    size_t codeSize = 0;
    bpv::RtcResult r = bpv::rtcCodeSize(compiler, program.get(), &codeSize);
    if (r == bpv::kRtcSuccess && codeSize > 0) {
        out.binary.resize(codeSize);
        r = bpv::rtcCode(compiler, program.get(), reinterpret_cast<char *>(out.binary.data()));
    }
    if (r != bpv::kRtcSuccess || codeSize == 0)
        throw sdk::Error(BP_ERROR_COMPILE,
                         "kernel '" + request.entryPoint + "': " + bpv::kRtcName +
                             " produced no binary for " + request.arch +
                             " (is the target supported by this compiler version?)",
                         r);
}

} // namespace backplane::gpu
