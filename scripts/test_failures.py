"""Print, in a few lines each, the tests that failed in make test's phases.

``make test`` runs pytest twice (two phases); each writes a JUnit XML file. A CI log
that keeps only the head and the tail of the output would otherwise lose the first
phase's failure messages behind the second phase's output, so ``make test`` ends with
this: per failed test its id, the place it failed and its last ``E`` lines.

    python scripts/test_failures.py RESULTS.xml [RESULTS.xml ...]
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

E_LINES = 12


def nodeid(case: ET.Element) -> str:
    cls = case.get("classname", "")
    parts = cls.split(".")
    # tests.test_x -> tests/test_x.py; tests.test_x.TestClass -> tests/test_x.py::TestClass
    mod = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), 0)
    path = "/".join(parts[:mod]) + ".py" if mod else cls
    rest = "::".join(parts[mod:])
    return "::".join(p for p in (path, rest, case.get("name", "")) if p)


def summary(el: ET.Element) -> list[str]:
    text = (el.text or "").splitlines()
    e_lines = [ln for ln in text if ln.startswith("E ")]
    # pytest's "path.py:LINE: Error" line under the traceback
    where = [ln for ln in text if ".py:" in ln and not ln.startswith((" ", "E ", ">"))]
    out = []
    if where:
        out.append("  at " + where[-1].strip())
    out += ["  " + ln for ln in e_lines[-E_LINES:]]
    if not e_lines:
        out.append("  " + (el.get("message") or "").splitlines()[0][:300]
                   if el.get("message") else "  (no message)")
    return out


def main(argv: list[str]) -> int:
    failed = []
    for name in argv:
        p = Path(name)
        if not p.is_file():
            continue  # a phase that did not start writes no file
        try:
            root = ET.parse(p).getroot()
        except ET.ParseError as e:
            print(f"make test: {p} is not readable JUnit XML ({e})")
            continue
        for case in root.iter("testcase"):
            for kind in ("failure", "error"):
                for el in case.findall(kind):
                    failed.append((kind, nodeid(case), summary(el)))
    if not failed:
        return 0
    print(f"make test: {len(failed)} failed")
    for kind, nid, lines in failed:
        print(f"{'FAILED' if kind == 'failure' else 'ERROR'} {nid}")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
