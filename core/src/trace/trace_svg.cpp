// renderTraceSvg: a Chrome trace file drawn as an SVG timeline, one lane per (process, thread).
#include "input/json_input.hpp"

#include <backplane/error.hpp>
#include <backplane/trace.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace backplane {
namespace {

/// Trace files are the user's (or another program's): bounded like every untrusted input.
constexpr detail::JsonLimits kTraceJsonLimits{64u << 20, 16};

constexpr double kWidth = 1400;    ///< of the drawing area, px
constexpr double kLabelWidth = 260; ///< lane names on the left
constexpr double kLaneHeight = 22;
constexpr double kTop = 46; ///< title and axis above the lanes

struct Box {
    double ts = 0;
    double dur = 0;
    std::string name;
    std::string category;
};

struct Lane {
    std::string process;
    std::string thread;
    std::vector<Box> boxes;
};

using LaneKey = std::pair<long long, long long>; ///< (pid, tid)

class Reader {
public:
    explicit Reader(const std::filesystem::path &file) : file_(file.string()) {}

    [[noreturn]] void fail(const std::string &pointer, const std::string &what) const {
        throw Error(ErrorCode::InvalidArgument,
                    file_ + ": " + (pointer.empty() ? "/" : pointer) + ": " + what +
                        " (a Chrome trace: an object with a \"traceEvents\" array of event "
                        "objects, as backplane::Trace and BACKPLANE_TRACE write)");
    }

    static const char *typeName(const nlohmann::json &v) { return v.type_name(); }

    double number(const nlohmann::json &event, const std::string &at, const char *key,
                  bool required) const {
        const auto it = event.find(key);
        if (it == event.end()) {
            if (required) fail(at, std::string("the event has no \"") + key + "\"");
            return 0;
        }
        if (!it->is_number())
            fail(at + "/" + key,
                 std::string("expected a number, found ") + typeName(*it));
        const double v = it->get<double>();
        if (!std::isfinite(v)) fail(at + "/" + key, "not a finite number");
        return v;
    }

    long long id(const nlohmann::json &event, const std::string &at, const char *key) const {
        const auto it = event.find(key);
        if (it == event.end()) return 0;
        if (!it->is_number_integer())
            fail(at + "/" + key, std::string("expected an integer, found ") + typeName(*it));
        return it->is_number_unsigned()
                   ? static_cast<long long>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                   : it->get<long long>();
    }

    std::string text(const nlohmann::json &event, const std::string &at, const char *key) const {
        const auto it = event.find(key);
        if (it == event.end()) return {};
        if (!it->is_string())
            fail(at + "/" + key, std::string("expected a string, found ") + typeName(*it));
        return it->get<std::string>();
    }

    std::map<LaneKey, Lane> read(const nlohmann::json &root) const {
        const nlohmann::json *events = &root;
        std::string base;
        if (root.is_object()) {
            const auto it = root.find("traceEvents");
            if (it == root.end()) fail("", "no \"traceEvents\" member");
            events = &*it;
            base = "/traceEvents";
        }
        if (!events->is_array())
            fail(base, std::string("expected an array of events, found ") + typeName(*events));
        std::map<LaneKey, Lane> lanes;
        std::map<long long, std::string> processes;
        for (size_t i = 0; i < events->size(); ++i) {
            const nlohmann::json &e = (*events)[i];
            const std::string at = base + "/" + std::to_string(i);
            if (!e.is_object()) fail(at, std::string("expected an event object, found ") + typeName(e));
            const std::string ph = text(e, at, "ph");
            if (ph.empty()) fail(at, "the event has no \"ph\" (phase) string");
            const LaneKey key{id(e, at, "pid"), id(e, at, "tid")};
            if (ph == "M") {
                const std::string name = text(e, at, "name");
                if (name != "process_name" && name != "thread_name") continue;
                const auto args = e.find("args");
                if (args == e.end() || !args->is_object())
                    fail(at + "/args", "a \"" + name + "\" event needs an \"args\" object");
                const std::string label = text(*args, at + "/args", "name");
                if (name == "process_name")
                    processes[key.first] = label;
                else
                    lanes[key].thread = label;
                continue;
            }
            if (ph != "X") continue; // instant, counter, flow events: not drawn
            Box box;
            box.ts = number(e, at, "ts", true);
            box.dur = number(e, at, "dur", true);
            if (box.dur < 0) fail(at + "/dur", "a negative duration");
            box.name = text(e, at, "name");
            box.category = text(e, at, "cat");
            lanes[key].boxes.push_back(std::move(box));
        }
        for (auto &[key, lane] : lanes) {
            const auto p = processes.find(key.first);
            lane.process = p != processes.end() ? p->second : "pid " + std::to_string(key.first);
            if (lane.thread.empty()) lane.thread = "tid " + std::to_string(key.second);
        }
        std::erase_if(lanes, [](const auto &l) { return l.second.boxes.empty(); });
        return lanes;
    }

private:
    std::string file_;
};

std::string xml(const std::string &text) {
    std::string out;
    for (char c : text) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        default:
            // Control characters are not allowed in XML 1.0 text.
            if (static_cast<unsigned char>(c) < 0x20) out += ' ';
            else out += c;
        }
    }
    return out;
}

