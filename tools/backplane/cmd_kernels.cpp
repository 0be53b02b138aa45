// `backplane kernels dump [--dialect D] [NAME...]`: the portable kernels' signatures and sources.
#include "commands.hpp"
#include "demo_matmul.hpp"

#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>

#include <cstdio>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace backplane::tool {
namespace {

constexpr const char *kUsage =
    "usage: backplane kernels dump [--dialect cuda|hip|glsl|host|cpp|all] [NAME...]\n"
    "  no NAME: list the library kernels (backplane/kernels.hpp) with their signatures\n"
    "  NAME:    print its generated source in the dialect (default: all, each under a header)\n"
    "  names:   saxpy, reduce_sum_<i32|u32|f32>_<block>, inclusive_scan_<i32|u32|f32>_<block>\n"
    "           (block a power of two up to 1024), matmul_t<tile>_w<perThread>_k<depth>,\n"
    "           row_sum_<f16|bf16|f32>_<block>, softmax_rows_<f16|bf16|f32>_<block>,\n"
    "           matmul_mu_<f16|bf16|f32>_<M>x<N>x<K>_w<warpsM>x<warpsN>_v<vector>_s<stages>[a],\n"
    "           matmul_regs_r<rows>_v<vectors>_b<threadsX>x<threadsY>\n";

int usage() { return printUsage(kUsage, false); }

struct NamedDialect {
    const char *name;
    Dialect dialect;
};
constexpr NamedDialect kDialects[] = {{"cuda", Dialect::Cuda},
                                      {"hip", Dialect::Hip},
                                      {"glsl", Dialect::Glsl},
                                      {"host", Dialect::Host},
                                      {"cpp", Dialect::Cpp}};

/// The kernels listed when no name is given: every kernel of backplane/kernels.hpp at the sizes
/// the tools use (the demo's reduction, the tuner's matmul tile sets).
std::vector<std::string> libraryNames() {
    std::vector<std::string> names = {"saxpy"};
    for (const char *type : {"i32", "u32", "f32"})
        names.push_back(std::string("reduce_sum_") + type + "_256");
    for (const char *type : {"i32", "u32", "f32"})
        names.push_back(std::string("inclusive_scan_") + type + "_256");
    for (const kernels::MatmulTiles &tiles : portableMatmulTiles())
        names.push_back(tiles.name());
    for (const lang::Type type : {lang::Type::F16, lang::Type::BF16, lang::Type::F32})
        names.push_back(kernels::MatrixMatmulTiles{}.name(type));
    names.push_back(kernels::RegisterTiles{}.name());
    for (const char *type : {"f16", "bf16", "f32"}) {
        names.push_back(std::string("row_sum_") + type + "_256");
        names.push_back(std::string("softmax_rows_") + type + "_256");
    }
    return names;
}

template <template <class> class Make>
std::optional<lang::Kernel> typed(const std::string &type, uint32_t block) {
    if (type == "i32") return Make<int32_t>{}(block);
    if (type == "u32") return Make<uint32_t>{}(block);
    return Make<float>{}(block);
}
template <class T> struct MakeReduce {
    lang::Kernel operator()(uint32_t block) const { return kernels::reduceSum<T>(block); }
};
template <class T> struct MakeRowSum {
    lang::Kernel operator()(uint32_t block) const { return kernels::rowSum<T>(block); }
};
template <class T> struct MakeSoftmax {
    lang::Kernel operator()(uint32_t block) const { return kernels::softmaxRows<T>(block); }
};
template <template <class> class Make>
std::optional<lang::Kernel> floating(const std::string &type, uint32_t block) {
    if (type == "f16") return Make<lang::f16>{}(block);
    if (type == "bf16") return Make<lang::bf16>{}(block);
    return Make<float>{}(block);
}
template <class T> struct MakeScan {
    lang::Kernel operator()(uint32_t block) const { return kernels::inclusiveScan<T>(block); }
};

/// The library kernel called `name`, or nothing (with the reason in `why`) for a name that is not
/// one or sizes the kernel does not support.
std::optional<lang::Kernel> kernelNamed(const std::string &name, std::string &why) {
    if (name == "saxpy") return kernels::saxpy();
    std::smatch m;
    static const std::regex typedName(R"((reduce_sum|inclusive_scan)_(i32|u32|f32)_([0-9]{1,5}))");
    static const std::regex matmulName(R"(matmul_t([0-9]{1,4})_w([0-9]{1,4})_k([0-9]{1,4}))");
    static const std::regex rowName(R"((row_sum|softmax_rows)_(f16|bf16|f32)_([0-9]{1,5}))");
    static const std::regex matrixName(
        R"(matmul_mu_(f16|bf16|f32)_([0-9]{1,4})x([0-9]{1,4})x([0-9]{1,4})_w([0-9]{1,2})x([0-9]{1,2})_v([0-9])_s([0-9])(a?))");
    if (std::regex_match(name, m, rowName)) {
        const uint32_t block = static_cast<uint32_t>(std::stoul(m[3]));
        if (block == 0 || block > 1024 || (block & (block - 1)) != 0) {
            why = "the block size must be a power of two from 1 to 1024";
            return std::nullopt;
        }
        if (m[1] == "row_sum") return floating<MakeRowSum>(m[2], block);
        return floating<MakeSoftmax>(m[2], block);
    }
    if (std::regex_match(name, m, matrixName)) {
        kernels::MatrixMatmulTiles tiles;
        const auto at = [&](size_t i) { return static_cast<uint32_t>(std::stoul(m[i])); };
        tiles.blockM = at(2), tiles.blockN = at(3), tiles.blockK = at(4);
        tiles.warpsM = at(5), tiles.warpsN = at(6), tiles.vector = at(7), tiles.stages = at(8);
        tiles.asyncCopies = m[9] == "a";
        try {
            if (m[1] == "f16") return kernels::matmulMatrixUnits<lang::f16>(tiles);
            if (m[1] == "bf16") return kernels::matmulMatrixUnits<lang::bf16>(tiles);
            return kernels::matmulMatrixUnits<float>(tiles);
        } catch (const Error &e) {
            why = e.what();
            return std::nullopt;
        }
    }
    static const std::regex registersName(
        R"(matmul_regs_r([0-9]{1,2})_v([0-9]{1,2})_b([0-9]{1,4})x([0-9]{1,4}))");
    if (std::regex_match(name, m, registersName)) {
        kernels::RegisterTiles tiles;
        const auto at = [&](size_t i) { return static_cast<uint32_t>(std::stoul(m[i])); };
        tiles.rows = at(1), tiles.vectors = at(2), tiles.threadsX = at(3), tiles.threadsY = at(4);
        if (tiles.rows == 0 || tiles.vectors == 0 || tiles.rows > 16 || tiles.vectors > 16 ||
            tiles.threadsX == 0 || tiles.threadsY == 0 || tiles.threadsX * tiles.threadsY > 1024) {
            why = "rows and vectors must be 1 to 16, threadsX * threadsY 1 to 1024";
            return std::nullopt;
        }
        return kernels::matmulRegisters(tiles);
    }
    if (std::regex_match(name, m, typedName)) {
        const uint32_t block = static_cast<uint32_t>(std::stoul(m[3]));
        if (block == 0 || block > 1024 || (block & (block - 1)) != 0) {
            why = "the block size must be a power of two from 1 to 1024";
            return std::nullopt;
        }
        if (m[1] == "reduce_sum") return typed<MakeReduce>(m[2], block);
        return typed<MakeScan>(m[2], block);
    }
    if (std::regex_match(name, m, matmulName)) {
        kernels::MatmulTiles tiles;
        tiles.tile = static_cast<uint32_t>(std::stoul(m[1]));
        tiles.perThread = static_cast<uint32_t>(std::stoul(m[2]));
        tiles.depth = static_cast<uint32_t>(std::stoul(m[3]));
        if (tiles.tile == 0 || tiles.perThread == 0 || tiles.depth == 0 ||
            tiles.tile % tiles.perThread != 0 || tiles.tile > 256 || tiles.depth > 256 ||
            tiles.perThread > 16) {
            why = "tile, perThread and depth must be positive, tile a multiple of perThread, "
                  "tile and depth at most 256, perThread at most 16";
            return std::nullopt;
        }
        return kernels::matmul(tiles);
    }
    why = "not a library kernel";
    return std::nullopt;
}

/// "bindings: f32 read, f32 read-write; scalars: f32, u32", read from the IR listing's header
/// (the lines "  binding N: TYPE ACCESS" and "  scalar N: TYPE").
std::string signatureOf(const lang::Kernel &kernel) {
    std::istringstream listing(kernel.text(Dialect::Host));
    std::string line, bindings, scalars;
    while (std::getline(listing, line)) {
        for (const auto &[prefix, list] :
             {std::pair<const char *, std::string *>{"  binding ", &bindings},
              {"  scalar ", &scalars}}) {
            if (line.rfind(prefix, 0) != 0) continue;
            const size_t colon = line.find(": ");
            if (colon == std::string::npos) continue;
            *list += (list->empty() ? "" : ", ") + line.substr(colon + 2);
        }
    }
    return "bindings: " + (bindings.empty() ? std::string("none") : bindings) +
           "; scalars: " + (scalars.empty() ? std::string("none") : scalars);
}

const KernelVariant *variantOf(const lang::Kernel &kernel, Dialect dialect) {
    for (const KernelVariant &v : kernel.source().variants)
        if (v.dialect == dialect) return &v;
    return nullptr;
}

int list() {
    std::printf("%-26s %s\n", "NAME", "SIGNATURE");
    for (const std::string &name : libraryNames()) {
        std::string why;
        const std::optional<lang::Kernel> kernel = kernelNamed(name, why);
        if (kernel) std::printf("%-26s %s\n", name.c_str(), signatureOf(*kernel).c_str());
    }
    std::printf("\nOther sizes: reduce_sum_<type>_<block>, inclusive_scan_<type>_<block>, "
                "matmul_t<tile>_w<perThread>_k<depth>, row_sum_<type>_<block>,\n"
                "softmax_rows_<type>_<block>, matmul_mu_<type>_<M>x<N>x<K>_w<wM>x<wN>_v<vector>_s<stages>[a],\n"
                "matmul_regs_r<rows>_v<vectors>_b<threadsX>x<threadsY>.\n"
                "Sources: backplane kernels dump [--dialect cuda|hip|glsl|host|cpp|all] NAME...\n");
    return 0;
}

int dump(const Args &args) {
    std::vector<Dialect> dialects;
    std::vector<std::string> names;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--dialect") {
            if (i + 1 >= args.size()) return usage();
            const std::string wanted = args[++i];
            dialects.clear();
            for (const NamedDialect &d : kDialects)
                if (wanted == "all" || wanted == d.name) dialects.push_back(d.dialect);
            if (dialects.empty()) {
                std::fprintf(stderr,
                             "backplane kernels dump: unknown dialect '%s' (cuda, hip, glsl, host, "
                             "cpp or all)\n",
                             wanted.c_str());
                return 2;
            }
        } else if (!args[i].empty() && args[i][0] == '-') {
            return usage();
        } else {
            names.push_back(args[i]);
        }
    }
    if (names.empty()) return list();
    if (dialects.empty())
        for (const NamedDialect &d : kDialects)
            dialects.push_back(d.dialect);

    // Every name is checked before anything is printed, so an error leaves no partial output.
    std::vector<lang::Kernel> found;
    for (const std::string &name : names) {
        std::string why;
        std::optional<lang::Kernel> kernel;
        try {
            kernel = kernelNamed(name, why);
        } catch (const Error &e) {
            why = e.what();
        }
        if (!kernel) {
            std::fprintf(stderr,
                         "backplane kernels dump: kernel '%s': %s (run `backplane kernels "
                         "dump` for the list)\n",
                         name.c_str(), why.c_str());
            return 2;
        }
        found.push_back(std::move(*kernel));
    }
    for (size_t k = 0; k < found.size(); ++k) {
        for (const Dialect dialect : dialects) {
            const char *dialectName = "";
            for (const NamedDialect &d : kDialects)
                if (d.dialect == dialect) dialectName = d.name;
            std::string header = "==== " + names[k] + ": " + dialectName;
            if (dialect == Dialect::Host) {
                header += " (the IR listing the host interpreter runs)";
            } else if (const KernelVariant *v = variantOf(found[k], dialect)) {
                header += " (entry point " + v->entryPoint;
                for (const std::string &option : v->options)
                    header += ", option " + option;
                header += ")";
            }
            if (dialect == Dialect::Cpp && variantOf(found[k], dialect) == nullptr) {
                // Interpreted on the host: say why instead of failing the whole dump.
                std::string why;
                try {
                    (void)found[k].text(dialect);
                } catch (const Error &e) {
                    why = e.what();
                }
                std::printf("%s (none) ====\n%s\n", header.c_str(), why.c_str());
                continue;
            }
            const std::string text = found[k].text(dialect);
            std::printf("%s ====\n%s%s", header.c_str(), text.c_str(),
                        !text.empty() && text.back() == '\n' ? "" : "\n");
        }
    }
    return 0;
}

} // namespace

int runKernels(const Args &args) {
    if (wantsHelp(args)) return printUsage(kUsage, true);
    if (args.empty() || args[0] != "dump") return usage();
    try {
        return dump(Args(args.begin() + 1, args.end()));
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane kernels dump: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
