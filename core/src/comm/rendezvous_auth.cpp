// The TCP rendezvous's proof of membership: the job's token, the handshake's nonces and MACs.
// The cryptography is OpenSSL's (HMAC-SHA256, RAND_bytes, CRYPTO_memcmp); nothing is written
// here but the order of the bytes.
#include "comm/rendezvous_detail.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include <cstdio>

namespace backplane::detail {

namespace wire {

namespace {

/// One label per direction: process 0's answer is never a valid proof and the other way round.
constexpr std::string_view kZeroLabel = "backplane rendezvous 2: process 0";
constexpr std::string_view kPeerLabel = "backplane rendezvous 2: peer";

} // namespace

Mac handshakeMac(std::string_view token, Side side, const Nonce &peerNonce, const Nonce &zeroNonce,
                 uint32_t process, uint32_t processCount) {
    const std::string_view label = side == Side::Zero ? kZeroLabel : kPeerLabel;
    std::vector<std::byte> message(label.size());
    std::memcpy(message.data(), label.data(), label.size());
    message.insert(message.end(), peerNonce.begin(), peerNonce.end());
    message.insert(message.end(), zeroNonce.begin(), zeroNonce.end());
    appendU32(message, process);
    appendU32(message, processCount);
    Mac mac{};
    unsigned length = 0;
    const unsigned char *done =
        ::HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
               reinterpret_cast<const unsigned char *>(message.data()), message.size(),
               reinterpret_cast<unsigned char *>(mac.data()), &length);
    if (done == nullptr || length != mac.size())
        throw Error(ErrorCode::Internal, "rendezvous handshake: OpenSSL's HMAC-SHA256 failed");
    return mac;
}

bool sameMac(const std::byte *received, const Mac &expected) {
    return ::CRYPTO_memcmp(received, expected.data(), expected.size()) == 0;
}

Nonce freshNonce() {
    Nonce nonce{};
    if (::RAND_bytes(reinterpret_cast<unsigned char *>(nonce.data()),
                     static_cast<int>(nonce.size())) != 1)
        throw Error(ErrorCode::Internal,
                    "rendezvous handshake: OpenSSL's random generator has no entropy");
    return nonce;
}

} // namespace wire

void checkToken(const std::string &what, std::string_view token) {
    const std::string how = "set BACKPLANE_RENDEZVOUS_TOKEN to the same secret in every process of "
                            "the job (`export BACKPLANE_RENDEZVOUS_TOKEN=$(backplane token)` "
                            "before starting them), or pass TcpRendezvousOptions::token (without "
                            "either, processes of one user share the token file "
                            "~/.config/backplane/rendezvous-token, which needs HOME)";
    if (token.empty())
        throw Error(ErrorCode::InvalidArgument,
                    what + ": no token, so nothing would keep other programs out: " + how);
    if (token.size() < kMinTokenBytes)
        throw Error(ErrorCode::InvalidArgument,
                    what + ": the token has " + std::to_string(token.size()) +
                        " bytes, fewer than " + std::to_string(kMinTokenBytes) +
                        " (a short secret can be guessed from one recorded handshake): " + how);
}

std::string generateToken() {
    const wire::Nonce bytes = wire::freshNonce();
    std::string text;
    for (const std::byte b : bytes) {
        char digits[3];
        std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned>(b));
        text += digits;
    }
    return text;
}

namespace {

/// The token in `path`, or "" when the file does not exist. Refuses what another user could
/// have written or can read.
std::string readTokenFile(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return {};
        throw Error(ErrorCode::InvalidArgument, "rendezvous token file " + path + ": " +
                                                    std::strerror(errno) +
                                                    " (a symbolic link is refused)");
    }
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))
        throw Error(ErrorCode::InvalidArgument,
                    "rendezvous token file " + path + " is not a regular file");
    if (info.st_uid != ::geteuid() || (info.st_mode & 077) != 0)
        throw Error(ErrorCode::InvalidArgument,
                    "rendezvous token file " + path +
                        " must belong to this user and be readable by nobody else (chmod 600 "
                        "it, or delete it to get a new one)");
    char text[257] = {};
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    std::string token(text, n > 0 ? static_cast<size_t>(n) : 0);
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
        token.pop_back();
    if (token.size() < kMinTokenBytes)
        throw Error(ErrorCode::InvalidArgument,
                    "rendezvous token file " + path + " holds no token of at least " +
                        std::to_string(kMinTokenBytes) + " bytes; delete it to get a new one");
    return token;
}

} // namespace

std::string defaultToken(const EnvironmentLookup &lookup, std::string &source) {
    if (const char *token = lookup("BACKPLANE_RENDEZVOUS_TOKEN"); token != nullptr) {
        source = "BACKPLANE_RENDEZVOUS_TOKEN";
        return token;
    }
    namespace fs = std::filesystem;
    std::string path;
    if (const char *file = lookup("BACKPLANE_RENDEZVOUS_TOKEN_FILE"); file && *file)
        path = file;
    else if (const char *config = lookup("XDG_CONFIG_HOME"); config && *config)
        path = (fs::path(config) / "backplane" / "rendezvous-token").string();
    else if (const char *home = lookup("HOME"); home && *home)
        path = (fs::path(home) / ".config" / "backplane" / "rendezvous-token").string();
    else
        return {}; // nowhere to keep one: checkToken says what to set
    source = "the token file " + path;
    if (std::string token = readTokenFile(path); !token.empty()) return token;

    // First use: a fresh token, written under a temporary name and linked into place, so that
    // of several processes racing here the first wins and the others read its token.
    std::error_code ec;
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::exists(parent, ec)) {
        fs::create_directories(parent.parent_path(), ec);
        ::mkdir(parent.c_str(), 0700);
    }
    const std::string temporary = path + "." + std::to_string(::getpid()) + "." + generateToken().substr(0, 8) + ".tmp";
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        throw Error(ErrorCode::InvalidArgument,
                    "cannot create the rendezvous token file " + path + ": " +
                        std::strerror(errno) + " (set BACKPLANE_RENDEZVOUS_TOKEN instead)");
    const std::string token = generateToken();
    const std::string line = token + "\n";
    const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    const bool linked = written && ::link(temporary.c_str(), path.c_str()) == 0;
    const int linkError = errno;
    ::unlink(temporary.c_str());
    if (linked) return token;
    if (written && linkError == EEXIST) return readTokenFile(path); // another process was first
    throw Error(ErrorCode::InvalidArgument,
                "cannot create the rendezvous token file " + path + ": " +
                    std::strerror(written ? linkError : EIO) +
                    " (set BACKPLANE_RENDEZVOUS_TOKEN instead)");
}

} // namespace backplane::detail
