/* The plugin ABI header compiles as C against backplane::plugin_sdk (tests/package/consumers). */
#include <backplane/abi/plugin.h>

int abi_major(void) { return BP_ABI_VERSION_MAJOR; }
