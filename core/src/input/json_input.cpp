// Bounded JSON reading: a depth scan before parsing, then nlohmann's (iterative) SAX parser
// feeding a DOM builder that knows where it is, so every error names a JSON pointer.
#include "json_input.hpp"

#include "input/elf_check.hpp"

#include <fstream>
#include <system_error>
#include <vector>

namespace backplane::detail {
namespace {

using Json = nlohmann::json;

struct Position {
    size_t line = 1;
    size_t column = 1;
};

Position positionOf(std::string_view text, size_t offset) {
    Position p;
    for (size_t i = 0; i < offset && i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++p.line;
            p.column = 1;
        } else {
            ++p.column;
        }
    }
    return p;
}

/// Offset of the first '{' or '[' (outside strings) that opens level maxDepth + 1, or npos.
size_t firstTooDeep(std::string_view text, uint32_t maxDepth) {
    uint32_t depth = 0;
    bool inString = false;
    bool escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (inString) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') inString = false;
            continue;
        }
        if (c == '"') {
            inString = true;
        } else if (c == '{' || c == '[') {
            if (++depth > maxDepth) return i;
        } else if ((c == '}' || c == ']') && depth > 0) {
            --depth;
        }
    }
    return std::string_view::npos;
}

/// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error
/// ..." without the bracketed id and the position (the caller adds its own).
std::string plainMessage(const std::string &what) {
    std::string text = what;
    if (!text.empty() && text.front() == '[') {
        if (const size_t end = text.find("] "); end != std::string::npos) text.erase(0, end + 2);
    }
    if (text.rfind("parse error", 0) == 0) {
        if (const size_t colon = text.find(": "); colon != std::string::npos)
            text.erase(0, colon + 2);
        text = "not valid JSON: " + text;
    }
    return text;
}

/// Builds the DOM from SAX events; keeps the open containers so an error can name its pointer.
class BoundedBuilder final : public nlohmann::json_sax<Json> {
public:
    explicit BoundedBuilder(uint32_t maxDepth) : maxDepth_(maxDepth) {}

    Json &root() { return root_; }
    bool failed() const { return failed_; }
    size_t errorPosition() const { return errorPosition_; }
    const std::string &errorMessage() const { return errorMessage_; }
    const std::string &errorPointer() const { return errorPointer_; }
    const std::string &errorToken() const { return errorToken_; }

    bool null() override { return add(Json(nullptr)); }
    bool boolean(bool value) override { return add(Json(value)); }
    bool number_integer(number_integer_t value) override { return add(Json(value)); }
    bool number_unsigned(number_unsigned_t value) override { return add(Json(value)); }
    bool number_float(number_float_t value, const string_t &) override { return add(Json(value)); }
    bool string(string_t &value) override { return add(Json(std::move(value))); }
    bool binary(binary_t &value) override { return add(Json::binary(std::move(value))); }

    bool start_object(std::size_t) override { return open(Json::object()); }
    bool start_array(std::size_t) override { return open(Json::array()); }
    bool key(string_t &value) override {
        keys_.back() = std::move(value);
        if (open_.back()->contains(keys_.back())) {
            // The last one would silently win: a hand-edited file with two "plugins" objects
            // means something else than it says.
            fail(0, "duplicate key '" + keys_.back().substr(0, 64) + "'");
            return false;
        }
        return true;
    }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }

    bool parse_error(std::size_t position, const std::string &lastToken,
                     const nlohmann::detail::exception &error) override {
        fail(position, plainMessage(error.what()));
        errorToken_ = lastToken;
        return false;
    }

    /// Records a failure found outside the parser (the depth scan).
    void fail(size_t position, std::string message) {
        if (failed_) return;
        failed_ = true;
        errorPosition_ = position;
        errorMessage_ = std::move(message);
        errorPointer_ = pointer();
    }

private:
    /// The pointer of the value being parsed now.
    std::string pointer() const {
        std::string out;
        for (size_t i = 0; i < open_.size(); ++i) {
            const Json &c = *open_[i];
            const bool last = i + 1 == open_.size();
            if (c.is_array())
                out += "/" + std::to_string(last ? c.size() : c.size() - 1);
            else
                out += "/" + pointerToken(keys_[i]);
        }
        return out.empty() ? "/" : out;
    }

    Json *put(Json &&value) {
        if (open_.empty()) {
            root_ = std::move(value);
            return &root_;
        }
        Json &parent = *open_.back();
        if (parent.is_array()) {
            parent.push_back(std::move(value));
            return &parent.back();
        }
        Json &slot = parent[keys_.back()];
        slot = std::move(value);
        return &slot;
    }
    bool add(Json value) {
        put(std::move(value));
        return true;
    }

    bool open(Json &&container) {
        if (open_.size() >= maxDepth_) {
            fail(0, "nesting deeper than " + std::to_string(maxDepth_) + " levels");
            return false;
        }
        Json *at = put(std::move(container));
        open_.push_back(at);
        keys_.emplace_back();
        return true;
    }
    bool close() {
        open_.pop_back();
        keys_.pop_back();
        return true;
    }

    uint32_t maxDepth_;
    Json root_;
    std::vector<Json *> open_;       // containers being filled, outermost first
    std::vector<std::string> keys_;  // per open container: its current key (objects)
    bool failed_ = false;
    size_t errorPosition_ = 0;
    std::string errorMessage_;
    std::string errorPointer_;
    std::string errorToken_; // the token the parser stopped at ("" when not from the parser)
};

