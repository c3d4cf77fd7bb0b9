"""evbfile over a directory holding two runs that both have event 1500 (issue 41
item 8): `event(1500)` does not silently pick the first run's record. It raises
evbfile.AmbiguousEventError naming both runs; `event(1500, run=101)` returns run
101's; an id only one run holds needs no run; a run that does not hold the id is a
KeyError. Before the fix event(1500) returned run 100's record without a word."""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402  (re-runs under a Python with numpy)

ensure_numpy()

import evbfile  # noqa: E402
from evbtest import check, fail  # noqa: E402
from test_python_reader_v2 import EVENT_ID, NONE, Writer  # noqa: E402


def main():
    wd = tempfile.mkdtemp(prefix="evbtest-runs-")
    try:
        for run, ids in ((100, (7, 1500)), (101, (1500, 1501))):
            w = Writer(EVENT_ID, NONE, 0, 1, run=run)
            for e in ids:
                w.record(e, 0, [(0, 0, bytes([run % 256]) * 16)])
            w.close(os.path.join(wd, f"run{run:06d}_001_00000.evb"))
        d = evbfile.open(wd)
        try:
            rec = d.event(1500)
        except LookupError as e:
            rec = e
        if not isinstance(rec, LookupError):
            fail(f"event(1500) returned run {rec.run_number}'s record though runs 100 and 101 both hold it")
        check(type(rec).__name__ == "AmbiguousEventError" and "100" in str(rec) and "101" in str(rec)
              and "run=" in str(rec), f"event(1500) raises AmbiguousEventError, naming both runs and how to choose: {rec}")
        r = d.event(1500, run=101)
        check(r.run_number == 101 and r.sections[0].payload[0] == 101, "event(1500, run=101) is run 101's record")
        check(d.event(1500, run=100).run_number == 100, "event(1500, run=100) is run 100's record")
        check(d.event(7).run_number == 100 and d.event(1501).run_number == 101,
              "an id one run holds needs no run named")
        try:
            d.event(7, run=101)
            fail("event(7, run=101) returned a record")
        except KeyError:
            check(True, "event(7, run=101): KeyError (run 101 has no event 7)")
        check(1500 in d and 7 in d and 9 not in d, "`id in d` still says whether any run holds the id")
        d.close()
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    print("1 passed, 0 failed", flush=True)


if __name__ == "__main__":
    main()