std::string fixed(double v, int digits = 1) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.*f", digits, v);
    return b;
}

/// A time in microseconds as the axis shows it.
std::string timeLabel(double us) {
    if (us == 0) return "0";
    const double a = std::fabs(us);
    if (a >= 1e12) { // past a million seconds (a hostile or broken file): 3 significant digits
        char b[32];
        std::snprintf(b, sizeof(b), "%.3g s", us / 1e6);
        return b;
    }
    if (a >= 1e6) return fixed(us / 1e6, a >= 1e7 ? 0 : 1) + " s";
    if (a >= 1e3) return fixed(us / 1e3, a >= 1e4 ? 0 : 1) + " ms";
    return fixed(us, a >= 10 ? 0 : 1) + " us";
}

/// The fill of a category: a few fixed colours, the rest by a hash of the name.
std::string colour(const std::string &category) {
    static const std::map<std::string, std::string> fixedColours = {
        {"launch", "#4e79a7"}, {"transfer", "#59a14f"}, {"staging", "#8cd17d"},
        {"copy", "#f28e2b"},   {"fill", "#edc948"},     {"collective", "#b07aa1"},
        {"wait", "#e15759"},   {"sync", "#ff9d9a"},     {"memory", "#76b7b2"},
        {"gc", "#bab0ac"}};
    if (auto it = fixedColours.find(category); it != fixedColours.end()) return it->second;
    static const char *palette[] = {"#9c755f", "#d37295", "#a0cbe8", "#ffbe7d", "#86bcb6"};
    return palette[std::hash<std::string>{}(category) % 5];
}

} // namespace

