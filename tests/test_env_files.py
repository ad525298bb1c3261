"""The set-up files agree with each other and run: environment.yml vs pyproject.toml,
the Vagrantfile's syntax and settings, and scripts/setup-system.sh on this machine.

conda's channels are not reachable here, so environment.yml is checked for its
contents only (MACHINE.md): every requirement of pyproject.toml (runtime and every extra)
is a conda package of the same name and floor. All of them are on conda-forge —
gprof2dot (noarch, 2024.6.6 and newer) and py-spy included — as conda-forge's package
pages showed when this was written, so nothing is left to the pip section but profkit.
The Vagrantfile is checked with ``ruby -c`` (no
VirtualBox/libvirt here to run ``vagrant validate``) plus what it must say.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# pip name -> conda-forge name where they differ (none of profkit's do today;
# e.g. "matplotlib" could be "matplotlib-base", "psycopg[binary]" is "psycopg").
PIP_TO_CONDA: dict[str, str] = {}


def normalise(requirement: str) -> str:
    """``psycopg[binary]>=3.2`` -> ``psycopg``; PEP 503 name normalisation."""
    req = requirement.split(";", 1)[0].strip()
    name = re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0]
    name = re.sub(r"[-_.]+", "-", name).lower()
    return PIP_TO_CONDA.get(name, name)


def pyproject_requirements() -> list[str]:
    """Runtime requirements and every extra's, without the self-reference
    (``profkit[jupyter,pyspy]`` in dev)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        reqs += extra
    return [r for r in reqs if normalise(r) != data["project"]["name"]]


def pyproject_names() -> set[str]:
    return {normalise(r) for r in pyproject_requirements()}


def read_environment_yml(text: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) from environment.yml.

    PyYAML is used when importable (it comes with jupyter's dependencies);
    otherwise a small reader for the subset environment.yml uses: a
    ``dependencies:`` list of strings and one ``- pip:`` sub-list.
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - depends on the venv
        yaml = None
    if yaml is not None:
        doc = yaml.safe_load(text)
        conda, pip = [], []
        for d in doc["dependencies"]:
            if isinstance(d, dict):
                pip += [str(x) for x in d.get("pip", [])]
            else:
                conda.append(str(d))
        return conda, pip
    return _read_simple(text)


def _read_simple(text: str) -> tuple[list[str], list[str]]:
    conda: list[str] = []
    pip: list[str] = []
    in_deps = False
    pip_indent: int | None = None  # indent of the "- pip:" item while inside its list
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" ") and not line.startswith("-"):
            in_deps = line.rstrip(":") == "dependencies"
            pip_indent = None
            continue
        m = re.match(r"^(\s*)-\s+(.*)$", line)
        if not in_deps or not m:
            continue
        indent, item = len(m.group(1)), m.group(2).strip()
        if item == "pip:":
            pip_indent = indent
        elif pip_indent is not None and indent > pip_indent:
            pip.append(item)
        else:
            pip_indent = None
            conda.append(item)
    return conda, pip


def environment_names() -> tuple[set[str], set[str]]:
    conda, pip = read_environment_yml((ROOT / "environment.yml").read_text())
    conda_names = {normalise(c) for c in conda} - {"python", "pip"}
    pip_names = {normalise(p) for p in pip if not p.startswith("-")}
    return conda_names, pip_names


def test_environment_yml_matches_pyproject():
    want = pyproject_names()
    conda_names, pip_names = environment_names()
    have = conda_names | pip_names
    missing = want - have
    extra = have - want
    assert not missing, f"environment.yml lacks {sorted(missing)} (in pyproject.toml)"
    assert not extra, f"environment.yml has {sorted(extra)} that pyproject.toml does not"
    assert not conda_names & pip_names, "a package is listed both for conda and pip"
    # everything is on conda-forge (gprof2dot and py-spy too): pip installs profkit only
    assert not pip_names
    assert {"gprof2dot", "psycopg", "py-spy", "hypothesis"} <= conda_names


