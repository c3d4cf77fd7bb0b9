"""CRC-32C (Castagnoli, reflected 0x82F63B78, preset and final inversion), as every
checksum in the evbd formats uses it.

crc32c(data, crc=0) returns the CRC of `data`; passing the CRC of earlier bytes as
`crc` continues it, so crc32c(b, crc32c(a)) == crc32c(a + b). `data` is any
contiguous object with the buffer protocol (bytes, memoryview, mmap, numpy array).
span_crc32c(buffer) gives a function (start, end, crc=0) for the CRCs of many spans
of one buffer (a file's mapping), without a slice object per call.

A CRC in Python bytecode runs at a few MB/s, three orders of magnitude below what a
reader needs, so a C implementation is used when one is installed, first found wins:

- ISA-L (Debian libisal2, the Intel Storage Acceleration Library), its crc32_iscsi
  through ctypes: ISA-L picks at run time what the CPU does best (the SSE4.2 crc32
  instruction, carry-less multiplication, or a table); 8.6 to 15.5 GB/s on one core
  of the development machine.
- `crc32c` built with the instruction (the wheel from PyPI; `hardware_based` True).
- `crc32c` without it (Debian python3-crc32c is built so): slicing-by-8 in C, about
  1.85 GB/s per core.
- `crcmod` (Debian python3-crcmod), its C extension: byte-at-a-time table, about
  0.35 GB/s.
- this module's own table loop, only so that the reader works everywhere.

BACKEND names the one in use. EVBFILE_CRC=isal|crc32c|crcmod|pure skips the ones
above it (for tests and comparisons); another value is an error.
"""
import os

_POLY = 0x82F63B78


def _pure_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