/// Where to point for an error the parser reported after reading `position` bytes: the start of
/// the offending token when it is there in the text, else the last byte read.
size_t errorOffset(std::string_view text, size_t position, const std::string &token) {
    if (!token.empty() && token.size() <= position && position <= text.size() &&
        text.substr(position - token.size(), token.size()) == token)
        return position - token.size();
    return position > 0 ? position - 1 : 0;
}

/// `text` cut to `limit` bytes with "…" when longer: messages stay readable for any input.
std::string cut(const std::string &text, size_t limit) {
    return text.size() <= limit ? text : text.substr(0, limit) + "…";
}

[[noreturn]] void throwAt(ErrorCode code, const std::string &origin, std::string_view text,
                          size_t offset, const std::string &pointer, const std::string &what) {
    const Position p = positionOf(text, offset);
    throw Error(code, origin + ": " + cut(pointer, 512) + ": " + cut(what, 512) + " (line " +
                          std::to_string(p.line) + ", column " + std::to_string(p.column) + ")");
}

std::string byteCount(uint64_t bytes) { return groupedNumber(bytes) + " bytes"; }

} // namespace

std::string pointerToken(std::string_view text) {
    std::string out;
    for (const char c : text) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
    }
    return out;
}

Json parseJson(std::string_view text, const std::string &origin, const JsonLimits &limits,
               ErrorCode code) {
    if (text.size() > limits.maxBytes)
        throw Error(code, origin + ": " + byteCount(text.size()) + " of JSON, more than the " +
                              byteCount(limits.maxBytes) + " accepted here");
    // nlohmann stops at a NUL byte as if the input ended there; JSON text never contains one.
    if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
        throwAt(code, origin, text, nul, "/",
                "a NUL byte at offset " + std::to_string(nul) + ": this is not a JSON text file");
    BoundedBuilder builder(limits.maxDepth);
    if (const size_t deep = firstTooDeep(text, limits.maxDepth); deep != std::string_view::npos) {
        // Parse up to the offending bracket to learn its pointer; the builder stops there.
        try {
            Json::sax_parse(text.substr(0, deep + 1), &builder, Json::input_format_t::json,
                            false);
        } catch (...) { // NOLINT(bugprone-empty-catch): only the pointer is wanted
        }
        const bool earlier = builder.failed() && builder.errorMessage().rfind("nesting", 0) != 0;
        if (earlier) // a syntax error before the deep part: that is the first problem
            throwAt(code, origin, text,
                    errorOffset(text, builder.errorPosition(), builder.errorToken()),
                    builder.errorPointer(),
                    builder.errorMessage());
        throwAt(code, origin, text, deep, builder.failed() ? builder.errorPointer() : "/",
                "nesting deeper than " + std::to_string(limits.maxDepth) +
                    " levels (the limit for this file)");
    }
    bool ok = false;
    try {
        ok = Json::sax_parse(text, &builder, Json::input_format_t::json, true, false);
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception &e) { // sax_parse reports through the builder; be sure anyway
        builder.fail(0, plainMessage(e.what()));
    }
    if (!ok || builder.failed())
        throwAt(code, origin, text,
                errorOffset(text, builder.errorPosition(), builder.errorToken()),
                builder.failed() ? builder.errorPointer() : "/",
                builder.failed() ? builder.errorMessage() : "malformed JSON");
    return std::move(builder.root());
}

Json readJsonFile(const std::filesystem::path &file, const JsonLimits &limits, ErrorCode code) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(file, ec);
    if (ec || !fs::exists(status))
        throw Error(code, file.string() + ": cannot open it (" +
                              (ec ? ec.message() : std::string("no such file")) + ")");
    if (!fs::is_regular_file(status))
        throw Error(code, file.string() + ": not a regular file (" +
                              (fs::is_directory(status) ? "a directory" : "a device, pipe or socket") +
                              "); expected a JSON file");
    const uintmax_t size = fs::file_size(file, ec);
    if (!ec && size > limits.maxBytes)
        throw Error(code, file.string() + ": " + byteCount(size) + ", more than the " +
                              byteCount(limits.maxBytes) +
                              " accepted here; is this the right file?");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(code, file.string() + ": cannot open it (permission denied?)");
    std::string text(limits.maxBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    return parseJson(text, file.string(), limits, code);
}

std::string dumpJson(const Json &value, int indent) {
    return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

} // namespace backplane::detail
