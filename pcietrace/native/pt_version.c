/* The native library's ABI version, checked by pcietrace.device.native before any loop is called. */
#define EXPORT __attribute__((visibility("default")))
EXPORT int pt_native_abi(void) { return 2; }
