// The backplane command: devices, config check, demo, bench, tune, cache.
#include <cstdio>

int main() {
    std::puts("backplane: not yet");
    return 0;
}
