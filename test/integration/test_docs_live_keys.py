"""docs/OPERATIONS.md section 4's table of the keys a reload applies live names exactly
the keys `evbd --config-reference` marks "live (reload)" (issue 40 item 8), and
docs/CONFIG.md holds the reference's table as evbd prints it: neither can drift
from the schema unnoticed."""
import os
import re
import subprocess

from evbtest import BIN, check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ref = subprocess.run([os.path.join(BIN, "evbd"), "--config-reference"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    schema_live = set()
    for line in ref.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[4].startswith("live"):
            schema_live.add(cells[0].strip("`"))
    with open(os.path.join(REPO, "docs", "OPERATIONS.md")) as f:
        ops = f.read()
    m = re.search(r"^\| live \| (.*) \|$", ops, re.M)
    check(m is not None, "OPERATIONS.md has the row of live keys")
    docs_live = set(re.findall(r"`([^`]+)`", m.group(1)))
    check(docs_live == schema_live,
          f"OPERATIONS.md's live keys are the schema's (only in the docs: {sorted(docs_live - schema_live)}; "
          f"only in the schema: {sorted(schema_live - docs_live)})")

    with open(os.path.join(REPO, "docs", "CONFIG.md")) as f:
        config_md = f.read().splitlines()
    stale = [line.split("|")[1].strip() for line in ref.splitlines() if line.startswith("| `") and line not in config_md]
    check(not stale, f"docs/CONFIG.md's table is `evbd --config-reference`'s (rows that differ: {stale})")


if __name__ == "__main__":
    main()
