"""MIDAS output speaks MIDAS (docs/FORMATS.md 9.2, issue 45): read with MIDAS's own
Python reader (`midas.file_reader`, from a checkout of MIDAS outside this project,
never copied into it: set EVB_MIDAS_PYTHON to the directory holding its `midas`
package, MIDAS's `python/`; the test skips without it).

A run (run_number 12) into rotated `.mid` files, and one into `.mid.lz4` files: in
every file MIDAS's idiom `get_bor_odb_dump().data["Runinfo"]["Run number"]` gives the
run; /Runinfo's "Start time binary" is the begin-of-run event's time stamp and "Start
time" its ctime() text; /Experiment/Name is there; evbd's configuration is under
/Evbd/Config; the end-of-run dump (`get_eor_odb_dump()`) has the run's stop time and
evbd's counts under /Evbd/End; MIDAS's reader counts the built events of every file as
evb-dump does. evb-dump --verify --pattern and evbfile read the files as before (the
configuration from /Evbd/Config)."""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_python_reader import ensure_numpy  # noqa: E402

ensure_numpy()
sys.path.insert(0, os.path.join(HERE, "..", "..", "packaging", "python"))

import evbfile  # noqa: E402
from evbtest import Evbd, check, midas_files, run_source, skip, verify, workdir  # noqa: E402

RUN = 12


def main():
    where = os.environ.get("EVB_MIDAS_PYTHON")
    if not where or not os.path.isfile(os.path.join(where, "midas", "file_reader.py")):
        skip("EVB_MIDAS_PYTHON does not name a directory holding MIDAS's Python package (midas/file_reader.py)")
    sys.path.insert(0, where)
    import midas.file_reader as file_reader

    wd = workdir()
    for fmt, sets in (("mid", []), ("mid.lz4", ["output.compression=lz4"])):
        sub = os.path.join(wd, fmt)
        os.makedirs(sub)
        d = Evbd(sub, sets=["sources=3", f"run_number={RUN}", "output.format=midas", "output.max_file_bytes=200000",
                            "output.direct_io=false", *sets])
        run_source(["--to", f"127.0.0.1:{d.port}", "--sources", 3, "--events", 400, "--size", "100:800",
                    "--rate", 5000, "--seed", 3, "--run", RUN])
        d.wait_metric("evb_events_written_total", lambda v: v >= 400, timeout=60)
        check(d.stop() == 0, f"{fmt}: evbd exits 0")
        names = midas_files(d.out)
        check(len(names) >= 2 and all(n.endswith("." + fmt) for n in names), f"{fmt}: the run rotated over {len(names)} files")
        total = 0
        for n in names:
            path = os.path.join(d.out, n)
            mf = file_reader.MidasFile(path)
            odb = mf.get_bor_odb_dump().data
            ri = odb["Runinfo"]
            check(ri["Run number"] == RUN, f"{n}: get_bor_odb_dump().data['Runinfo']['Run number'] is {RUN}")
            mf.jump_to_start()
            mf.read_next_event_header()
            stamp = mf.event.header.timestamp
            check(int(ri["Start time binary"], 16) == stamp and ri["Start time"] == time.ctime(stamp)
                  and ri["State"] == 3 and int(ri["Stop time binary"], 16) == 0,
                  f"{n}: Start time binary {ri['Start time binary']} and Start time {ri['Start time']!r} are the "
                  f"begin-of-run time stamp {stamp}")
            check(odb["Experiment"]["Name"] == "evbd" and odb["Evbd"]["Config"]["run_number"] == RUN
                  and odb["Evbd"]["Config"]["output"]["format"] == "midas",
                  f"{n}: /Experiment/Name, evbd's configuration under /Evbd/Config")
            eor = mf.get_eor_odb_dump().data
            stop = int(eor["Runinfo"]["Stop time binary"], 16)
            check(eor["Runinfo"]["Run number"] == RUN and eor["Runinfo"]["State"] == 1 and stop >= stamp
                  and eor["Runinfo"]["Start time binary"] == ri["Start time binary"],
                  f"{n}: the end-of-run dump has the run's start and stop times")
            events = mf.get_event_count()
            check(eor["Evbd"]["End"]["file"]["events"] == events,
                  f"{n}: /Evbd/End counts the file's {events} events, as MIDAS's reader counts them")
            total += events
            with evbfile.open(path) as f:
                check(f.config["output"]["format"] == "midas" and f.odb["Runinfo"]["Run number"] == RUN
                      and f.end_of_run["file"]["events"] == events,
                      f"{n}: evbfile takes the configuration and the counts from the dumps")
        check(total == 400, f"{fmt}: MIDAS's reader counts 400 built events in the run's files ({total})")
        rc, out = verify([os.path.join(d.out, n) for n in names])
        check(rc == 0, f"{fmt}: evb-dump --verify --pattern passes:\n{out[-800:]}")
    print("PASS")


if __name__ == "__main__":
    main()
