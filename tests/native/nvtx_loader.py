"""A STAND-IN for NVTX's loader (no GPU, no NVTX headers), for CPU tests of the injection library: hands the
library whose path is in ``NVTX_INJECTION64_PATH`` callback tables of the sizes nvtxTypes.h gives, then
:func:`fn` returns what it installed, callable through ctypes (which releases the GIL, so threads call it at
once, as C threads would). Callback ids: nvtxTypes.h (NVTX_CBID_CORE_* in module 1, NVTX_CBID_CORE2_* in 5);
:class:`Attrs` is nvtxEventAttributes_v2 (message type at byte 32, message at 40)."""

import ctypes as C
import os

CORE, CORE2 = 1, 5
ASCII, UNICODE, REGISTERED = 1, 2, 3
_sizes = {CORE: 16, CORE2: 16}  # NVTX_CBID_CORE_SIZE, NVTX_CBID_CORE2_SIZE
_slots = {m: (C.c_void_p * n)() for m, n in _sizes.items()}
_tables = {m: (C.c_void_p * n)(*[C.addressof(_slots[m]) + 8 * i for i in range(n)]) for m, n in _sizes.items()}
_GetTable = C.CFUNCTYPE(C.c_int, C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_uint))


def _get_table(module, table, size):
    if module not in _tables:
        return 0
    table[0] = C.addressof(_tables[module])
    size[0] = _sizes[module]
    return 1


class _Callbacks(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("get", _GetTable)]


class Attrs(C.Structure):
    _fields_ = [("version", C.c_uint16), ("size", C.c_uint16), ("category", C.c_uint32), ("colorType", C.c_int32),
                ("color", C.c_uint32), ("payloadType", C.c_int32), ("reserved0", C.c_int32), ("payload", C.c_uint64),
                ("messageType", C.c_int32), ("pad", C.c_int32), ("message", C.c_void_p)]


assert Attrs.messageType.offset == 32 and Attrs.message.offset == 40
_get_table_c = _GetTable(_get_table)
_callbacks = _Callbacks(C.sizeof(_Callbacks), _get_table_c)
_get_export = C.CFUNCTYPE(C.c_void_p, C.c_uint32)(lambda etid: C.addressof(_callbacks) if etid == 1 else None)
lib = C.CDLL(os.environ["NVTX_INJECTION64_PATH"])
assert lib.InitializeInjectionNvtx2(_get_export) == 1


def fn(module: int, cbid: int, restype, *argtypes):
    """The function the library installed for callback ``cbid`` of ``module``, with that C signature."""
    assert _slots[module][cbid], f"module {module} callback {cbid} not installed"
    return C.CFUNCTYPE(restype, *argtypes)(_slots[module][cbid])


def attrs(kind: int, message) -> Attrs:
    """Event attributes with a colour and ``message`` (a ctypes buffer or handle) of ``kind``."""
    return Attrs(3, C.sizeof(Attrs), 0, 1, 0xFF00FF00, 0, 0, 0, kind, 0, C.cast(message, C.c_void_p))
