// The wire format of the host plugin's rendezvous store and its socket helpers.
#include "store_protocol.hpp"

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace backplane::host::store {

FrameWriter &FrameWriter::u8(uint8_t value) {
    bytes_.push_back(value);
    return *this;
}

FrameWriter &FrameWriter::u16(uint16_t value) {
    bytes_.push_back(static_cast<unsigned char>(value & 0xff));
    bytes_.push_back(static_cast<unsigned char>(value >> 8));
    return *this;
}

FrameWriter &FrameWriter::u32(uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8)
        bytes_.push_back(static_cast<unsigned char>((value >> shift) & 0xff));
    return *this;
}

FrameWriter &FrameWriter::raw(const void *data, size_t size) {
    const auto *p = static_cast<const unsigned char *>(data);
    bytes_.insert(bytes_.end(), p, p + size);
    return *this;
}

FrameWriter &FrameWriter::text(const void *data, size_t size) {
    u32(static_cast<uint32_t>(size));
    return raw(data, size);
}

std::vector<unsigned char> FrameWriter::finish() {
    const auto body = static_cast<uint32_t>(bytes_.size() - 4);
    for (int i = 0; i < 4; ++i)
        bytes_[i] = static_cast<unsigned char>((body >> (8 * i)) & 0xff);
    return std::move(bytes_);
}

bool FrameReader::take(size_t size) {
    if (failed_ || size > size_ - at_) {
        failed_ = true;
        return false;
    }
    return true;
}

uint8_t FrameReader::u8() {
    if (!take(1)) return 0;
    return data_[at_++];
}

uint16_t FrameReader::u16() {
    if (!take(2)) return 0;
    const auto value = static_cast<uint16_t>(data_[at_] | (data_[at_ + 1] << 8));
    at_ += 2;
    return value;
}

uint32_t FrameReader::u32() {
    if (!take(4)) return 0;
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i)
        value |= uint32_t{data_[at_ + i]} << (8 * i);
    at_ += 4;
    return value;
}

void FrameReader::raw(void *out, size_t size) {
    if (!take(size)) {
        std::memset(out, 0, size);
        return;
    }
    std::memcpy(out, data_ + at_, size);
    at_ += size;
}

std::string FrameReader::text(uint32_t limit) {
    const uint32_t size = u32();
    if (size > limit) failed_ = true;
    if (!take(size)) return {};
    std::string value(reinterpret_cast<const char *>(data_ + at_), size);
    at_ += size;
    return value;
}

void Socket::reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

std::vector<Endpoint> resolve(const std::string &host, uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo *list = nullptr;
    const std::string service = std::to_string(port);
    const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
    if (rc != 0 || list == nullptr)
        throw std::runtime_error("cannot resolve '" + host +
                                 "': " + (rc == EAI_SYSTEM ? errorText(errno) : gai_strerror(rc)));
    std::vector<Endpoint> found;
    for (const addrinfo *a = list; a != nullptr; a = a->ai_next) {
        if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
        Endpoint e;
        std::memcpy(&e.address, a->ai_addr, a->ai_addrlen);
        e.length = a->ai_addrlen;
        e.family = a->ai_family;
        found.push_back(e);
    }
    freeaddrinfo(list);
    // IPv4 first: the common case, and what a host name's first address usually is.
    std::stable_partition(found.begin(), found.end(),
                          [](const Endpoint &e) { return e.family == AF_INET; });
    return found;
}

std::string numericHost(const Endpoint &endpoint) {
    char text[NI_MAXHOST] = {};
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&endpoint.address), endpoint.length, text,
                    sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0)
        return "?";
    return text;
}

std::string errorText(int error) {
    char buffer[256] = {};
    // GNU strerror_r returns the text, which may or may not be `buffer`.
    return strerror_r(error, buffer, sizeof(buffer));
}

int pollTimeoutMs(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    return static_cast<int>(std::min<int64_t>(left.count(), 24 * 3600 * 1000));
}

} // namespace backplane::host::store
