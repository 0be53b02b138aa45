// A plugin's options against the schema it publishes (ABI 1.5, bp_plugin_api::options_schema):
// the subset of JSON Schema that plugin.h describes, every problem reported with its JSON pointer.
#include "input/json_input.hpp"

#include <backplane/config.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace backplane {
namespace {

using Json = nlohmann::json;

/// A schema is at most this deep (objects within objects); deeper is refused as malformed.
constexpr int kMaxSchemaDepth = 8;

/// Text from a plugin's schema or a user's options, safe to print: control characters (a
/// JSON "\u001b" decodes to a real ESC) become '?'.
std::string printable(const std::string &text) {
    std::string out = text.substr(0, 200);
    for (char &c : out)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return out;
}

std::string typeOfValue(const Json &v) {
    if (v.is_boolean()) return "boolean";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    if (v.is_number()) return "number";
    if (v.is_string()) return "string";
    if (v.is_array()) return "array";
    if (v.is_object()) return "object";
    return "null";
}

bool hasType(const Json &v, const std::string &type) {
    const std::string actual = typeOfValue(v);
    return actual == type || (type == "number" && actual == "integer");
}

std::string shortText(const Json &v) {
    std::string text = detail::dumpJson(v);
    return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

std::string numberText(const Json &v) {
    if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    return shortText(v);
}

/// Whether a <= b for two JSON numbers, exactly for integers.
bool lessEqual(const Json &a, const Json &b) {
    if (a.is_number_unsigned() && b.is_number_unsigned()) return a.get<uint64_t>() <= b.get<uint64_t>();
    if ((a.is_number_integer() || a.is_number_unsigned()) && (b.is_number_integer() || b.is_number_unsigned())) {
        if (a.is_number_unsigned()) return false;  // a >= 0 > b (b negative, since not both unsigned)
        if (b.is_number_unsigned()) return true;   // a negative
        return a.get<int64_t>() <= b.get<int64_t>();
    }
    return a.get<double>() <= b.get<double>();
}

void check(const Json &schema, const Json &value, const std::string &pointer, int depth,
           std::vector<std::string> &problems) {
    if (depth > kMaxSchemaDepth || !schema.is_object()) return;
    if (schema.contains("type") && schema["type"].is_string()) {
        const std::string type = schema["type"].get<std::string>();
        if (!hasType(value, type)) {
            problems.push_back(pointer + ": expected " + (type == "integer" ? "an " : "a ") + type +
                               ", got " + shortText(value));
            return;
        }
    }
    if (schema.contains("enum") && schema["enum"].is_array()) {
        bool found = false;
        std::string allowed;
        for (const Json &e : schema["enum"]) {
            found = found || e == value;
            allowed += (allowed.empty() ? "" : ", ") + shortText(e);
        }
        if (!found) problems.push_back(pointer + ": " + shortText(value) + " is not one of " + allowed);
    }
    if (value.is_number()) {
        if (schema.contains("minimum") && schema["minimum"].is_number() && !lessEqual(schema["minimum"], value))
            problems.push_back(pointer + ": " + numberText(value) + " is less than the minimum " +
                               numberText(schema["minimum"]));
        if (schema.contains("maximum") && schema["maximum"].is_number() && !lessEqual(value, schema["maximum"]))
            problems.push_back(pointer + ": " + numberText(value) + " is more than the maximum " +
                               numberText(schema["maximum"]));
    }
    if (value.is_string() && schema.contains("maxLength") && schema["maxLength"].is_number_unsigned() &&
        value.get<std::string>().size() > schema["maxLength"].get<uint64_t>())
        problems.push_back(pointer + ": a string of " + std::to_string(value.get<std::string>().size()) +
                           " bytes, more than " + numberText(schema["maxLength"]));
    if (value.is_array() && schema.contains("items"))
        for (size_t i = 0; i < value.size(); ++i)
            check(schema["items"], value[i], pointer + "/" + std::to_string(i), depth + 1, problems);
    if (value.is_object()) {
        const Json empty = Json::object();
        const Json &properties =
            schema.contains("properties") && schema["properties"].is_object() ? schema["properties"] : empty;
        const bool closed = schema.contains("additionalProperties") &&
                            schema["additionalProperties"].is_boolean() &&
                            !schema["additionalProperties"].get<bool>();
        for (const auto &[key, item] : value.items()) {
            const std::string at = pointer + "/" + printable(detail::pointerToken(key));
            if (properties.contains(key)) {
                check(properties[key], item, at, depth + 1, problems);
            } else if (closed) {
                std::string known;
                for (const auto &[name, unused] : properties.items())
                    known += (known.empty() ? "" : ", ") + printable(name);
                problems.push_back(at + ": unknown option '" + printable(key) + "'" +
                                   (known.empty() ? std::string(" (this takes none)")
                                                  : " (known here: " + known + ")"));
            }
        }
    }
}

Json parseSchema(const std::string &schemaJson, const std::string &origin) {
    Json schema = detail::parseJson(schemaJson, origin, detail::kPluginOptionsJsonLimits);
    if (!schema.is_object())
        throw Error(ErrorCode::Config, origin + ": the options schema is not a JSON object");
    return schema;
}

/// "integer 1..64, default 1" for one option's schema.
std::string summary(const Json &s) {
    std::string text = s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "any";
    if (text == "array" && s.contains("items") && s["items"].is_object() && s["items"].contains("type") &&
        s["items"]["type"].is_string())
        text += " of " + s["items"]["type"].get<std::string>();
    if (s.contains("minimum") || s.contains("maximum"))
        text += " " + (s.contains("minimum") ? numberText(s["minimum"]) : std::string()) + ".." +
                (s.contains("maximum") ? numberText(s["maximum"]) : std::string());
    const Json *choices = s.contains("enum") ? &s["enum"]
                          : s.contains("items") && s["items"].is_object() && s["items"].contains("enum")
                              ? &s["items"]["enum"]
                              : nullptr;
    if (choices != nullptr && choices->is_array()) {
        std::string list;
        for (const Json &e : *choices)
            list += (list.empty() ? "" : "|") + (e.is_string() ? printable(e.get<std::string>()) : shortText(e));
        text += " (" + list + ")";
    }
    if (s.contains("default")) text += ", default " + shortText(s["default"]);
    return text;
}

void describe(const Json &schema, const std::string &prefix, int depth, std::ostringstream &out) {
    if (depth > kMaxSchemaDepth || !schema.contains("properties") || !schema["properties"].is_object()) return;
    for (const auto &[name, s] : schema["properties"].items()) {
        if (!s.is_object()) continue;
        const std::string help = s.contains("description") && s["description"].is_string()
                                     ? s["description"].get<std::string>()
                                     : "";
        out << "  " << prefix << printable(name) << "  " << summary(s) << "\n";
        if (!help.empty()) out << "      " << printable(help) << "\n";
        if (s.contains("properties")) describe(s, prefix + printable(name) + ".", depth + 1, out);
    }
}

} // namespace

std::vector<std::string> checkPluginOptions(const std::string &schemaJson,
                                            const std::string &optionsJson,
                                            const std::string &where) {
    if (schemaJson.empty()) return {};
    std::vector<std::string> problems;
    Json schema, options;
    try {
        schema = parseSchema(schemaJson, where + " (the plugin's options schema)");
    } catch (const Error &) {
        // The plugin's fault, not the config's: nothing is checked here (the plugin's init still
        // checks its options; `devices --options` shows the schema as malformed).
        return {};
    }
    try {
        options = detail::parseJson(optionsJson.empty() ? std::string("{}") : optionsJson, where,
                                    detail::kPluginOptionsJsonLimits);
    } catch (const Error &e) {
        return {e.what()};
    }
    check(schema, options, where, 0, problems);
    return problems;
}

std::string describePluginOptions(const std::string &schemaJson) {
    if (schemaJson.empty()) return "  (the plugin publishes no options schema)\n";
    Json schema;
    try {
        schema = parseSchema(schemaJson, "options schema");
    } catch (const Error &e) {
        return std::string("  (malformed options schema: ") + e.what() + ")\n";
    }
    std::ostringstream out;
    describe(schema, "", 0, out);
    const std::string text = out.str();
    return text.empty() ? "  (no options)\n" : text;
}

} // namespace backplane
