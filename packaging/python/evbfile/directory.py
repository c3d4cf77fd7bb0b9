"""Opening a path: a file of either format evbd writes (.evb, or MIDAS: .mid,
.mid.lz4, and their .part), or a directory of them read as one stream."""
import builtins
import os
import re

from .midas import MidasFile, is_midas_name, looks_midas
from .reader import FILE_MAGIC, EvbFile, is_evb_name

_FILE_NAME = re.compile(r"run(\d+)_(\d+)_(\d+)\.(?:evb|mid|mid\.lz4)(?:\.part)?$")


def is_data_name(name):
    """A name evbd gives its data files: .evb, .mid, .mid.lz4, each also as .part."""
    return is_evb_name(name) or is_midas_name(name)


def file_order(name):
    """Run, builder and file sequence from evbd's file name, as numbers: sequences
    past 99999 are written in full (more than five digits), so plain name order
    would put 100000 before 99999. A run's .evb and MIDAS files share one sequence
    numbering. Other names after those, by name."""
    m = _FILE_NAME.match(name)
    return (0, int(m.group(1)), int(m.group(2)), int(m.group(3)), name) if m else (1, 0, 0, 0, name)


def open_file(path, strict=False, verify_crc=True):
    """An EvbFile or a MidasFile, by the file's first bytes (as evb-dump tells
    them apart); a file too short to tell, by its name."""
    with builtins.open(path, "rb") as f:
        head = f.read(8)
    if head != FILE_MAGIC and (looks_midas(head) or (not any(head) and is_midas_name(os.fspath(path)))):
        return MidasFile(path, strict, verify_crc)
    return EvbFile(path, strict, verify_crc)


class AmbiguousEventError(LookupError):
    """EvbDirectory.event(id) without a run, where more than one run holds the id."""


class EvbDirectory:
    """The data files of a directory (.evb, .mid, .mid.lz4 and their .part), in file
    order (run, builder, sequence; see file_order), read as one stream of records."""

    def __init__(self, path, strict=False, verify_crc=True):
        self.path = os.fspath(path)
        names = sorted((n for n in os.listdir(self.path)
                        if is_data_name(n) and os.path.isfile(os.path.join(self.path, n))), key=file_order)
        self.files = [open_file(os.path.join(self.path, n), strict, verify_crc) for n in names]

    def __iter__(self):
        for f in self.files:
            last = None
            for last in f:
                yield last
            if last is not None:
                last._release()  # one decoded area at a time across files too

    @property
    def problems(self):
        return [(f.path, p) for f in self.files for p in f.problems]

    def event(self, event_id, run=None):
        """The record of `event_id`; of run `run` when given. Event ids start again
        with each run: an id that more than one run of the directory holds raises
        AmbiguousEventError unless the run is named. KeyError if absent."""
        files = [f for f in self.files if run is None or f.run_number == run]
        holding = [f for f in files if event_id in f]
        if not holding:
            raise KeyError(event_id if run is None else (event_id, run))
        runs = sorted({f.run_number for f in holding})
        if len(runs) > 1:
            raise AmbiguousEventError(
                f"{self.path}: event {event_id} is in runs {', '.join(map(str, runs))}: "
                f"name one, event({event_id}, run={runs[0]})")
        return holding[0].event(event_id)

    def __contains__(self, event_id):
        return any(event_id in f for f in self.files)

    def __len__(self):
        return sum(len(f) for f in self.files)

    def close(self):
        for f in self.files:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open(path, strict=False, verify_crc=True):  # noqa: A001 (evbfile.open is the entry point)
    """An EvbFile or a MidasFile for a file, an EvbDirectory for a directory."""
    if os.path.isdir(path):
        return EvbDirectory(path, strict, verify_crc)
    return open_file(path, strict, verify_crc)
