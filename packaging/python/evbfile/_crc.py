"""CRC-32C (Castagnoli, reflected 0x82F63B78, preset and final inversion), as every
checksum in the evbd formats uses it.

crc32c(data, crc=0) returns the CRC of `data`; passing the CRC of earlier bytes as
`crc` continues it, so crc32c(b, crc32c(a)) == crc32c(a + b). `data` is any object
with the buffer protocol (bytes, memoryview, mmap, numpy array).

A CRC in Python bytecode runs at a few MB/s, three orders of magnitude below what a
reader needs, so a C implementation is used when one is installed, first found wins:

- `crc32c` (Debian python3-crc32c): slicing-by-8 in C, about 1.85 GB/s per core.
  Debian builds it without the SSE4.2 instruction; the same module from a wheel uses
  the instruction and is several times faster still.
- `crcmod` (Debian python3-crcmod), its C extension: byte-at-a-time table, about
  0.35 GB/s.
- this module's own table loop, only so that the reader works everywhere.

BACKEND names the one in use.
"""

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


def _select():
    try:
        import crc32c as _mod

        fn = _mod.crc32c
        return fn, "crc32c (hardware)" if getattr(_mod, "hardware_based", False) else "crc32c"
    except ImportError:
        pass
    try:
        import sys

        import crcmod.predefined

        # crcmod silently falls back to Python code when its extension is missing.
        # (The package re-exports its crcmod module's names, hiding the module itself.)
        if sys.modules["crcmod.crcmod"]._usingExtension:
            return crcmod.predefined.mkPredefinedCrcFun("crc-32c"), "crcmod"
    except ImportError:
        pass
    return _make_pure(), "pure python"


crc32c, BACKEND = _select()
pure_crc32c = _make_pure()


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
