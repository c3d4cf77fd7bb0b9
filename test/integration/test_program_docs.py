"""Every program answers --version with its name and the project's version, and has a
man page in packaging/ (which the package installs, test_package.py) that names
every option of its --help (evbd's also every configuration key) and renders
without warnings."""
import os
import re
import shutil
import subprocess

from evbtest import BIN, check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = ("evbd", "evb-source", "evb-dump", "evb-limits", "evb-ctl")


def project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        return re.search(r"project\(evbd VERSION ([0-9.]+)", f.read()).group(1)


def man_page(program):
    """packaging/PROGRAM.1, and its text without font escapes."""
    with open(os.path.join(REPO, "packaging", f"{program}.1")) as f:
        man = f.read()
    return man, re.sub(r"\\f[BIRP]", "", man).replace("\\-", "-").replace("\\e", "\\")


def main():
    version = project_version()
    for program in PROGRAMS:
        p = subprocess.run([os.path.join(BIN, program), "--version"], capture_output=True, text=True, timeout=30)
        check(p.returncode == 0 and p.stdout.strip() == f"{program} {version}",
              f"{program} --version prints '{program} {version}' and exits 0 (got {p.returncode}: "
              f"{(p.stdout + p.stderr).strip()!r})")

        page = os.path.join(REPO, "packaging", f"{program}.1")
        check(os.path.isfile(page), f"{program} has a man page, packaging/{program}.1")
        man, plain = man_page(program)
        check(re.search(r"^\.TH " + re.escape(program.upper()) + r" 1 ", man, re.M) and
              re.search(r"^\.SH NAME\n" + re.escape(program) + r" \\- ", man, re.M),
              f"{program}.1: section 1, named {program}")
        helptext = subprocess.run([os.path.join(BIN, program), "--help"], capture_output=True, text=True,
                                  timeout=30).stdout
        options = sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", helptext)) | {"--version"})
        missing = [o for o in options if o not in plain]
        check(not missing, f"{program}.1 names every --help option ({len(options)}; missing {missing})")
        if shutil.which("groff"):
            r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=man, capture_output=True, text=True)
            check(r.returncode == 0 and not r.stderr.strip(), f"groff renders {program}.1 without warnings {r.stderr.strip()}")

    _, plain = man_page("evbd")
    reference = subprocess.run([os.path.join(BIN, "evbd"), "--config-reference"], capture_output=True, text=True).stdout
    keys = re.findall(r"^\| `([a-z_.]+)` \|", reference, re.M)
    missing = [k for k in keys if not re.search(r"(?<![\w.])" + re.escape(k) + r"(?![\w])", plain)]
    check(keys and not missing, f"evbd.1 names every configuration key ({len(keys)}; missing {missing})")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
