#include "memory/poison.hpp"

#include <iterator>

namespace backplane::detail {

void Poison::cut(uint64_t begin, uint64_t end) {
    auto it = ranges_.lower_bound(begin);
    if (it != ranges_.begin())
        if (const auto before = std::prev(it); before->second.end > begin) it = before;
    while (it != ranges_.end() && it->first < end) {
        const uint64_t start = it->first;
        const Range range = it->second;
        it = ranges_.erase(it);
        if (start < begin) ranges_.emplace(start, Range{begin, range.why});
        if (range.end > end) {
            // Ranges are disjoint: nothing after this one starts before `end`.
            ranges_.emplace(end, Range{range.end, range.why});
            break;
        }
    }
}

void Poison::mark(uint64_t begin, uint64_t end, PoisonReason why) {
    if (begin >= end) return;
    std::lock_guard lock(mutex_);
    cut(begin, end);
    ranges_.emplace(begin, Range{end, std::move(why)});
    any_.store(true, std::memory_order_release);
}

void Poison::clear(uint64_t begin, uint64_t end) {
    if (!any() || begin >= end) return;
    std::lock_guard lock(mutex_);
    cut(begin, end);
    any_.store(!ranges_.empty(), std::memory_order_release);
}

void Poison::reset() {
    if (!any()) return;
    std::lock_guard lock(mutex_);
    ranges_.clear();
    any_.store(false, std::memory_order_release);
}

Poison::Hit Poison::find(uint64_t begin, uint64_t end) const {
    if (!any()) return {};
    std::lock_guard lock(mutex_);
    // The first range overlapping [begin, end): the one before `begin` if it reaches past it,
    // else the first starting inside.
    auto it = ranges_.lower_bound(begin);
    if (it != ranges_.begin())
        if (const auto before = std::prev(it); before->second.end > begin)
            return {before->second.why, before->first, before->second.end};
    if (it != ranges_.end() && it->first < end) return {it->second.why, it->first, it->second.end};
    return {};
}

} // namespace backplane::detail
