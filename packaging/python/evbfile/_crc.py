"""CRC-32C (Castagnoli, reflected 0x82F63B78, preset and final inversion), as every
checksum in the evbd formats uses it.

crc32c(data, crc=0) returns the CRC of `data`; passing the CRC of earlier bytes as
`crc` continues it, so crc32c(b, crc32c(a)) == crc32c(a + b). `data` is any object
with the buffer protocol (bytes, memoryview, mmap, numpy array).

A CRC in Python bytecode runs at a few MB/s, three orders of magnitude below what a
reader needs, so a C implementation is used when one is installed, first found wins:

- `crc32c` (Debian python3-crc32c): slicing-by-8 in C, about 1.7 GB/s per core.
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
