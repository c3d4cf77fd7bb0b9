"""evbfile: read the files evbd writes (.evb, and MIDAS .mid, .mid.lz4), for analysis.

    import evbfile
    for rec in evbfile.open("evb-data/"):          # a file, a .part, or a directory
        for s in rec.sections:                      # s.payload: numpy view, no copy
            print(rec.event_id, rec.status, s.source_id, s.status, s.payload[:8])
    f = evbfile.open("evb-data/run000001_000_00000.evb"); rec = f.event(42)

See docs/PYTHON.md in the evbd repository.
"""
from ._crc import BACKEND as CRC_BACKEND
from ._crc import crc32c
from ._codecs import CodecError
from .directory import AmbiguousEventError, EvbDirectory, open
from .midas import MidasFile, MidasRecord
from .reader import (CODECS, MATCH_MODES, EvbFile, FormatError, Item, Problem, Record, RecordStatus, RunRecord, Section,
                     SectionStatus)

__all__ = ["open", "EvbFile", "MidasFile", "MidasRecord", "EvbDirectory", "Record", "Section", "Item", "Problem",
           "FormatError", "AmbiguousEventError", "RunRecord",
           "CodecError", "RecordStatus", "SectionStatus", "MATCH_MODES", "CODECS", "crc32c", "CRC_BACKEND"]
__version__ = "0.1.0"