def _make_pure():
    table = _pure_table()

    def crc32c(data, crc=0):
        c = crc ^ 0xFFFFFFFF
        for b in memoryview(data).cast("B"):
            c = table[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF

    return crc32c


_MASK = 0xFFFFFFFF
_CALL_MAX = 1 << 30  # crc32_iscsi takes an int length


def _load_isal():
    """ISA-L's crc32_iscsi, checked against the CRC-32C check value; None without it."""
    import ctypes

    lib = None
    for name in ("libisal.so.2", "libisal.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return None
    try:
        fn = lib.crc32_iscsi
    except AttributeError:  # a libisal without it: not the library this expects
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
    # crc32_iscsi(buf, len, init) is the register without the final inversion:
    # CRC-32C(buf) continued from crc is crc32_iscsi(buf, len, ~crc) inverted.
    if fn(b"123456789", 9, _MASK) ^ _MASK != 0xE3069283:
        return None
    return fn


def _make_isal(fn):
    import numpy as np  # for a buffer's address; evbfile needs numpy anyway

    def crc32c(data, crc=0):
        a = np.frombuffer(data, dtype=np.uint8)
        addr, n = a.ctypes.data, a.size
        c = crc ^ _MASK
        while n > _CALL_MAX:
            c = fn(addr, _CALL_MAX, c)
            addr += _CALL_MAX
            n -= _CALL_MAX
        return fn(addr, n, c) ^ _MASK

    return crc32c


def _select():
    skip = os.environ.get("EVBFILE_CRC", "")
    order = ["isal", "crc32c", "crcmod", "pure"]
    if skip and skip not in order:
        raise ValueError(f"EVBFILE_CRC={skip!r}: expected one of {', '.join(order)}")
    allowed = order[order.index(skip):] if skip else order
    if "isal" in allowed:
        try:
            import numpy  # noqa: F401  (this module alone may be loaded without it, by tests)

            fn = _load_isal()
        except ImportError:
            fn = None
        if fn is not None:
            return _make_isal(fn), "isal", fn
    if "crc32c" in allowed:
        try:
            import crc32c as _mod

            fn = _mod.crc32c
            return fn, "crc32c (hardware)" if getattr(_mod, "hardware_based", False) else "crc32c", None
        except ImportError:
            pass
    if "crcmod" in allowed:
        try:
            import sys

            import crcmod.predefined

            # crcmod silently falls back to Python code when its extension is missing.
            # (The package re-exports its crcmod module's names, hiding the module itself.)
            if sys.modules["crcmod.crcmod"]._usingExtension:
                return crcmod.predefined.mkPredefinedCrcFun("crc-32c"), "crcmod", None
        except ImportError:
            pass
    return _make_pure(), "pure python", None


crc32c, BACKEND, _isal = _select()


def span_crc32c(buffer):
    """A function crc(start, end, crc=0): the CRC-32C of buffer[start:end], continuing
    `crc`. For a reader checking many spans of one mapping: with ISA-L it passes an
    address, no slice or buffer export per call. Spans must lie inside the buffer
    (checked: a wrong span is a ValueError, never a read outside it). The function
    holds a view of `buffer` for as long as it lives."""
    if _isal is not None:
        import numpy as np

        a = np.frombuffer(buffer, dtype=np.uint8)
        base, size, fn = a.ctypes.data, a.size, _isal

        def span(start, end, crc=0, _keep=a):
            if not 0 <= start <= end <= size:
                raise ValueError(f"span {start}..{end} outside a buffer of {size} bytes")
            n = end - start
            if n > _CALL_MAX:
                return crc32c(_keep[start:end], crc)
            return fn(base + start, n, crc ^ _MASK) ^ _MASK

        return span
    mv = memoryview(buffer).cast("B")
    size, fn = len(mv), crc32c

    def span(start, end, crc=0):
        if not 0 <= start <= end <= size:
            raise ValueError(f"span {start}..{end} outside a buffer of {size} bytes")
        return fn(mv[start:end], crc)

    return span


# The definition, for tests and comparisons (the same function when it is the backend).
pure_crc32c = crc32c if BACKEND == "pure python" else _make_pure()


# ---- joining the CRCs of adjacent pieces ----
#
# GF(2) arithmetic modulo the polynomial, in the reflected representation the CRC
# register uses (bit 31 is the coefficient of x^0), as in evbd's core/format/crc32c.cpp.
# Multiplying a register by x^(8n) is what feeding it n zero bytes does, so
# crc32c(a + b) == crc32c_combine(crc32c(a), crc32c(b), len(b)): one pass over b gives
# the CRC of b and, for the cost of a few table look-ups, that of a + b too.

_ONE = 0x80000000  # x^0


def _mul_mod_p(a, b):
    product = 0
    bit = _ONE
    while bit and a:
        if a & bit:
            product ^= b
            a ^= bit
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        bit >>= 1
    return product


_X2N = [_ONE >> 1]  # _X2N[k] = x^(2^k) mod P
for _ in range(66):
    _X2N.append(_mul_mod_p(_X2N[-1], _X2N[-1]))

# _SHIFT[k]: 4 x 256 entries, multiplication by x^(8 * 2^k) one register byte at a
# time; built on first use (a quarter of a millisecond each).
_SHIFT = {}


def _shift_table(k):
    factor = _X2N[k + 3]
    table = []
    for i in range(4):
        basis = [_mul_mod_p(factor, 1 << (8 * i + j)) for j in range(8)]
        t = [0] * 256
        for b in range(1, 256):
            low = b & -b
            t[b] = t[b ^ low] ^ basis[low.bit_length() - 1]
        table.append(t)
    _SHIFT[k] = table
    return table


def crc32c_combine(crc_a, crc_b, len_b):
    """The CRC-32C of a + b from crc_a = crc32c(a), crc_b = crc32c(b) and len(b)."""
    r = crc_a
    k = 0
    while len_b:
        if len_b & 1:
            t0, t1, t2, t3 = _SHIFT.get(k) or _shift_table(k)
            r = t0[r & 0xFF] ^ t1[(r >> 8) & 0xFF] ^ t2[(r >> 16) & 0xFF] ^ t3[r >> 24]
        len_b >>= 1
        k += 1
    return r ^ crc_b
