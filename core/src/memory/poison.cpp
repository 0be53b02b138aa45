#include "memory/poison.hpp"

#include <mutex>

namespace backplane::detail {

namespace {

/// One lock for every allocation's ranges: they are touched only on the failure path and by
/// operations on memory that is poisoned, never under it is another lock taken.
std::mutex &poisonLock() {
    static std::mutex lock;
    return lock;
}

} // namespace

void Poison::cut(uint64_t begin, uint64_t end) {
    std::vector<Range> kept;
    kept.reserve(ranges_.size() + 1);
    for (Range &r : ranges_) {
        if (r.end <= begin || r.begin >= end) {
            kept.push_back(std::move(r));
            continue;
        }
        if (r.begin < begin) kept.push_back({r.begin, begin, r.why});
        if (r.end > end) kept.push_back({end, r.end, r.why});
    }
    ranges_ = std::move(kept);
}

void Poison::mark(uint64_t begin, uint64_t end, PoisonReason why) {
    if (begin >= end) return;
    std::lock_guard lock(poisonLock());
    cut(begin, end);
    ranges_.push_back({begin, end, std::move(why)});
    any_.store(true, std::memory_order_release);
}

void Poison::clear(uint64_t begin, uint64_t end) {
    if (!any() || begin >= end) return;
    std::lock_guard lock(poisonLock());
    cut(begin, end);
    any_.store(!ranges_.empty(), std::memory_order_release);
}

void Poison::reset() {
    if (!any()) return;
    std::lock_guard lock(poisonLock());
    ranges_.clear();
    any_.store(false, std::memory_order_release);
}

Poison::Hit Poison::find(uint64_t begin, uint64_t end) const {
    if (!any()) return {};
    std::lock_guard lock(poisonLock());
    const Range *first = nullptr;
    for (const Range &r : ranges_)
        if (r.begin < end && r.end > begin && (first == nullptr || r.begin < first->begin))
            first = &r;
    if (first == nullptr) return {};
    return {first->why, first->begin, first->end};
}

} // namespace backplane::detail