def test_environment_yml_minimum_versions_match():
    """The lower bounds agree too (a newer floor in one file is a silent drift)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = pyproject_requirements()

    def floors(items: list[str]) -> dict[str, str]:
        out = {}
        for r in items:
            m = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", r)
            if m:
                out[normalise(r)] = m.group(1)
        return out

    conda, pip = read_environment_yml((ROOT / "environment.yml").read_text())
    env_floors = floors(conda + [p for p in pip if not p.startswith("-")])
    py_floors = floors(reqs)
    diff = {k: (v, env_floors.get(k)) for k, v in py_floors.items() if env_floors.get(k) != v}
    assert not diff, f"minimum versions differ (pyproject, environment.yml): {diff}"
    assert env_floors["python"] == data["project"]["requires-python"].lstrip(">=")


def test_simple_yaml_reader_agrees_with_pyyaml():
    import yaml  # pyyaml: a dependency of jupyter (dev extra)
    text = (ROOT / "environment.yml").read_text()
    doc = yaml.safe_load(text)
    conda = [d for d in doc["dependencies"] if isinstance(d, str)]
    pip = [x for d in doc["dependencies"] if isinstance(d, dict) for x in d["pip"]]
    assert _read_simple(text) == (conda, pip)
    assert doc["channels"] == ["conda-forge"]


def _ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.fail("ruby is not installed; run scripts/setup-system.sh (it installs ruby)")
    return ruby


def test_vagrantfile_syntax():
    cp = subprocess.run([_ruby(), "-c", str(ROOT / "Vagrantfile")], check=False,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "Syntax OK" in cp.stdout


def test_vagrantfile_settings():
    """Evaluate the Vagrantfile in Ruby with a recording stand-in for Vagrant's DSL
    (Vagrant itself cannot run here: no hypervisor), and check what it configures."""
    recorder = r'''
require "json"
$rec = {"calls" => []}
class Rec
  def initialize(path) = (@path = path)
  def method_missing(name, *args, **kw, &blk)
    n = name.to_s
    if n.end_with?("=")
      $rec["calls"] << [@path + "." + n.chomp("="), args[0].is_a?(Symbol) ? args[0].to_s : args[0]]
      return nil
    end
    plain = args.map { |a| a.is_a?(Symbol) ? a.to_s : a }
    $rec["calls"] << [@path + "." + n, plain, kw.transform_keys(&:to_s)]
    # a block's receiver is named after its first argument: config.vm.provider.virtualbox
    sub = blk && args[0] ? @path + "." + n + "." + args[0].to_s : @path + "." + n
    child = Rec.new(sub)
    blk.call(child) if blk
    child
  end
  def respond_to_missing?(*) = true
end
module Vagrant
  def self.configure(version)
    yield Rec.new("config")
  end
end
load ARGV[0]
puts JSON.generate($rec)
'''
    import json

    cp = subprocess.run([_ruby(), "-e", recorder, str(ROOT / "Vagrantfile")], check=False,
                        capture_output=True, text=True, timeout=60,
                        env={**os.environ, "PROFKIT_DEMO": "0"})
    assert cp.returncode == 0, cp.stderr
    calls = json.loads(cp.stdout)["calls"]
    sets = {c[0]: c[1] for c in calls if len(c) == 2}
    assert sets["config.vm.box"] in ("bento/ubuntu-24.04", "ubuntu/noble64")
    assert sets["config.vm.provider.virtualbox.cpus"] >= 2
    assert sets["config.vm.provider.virtualbox.memory"] >= 4096
    nets = [c for c in calls if c[0] == "config.vm.network"]
    fwd = [c for c in nets if c[1][0] == "forwarded_port"]
    assert fwd and fwd[0][2]["guest"] == 8888 and fwd[0][2]["host_ip"] == "127.0.0.1"
    synced = [c for c in calls if c[0] == "config.vm.synced_folder"]
    assert synced and synced[0][1][0] == "."
    provs = [c for c in calls if c[0] == "config.vm.provision"]
    by_name = {c[1][0]: c[2] for c in provs}
    # the very script `make` runs here provisions the VM
    assert by_name["system"]["path"] == "scripts/setup-system.sh"
    assert "make -C /vagrant venv" in by_name["venv"]["inline"]
    assert "demo" not in by_name


def test_setup_script_packages_include_ruby_and_ubuntu_branch():
    text = (ROOT / "scripts" / "setup-system.sh").read_text()
    assert re.search(r"\bruby\b", text)
    assert "ubuntu)" in text and "debian)" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="installs system packages: needs root")
def test_setup_system_script_runs_here():
    """The provisioning script (also the Vagrant VM's) completes on this Debian machine."""
    cp = subprocess.run(["bash", str(ROOT / "scripts" / "setup-system.sh")], check=False,
                        capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "setup-system: done" in cp.stdout
    assert shutil.which("ruby") and shutil.which("ltrace") and shutil.which("valgrind")