std::string renderTraceSvg(const std::filesystem::path &traceFile) {
    const Reader reader(traceFile);
    const nlohmann::json root =
        detail::readJsonFile(traceFile, kTraceJsonLimits, ErrorCode::InvalidArgument);
    const std::map<LaneKey, Lane> lanes = reader.read(root);

    double begin = 0, end = 0;
    bool any = false;
    for (const auto &[key, lane] : lanes)
        for (const Box &b : lane.boxes) {
            begin = any ? std::min(begin, b.ts) : b.ts;
            end = any ? std::max(end, b.ts + b.dur) : b.ts + b.dur;
            any = true;
        }
    // Finite times whose sum or span is not (1e308 + 1e308) would make an infinite axis.
    if (any && !(std::isfinite(end) && std::isfinite(end - begin)))
        throw Error(ErrorCode::InvalidArgument,
                    traceFile.string() + ": /traceEvents: the events span more than a double "
                                         "holds (ts + dur overflows); not a trace this can draw");
    const double span = std::max(end - begin, 1.0);
    const double scale = kWidth / span;
    const double height = kTop + kLaneHeight * static_cast<double>(std::max<size_t>(lanes.size(), 1)) + 30;
    const double total = kLabelWidth + kWidth + 20;

    std::string s;
    s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fixed(total, 0) + "\" height=\"" +
         fixed(height, 0) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    size_t events = 0;
    for (const auto &[key, lane] : lanes) events += lane.boxes.size();
    s += "<text x=\"8\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" +
         xml(traceFile.filename().string()) + ": " + std::to_string(events) + " events, " +
         std::to_string(lanes.size()) + " lanes, " + xml(timeLabel(any ? end - begin : 0)) +
         "</text>\n";
    if (!any)
        s += "<text x=\"8\" y=\"40\">no complete (\"X\") events in this trace</text>\n";

    // The axis: about ten ticks at 1, 2 or 5 times a power of ten.
    const double raw = span / 10;
    const double power = std::pow(10.0, std::floor(std::log10(raw)));
    const double step = raw / power < 2 ? 2 * power : raw / power < 5 ? 5 * power : 10 * power;
    const double axisY = kTop - 6;
    // Counted, not stepped: near the top of the double range `span + step / 2` is infinite and
    // `t += step` stops moving (review finding: a span of 1.7e308 never ended). At most 12 ticks.
    for (int tick = 0; any && tick <= 11; ++tick) {
        const double t = tick * step;
        if (t > span + step / 2) break;
        const double x = kLabelWidth + t * scale;
        s += "<line x1=\"" + fixed(x) + "\" y1=\"" + fixed(axisY) + "\" x2=\"" + fixed(x) +
             "\" y2=\"" + fixed(height - 30) + "\" stroke=\"#ddd\"/>\n";
        s += "<text x=\"" + fixed(x) + "\" y=\"" + fixed(axisY - 4) +
             "\" text-anchor=\"middle\" fill=\"#555\">" + xml(timeLabel(t)) + "</text>\n";
    }

    double y = kTop;
    long long lastPid = 0;
    bool firstLane = true;
    for (const auto &[key, lane] : lanes) {
        if (!firstLane && key.first != lastPid)
            s += "<line x1=\"0\" y1=\"" + fixed(y) + "\" x2=\"" + fixed(total) + "\" y2=\"" +
                 fixed(y) + "\" stroke=\"#888\"/>\n";
        firstLane = false;
        lastPid = key.first;
        s += "<text x=\"8\" y=\"" + fixed(y + kLaneHeight * 0.68) + "\">" +
             xml(lane.process + " / " + lane.thread) + "</text>\n";
        for (const Box &b : lane.boxes) {
            const double x = kLabelWidth + (b.ts - begin) * scale;
            const double w = std::max(b.dur * scale, 1.0);
            const std::string title = b.name + " (" + b.category + ") " + timeLabel(b.dur) +
                                      " at " + timeLabel(b.ts - begin);
            s += "<g><title>" + xml(title) + "</title><rect x=\"" + fixed(x, 2) + "\" y=\"" +
                 fixed(y + 2) + "\" width=\"" + fixed(w, 2) + "\" height=\"" +
                 fixed(kLaneHeight - 4) + "\" fill=\"" + colour(b.category) +
                 "\" stroke=\"#333\" stroke-width=\"0.3\"/>";
            // The name where the box is wide enough for a few letters (about 6 px each).
            const size_t fits = static_cast<size_t>(w / 6.2);
            if (fits >= 3) {
                std::string label = b.name;
                if (label.size() > fits) {
                    size_t cut = fits - 1;
                    // Never inside a UTF-8 sequence.
                    while (cut > 0 && (static_cast<unsigned char>(label[cut]) & 0xC0) == 0x80) --cut;
                    label = label.substr(0, cut) + "~";
                }
                s += "<text x=\"" + fixed(x + 2) + "\" y=\"" + fixed(y + kLaneHeight * 0.68) +
                     "\" fill=\"white\">" + xml(label) + "</text>";
            }
            s += "</g>\n";
        }
        y += kLaneHeight;
    }
    s += "<text x=\"8\" y=\"" + fixed(height - 10) +
         "\" fill=\"#555\">time from the first event; hover a box for its name and length</text>\n";
    s += "</svg>\n";
    return s;
}

} // namespace backplane
